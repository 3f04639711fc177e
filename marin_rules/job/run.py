"""Calling one step: its success record last, or a failure record naming why it stopped.

Model: the step runs in the job process's main thread, which owns the signals. The
first SIGTERM or SIGINT raises `JobTerminated` inside the step (wherever it is in
Python code, but for an import, or a place where Python drops what is raised, a gc
callback or a `__del__`: there it is raised again 50 ms later, `_raise_stop`), named as
the signal Snakemake received when that is known (a SIGTERM
from an executor cancelling after a Ctrl-C is the Ctrl-C's); later ones are ignored
(the step's cleanup, committing a checkpoint say, and the failure record run to their
end). Once the record is written, a signal no longer fails the job (the build is
finished: it exits 0 once its bookkeeping is done, `stopped_after_record`). A step
that catches the stop and returns all the same fails as stopped (`_caught_stop`), and
one that raises another error instead has the stop as its failure's exit status. A
lease that is lost while the step runs (`stop_for_lost_lease`, called by the lease's
heartbeat thread) is delivered the same way, through `_thread.interrupt_main`. Any
failure writes `{location}/.failures/<time>.json` (a shard's too: the artifact's
history holds it) and re-raises; a `MarinError` that suggests a command (an upstream's
unreadable file: rebuild it) first gets it completed (`hint_flags`), so it runs as
printed. On success the fence (`still_held`, the lease re-read right before) must
pass, then `write_success` lists the data files and writes `.artifact.json` last. On
a pod every process runs the step; only process 0 writes the success record, every
failing process its own failure.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import traceback
from typing import Any, Callable

from marin_rules.artifacts.canonical import canonical_value
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import MAX_JSON_DEPTH, MarinError, StepError, deeper_than
from marin_rules.artifacts.lease import LeaseLost
from marin_rules.artifacts.records import Provenance, Record, error_message, utc_now, write_failure, write_success

# SIGHUP: the terminal or ssh session the run was started from closed. Left alone when
# it is ignored (`nohup`: the user asked the run to outlive its terminal).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# stopping: the stop's name ("SIGTERM", "lease lost"); recorded: the step's record is written
# pending: a stop not yet raised (`_raise_stop`), timer: what raises it (`_retry_later`)
_state: dict[str, Any] = {
    "stopping": None, "lost": None, "cause": None, "recorded": False, "late_signal": None, "pending": None,
    "timer": None, "retry_due": False, "previous_unraisablehook": None,
}  # fmt: skip


class JobTerminated(BaseException):
    """Raised inside a step by SIGTERM/SIGINT/SIGHUP (`signum`), or when its lease was lost
    (`signum` None, `reason` says how). A BaseException: `except Exception` in a step
    does not swallow it."""

    def __init__(self, signum: int | None = None, reason: str | None = None):
        self.signum = signum
        self.reason = reason
        super().__init__(reason or f"terminated by signal {signal.Signals(signum or signal.SIGTERM).name}")

    @property
    def exit_status(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "lease lost"


def _on_signal(signum: int, frame: Any) -> None:
    if _state["retry_due"]:  # `_retry_later`'s own SIGTERM, not a signal sent to the job
        _state["retry_due"] = False
        stop = _state["pending"]
        if stop is not None and not _state["recorded"]:
            _raise_stop(JobTerminated(stop.signum, stop.reason), frame)
        return
    if _state["recorded"]:
        # the step finished and its record is written: a signal that comes while the job
        # exits (Snakemake stopping at the same moment) does not turn a finished build into a
        # failed job; the job finishes its bookkeeping, then exits 0 at once (`stopped_after_record`)
        _state["late_signal"] = signal.Signals(signum).name
        return
    if _state["stopping"] is not None:
        # already stopping: the step's own cleanup (a checkpoint being committed) and the
        # failure record run to their end; a pod's processes get SIGTERM more than once
        return
    if _state["lost"] is not None:
        _state["stopping"] = "lease lost"
        _raise_stop(JobTerminated(None, _state["lost"]), frame)
        return
    if signum == signal.SIGTERM:
        signum = _snakemakes_signal() or signum
    _state["stopping"] = signal.Signals(signum).name
    _raise_stop(JobTerminated(signum), frame)


RETRY_S = 0.05  # how soon a stop that could not be raised where the signal found the step is raised again


def _raise_stop(stop: JobTerminated, frame: Any) -> None:
    """Raise `stop` where the signal found the main thread, unless that is inside an
    import (an exception there can leave a C extension half-initialised and crash the
    interpreter: a SIGSEGV, no failure record): then it stays pending and is raised
    RETRY_S later (`_retry_later`), once the import is done."""
    if _importing(frame):
        _retry_later(stop)
        return
    _state["pending"] = None  # (its timer, if any, finds nothing pending: not cancelled from a handler)
    raise stop


def _importing(frame: Any) -> bool:
    """Is `frame`, or a frame that called it, the import machinery's?"""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _retry_later(stop: JobTerminated) -> None:
    """Keep `stop` pending and signal the main thread again RETRY_S later: a timer
    thread sends it SIGTERM (`signal.pthread_kill`: a real signal interrupts a blocking
    wait, as the first did), which `_on_signal` knows for the retry; no signal of its own
    is taken from the step or its libraries (SIGALRM stays theirs)."""
    _cancel_pending()
    _state["pending"] = stop
    main = threading.main_thread().ident

    def due() -> None:
        if _state["pending"] is stop and main is not None:
            _state["retry_due"] = True
            signal.pthread_kill(main, signal.SIGTERM)

    timer = threading.Timer(RETRY_S, due)
    timer.daemon = True
    _state["timer"] = timer
    timer.start()


