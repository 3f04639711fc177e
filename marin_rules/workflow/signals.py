"""Stopping: SIGINT, SIGTERM or SIGHUP sent to the `snakemake` process reaches the running steps.

Model: each step runs as its own job process (`python -m marin_rules.job`), which
registers itself in this invocation's registry folder
`.snakemake/marin-jobs/<snakemake pid>@<host key>/` while it runs, as the entry
`<job pid>@<host key>` (`host_key`: the host name and pid namespace, since a pid means
a process only there). Snakemake alone would finish running jobs on SIGTERM (its
scheduler's graceful exit) and only shut its thread pool down on SIGINT, so a step
started by a `timeout` or a CI cancel runs to its end. The Snakefile's `onstart:`
handler (public API: it runs in the main process after the scheduler has installed its
own handler) calls `forward_signals`, which chains a handler in front of the current
ones: it writes the file `stop` (the signal's name) into the registry, sends the signal
to every registered job process of its own host, then calls the previous handler, so
Snakemake stops as it would anyway (the second delivery of the same signal reaches the
jobs alone). Each job process stops its step, writes a failure record naming the signal
and exits non-zero; no success record is written.

A job process that starts after the signal (Snakemake had already launched it; under
the tpu executor a job's own `snakemake --mode remote` takes seconds to start) finds
the `stop` file and stops before it begins (`stop_requested`). A job a cluster executor
runs on another host (a shared working directory, as Slurm's) cannot be signalled from
here: it watches the `stop` file instead (`watch_stop`, once a second) and stops itself
with that signal.

Entries of processes that no longer exist (a job killed with SIGKILL, a run whose
machine went down) are pruned whenever a job registers, with the `stop` file of a main
process that no longer exists, and a registry folder is removed once empty, so
`.snakemake/marin-jobs/` does not grow. Only this host's processes can be checked: a
registry or entry of another host is left to its own host (a job unregisters itself).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
from typing import Any, Callable

from marin_rules.artifacts.lease import pid_namespace, process_exists

REGISTRY_ROOT = ".snakemake/marin-jobs"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_FILE = "stop"  # in a registry: the signal its main process received, for jobs registering later
WATCH_S = 1.0  # how often a job on another host than its main process looks for the `stop` file


def host_key() -> str:
    """This host and pid namespace, as registry and entry names carry them: a pid names
    a process only there (`<host name>.<pid namespace number>`, or the host name alone)."""
    namespace = "".join(re.findall(r"\d", pid_namespace()))
    return socket.gethostname() + (f".{namespace}" if namespace else "")


def registry_dir(main_pid: int | None = None) -> str:
    """This invocation's registry (absolute: job processes may change directory)."""
    return os.path.abspath(os.path.join(REGISTRY_ROOT, f"{main_pid or os.getpid()}@{host_key()}"))


def _pid_here(name: str) -> int | None:
    """The pid an entry or registry name gives for a process of this host: `<pid>@<this
    host key>`, or a bare `<pid>` (written before names carried a host); else None."""
    pid, at, host = name.partition("@")
    if not pid.isdigit() or (at and host != host_key()):
        return None
    return int(pid)


def _remove_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:  # not empty (or gone, or not ours): leave it
        pass


def prune(root: str) -> None:
    """Under the registries' root: remove entries of this host's processes that no longer
    exist, and registries left empty (runs killed before they could clean up); a
    registry of a main process of this host that no longer exists loses its `stop` file
    and its other hosts' entries (nobody forwards to them now; a job of this host still
    running keeps its entry until it ends). Only folders named by a pid (of this host)
    are registries to prune; nothing else there is touched."""
    try:
        registries = [n for n in os.listdir(root) if _pid_here(n) is not None and os.path.isdir(os.path.join(root, n))]
    except FileNotFoundError:
        return
    for name in registries:
        registry = os.path.join(root, name)
        ended = not process_exists(_pid_here(name) or 0)
        if ended:
            clear_stop(registry)
        for entry in _entries(registry):
            pid = _pid_here(entry)
            if (pid is None and ended) or (pid is not None and not process_exists(pid)):
                try:
                    os.remove(os.path.join(registry, entry))
                except FileNotFoundError:
                    pass
        _remove_if_empty(registry)


def register(registry: str, pid: int) -> Callable[[], None]:
    """Record a running job process (after pruning dead entries and empty registries
    beside it); returns the function that removes the entry, and the registry once empty."""
    prune(os.path.dirname(os.path.abspath(registry)))
    entry = os.path.join(registry, f"{pid}@{host_key()}")
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


def _entries(registry: str) -> list[str]:
    """The names of a registry's job entries (`<pid>@<host key>`, or an older bare `<pid>`)."""
    try:
        names = os.listdir(registry)
    except FileNotFoundError:
        return []
    return [n for n in names if n.partition("@")[0].isdigit()]


def registered(registry: str) -> list[int]:
    """The pids of the registry's job processes on this host (those a signal can reach)."""
    return [pid for n in _entries(registry) if (pid := _pid_here(n)) is not None]


def watch_stop(registry: str) -> threading.Event | None:
    """In a job process on another host than its main process (the registry's name says
    where that runs): a daemon thread that looks for the `stop` file every `WATCH_S`
    seconds and, once there, sends this process the signal it names, as the main process
    would have (`forward`). Returns the event that ends the watch; None on the main
    process's own host, where `forward` signals the job directly."""
    if _pid_here(os.path.basename(os.path.normpath(registry))) is not None:
        return None
    done = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_S):
            stopped = stop_requested(registry)
            if stopped is not None:
                os.kill(os.getpid(), int(getattr(signal.Signals, stopped, signal.SIGTERM)))
                return

    threading.Thread(target=watch, name="marin-stop-watch", daemon=True).start()
    return done


def forward(registry: str, signum: int) -> list[int]:
    """Note the stop for jobs that register later (and for jobs on other hosts, which
    watch for it), then send `signum` to every registered job process of this host;
    returns the pids reached."""
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
            for name in (f"{pid}@{host_key()}", str(pid)):
                try:
                    os.remove(os.path.join(registry, name))
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
