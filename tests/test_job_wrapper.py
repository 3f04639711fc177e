"""Calling a step (`run_step`) without Snakemake: records on success, failure, signals, fencing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.records import Provenance
from marin_rules.job.run import run_step


def _entry(output: str) -> dict:
    return {"name": "x/y", "version": "v1", "step": "t:f", "fingerprint": "0" * 16,
            "config": {}, "deps": {}, "runtime": {}, "path": output}  # fmt: skip


def _ctx(output: str) -> StepContext:
    return StepContext(name="x/y", version="v1", config={}, deps={}, runtime={}, output=output)


def test_success_record_is_written_after_the_step_and_holds_its_result(tmp_path):
    out = str(tmp_path / "x/y/v1")
    seen = {}

    def step(ctx):
        seen["record_existed"] = (Path(ctx.output) / ".artifact.json").exists()
        return {"tokens": 12}

    record = run_step(_ctx(out), _entry(out), Provenance(str(tmp_path), ["cmd"], "r", 1), step)
    assert seen["record_existed"] is False
    assert json.loads((Path(out) / ".artifact.json").read_text()) == record.to_json()
    assert record.result == {"tokens": 12} and record.status == "success"


def test_on_a_pod_only_process_0_writes_success_and_every_failing_process_its_own_failure(tmp_path):
    out = str(tmp_path / "x/y/v1")
    provenance = Provenance(str(tmp_path), [], None, None)
    record = run_step(_ctx(out), _entry(out), provenance, lambda ctx: {"n": 1}, process=1)
    assert record is None and not (Path(out) / ".artifact.json").exists()

    def out_of_memory(ctx):
        raise MemoryError("host 1 ran out of memory")

    for process in (1, 0):
        with pytest.raises(MemoryError):
            run_step(_ctx(out), _entry(out), provenance, out_of_memory, process=process)
    failures = {f.name: json.loads(f.read_text()) for f in (Path(out) / ".failures").glob("*.json")}
    assert sorted(f["process"] for f in failures.values()) == [0, 1]
    (host1,) = [name for name, f in failures.items() if f["process"] == 1]
    assert host1.endswith("-p1.json") and "host 1 ran out of memory" in failures[host1]["error"]["message"]
    assert not (Path(out) / ".artifact.json").exists()


def test_result_without_stable_json_form_fails_with_a_record(tmp_path):
    out = str(tmp_path / "x/y/v1")
    with pytest.raises(Exception, match=r"result\.s"):
        run_step(_ctx(out), _entry(out), Provenance(str(tmp_path), [], None, None), lambda ctx: {"s": {1, 2}})
    assert not (Path(out) / ".artifact.json").exists()
    (failure,) = (Path(out) / ".failures").glob("*.json")
    message = json.loads(failure.read_text())["error"]["message"]
    assert message == (
        "result.s: value of type set has no stable form for the record of the step's result; use numbers, strings, "
        "booleans, null, lists and mappings (convert arrays with .tolist(), numpy scalars with float() or int())"
    )


def test_a_result_that_is_not_a_dict_fails_with_a_record(tmp_path):
    out = str(tmp_path / "x/y/v1")
    with pytest.raises(StepError, match=r"^result: the step returned a list; a step returns a JSON-able dict"):
        run_step(_ctx(out), _entry(out), Provenance(str(tmp_path), [], None, None), lambda ctx: [1, 2])
    assert not (Path(out) / ".artifact.json").exists()
    assert len(list((Path(out) / ".failures").glob("*.json"))) == 1
    assert run_step(_ctx(out), _entry(out), Provenance(str(tmp_path), [], None, None), lambda ctx: None).result == {}


def test_an_error_whose_message_cannot_be_made_still_leaves_a_failure_record(tmp_path):
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("str failed")

    def step(ctx):
        raise Unprintable()

    out = str(tmp_path / "x/y/v1")
    with pytest.raises(Unprintable):
        run_step(_ctx(out), _entry(out), Provenance(str(tmp_path), [], None, None), step)
    (failure,) = (Path(out) / ".failures").glob("*.json")
    error = json.loads(failure.read_text())["error"]
    assert error["type"] == "Unprintable"
    assert error["message"] == "<the Unprintable's message could not be made: RuntimeError>"


def _run_step_in_a_process(out: str, step_body: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`run_step` of a step whose body is `step_body` (it may signal its own process), in
    a process of its own; (that process, the error of the one failure record written)."""
    template = textwrap.dedent(
        f"""
        import os, signal
        from marin_rules.artifacts.context import StepContext
        from marin_rules.artifacts.records import Provenance
        from marin_rules.job.run import run_step

        def step(ctx):
        BODY

        entry = {json.dumps(_entry(out))}
        ctx = StepContext(name="x/y", version="v1", config={{}}, deps={{}}, runtime={{}}, output={out!r})
        run_step(ctx, entry, Provenance(".", [], "r", 3), step)
        """
    )
    script = template.replace("BODY", textwrap.indent(textwrap.dedent(step_body).strip("\n"), "    "))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    (failure,) = (Path(out) / ".failures").glob("*.json")
    return proc, json.loads(failure.read_text())["error"]