def _cancel_pending() -> None:
    """No stop pending any more (raised, or the step's failure is being recorded)."""
    timer, _state["pending"], _state["timer"] = _state["timer"], None, None  # nothing pending first
    if timer is not None:
        timer.cancel()


def _on_unraisable(unraisable: Any) -> None:
    """`sys.unraisablehook`: a stop raised where Python cannot raise (the signal found the
    main thread in a garbage-collector callback, a `__del__`, a weakref callback: JAX
    registers a gc callback) was dropped there; it is raised again RETRY_S later.
    Everything else goes to the hook that was there before."""
    if isinstance(unraisable.exc_value, JobTerminated) and not _state["recorded"]:
        _retry_later(unraisable.exc_value)
        return
    _state["previous_unraisablehook"](unraisable)


def _snakemakes_signal() -> int | None:
    """The signal Snakemake received, when it received one (`note_stop_cause`): a job its
    executor stops with SIGTERM after a Ctrl-C (a cancelled pod, a killed process group),
    possibly before the forwarded SIGINT arrives, was stopped by that Ctrl-C."""
    try:
        name = _state["cause"]() if _state["cause"] is not None else None
    except Exception:  # noqa: BLE001 - an unreadable registry or stop file: the signal this process got is all it knows
        return None
    found = getattr(signal.Signals, name, None) if isinstance(name, str) and name.startswith("SIG") else None
    return int(found) if found in STOP_SIGNALS else None


def stopped_after_record() -> str | None:
    """The signal that came after this process wrote its step's record (ignored then: the
    build is finished), or None: the job then exits 0 without the interpreter's teardown,
    as a stopped job does (`__main__`)."""
    return _state["late_signal"]


def note_stop_cause(read: Callable[[], str | None]) -> None:
    """`read()` names the signal the `snakemake` running this job received ("SIGINT"), or
    None: a SIGTERM then stops the step as that signal (the failure record names what the
    user sent, not the executor's SIGTERM that followed it)."""
    _state["cause"] = read


def install_stop_handlers() -> None:
    """From the main thread: SIGTERM, SIGINT and SIGHUP (unless ignored, as under
    `nohup`) stop the step (idempotent)."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            current = signal.getsignal(signum)
            if current is not _on_signal and not (signum == signal.SIGHUP and current == signal.SIG_IGN):
                signal.signal(signum, _on_signal)
        if _state["previous_unraisablehook"] is None:  # once: a hook installed since may chain to this one
            _state["previous_unraisablehook"] = sys.unraisablehook
            sys.unraisablehook = _on_unraisable


def stop_for_lost_lease(reason: str) -> None:
    """Called from the heartbeat thread: stop the step in the main thread."""
    print(f"{reason}; stopping the step", file=sys.stderr, flush=True)
    _state["lost"] = reason
    _thread.interrupt_main(signal.SIGTERM)


def _raise_pending() -> None:
    """Raise the stop still pending (`_raise_stop`) here, now."""
    stop = _state["pending"]
    if stop is not None:
        _cancel_pending()
        raise JobTerminated(stop.signum, stop.reason)


def exit_status(error: BaseException) -> int | str | None:
    """The exit status a failure record gives for `error`: the stop's signal (or "lease
    lost"), SystemExit's code, the stop a step turned into another error, else None."""
    if isinstance(error, JobTerminated):
        return error.exit_status
    if isinstance(error, KeyboardInterrupt):
        return "SIGINT"
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else 1
    return _state["stopping"]  # the step caught the stop and raised another error; None when not stopping


def _caught_stop(what: str) -> JobTerminated:
    """The stop that was caught (`except BaseException:`, a bare `except:`) by `what`
    ("the step caught the stop and returned"): work that may be cut short, so it fails as
    stopped."""
    stopping = _state["stopping"]
    signum = None if stopping == "lease lost" else int(getattr(signal.Signals, stopping, signal.SIGTERM))
    why = _state["lost"] if signum is None else f"terminated by signal {stopping}"
    return JobTerminated(
        signum,
        f"{why}; {what} (an `except BaseException:` or a bare `except:`, in the step or a library it calls): no "
        "success is recorded for a stopped step (let marin_rules.job.run.JobTerminated through)",
    )


