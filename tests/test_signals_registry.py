"""The registry of running job processes (`.snakemake/marin-jobs/<snakemake pid>/<job
pid>`) cleans up after runs that died: registering prunes entries whose process no
longer exists and registries left empty; unregistering removes its registry once empty.
Real processes: a reaped child's pid stands for a dead job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from marin_rules.workflow.signals import register, registered


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)  # reaped: the pid no longer exists
    return proc.pid


def entry(registry: Path, pid: int) -> None:
    registry.mkdir(parents=True, exist_ok=True)
    (registry / str(pid)).write_text(str(pid))


def test_registering_prunes_dead_entries_and_empty_registries_and_touches_nothing_else(tmp_path):
    root = tmp_path / ".snakemake" / "marin-jobs"
    dead, live = dead_pid(), os.getpid()
    entry(root / "111", dead)
    entry(root / "111", live)  # a job still running in an older run: kept
    entry(root / "222", dead)  # a killed run: its registry goes
    (root / "333").mkdir()  # left empty
    (root / "notes").mkdir()  # not a registry: untouched
    unregister = register(str(root / "444"), live)
    assert registered(str(root / "111")) == [live]
    assert sorted(p.name for p in root.iterdir()) == ["111", "444", "notes"]
    assert registered(str(root / "444")) == [live]
    unregister()
    assert sorted(p.name for p in root.iterdir()) == ["111", "notes"]  # its empty registry removed
    unregister()  # idempotent


def test_a_job_that_registers_after_the_stop_signal_does_not_begin(tmp_path):
    # the signal came while the job process was starting (Snakemake had launched it)
    import signal

    from marin_rules.workflow.signals import forward

    registry = tmp_path / ".snakemake" / "marin-jobs" / str(os.getpid())  # this process stands for snakemake
    assert forward(str(registry), signal.SIGINT) == []  # no job registered yet
    (tmp_path / "steps.py").write_text("def make(ctx):\n    open(ctx.output + '/made', 'w').close()\n")
    (tmp_path / "exp.yaml").write_text('artifacts:\n  raw/a@v1: {step: "steps:make"}\n')
    job = [sys.executable, "-m", "marin_rules.job", "--artifact", "raw/a/v1", "--experiment", "exp.yaml",
           "--prefix", "art", "--registry", str(registry), "--log", "job.log"]  # fmt: skip
    proc = subprocess.run(job, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 128 + signal.SIGINT
    assert proc.stderr == "marin-rules: raw/a/v1: not started: snakemake received SIGINT\n"
    assert not (tmp_path / "art").exists() and registered(str(registry)) == []

    # the stop file of a snakemake that no longer exists goes with its registry
    old = tmp_path / ".snakemake" / "marin-jobs" / str(dead_pid())
    old.mkdir()
    (old / "stop").write_text("SIGTERM")
    register(str(registry.parent / "999999999"), os.getpid())()
    assert not old.exists() and (registry / "stop").exists()


def test_a_second_delivery_of_a_signal_reaches_the_jobs_only_and_another_signal_goes_on(tmp_path):
    # `timeout -s INT` delivers SIGINT twice; a SIGTERM (a CI cancel) then a Ctrl-C must still
    # reach Snakemake's handler, which cancels jobs the registry does not list (TPU pods)
    import signal as sig

    from marin_rules.workflow.signals import forward_signals

    calls = []
    saved = {s: sig.getsignal(s) for s in (sig.SIGINT, sig.SIGTERM, sig.SIGHUP)}
    try:
        for s in saved:
            sig.signal(s, lambda signum, frame: calls.append(signum))
        forward_signals(str(tmp_path / "registry"))
        handler = {s: sig.getsignal(s) for s in (sig.SIGINT, sig.SIGTERM)}
        handler[sig.SIGINT](sig.SIGINT, None)
        handler[sig.SIGINT](sig.SIGINT, None)  # the duplicate: jobs only
        handler[sig.SIGTERM](sig.SIGTERM, None)
        handler[sig.SIGINT](sig.SIGINT, None)  # a third Ctrl-C: the user insists
        assert calls == [sig.SIGINT, sig.SIGTERM, sig.SIGINT]
        for s in saved:  # a second run in this process: Snakemake's scheduler installs its handlers again
            sig.signal(s, lambda signum, frame: calls.append(signum))
        forward_signals(str(tmp_path / "registry"))  # ... and this run's counts start afresh
        sig.getsignal(sig.SIGTERM)(sig.SIGTERM, None)
        assert calls[-1] == sig.SIGTERM and len(calls) == 4
    finally:
        for s, h in saved.items():
            sig.signal(s, h)


def test_an_entry_of_another_host_is_never_signalled_nor_pruned_here(tmp_path):
    # a job on a cluster node (a shared working directory) may have the pid of any process
    # here, even a live one: it is not ours to signal, and only its own host can prune it
    import signal

    from marin_rules.workflow.signals import forward, host_key, registry_dir

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        registry = tmp_path / os.path.basename(registry_dir())  # this process stands for snakemake
        assert registry.name == f"{os.getpid()}@{host_key()}"
        entry(registry, 0)
        (registry / "0").rename(registry / f"{bystander.pid}@node-17")
        assert registered(str(registry)) == []  # none this host can reach
        assert forward(str(registry), signal.SIGTERM) == [] and bystander.poll() is None  # not signalled
        assert (registry / "stop").read_text() == "SIGTERM"  # what that job watches for
        register(str(tmp_path / "999999999"), os.getpid())()  # prunes beside it
        assert (registry / f"{bystander.pid}@node-17").exists()
        other = tmp_path / "4242@node-17"  # another host's run: untouched here
        entry(other, dead_pid())
        register(str(tmp_path / "999999999"), os.getpid())()
        assert other.exists()
    finally:
        bystander.kill()
        bystander.wait(timeout=30)


def test_a_job_on_another_host_than_snakemake_stops_on_the_stop_file(tmp_path):
    # the registry names snakemake's host: this job cannot be signalled from there, so it
    # watches the registry's stop file and stops itself with the signal named there
    import signal

    registry = tmp_path / ".snakemake" / "marin-jobs" / "4242@login-node"
    (tmp_path / "steps.py").write_text("import time\ndef make(ctx):\n    while True:\n        time.sleep(0.05)\n")
    (tmp_path / "exp.yaml").write_text('artifacts:\n  raw/a@v1: {step: "steps:make"}\n')
    job = [sys.executable, "-m", "marin_rules.job", "--artifact", "raw/a/v1", "--experiment", "exp.yaml",
           "--prefix", "art", "--registry", str(registry), "--log", "job.log"]  # fmt: skip
    proc = subprocess.Popen(job, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "art/raw/a/v1/.lease.json").exists():  # registered, and the step has begun
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
            time.sleep(0.02)  # polling a subprocess, bounded by the deadline
        (registry / "stop").write_text("SIGTERM")
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    (failure,) = (tmp_path / "art/raw/a/v1/.failures").glob("*.json")
    assert "SIGTERM" in failure.read_text() and not (tmp_path / "art/raw/a/v1/.artifact.json").exists()
    assert list(registry.glob("*@*")) == []  # unregistered


def test_sigterm_after_snakemake_received_sigint_records_the_sigint(tmp_path):
    # Ctrl-C: snakemake forwards SIGINT, then its executor cancels the job with SIGTERM;
    # under load the SIGTERM can come first. The record names what the user sent.
    import json
    import signal

    registry = tmp_path / ".snakemake" / "marin-jobs" / str(os.getpid())  # this process stands for snakemake
    (tmp_path / "steps.py").write_text(
        "import os, signal\n\n"
        "def make(ctx):\n"
        f"    open({str(registry / 'stop')!r}, 'w').write('SIGINT')  # what forward() writes first\n"
        "    os.kill(os.getpid(), signal.SIGTERM)  # the executor's cancel, before the forwarded SIGINT\n"
    )  # fmt: skip
    (tmp_path / "exp.yaml").write_text('artifacts:\n  raw/a@v1: {step: "steps:make"}\n')
    job = [sys.executable, "-m", "marin_rules.job", "--artifact", "raw/a/v1", "--experiment", "exp.yaml",
           "--prefix", "art", "--registry", str(registry), "--log", "job.log"]  # fmt: skip
    proc = subprocess.run(job, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    (failure,) = (tmp_path / "art/raw/a/v1/.failures").glob("*.json")
    error = json.loads(failure.read_text())["error"]
    assert (error["type"], error["exit_status"]) == ("JobTerminated", "SIGINT")
    assert not (tmp_path / "art/raw/a/v1/.artifact.json").exists()
