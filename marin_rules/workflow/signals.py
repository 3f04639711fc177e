"""Stopping: SIGINT or SIGTERM sent to the `snakemake` process reaches the running steps.

Model: each step runs as its own job process (`python -m marin_rules.job`), which
writes its pid into this invocation's registry folder
`.snakemake/marin-jobs/<snakemake pid>/` while it runs. Snakemake alone would finish
running jobs on SIGTERM (its scheduler's graceful exit) and only shut its thread pool
down on SIGINT, so a step started by a `timeout` or a CI cancel runs to its end. The
Snakefile's `onstart:` handler (public API: it runs in the main process after the
scheduler has installed its own handler) calls `forward_signals`, which chains a
handler in front of the current ones: it sends the signal to every registered job
process, then calls the previous handler, so Snakemake stops as it would anyway. Each
job process stops its step, writes a failure record naming the signal and exits
non-zero; no success record is written.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

REGISTRY_ROOT = ".snakemake/marin-jobs"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def registry_dir(main_pid: int | None = None) -> str:
    """This invocation's registry (absolute: job processes may change directory)."""
    return os.path.abspath(os.path.join(REGISTRY_ROOT, str(main_pid or os.getpid())))


def register(registry: str, pid: int) -> Callable[[], None]:
    """Record a running job process; returns the function that removes the entry."""
    os.makedirs(registry, exist_ok=True)
    entry = os.path.join(registry, str(pid))
    with open(entry, "w", encoding="utf-8") as f:
        f.write(str(pid))

    def unregister() -> None:
        try:
            os.remove(entry)
        except FileNotFoundError:
            pass

    return unregister


def registered(registry: str) -> list[int]:
    try:
        names = os.listdir(registry)
    except FileNotFoundError:
        return []
    return [int(n) for n in names if n.isdigit()]


def forward(registry: str, signum: int) -> list[int]:
    """Send `signum` to every registered job process; returns the pids reached."""
    reached = []
    for pid in registered(registry):
        try:
            os.kill(pid, signum)
            reached.append(pid)
        except ProcessLookupError:  # finished meanwhile
            os.remove(os.path.join(registry, str(pid)))
        except PermissionError:
            pass
    return reached


def forward_signals(registry: str) -> None:
    """In the main process (from `onstart:`): forward SIGINT/SIGTERM to the job
    processes, then run the handler that was there before."""
    for signum in STOP_SIGNALS:
        previous = signal.getsignal(signum)

        def handler(sig, frame, previous=previous):
            forward(registry, sig)
            if callable(previous):
                previous(sig, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)

        signal.signal(signum, handler)
