"""SIGTERM or SIGINT sent to the `snakemake` process alone (what `timeout`, `kill`, CI
cancel and systemd send) stops the running step within seconds: a failure record names
the signal, no success record is written, and the job's log holds the step's output."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import REPO, SNAKEMAKE

SLOW = '''
import time
from marin_rules.artifacts import storage

def slow(ctx):
    storage.write_text_atomic(storage.join(ctx.output, "partial.txt"), "half")
    print("slow step: started", flush=True)
    for _ in range(600):  # two minutes unless stopped
        time.sleep(0.2)
    return {"finished": True}


def slow_joined(ctx):  # as training on a pod does first: JAX's own SIGTERM handler must not win
    from marin_rules.train.distributed import initialize, parse_distributed

    initialize(parse_distributed(ctx.runtime.get("distributed")))
    return slow(ctx)
'''


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


EXECUTORS = {
    "local": ([], ""),
    # the tpu executor runs each job as `snakemake --mode remote` in its own process
    # group: the job registers where the main process forwards signals all the same
    "tpu host job": (["--executor", "tpu", "--jobs", "1", "--tpu-backend", "local-pod"], ""),
    "tpu local pod": (
        ["--executor", "tpu", "--jobs", "1", "--tpu-backend", "local-pod", "--tpu-local-processes", "2"],
        ", runtime: {tpu: v5p-8}",
    ),
    "tpu local pod, jax.distributed joined": (
        ["--executor", "tpu", "--jobs", "1", "--tpu-backend", "local-pod", "--tpu-local-processes", "2"],
        ", runtime: {tpu: v5p-8}",
    ),
}


@pytest.mark.parametrize(
    "signal_name, executor",
    [("SIGTERM", "local"), ("SIGINT", "local"), ("SIGTERM", "tpu host job"), ("SIGTERM", "tpu local pod"),
     ("SIGINT", "tpu local pod"), ("SIGTERM", "tpu local pod, jax.distributed joined")],
)
def test_signal_to_snakemake_stops_the_running_step_with_a_failure_record(tmp_path, signal_name, executor):
    flags, runtime = EXECUTORS[executor]
    (tmp_path / "slowsteps.py").write_text(SLOW)
    step = "slowsteps:slow_joined" if "joined" in executor else "slowsteps:slow"
    (tmp_path / "exp.yaml").write_text(f'artifacts:\n  ck/s@v1: {{step: "{step}"{runtime}}}\n')
    prefix = tmp_path / "art"
    command = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "--config", f"prefix={prefix}", *flags]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        log = tmp_path / ".snakemake/marin-logs/ck/s/v1/job.log"  # process 0's, on a pod
        started = lambda: log.exists() and "slow step: started" in log.read_text()  # noqa: E731
        _wait_for(lambda: started() or proc.poll() is not None, 120, "the step to start")
        assert proc.poll() is None, proc.communicate()[0]
        sent = time.monotonic()
        proc.send_signal(getattr(signal, signal_name))  # the snakemake process only, not its group
        out, _ = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert stopped_after < 15, stopped_after  # the step would run two minutes
    folder = prefix / "ck/s/v1"
    failures = {f.name: json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")}
    assert len([n for n in failures if "-p" not in n]) == 1  # a pod's other processes add theirs (-p1)
    if "joined" in executor:  # process 0 keeps the coordinator until process 1 has written its record too
        assert len([n for n in failures if "-p1" in n]) == 1, sorted(failures)
    for name, failure in failures.items():
        # process 0 names the signal; a pod's other processes may meet the executor's SIGTERM first (Ctrl-C cancels)
        named = {signal_name} if "-p" not in name else {signal_name, "SIGTERM"}
        assert failure["error"]["type"] == "JobTerminated" and failure["error"]["exit_status"] in named
        assert failure["provenance"]["command"][1:] == command[1:]  # the user's command, not the executor's
    assert not (folder / ".artifact.json").exists() and not (folder / ".lease.json").exists()
    assert (folder / "partial.txt").read_text() == "half"
    log = (tmp_path / ".snakemake/marin-logs/ck/s/v1/job.log").read_text()
    assert "slow step: started" in log and f"terminated by signal {signal_name}" in log
    assert not list((tmp_path / ".snakemake/marin-jobs").glob("*/*"))  # the job unregistered


@pytest.mark.parametrize("to_group", [True, False], ids=["terminal closed: the whole group", "snakemake alone"])
def test_hangup_stops_the_step_with_a_failure_record_and_releases_snakemakes_lock(tmp_path, to_group):
    """SIGHUP (the terminal or ssh session closed) is a stop like SIGTERM: the step writes
    a failure record naming it, Snakemake exits and unlocks (the next run starts without
    `--unlock`); its default action would kill both outright, leaving no record and the lock."""
    (tmp_path / "slowsteps.py").write_text(SLOW)
    (tmp_path / "exp.yaml").write_text('artifacts:\n  ck/s@v1: {step: "slowsteps:slow"}\n')
    prefix = tmp_path / "art"
    command = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "--config", f"prefix={prefix}"]
    proc = subprocess.Popen(
        command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        log = tmp_path / ".snakemake/marin-logs/ck/s/v1/job.log"
        started = lambda: log.exists() and "slow step: started" in log.read_text()  # noqa: E731
        _wait_for(lambda: started() or proc.poll() is not None, 120, "the step to start")
        assert proc.poll() is None, proc.communicate()[0]
        if to_group:
            os.killpg(proc.pid, signal.SIGHUP)
        else:
            proc.send_signal(signal.SIGHUP)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    folder = prefix / "ck/s/v1"
    (failure,) = [json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")]
    assert failure["error"]["type"] == "JobTerminated" and failure["error"]["exit_status"] == "SIGHUP", failure
    assert not (folder / ".artifact.json").exists() and (folder / "partial.txt").read_text() == "half"
    assert not list((tmp_path / ".snakemake/locks").glob("*")), out  # unlocked: no LockException next time
    dry = subprocess.run([*command, "-n"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dry.returncode == 0 and "LockException" not in dry.stdout + dry.stderr, dry.stderr


def test_failed_step_error_is_in_its_log_and_shown_by_show_failed_logs(tmp_path, snakemake_cmd):
    (tmp_path / "badsteps.py").write_text("def boom(ctx):\n    print('step output line')\n    raise RuntimeError('boom at step 3')\n")
    (tmp_path / "exp.yaml").write_text('artifacts:\n  ck/b@v1: {step: "badsteps:boom"}\n')
    proc = snakemake_cmd("--configfile", "exp.yaml", "--config", f"prefix={tmp_path / 'art'}",
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=False)  # fmt: skip
    assert proc.returncode != 0
    log = (tmp_path / ".snakemake/marin-logs/ck/b/v1/job.log").read_text()
    assert "step output line" in log and "RuntimeError: boom at step 3" in log
    assert "RuntimeError: boom at step 3" in proc.stdout + proc.stderr  # --show-failed-logs (profiles/default)


STUBBORN = '''
import time
from marin_rules.artifacts import storage

def stubborn(ctx):  # catches everything, as a careless step's retry loop does
    print("stubborn step: started", flush=True)
    for _ in range(600):
        try:
            time.sleep(0.2)
        except BaseException:
            break
    storage.write_text_atomic(storage.join(ctx.output, "out.txt"), "cut short")
    return {"finished": True}
'''


@contextlib.contextmanager
def _run_until_started(tmp_path, module: str, text: str, step: str, said: str):
    """A real `snakemake` run of one artifact `ck/s@v1` (step `module:step`, from `text`),
    yielded once its step printed `said` (killed at the end if still running)."""
    (tmp_path / f"{module}.py").write_text(text)
    (tmp_path / "exp.yaml").write_text(f'artifacts:\n  ck/s@v1: {{step: "{module}:{step}"}}\n')
    command = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "--config",
               f"prefix={tmp_path / 'art'}"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        log = tmp_path / ".snakemake/marin-logs/ck/s/v1/job.log"
        started = lambda: log.exists() and said in log.read_text()  # noqa: E731
        _wait_for(lambda: started() or proc.poll() is not None, 120, "the step to start")
        assert proc.poll() is None, proc.communicate()[0]
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_step_that_catches_the_stop_and_returns_fails_as_stopped_without_a_success_record(tmp_path):
    with _run_until_started(tmp_path, "stubbornsteps", STUBBORN, "stubborn", "stubborn step: started") as proc:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode != 0
    folder = tmp_path / "art/ck/s/v1"
    assert not (folder / ".artifact.json").exists()  # the step returned, but it was stopped
    (failure,) = [json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")]
    assert failure["error"]["type"] == "JobTerminated" and failure["error"]["exit_status"] == "SIGTERM"
    assert "the step caught the stop" in failure["error"]["message"]
    assert (folder / "out.txt").read_text() == "cut short"  # what it wrote stays, for a look


def test_sigint_sent_twice_as_timeout_sends_it_stops_the_run_once_without_tracebacks(tmp_path):
    # GNU `timeout -s INT` signals snakemake, then its process group: Snakemake's own
    # handler, called a second time while it shuts down, ends in chained event-loop tracebacks
    failures = tmp_path / "art/ck/s/v1/.failures"
    with _run_until_started(tmp_path, "slowsteps", SLOW, "slow", "slow step: started") as proc:
        proc.send_signal(signal.SIGINT)  # the step stops: Snakemake is shutting down
        _wait_for(lambda: proc.poll() is not None or (failures.exists() and any(failures.iterdir())), 60, "the stop")
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in out and "event loop" not in out, out[-4000:]
    (failure,) = [json.loads(f.read_text()) for f in failures.glob("*.json")]
    assert failure["error"]["exit_status"] == "SIGINT"


SELF_STOPPING = '''
import gc, os, signal, threading
from marin_rules.artifacts import storage

def during_import(ctx):
    import stopsonimport  # sends SIGTERM to this process from its module code, then goes on
    storage.write_text_atomic(storage.join(ctx.output, "reached.txt"), str(stopsonimport.DONE))
    threading.Event().wait(60)  # the stop arrives here (a lock wait: signals interrupt it)
    return {"finished": True}

def in_gc_callback(ctx):
    def once(phase, info):  # what JAX registers: a callback the collector calls
        gc.callbacks.remove(once)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs in here: Python drops what it raises
    gc.callbacks.append(once)
    gc.collect()
    storage.write_text_atomic(storage.join(ctx.output, "reached.txt"), "collected")
    threading.Event().wait(60)
    return {"finished": True}
'''


@pytest.mark.parametrize("step, reached", [("during_import", "499500"), ("in_gc_callback", "collected")])
def test_a_stop_arriving_inside_an_import_or_a_gc_callback_is_raised_just_after_not_lost(tmp_path, step, reached):
    """A signal that finds the main thread importing (raising there crashed the
    interpreter with SIGSEGV mid C-extension import: no failure record) or in a gc
    callback (Python drops an exception raised there: the step ran on, then failed as
    "caught the stop") stops the step 50 ms later, once it is out: the step got past
    that point, the record says SIGTERM, and nothing was caught."""
    (tmp_path / "stopsonimport.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nDONE = sum(range(1000))\n")
    (tmp_path / "selfstop.py").write_text(SELF_STOPPING)
    (tmp_path / "exp.yaml").write_text(f'artifacts:\n  ck/s@v1: {{step: "selfstop:{step}"}}\n')
    command = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "--config", f"prefix={tmp_path / 'art'}"]
    started = time.monotonic()
    proc = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=50)  # fmt: skip
    assert proc.returncode != 0 and time.monotonic() - started < 50
    folder = tmp_path / "art/ck/s/v1"
    assert (folder / "reached.txt").read_text() == reached and not (folder / ".artifact.json").exists()
    (failure,) = [json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")]
    assert failure["error"]["message"] == "terminated by signal SIGTERM" and failure["error"]["exit_status"] == "SIGTERM"