def test_sigterm_during_a_step_leaves_a_failure_record_naming_the_signal(tmp_path):
    out = str(tmp_path / "x/y/v1")
    proc, error = _run_step_in_a_process(out, """
        open(os.path.join(ctx.output, "partial.bin"), "w").write("half")
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("not reached")
    """)  # fmt: skip
    assert proc.returncode != 0
    assert error["exit_status"] == "SIGTERM" and error["type"] == "JobTerminated"
    assert (Path(out) / "partial.bin").read_text() == "half"
    assert not (Path(out) / ".artifact.json").exists()


def test_a_signal_after_the_success_record_is_written_does_not_fail_the_finished_job(tmp_path):
    # Snakemake stopping at the moment a step finished: the build is whole, the job exits 0
    out = str(tmp_path / "x/y/v1")
    script = textwrap.dedent(
        f"""
        import os, signal
        from marin_rules.artifacts.context import StepContext
        from marin_rules.artifacts.records import Provenance
        from marin_rules.job.run import run_step

        ctx = StepContext(name="x/y", version="v1", config={{}}, deps={{}}, runtime={{}}, output={out!r})
        run_step(ctx, {json.dumps(_entry(out))}, Provenance(".", [], "r", 3), lambda ctx: {{"n": 1}})
        os.kill(os.getpid(), signal.SIGTERM)  # as the job's last lines run
        print("exited normally")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "exited normally\n"), proc.stderr
    assert json.loads((Path(out) / ".artifact.json").read_text())["result"] == {"n": 1}
    assert not (Path(out) / ".failures").exists()


def test_a_step_that_turns_the_stop_into_another_error_has_the_signal_as_its_exit_status(tmp_path):
    out = str(tmp_path / "x/y/v1")
    proc, error = _run_step_in_a_process(out, """
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except BaseException:
            raise RuntimeError("cleanup failed")
    """)  # fmt: skip
    assert proc.returncode != 0
    assert error["type"] == "RuntimeError" and error["exit_status"] == "SIGTERM"
    assert not (Path(out) / ".artifact.json").exists()


def test_a_step_whose_lease_is_no_longer_held_records_failure_not_success(tmp_path):
    from marin_rules.artifacts.lease import LeaseLost

    out = str(tmp_path / "x/y/v1")
    with pytest.raises(LeaseLost):
        run_step(_ctx(out), _entry(out), Provenance(str(tmp_path), [], None, None), lambda ctx: {"n": 1},
                 still_held=lambda: False)  # fmt: skip
    assert not (Path(out) / ".artifact.json").exists()
    (failure,) = (Path(out) / ".failures").glob("*.json")
    assert "lease lost before the success record" in json.loads(failure.read_text())["error"]["message"]


def test_a_failing_steps_line_escapes_control_characters_its_message_holds(tmp_path):
    # the line reaches the terminal (the log Snakemake shows); the record keeps the message as it was
    out = str(tmp_path / "x/y/v1")
    proc, error = _run_step_in_a_process(out, """
        raise RuntimeError("kaboom \\x1b[2J\\x1b[31mred")
    """)  # fmt: skip
    assert proc.returncode != 0 and error["message"] == "kaboom \x1b[2J\x1b[31mred"
    (line,) = [x for x in proc.stderr.splitlines() if "step failed" in x]
    assert line.endswith("RuntimeError: kaboom \\x1b[2J\\x1b[31mred") and "\x1b" not in line


SIGNALS_ON_IMPORT = """
    import pathlib, sys
    folder = pathlib.Path(ctx.output).parent
    (folder / "stopper_mod.py").write_text("import os, signal\\nos.kill(os.getpid(), signal.SIGTERM)\\n")
    sys.path.insert(0, str(folder))
    import marin_rules.job.run as run
"""


def test_a_lost_lease_arriving_inside_an_import_is_recorded_as_the_lost_lease(tmp_path):
    """Set aside until the import is done (`_raise_stop`), it stays the lease's stop, not SIGTERM."""
    out = str(tmp_path / "x/y/v1")
    proc, error = _run_step_in_a_process(out, textwrap.dedent(SIGNALS_ON_IMPORT) + textwrap.dedent("""
        run._state["lost"] = "lease of x/y taken over by bob"
        import stopper_mod
        import threading
        threading.Event().wait(30)
        raise AssertionError("not stopped")
    """))  # fmt: skip
    assert proc.returncode != 0
    assert (error["type"], error["exit_status"], error["message"]) == (
        "JobTerminated", "lease lost", "lease of x/y taken over by bob")


def test_a_stop_set_aside_is_not_raised_into_the_recording_of_another_failure(tmp_path):
    """A stop pending (it came inside an import) when the step fails another way within
    the 50 ms: the failure is recorded whole (the retry used to land in write_failure:
    no record at all), with the signal as its exit status."""
    out = str(tmp_path / "x/y/v1")
    proc, error = _run_step_in_a_process(out, textwrap.dedent(SIGNALS_ON_IMPORT) + textwrap.dedent("""
        import time
        recorded = run.write_failure
        def slow_storage(*args, **kwargs):
            time.sleep(0.3)  # longer than the retry's 50 ms
            return recorded(*args, **kwargs)
        run.write_failure = slow_storage
        import stopper_mod
        raise ValueError("boom")
    """))  # fmt: skip
    assert proc.returncode != 0 and "JobTerminated" not in proc.stderr
    assert (error["type"], error["exit_status"], error["message"]) == ("ValueError", "SIGTERM", "boom")


def test_a_bug_in_a_step_prints_where_it_happened_before_the_one_line_a_marin_error_does_not(tmp_path):
    """The job's log (shown by --show-failed-logs) gets the traceback of an unexpected
    error, escaped, then the one line; an error meant for the user is the line alone."""
    out = str(tmp_path / "x/y/v1")
    proc, error = _run_step_in_a_process(out, """
        def count_words():
            raise RuntimeError("boom \\x1b[31m")
        count_words()
    """)  # fmt: skip
    ours = proc.stderr[: proc.stderr.index("step failed")]  # (the script re-raises: Python prints it again after)
    assert "Traceback (most recent call last):" in ours and ", in count_words" in ours
    assert "RuntimeError: boom \\x1b[31m" in ours and "\x1b" not in ours  # escaped
    assert error["type"] == "RuntimeError"

    out = str(tmp_path / "x/z/v1")
    proc, error = _run_step_in_a_process(out, """
        from marin_rules.artifacts.errors import StepError
        raise StepError("config.source: no such file; give a path")
    """)  # fmt: skip
    assert "Traceback" not in proc.stderr[: proc.stderr.index("step failed")]
