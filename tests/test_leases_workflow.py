"""Two real `snakemake` runs from different folders on one prefix build each artifact
once: the second waits, says who holds the lease, then serves the finished artifact
(both exit 0); with `--config lease_wait=false` it fails at once in one line instead.
On a local prefix and on a gs:// prefix (the local GCS emulator)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, SNAKEMAKE
from marin_rules.artifacts import storage

STEP = '''
import os, time
from marin_rules.artifacts import storage

def build(ctx):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    release = os.environ["RUNS_LOG"] + ".release"  # the test says when the other run is waiting
    for _ in range(1200):
        if os.path.exists(release):
            break
        time.sleep(0.1)
    storage.write_text_atomic(storage.join(ctx.output, "data.txt"), "built")
    return {"pid": os.getpid()}
'''


def _start(folder: Path, prefix: str, env: dict, *config: str) -> subprocess.Popen:
    folder.mkdir()
    (folder / "exp.yaml").write_text('artifacts:\n  ck/l@v1: {step: "leasesteps:build"}\n')
    return subprocess.Popen(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml",
         "--config", f"prefix={prefix}", "lease_poll_s=0.2", *config],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _env(tmp_path: Path, extra: dict | None = None) -> dict:
    (tmp_path / "leasesteps.py").write_text(STEP)
    return {**os.environ, **(extra or {}), "PYTHONPATH": str(tmp_path), "RUNS_LOG": str(tmp_path / "runs.log")}


def _two_runs(tmp_path: Path, prefix: str, env: dict, *config: str) -> tuple:
    first = _start(tmp_path / "alice", prefix, env)
    try:
        return _race(tmp_path, prefix, env, first, *config)
    finally:
        (tmp_path / "runs.log.release").write_text("")
        if first.poll() is None:
            first.communicate(timeout=180)


def _race(tmp_path: Path, prefix: str, env: dict, first: subprocess.Popen, *config: str) -> tuple:
    deadline = time.monotonic() + 120
    while not (tmp_path / "runs.log").exists():  # the first run's step has started
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.1)
    second = _start(tmp_path / "bob", prefix, env, *config)
    bob_log = tmp_path / "bob/.snakemake/marin-logs/ck/l/v1/job.log"
    while not (bob_log.exists() and "being built by" in bob_log.read_text()):
        assert time.monotonic() < deadline, second.communicate()[0] if second.poll() is not None else "timeout"
        time.sleep(0.1)
    (tmp_path / "runs.log.release").write_text("")
    out2, _ = second.communicate(timeout=180)
    out1, _ = first.communicate(timeout=180)
    log2 = (tmp_path / "bob/.snakemake/marin-logs/ck/l/v1/job.log").read_text()
    return first.returncode, out1, second.returncode, out2 + JOB_LOG + log2


JOB_LOG = "\n--- the waiting run's job log ---\n"


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_two_runs_on_one_prefix_build_once_and_both_succeed(tmp_path, where, request):
    if where == "gcs":
        gcs_env, prefix = request.getfixturevalue("gcs_env"), request.getfixturevalue("gcs_prefix")
    else:
        gcs_env, prefix = {}, str(tmp_path / "art")
    rc1, out1, rc2, out2 = _two_runs(tmp_path, prefix, _env(tmp_path, gcs_env))
    assert rc1 == 0 and rc2 == 0, (out1, out2)
    assert len((tmp_path / "runs.log").read_text().split()) == 1  # the step ran exactly once
    terminal, log = out2.split(JOB_LOG)
    for seen in (terminal, log):  # the user watching the second run sees why it waits, and the log keeps it
        assert "ck/l@v1: waiting: " in seen and " is being built by " in seen and "pid " in seen
        assert "built meanwhile by another run" in seen
    assert storage.read_text(f"{prefix}/ck/l/v1/data.txt") == "built"
    if where == "gcs":  # the waiting run's mirror holds the record Snakemake checked
        assert list((tmp_path / "bob/.snakemake/marin-mirror").rglob("ck/l/v1/.artifact.json"))


def test_lease_wait_false_fails_at_once_naming_the_holder(tmp_path):
    env = _env(tmp_path)
    started = time.monotonic()
    rc1, out1, rc2, out2 = _two_runs(tmp_path, str(tmp_path / "art"), env, "lease_wait=false")
    assert rc1 == 0 and rc2 != 0, (out1[-3000:], out2)
    lines = [l for l in out2.splitlines() if "being built by" in l]
    assert lines and lines[0].startswith("marin-rules: ") and "wait for it to finish" in lines[0]
    assert len((tmp_path / "runs.log").read_text().split()) == 1
    assert not (tmp_path / "art/ck/l/v1/.failures").exists()  # a refusal is not a failed build
    assert time.monotonic() - started < 120


def test_a_holder_that_loses_its_lease_stops_its_step_and_records_no_success(tmp_path):
    import json

    env = _env(tmp_path)
    folder = tmp_path / "alice"
    proc = _start(folder, str(tmp_path / "art"), env, "lease_heartbeat_s=0.3")
    location = tmp_path / "art/ck/l/v1"
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "runs.log").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
        lease = json.loads((location / ".lease.json").read_text())
        stolen = {**lease, "host": "thief", "token": "0" * 32}  # another holder took it over
        (location / ".lease.json.new").write_text(json.dumps(stolen))
        os.replace(location / ".lease.json.new", location / ".lease.json")
        out, _ = proc.communicate(timeout=120)
    finally:
        (tmp_path / "runs.log.release").write_text("")
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert not (location / ".artifact.json").exists()
    (failure,) = [json.loads(p.read_text()) for p in (location / ".failures").glob("*.json")]
    assert failure["error"]["exit_status"] == "lease lost" and "taken over by" in failure["error"]["message"]
    assert json.loads((location / ".lease.json").read_text())["token"] == "0" * 32  # the thief's lease is kept


def test_a_lease_left_by_a_killed_run_is_taken_over_once_stale(tmp_path):
    import signal

    env = _env(tmp_path)
    prefix = str(tmp_path / "art")
    first = _start(tmp_path / "alice", prefix, env, "lease_heartbeat_s=0.5")
    deadline = time.monotonic() + 120
    while not (tmp_path / "runs.log").exists():
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.1)
    (job_pid,) = map(int, (tmp_path / "runs.log").read_text().split())
    os.kill(job_pid, signal.SIGKILL)  # the builder dies without a word: its lease stays behind
    first.kill()
    first.communicate(timeout=60)
    assert (tmp_path / "art/ck/l/v1/.lease.json").exists()
    (tmp_path / "runs.log.release").write_text("")
    second = _start(tmp_path / "bob", prefix, env, "lease_heartbeat_s=0.5", "lease_stale_s=2")  # stale > 2 x heartbeat
    out, _ = second.communicate(timeout=180)
    assert second.returncode == 0, out
    assert len((tmp_path / "runs.log").read_text().split()) == 2  # built again, by the second run
    assert storage.read_text(f"{prefix}/ck/l/v1/data.txt") == "built"
    assert not (tmp_path / "art/ck/l/v1/.lease.json").exists()  # released after the build


def test_a_stale_lease_whose_holder_still_lives_is_recorded_as_lost_not_killed(tmp_path):
    """A holder that stopped renewing but whose process exists (paused by SIGSTOP, say:
    it writes its own record when it wakes) is taken over once stale; the failure record
    written for it says it stopped renewing, not that it was killed."""
    import dataclasses
    import json
    import sys

    from marin_rules.artifacts.lease import new_holder

    env = _env(tmp_path)
    prefix = str(tmp_path / "art")
    paused = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        then = "2026-01-01T00:00:00.000000+00:00"
        holder = dataclasses.replace(new_holder(), pid=paused.pid, since=then, renewed=then)
        storage.write_json_atomic(f"{prefix}/ck/l/v1/.lease.json", dataclasses.asdict(holder))
        (tmp_path / "runs.log.release").write_text("")
        second = _start(tmp_path / "bob", prefix, env, "lease_heartbeat_s=0.5", "lease_stale_s=2")
        out, _ = second.communicate(timeout=180)
    finally:
        paused.communicate(b"", timeout=60)
    assert second.returncode == 0, out
    assert f"an earlier attempt ({holder.describe()}) stopped renewing its lease; taking the build over" in out
    (failure,) = [json.loads(f.read_text()) for f in (tmp_path / "art/ck/l/v1/.failures").glob("*.json")]
    assert failure["error"]["type"] == "AttemptLost" and failure["error"]["exit_status"] == "lost"
    assert "it stopped renewing its lease: killed, paused (SIGSTOP), or its machine lost" in failure["error"]["message"]


CHAIN_STEPS = '''
import os
from marin_rules.artifacts import storage

def make(ctx):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(ctx.name + "\\n")
    storage.write_text_atomic(storage.join(ctx.output, "data.txt"), ctx.name)
    return {"pid": os.getpid()}
'''


def test_a_run_serves_what_another_run_finished_after_it_planned_instead_of_deleting_it(tmp_path):
    """Bob plans l and m while neither exists; then another run finishes both (here: a
    copy of a build made elsewhere, while this test holds l's lease so Bob's l job
    waits). Snakemake would delete m's finished record before Bob's m job starts (it
    was missing when Bob planned) and the job would build m again under readers of it:
    records are `update()` outputs, so Bob serves m as it is."""
    import shutil

    from marin_rules.artifacts.lease import acquire

    (tmp_path / "chainsteps.py").write_text(CHAIN_STEPS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "RUNS_LOG": str(tmp_path / "runs.log")}
    experiment = 'artifacts:\n  ck/l@v1: {step: "chainsteps:make"}\n  ck/m@v1: {step: "chainsteps:make", deps: {l: ck/l@v1}}\n'
    runs = []
    for name, prefix in (("carol", tmp_path / "elsewhere"), ("bob", tmp_path / "art")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "exp.yaml").write_text(experiment)
        runs.append([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml",
                     "--config", f"prefix={prefix}", "lease_poll_s=0.2"])  # fmt: skip
    subprocess.run(runs[0], cwd=tmp_path / "carol", env=env, check=True, capture_output=True, timeout=300)
    built = {key: storage.read_json(f"{tmp_path}/elsewhere/ck/{key}/v1/.artifact.json") for key in "lm"}
    held = acquire(str(tmp_path / "art/ck/l/v1"), is_done=lambda: False, wait=False)
    bob = subprocess.Popen(runs[1], cwd=tmp_path / "bob", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        bob_log = tmp_path / "bob/.snakemake/marin-logs/ck/l/v1/job.log"
        deadline = time.monotonic() + 120
        while not (bob_log.exists() and "being built by" in bob_log.read_text()):  # Bob planned both, waits on l
            assert time.monotonic() < deadline and bob.poll() is None, bob.communicate()[0] if bob.poll() else "timeout"
            time.sleep(0.1)
        for key in "lm":  # the other run finishes both
            shutil.copytree(tmp_path / f"elsewhere/ck/{key}/v1", tmp_path / f"art/ck/{key}/v1", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".lease.json*"))  # fmt: skip
    finally:
        held.release()
    out, _ = bob.communicate(timeout=300)
    assert bob.returncode == 0, out
    assert (tmp_path / "runs.log").read_text().split() == ["ck/l", "ck/m"]  # Carol's builds only
    for key in "lm":
        assert storage.read_json(f"{tmp_path}/art/ck/{key}/v1/.artifact.json") == built[key]


TAKER_STEPS = '''
import json
from marin_rules.artifacts import storage
from marin_rules.artifacts.provenance import iso, utc_now

def take(ctx):
    """Stands in for another run's forced job starting on config.other: it holds that
    artifact's lease and has moved its record aside."""
    other = ctx.config["other"]
    now = iso(utc_now())
    holder = {"user": "someone", "host": "another-host", "pid": 4242, "since": now, "renewed": now, "token": "f" * 32}
    storage.write_bytes_atomic(other + "/.lease.json", json.dumps(holder).encode())
    storage.makedirs(other + "/.history/t")
    storage.move(other + "/.artifact.json", other + "/.history/t/.artifact.json")
    return {}
