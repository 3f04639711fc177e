"""Stopping: SIGINT, SIGTERM or SIGHUP sent to the `snakemake` process reaches the running steps.

Model: each step runs as its own job process (`python -m marin_rules.job`), which
writes its pid into this invocation's registry folder
`.snakemake/marin-jobs/<snakemake pid>/` while it runs. Snakemake alone would finish
running jobs on SIGTERM (its scheduler's graceful exit) and only shut its thread pool
down on SIGINT, so a step started by a `timeout` or a CI cancel runs to its end. The
Snakefile's `onstart:` handler (public API: it runs in the main process after the
scheduler has installed its own handler) calls `forward_signals`, which chains a
handler in front of the current ones: it sends the signal to every registered job
process, then calls the previous handler, so Snakemake stops as it would anyway (the second
delivery of the same signal reaches the jobs alone). Each
job process stops its step, writes a failure record naming the signal and exits
non-zero; no success record is written.

A job process that starts after the signal (Snakemake had already launched it; under
the tpu executor a job's own `snakemake --mode remote` takes seconds to start) finds
the file `stop` the main process wrote into the registry before forwarding, and stops
before it begins (`stop_requested`).

Entries of processes that no longer exist (a job killed with SIGKILL, a run whose
machine went down) are pruned whenever a job registers, with the `stop` file of a main
process that no longer exists, and a registry folder is removed once empty, so
`.snakemake/marin-jobs/` does not grow.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Callable

from marin_rules.artifacts.lease import process_exists

REGISTRY_ROOT = ".snakemake/marin-jobs"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_FILE = "stop"  # in a registry: the signal its main process received, for jobs registering later


def registry_dir(main_pid: int | None = None) -> str:
    """This invocation's registry (absolute: job processes may change directory)."""
    return os.path.abspath(os.path.join(REGISTRY_ROOT, str(main_pid or os.getpid())))


def _remove_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:  # not empty (or gone, or not ours): leave it
        pass


def prune(root: str) -> None:
    """Under the registries' root: remove entries of processes that no longer exist, and
    registries left empty (runs killed before they could clean up). Only folders named
    by a pid are registries; nothing else there is touched."""
    try:
        registries = [n for n in os.listdir(root) if n.isdigit() and os.path.isdir(os.path.join(root, n))]
    except FileNotFoundError:
        return
    for name in registries:
        registry = os.path.join(root, name)
        if not process_exists(int(name)):
            clear_stop(registry)
        for pid in registered(registry):
            if not process_exists(pid):
                try:
                    os.remove(os.path.join(registry, str(pid)))
                except FileNotFoundError:
                    pass
        _remove_if_empty(registry)


def register(registry: str, pid: int) -> Callable[[], None]:
    """Record a running job process (after pruning dead entries and empty registries
    beside it); returns the function that removes the entry, and the registry once empty."""
    prune(os.path.dirname(os.path.abspath(registry)))
    entry = os.path.join(registry, str(pid))
    for _ in range(10):  # another job's prune may remove the empty folder between the two calls
        os.makedirs(registry, exist_ok=True)
        try:
            with open(entry, "w", encoding="utf-8") as f:
                f.write(str(pid))
            break
        except FileNotFoundError:
            continue

    def unregister() -> None:
        try:
            os.remove(entry)
        except FileNotFoundError:
            pass
        _remove_if_empty(registry)

    return unregister


def clear_stop(registry: str) -> None:
    """Remove the `stop` file (a new main process whose pid an old one had, or a dead one)."""
    try:
        os.remove(os.path.join(registry, STOP_FILE))
    except FileNotFoundError:
        pass


def close(registry: str) -> None:
    """At the main process's exit: its `stop` file, and its registry once empty, go."""
    clear_stop(registry)
    _remove_if_empty(registry)


def stop_requested(registry: str) -> str | None:
    """The name of the signal the main process received before this job registered, or None."""
    try:
        with open(os.path.join(registry, STOP_FILE), encoding="utf-8") as f:
            return f.read().strip() or "SIGTERM"
    except FileNotFoundError:
        return None


def registered(registry: str) -> list[int]:
    try:
        names = os.listdir(registry)
    except FileNotFoundError:
        return []
    return [int(n) for n in names if n.isdigit()]


def forward(registry: str, signum: int) -> list[int]:
    """Note the stop for jobs that register later, then send `signum` to every
    registered job process; returns the pids reached."""
    try:
        os.makedirs(registry, exist_ok=True)
        with open(os.path.join(registry, STOP_FILE), "w", encoding="utf-8") as f:
            f.write(signal.Signals(signum).name)
    except OSError:  # a read-only or vanished workdir: the running jobs still get the signal
        pass
    reached = []
    for pid in registered(registry):
        try:
            os.kill(pid, signum)
            reached.append(pid)
        except ProcessLookupError:  # finished meanwhile
            try:
                os.remove(os.path.join(registry, str(pid)))
            except FileNotFoundError:
                pass
        except PermissionError:
            pass
    return reached


def forward_signals(registry: str) -> None:
    """In the main process (from `onstart:`): forward SIGINT/SIGTERM to the job
    processes, then run the handler that was there before. SIGHUP (the terminal or ssh
    session closed) is forwarded too and then stops Snakemake as SIGTERM does (its
    default would kill it outright, leaving its lock), unless it is ignored (`nohup`).
    The second delivery of a signal is forwarded only (`chain_handler`)."""
    received: dict[int, int] = {}  # this run's count of each signal received
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        chain_handler(registry, signal.SIGHUP, signal.getsignal(signal.SIGTERM), as_signal=signal.SIGTERM,
                      received=received)  # fmt: skip
    for signum in STOP_SIGNALS:
        chain_handler(registry, signum, signal.getsignal(signum), received=received)


def chain_handler(
    registry: str, signum: int, previous: Any, as_signal: int | None = None, received: dict[int, int] | None = None
) -> None:
    """Handle `signum`: forward it to the job processes, then call `previous` (with
    `as_signal` in place of `signum` when given), or die of the signal when `previous`
    is the default action. With `received` (counts shared by a run's handlers), the
    second delivery of the same signal is forwarded to the jobs only: `timeout -s INT`
    delivers SIGINT twice, and Snakemake's handler called again while it shuts down ends
    in chained tracebacks of its event loop. Another signal, or a third Ctrl-C, goes on
    to `previous` as the first did."""

    def handler(sig, frame):
        forward(registry, sig)
        if received is not None:
            received[sig] = received.get(sig, 0) + 1
            if received[sig] == 2:
                return
        passed = sig if as_signal is None else as_signal
        if callable(previous):
            previous(passed, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(passed, signal.SIG_DFL)
            os.kill(os.getpid(), passed)

    signal.signal(signum, handler)
