"""A pod's attempt begins on process 0 (`marin_rules/job/pod_start.py`), with real
`snakemake --profile tpu --tpu-backend local-pod` runs of 2 local processes.

Process 0 takes the lease and readies the artifact folder (a forced build's old build,
an earlier attempt's leftovers of another recipe move to `.history/`); the other
processes start the step only after that. The step `podlook:look` notes, on each
process, what it finds in its folder when it starts, in a report outside the artifact.
When process 0 dies outright (SIGKILL), the failure record of the process stopped with
it says so, and the next run records process 0's death when it takes the lease over.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, SNAKEMAKE
from marin_rules.artifacts.lease import acquire

STEP = '''
import json, os, time

def look(ctx):  # process 0 waits for process 1's look, as a step's first collective would
    process = ctx.runtime["distributed"]["process_id"]
    attempt = os.path.join(ctx.output, ".attempt.json")
    seen = {
        "old": os.path.exists(os.path.join(ctx.output, "old.txt")),
        "attempt": json.load(open(attempt))["fingerprint"] if os.path.exists(attempt) else None,
    }
    with open(os.path.join(ctx.config["report"], f"seen-{process}.json"), "w") as f:
        json.dump(seen, f)
    deadline = time.monotonic() + 60
    while process == 0 and not os.path.exists(os.path.join(ctx.config["report"], "seen-1.json")):
        assert time.monotonic() < deadline, "process 1 never started the step"
        time.sleep(0.05)
    return seen
'''


DIE = '''
import os, signal, time

def die_once(ctx):  # while the file kill-once lies in the report folder, process 0 dies once process 1 runs
    process = ctx.runtime["distributed"]["process_id"]
    kill, running = (os.path.join(ctx.config["report"], name) for name in ("kill-once", "p1-running"))
    deadline = time.monotonic() + 60
    if process == 1:
        dying = os.path.exists(kill)
        open(running, "w").close()
        while dying and time.monotonic() < deadline:  # stopped by the executor once process 0 died
            time.sleep(0.05)
        return {}
    if os.path.exists(kill):
        while not os.path.exists(running) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.remove(kill)
        os.kill(os.getpid(), signal.SIGKILL)
    return {}
'''


def _pod_run(tmp_path: Path, *config: str) -> subprocess.Popen:
    """`snakemake` on a local pod of 2 processes (1 CPU device each), started."""
    return subprocess.Popen(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--profile", str(REPO / "tpu"), "--tpu-backend", "local-pod",
         "--tpu-local-processes", "2", "--tpu-local-devices", "1", "--configfile", "exp.yaml",
         "--config", "lease_poll_s=0.1", *config],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()[0][-6000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.slow
def test_other_pod_processes_start_the_step_only_after_process_0_set_aside_the_leftovers(tmp_path):
    (tmp_path / "podlook.py").write_text(STEP)
    reports = tmp_path / "reports"
    reports.mkdir()
    (tmp_path / "exp.yaml").write_text(
        f'artifacts:\n  pods/look@v1: {{step: "podlook:look", config: {{report: "{reports}"}}, runtime: {{tpu: v5p-8}}}}\n'
    )
    folder = tmp_path / "artifacts/pods/look/v1"  # what a stopped attempt of another recipe left
    folder.mkdir(parents=True)
    (folder / ".attempt.json").write_text(json.dumps({"fingerprint": "0" * 16, "upstreams": {}}))
    (folder / "old.txt").write_text("of another recipe")
    held = acquire(str(folder), is_done=lambda: False)  # another run holds the lease: process 0 waits for it
    proc = _pod_run(tmp_path)
    try:
        logs = tmp_path / ".snakemake/marin-logs/pods/look/v1"
        _wait_for(lambda: "waiting: " in _text(logs / "job.log"), proc, "process 0 to wait for the lease")
        _wait_for(lambda: "waiting for process 0" in _text(logs / "job.log.p1") or (reports / "seen-1.json").exists(),
                  proc, "process 1 to wait or start")  # fmt: skip
        assert not (reports / "seen-1.json").exists()  # process 1 did not start the step before process 0 began
    finally:
        held.release()
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out[-6000:]
    record = json.loads((folder / ".artifact.json").read_text())
    for process in (0, 1):  # both found the folder readied for today's recipe
        seen = json.loads((reports / f"seen-{process}.json").read_text())
        assert seen == {"old": False, "attempt": record["fingerprint"]}, (process, seen)
    (stale,) = (folder / ".history").glob("*-stale")
    assert (stale / "old.txt").read_text() == "of another recipe"
    assert "old.txt" not in record["files"]
    assert "process 0 has begun; starting the step" in _text(logs / "job.log.p1")


@pytest.mark.slow
def test_when_process_0_is_killed_outright_the_records_say_so(tmp_path):
    (tmp_path / "podkill.py").write_text(DIE)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "kill-once").write_text("")
    (tmp_path / "exp.yaml").write_text(
        f'artifacts:\n  pods/die@v1: {{step: "podkill:die_once", config: {{report: "{reports}"}}, runtime: {{tpu: v5p-8}}}}\n'
    )
    folder = tmp_path / "artifacts/pods/die/v1"
    out = _pod_run(tmp_path).communicate(timeout=180)[0]
    assert not (reports / "kill-once").exists() and not (folder / ".artifact.json").exists(), out[-6000:]
    (stopped,) = [json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")]
    assert stopped["process"] == 1 and stopped["error"]["exit_status"] == "SIGTERM"
    message = stopped["error"]["message"]  # not only "terminated by signal SIGTERM", as a user's stop reads
    assert message.startswith("terminated by signal SIGTERM: process 0 of the pod (") and message.endswith(
        ") died before it, without a record (SIGKILL, the OOM killer?), and the pod was stopped"
    )

    proc = _pod_run(tmp_path)  # the next run takes the dead process 0's lease over and records its death
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 0, out[-6000:]
    failures = [json.loads(f.read_text()) for f in sorted((folder / ".failures").glob("*.json"))]
    (lost,) = [f for f in failures if "process" not in f]
    assert lost["error"]["type"] == "AttemptLost" and lost["error"]["exit_status"] == "killed"
    assert "ended without a record" in lost["error"]["message"]
    # both records name the one attempt: `marin history` shows it once, process 0's death as its cause
    assert lost["provenance"]["pod_attempt"] == stopped["provenance"]["pod_attempt"]
    from marin_rules.inspect.history import artifact_history

    killed = [e for e in artifact_history(str(folder)) if e.outcome == "failed"]
    assert [(e.processes, e.error.split(":")[0]) for e in killed] == [(2, "AttemptLost (exit status killed)")]
