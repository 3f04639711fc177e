"""Files of a built artifact damaged in place (their recorded sizes kept, so the size
check passes): every reader names the field, the file and the fix in one line, and
never trains, scores or exports what it read; in a real run the fix is a command that
runs as printed. Real data from the data steps and a model in the training checkpoint
layout; the damage is done by hand, as a bad disk or a stray editor would."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from marin_rules.artifacts.errors import StepError
from marin_rules.data.loader import make_loader
from marin_rules.eval.lm import load_tokenizer
from marin_rules.train.metrics import MetricsLog
from conftest import REPO, SNAKEMAKE
from test_workflow import ws  # noqa: F401 (fixture)
from train_helpers.tokens import make_tokens


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return Path(make_tokens(str(tmp_path_factory.mktemp("damaged"))))


@pytest.fixture
def tokens(built, tmp_path) -> Path:
    copy = tmp_path / "tokens"
    shutil.copytree(built, copy)
    return copy


def garble_first_bytes(path: Path, n: int = 6) -> None:
    data = bytearray(path.read_bytes())
    data[:n] = b"\x00" * n
    path.write_bytes(bytes(data))  # same size: the record's size check cannot see it


def loader(tokens: Path):
    return make_loader(str(tokens), seq_len=16, batch_size=4, seed=0)


def test_a_garbled_index_json_is_named_with_the_rebuild_command(tokens):
    garble_first_bytes(tokens / "index.json", 1)
    with pytest.raises(StepError) as error:
        loader(tokens)
    message = str(error.value)
    assert message.startswith(f"deps.data: {tokens / 'index.json'} is unreadable (JSONDecodeError")
    assert message.endswith(f"rebuild it with: snakemake -f {tokens / '.artifact.json'}") and "\n" not in message


def test_a_garbled_token_shard_is_named_not_reported_as_pickled_data(tokens):
    shard = next((tokens / "shards").rglob("train/tokens-00000.npy"))
    garble_first_bytes(shard)
    with pytest.raises(StepError, match=rf"deps.data: {shard} is unreadable \(not a numpy array file\)") as error:
        loader(tokens)
    assert "pickle" not in str(error.value)


def test_token_ids_outside_the_vocabulary_stop_the_loader_not_the_learning_rate(tokens):
    for shard in (tokens / "shards").rglob("train/tokens-*.npy"):
        np.load(shard, mmap_mode="r+")[:] = 60000
    with pytest.raises(StepError, match=r"token id 60000 outside the vocabulary of 512 ids") as error:
        loader(tokens).batch(0)
    assert str(error.value).startswith("deps.data: ") and "learning_rate" not in str(error.value)


def test_a_garbled_tokenizer_json_is_named_by_evaluation(built):
    path = Path(json.loads((built / "index.json").read_text())["tokenizer"])
    copy = built.parent / "tok-garbled" / "tokenizer.json"
    copy.parent.mkdir(exist_ok=True)
    copy.write_bytes(b"\x00" + (built / path).resolve().read_bytes()[1:])
    with pytest.raises(StepError, match=rf"deps.model: {copy} is unreadable \(Exception: expected value"):
        load_tokenizer(str(copy))


def test_a_torn_metrics_line_is_dropped_on_resume_not_blocking_it(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"split": "train", "step": 10, "loss": 3.0}\n{"split": "train", "step": 20, "lo')
    resumed = MetricsLog.resume(str(log), up_to_step=20)
    assert resumed.records == [{"split": "train", "step": 10, "loss": 3.0}]
    assert "1 unreadable line(s) dropped while resuming" in capsys.readouterr().err


def test_a_garbled_model_json_is_named_before_any_checkpoint_is_read(tmp_path):
    from marin_rules.train.load import load_trained

    (tmp_path / "model.json").write_text('{"model": {"d_model": 1')  # torn mid-write by hand
    with pytest.raises(StepError, match=rf"deps.model: {tmp_path / 'model.json'} is unreadable \(JSONDecodeError"):
        load_trained(str(tmp_path))


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory) -> Path:
    from test_eval_lm import tiny_artifacts  # a tiny model in the training checkpoint layout, built once

    return Path(tiny_artifacts(str(tmp_path_factory.getbasetemp() / "eval-artifacts"))["model"])


def damaged_checkpoint(trained_model: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the model whose last checkpoint's embedding holds random bytes of its size
    (so `marin verify` passes): (the copy, the damaged file)."""
    copy = tmp_path / "model"
    shutil.copytree(trained_model, copy)
    (chunk,) = (copy / "checkpoints").glob("*/model/params.embed.value/0.0")
    chunk.write_bytes(np.random.default_rng(0).bytes(chunk.stat().st_size))
    return copy, chunk