def _completed(error: BaseException, hint_flags: str) -> BaseException:
    """`error` with its suggested command completed by `hint_flags` (`with_flags`; a new
    error with the same traceback), or `error` itself when it suggests none."""
    if not hint_flags or not isinstance(error, MarinError):
        return error
    shown = error.with_flags(hint_flags)
    return error if shown is error else shown.with_traceback(error.__traceback__)


def _explained(error: BaseException, why_stopped: Callable[[], str | None] | None) -> BaseException:
    """A `JobTerminated` by a signal with `why_stopped()` added to its message (a new
    error with the same traceback), or `error` itself."""
    if why_stopped is None or not isinstance(error, JobTerminated) or not error.signum:
        return error
    try:
        why = why_stopped()
    except Exception:  # noqa: BLE001 - a failure record without the note rather than none
        why = None
    return error if not why else JobTerminated(error.signum, f"{error}: {why}").with_traceback(error.__traceback__)


def run_step(
    ctx: StepContext,
    entry: dict,
    provenance: Provenance,
    function: Callable[[StepContext], Any],
    process: int | None = None,
    still_held: Callable[[], bool] | None = None,
    write: Callable[[Any, dict], Any] | None = None,
    hint_flags: str = "",
    why_stopped: Callable[[], str | None] | None = None,
) -> Record | None:
    """Call a step; success record last (process 0 or no pod), or failure record and
    re-raise. `still_held` is the lease's fencing check. `write(result, provenance)`
    replaces the success record (a shard job writes its shard record instead).
    `why_stopped()`: what is known of why a signal stopped the step (a pod process
    stopped because process 0 died), added to its failure record and line.
    `hint_flags`: what a command suggested by the step's error needs besides its target
    (`workflow.options.rerun_flags`; `MarinError.with_flags`), so that the failure
    record and the line on stderr name one that runs as printed."""
    from marin_rules.artifacts import storage

    install_stop_handlers()
    _state["recorded"] = False
    started = utc_now()
    storage.makedirs(ctx.output)
    try:
        _raise_pending()
        if _state["stopping"] is not None:
            raise _caught_stop("it was caught before the step began")
        result = function(ctx)
        _raise_pending()  # the step returned before its stop could be raised: stopped all the same
        if _state["stopping"] is not None:
            raise _caught_stop("the step caught the stop and returned")
        if result is not None and not isinstance(result, dict):
            raise StepError(
                f"result: the step returned a {type(result).__name__}; a step returns a JSON-able dict "
                "(or None), which becomes its record's result"
            )
        result = canonical_value({} if result is None else result, "result", "the record of the step's result")
        if deeper_than(result, MAX_JSON_DEPTH - 10):  # the record around it must read back (`decode_json`)
            raise StepError(f"result: nested more than {MAX_JSON_DEPTH - 10} levels deep; a record holds a "
                            "flatter result")  # fmt: skip
        if not process and still_held is not None and not still_held():
            raise LeaseLost(f"{ctx.output}: lease lost before the success record was written; not recording success")
    except BaseException as caught:  # noqa: BLE001 - every failure leaves a record
        _cancel_pending()  # a stop set aside is not raised into the recording of this failure
        error = _explained(_completed(caught, hint_flags), why_stopped)
        ended = utc_now()
        where = write_failure(ctx.output, entry, error, provenance.as_dict(started, ended), exit_status(error), process)
        if not isinstance(error, (MarinError, JobTerminated, KeyboardInterrupt, SystemExit)):
            # a bug, in a user's step or ours: where it happened, in the job's log (which
            # --show-failed-logs prints) as in the failure record; escaped: it reaches the terminal
            trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            print("\n".join(printable(line) for line in trace.rstrip("\n").split("\n")), file=sys.stderr)
        # the error last: a command it ends with can be copied to the end of the line
        print(f"{ctx.key}: step failed, failure record {where}: {type(error).__name__}: "
              f"{printable(error_message(error))}", file=sys.stderr)  # fmt: skip (escaped: it reaches the terminal)
        try:
            error.reported = True  # type: ignore[attr-defined]  # the job process prints nothing more
        except AttributeError:  # an exception type without attributes: reported again, no harm
            pass
        if error is caught:
            raise
        raise error from caught.__cause__
    if process:  # process 0 records the pod's success; until it has, a signal stops this one as before
        return None
    if write is not None:
        record = write(result, provenance.as_dict(started, utc_now()))
    else:
        record = write_success(ctx.output, entry, result, provenance.as_dict(started, utc_now()))
    _state["recorded"] = True
    return record