'''


def test_a_record_another_run_takes_away_mid_run_is_named_with_its_holder(tmp_path, snakemake_cmd):
    # what Snakemake alone says then is "Missing files after 5 seconds ... --latency-wait"
    from test_workflow import Workspace

    ws = Workspace(tmp_path, snakemake_cmd)
    (tmp_path / "takersteps.py").write_text(TAKER_STEPS)
    ws.write({
        "raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}},
        "side/d@v1": {"step": "takersteps:take", "config": {"other": f"{ws.prefix}/raw/a/v1"}},
    })  # fmt: skip
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=raw/a@v1")
    proc = ws.snakemake(check=False)
    assert proc.returncode != 0
    assert (
        "marin-rules: raw/a@v1: its record is not there: another run is building it "
        "(lease held by someone@another-host pid 4242"
    ) in proc.stderr
    assert "side/d@v1: its record" not in proc.stderr  # only what was taken away


def test_a_lease_of_this_runs_own_job_still_ending_is_not_named_as_another_run(tmp_path):
    # a job stopped by SIGINT may still be writing its failure record, lease held, when
    # Snakemake exits: it is registered in this run's registry until it has ended
    import dataclasses
    import types

    from marin_rules.artifacts.lease import new_holder
    from marin_rules.workflow.session import Session
    from marin_rules.workflow.signals import register

    location = tmp_path / "art/raw/a/v1"
    location.mkdir(parents=True)
    holder = dataclasses.asdict(dataclasses.replace(new_holder(), pid=os.getpid()))  # a live process of this host
    storage.write_json_atomic(str(location / ".lease.json"), holder)
    run = types.SimpleNamespace(
        _records={"raw/a@v1": None}, registry=str(tmp_path / "registry"), location=lambda key: str(location),
        record_path=lambda key: str(location / ".artifact.json"),
    )  # fmt: skip
    (line,) = Session.taken_by_another_run(run)  # not this run's job: another run's
    assert line.startswith("raw/a@v1: its record is not there: another run is building it (lease held by ")
    unregister = register(run.registry, os.getpid())  # this run's job, still ending
    try:
        assert Session.taken_by_another_run(run) == []
    finally:
        unregister()


def test_a_lease_held_on_a_tpu_worker_by_a_job_this_run_submitted_is_named_as_its_own_pod_job(tmp_path):
    # a pod job's process 0 holds the lease on a TPU worker: another host, a process no
    # registry here lists; the tpu executor told it who submitted it, and its lease says so
    import dataclasses
    import types

    from marin_rules.artifacts.lease import new_holder
    from marin_rules.cluster.pod import this_submitter
    from marin_rules.workflow.session import Session

    location = tmp_path / "art/pods/p/v1"
    location.mkdir(parents=True)
    run = types.SimpleNamespace(
        _records={"pods/p@v1": None}, registry=str(tmp_path / "registry"), location=lambda key: str(location),
        record_path=lambda key: str(location / ".artifact.json"),
    )  # fmt: skip
    worker = dataclasses.replace(new_holder(), host="t1v-n-0a1b2c3d-w-0", pid=4242)
    for submitter, ours in ((this_submitter(), True), ("another-host 4242 pid:[1]", False), ("", False)):
        holder = dataclasses.replace(worker, submitted_by=submitter)
        storage.write_json_atomic(str(location / ".lease.json"), dataclasses.asdict(holder))
        (line,) = Session.taken_by_another_run(run)
        assert "@t1v-n-0a1b2c3d-w-0 pid 4242" in line
        said = "this run's pod job still holds its lease" if ours else "another run is building it"
        assert said in line, (submitter, line)


def test_two_runs_forcing_one_artifact_at_once_build_it_once(tmp_path):
    """Bob forces ck/l while Alice's forced rebuild of it runs (Alice has moved the old
    build aside, so Bob's run finds none to set aside): Alice's build of the same
    recipe and code, ended while Bob's job waited for the lease, meets Bob's force."""
    env = _env(tmp_path)
    (tmp_path / "runs.log.release").write_text("")  # the first build runs through
    first = _start(tmp_path / "first", str(tmp_path / "art"), env)
    assert first.communicate(timeout=180)[0] is not None and first.returncode == 0
    (tmp_path / "runs.log").unlink()
    (tmp_path / "runs.log.release").unlink()
    alice = _start(tmp_path / "alice", str(tmp_path / "art"), env, "--forceall")
    try:
        rc1, out1, rc2, out2 = _race(tmp_path, str(tmp_path / "art"), env, alice, "--forceall")
    finally:
        (tmp_path / "runs.log.release").write_text("")
        if alice.poll() is None:
            alice.communicate(timeout=180)
    assert rc1 == 0 and rc2 == 0, (out1, out2)
    assert len((tmp_path / "runs.log").read_text().split()) == 1  # Alice's rebuild only
    assert "forced, but another run was building it when this run began" in out2
    assert "not building it twice; serving it" in out2
    history = sorted(p.name for p in (tmp_path / "art/ck/l/v1/.history").iterdir())
    assert len(history) == 1, history  # the first build, set aside once (by Alice)