# orbax leaves the reads of the other arrays of a failed restore unawaited; Python may report
# them when they are collected, after the failure was handled (as in test_train_checkpoint.py)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("step", ["evaluate", "export_hf"])
def test_a_damaged_checkpoint_is_one_line_naming_it_with_the_rebuild_command_in_evaluate_and_export(
    trained_model, tmp_path, step
):
    from marin_rules.artifacts.context import StepContext
    from marin_rules.eval.step import evaluate
    from marin_rules.export.hf import export_hf

    model, chunk = damaged_checkpoint(trained_model, tmp_path)
    raw = trained_model.parent / "raw"
    ctx = {
        "evaluate": StepContext("evals/m", "v1", {"tasks": ["marin_shakespeare_bpb"], "limit": 2},
                                {"model": str(model), "data": str(raw)}, output=str(tmp_path / "eval")),
        "export_hf": StepContext("exports/m", "v1", {}, {"model": str(model)}, output=str(tmp_path / "hf")),
    }[step]  # fmt: skip
    with pytest.raises(StepError) as error:
        {"evaluate": evaluate, "export_hf": export_hf}[step](ctx)
    message = str(error.value)
    assert message.startswith(f"deps.model: {chunk.parents[2]} is unreadable (ValueError: "), message
    assert str(chunk) in message  # the file, from the innermost cause
    assert message.endswith(f"the artifact is damaged; rebuild it with: snakemake -f {model / '.artifact.json'}")
    assert "\n" not in message and "TensorStore" not in message  # not orbax's dump of the array's spec


def test_a_checkpoint_step_never_saved_is_named_as_missing_not_as_damage(trained_model):
    from marin_rules.train.load import load_trained

    with pytest.raises(StepError, match=rf"^no checkpoint 99 under {trained_model / 'checkpoints'}$"):
        load_trained(str(trained_model), step=99)


TOKENS_AND_MODEL = {
    "raw/s@v1": {"step": "download", "config": {"source": "package:shakespeare", "sample_count": 3}},
    "tokenizers/bpe@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/s@v1"}, "config": {"vocab_size": 384}},
    "tokenized/s@v1": {"step": "tokenize", "deps": {"corpus": "raw/s@v1", "tokenizer": "tokenizers/bpe@v1"},
                       "config": {"validation_fraction": 0.05}},
    "checkpoints/nano@v1": {"step": "train", "deps": {"data": "tokenized/s@v1"}, "config": {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "d_ff": 64, "n_experts": 4, "top_k": 2,
                  "d_expert": 32, "max_seq_len": 32},
        "optimizer": {"name": "adamw", "learning_rate": 0.01}, "num_train_steps": 4, "batch_size": 4, "seq_len": 32}},
}  # fmt: skip


def test_an_unreadable_upstream_files_rebuild_command_runs_as_printed_and_rebuilds_it(ws):  # noqa: F811
    ws.write(TOKENS_AND_MODEL)
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=tokenized/s@v1")
    tokens = Path(ws.prefix) / "tokenized/s/v1"
    shard = next((tokens / "shards").rglob("train/tokens-00000.npy"))
    garble_first_bytes(shard)
    built = ws.record("tokenized/s@v1")["provenance"]["ended"]
    proc = ws.snakemake(check=False)  # training on it stops at its loader
    assert proc.returncode != 0
    line = next(ln for ln in (proc.stdout + proc.stderr).splitlines() if "is unreadable (not a numpy array file)" in ln)
    printed = line.split("the artifact is damaged; rebuild it with: ")[1].split("); failure record ")[0]
    # the run's experiment, prefix and Snakefile are not the defaults: the command names them
    assert printed == shlex.join(["snakemake", "-f", str(tokens / ".artifact.json"), "-s", str(REPO / "Snakefile"),
                                  "-d", str(ws.root), "--configfile", str(ws.root / "exp.yaml"),
                                  "--config", f"prefix={ws.prefix}"])  # fmt: skip
    (failure,) = (Path(ws.prefix) / "checkpoints/nano/v1/.failures").glob("*.json")
    assert json.loads(failure.read_text())["error"]["message"].endswith(printed)  # the record says the same
    elsewhere = ws.root / "elsewhere"
    elsewhere.mkdir()
    rebuilt = subprocess.run([SNAKEMAKE, *shlex.split(printed)[1:]], cwd=elsewhere, env={**os.environ, **ws.env},
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr[-4000:]
    assert ws.record("tokenized/s@v1")["provenance"]["ended"] != built
    assert np.load(shard, allow_pickle=False).size > 0  # readable again


def test_run_step_completes_an_unreadable_files_rebuild_command_in_the_failure_record_and_on_stderr(tmp_path, capsys):
    from marin_rules.artifacts.context import StepContext
    from marin_rules.artifacts.records import Provenance, unreadable_file
    from marin_rules.job.run import run_step

    upstream, out = str(tmp_path / "tokenized/x/v1"), str(tmp_path / "checkpoints/m/v1")
    flags = f"--configfile {tmp_path / 'exp.yaml'} --config prefix={tmp_path}"

    def step(ctx):
        raise unreadable_file("deps.data", f"{upstream}/index.json", upstream, "not valid JSON")

    entry = {"name": "checkpoints/m", "version": "v1", "step": "train", "fingerprint": "0" * 16, "config": {},
             "deps": {}, "runtime": {}}  # fmt: skip
    ctx = StepContext("checkpoints/m", "v1", {}, {"data": upstream}, output=out)
    with pytest.raises(StepError) as error:
        run_step(ctx, entry, Provenance(str(tmp_path), [], None, None), step, hint_flags=flags)
    expected = f"the artifact is damaged; rebuild it with: snakemake -f {upstream}/.artifact.json {flags}"
    assert str(error.value).endswith(expected)
    (failure,) = (Path(out) / ".failures").glob("*.json")
    assert json.loads(failure.read_text())["error"]["message"].endswith(expected)
    assert f"{expected}); failure record " in capsys.readouterr().err
