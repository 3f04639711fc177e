"""A pod's other processes start the step only once process 0 has begun the attempt.

Model: on a pod (`marin_rules.cluster.pod`) every process runs the job command, but
only process 0 takes the artifact's lease and readies its folder: a forced build's old
build moves to `.history/` (`forcing.move_old_build`), an earlier attempt's leftovers
of another recipe too (`attempt.begin`). The other processes must not list or read the
folder before that is done. Before the step joins `jax.distributed` (the step joins it
itself, from `runtime.distributed`) the processes share nothing but the storage, so
process 0 says so there: once the folder is ready it writes `{location}/.lease.json.begun`
(`announce_begun`) naming the token of the lease it holds and the pod's coordinator.
Every other process waits (`wait_for_process_0`, polling every `poll_s`) until that file
names the lease held now by a live holder (renewed within `stale_s`, not a dead process
on this host) and this pod's coordinator. The token is new for every lease taken, so a
file an earlier attempt left names a lease nobody holds any more and is ignored; the
coordinator (a fresh port on a local pod) tells two launches apart besides. The name
makes it lease bookkeeping: never data (`files.list_data_files`), never moved with an
old build (`forcing`); the next pod attempt overwrites it.

While it waits, a process also ends when the artifact is done (process 0 served what
another run finished: nothing to do, exit 0), and gives up (exit 1, naming process 0's
log) when for `START_GRACE_S` nobody live held the lease: process 0 ended or died
before it began (its log says why), or never started. While any live holder has it
(process 0 building, or another run process 0 waits for) it waits on, as process 0 does.

A process stopped by a signal after process 0 died outright says so in its failure
record (`process_0_died`): that is why the pod stopped, not a user's Ctrl-C. Every
process's records name the attempt (`attempt_id` of the begun lease's token).
"""

from __future__ import annotations

import time
from typing import Callable

import xxhash

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.lease import LEASE_FILE, held_live, holder_gone, read_lease

BEGUN_FILE = LEASE_FILE + ".begun"
# how long the other processes wait without a live lease: process 0's start may lag theirs
# by a Snakemake start-up and a slice's ssh; after it, process 0 is taken to have ended
START_GRACE_S = 120.0


class Process0Ended(MarinError):
    """Process 0 of the pod ended (or never started) without beginning the attempt."""


def begun_file(location: str) -> str:
    return storage.join(location, BEGUN_FILE)


def _begun(location: str) -> dict:
    """What the begun file says ({} when it is not there yet, or half-written elsewhere)."""
    try:
        data = storage.read_json(begun_file(location))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def attempt_of(location: str, token: str) -> str | None:
    """The `attempt_id` of the attempt the lease `token` began at `location` when it was a
    pod's (the begun file names it), else None."""
    data = _begun(location)
    return attempt_id(token) if data.get("token") == token else None


def attempt_id(token: str) -> str:
    """The pod attempt every process's record names (`provenance.pod_attempt`), so
    `marin history` shows their failure records as one attempt: a digest of the lease
    token process 0 took (new for every lease), which the token cannot be read back from."""
    return xxhash.xxh3_64_hexdigest(token.encode("utf-8"))


def announce_begun(location: str, token: str, coordinator: str) -> None:
    """Process 0, holding the lease with `token`: the artifact folder is ready for the step."""
    storage.write_json_atomic(begun_file(location), {"token": token, "coordinator": coordinator})


def begun_token(location: str, coordinator: str) -> str | None:
    """The lease token the begun file names for this pod (`coordinator`), or None."""
    data = _begun(location)
    if data.get("coordinator") != coordinator:
        return None
    token = data.get("token")
    return token if isinstance(token, str) else None


def wait_for_process_0(
    key: str, location: str, coordinator: str, is_done: Callable[[], bool], poll_s: float, stale_s: float,
    grace_s: float = START_GRACE_S, process_0_log: str = "",
) -> str:  # fmt: skip
    """Block until process 0 of the pod at `coordinator` has begun the attempt on the
    artifact `key` at `location` ("begun") or the artifact is done ("done"); raises
    Process0Ended when for `grace_s` no live holder had the lease."""
    fs = storage.filesystem(location)[0]
    give_up: float | None = None
    while True:
        fs.invalidate_cache()  # another process writes these (gcsfs caches listings)
        holder = read_lease(location)
        live = held_live(holder, stale_s)
        if live and begun_token(location, coordinator) == holder.token:
            return "begun"
        if is_done():
            return "done"
        if live:
            give_up = None
        elif give_up is None:
            give_up = time.monotonic() + grace_s
        elif time.monotonic() >= give_up:
            where = f" (its log: {process_0_log})" if process_0_log else ""
            raise Process0Ended(
                f"{key}: process 0 of the pod did not begin the build within {grace_s:.0f} s: it ended, was "
                f"killed or never started{where}; this process does not run the step without it"
            )
        time.sleep(poll_s)


def process_0_died(location: str, coordinator: str) -> str | None:
    """Why a process of the pod at `coordinator` was stopped, when its process 0 died
    outright: the lease named by its begun file is still there but its process is gone
    (`holder_gone`: it ran on this host, as on a local pod; elsewhere no process can tell
    at once). Every other end of process 0 releases the lease and writes its own
    record. None when it cannot tell."""
    holder = read_lease(location)
    if holder is None or not holder_gone(holder) or begun_token(location, coordinator) != holder.token:
        return None
    return (f"process 0 of the pod ({holder.describe()}) died before it, without a record (SIGKILL, the OOM "
            "killer?), and the pod was stopped")


def process_0_log(log: str | None) -> str:
    """Process 0's job log, from this process's (`<log>.p<k>`, `main.main`)."""
    if not log:
        return ""
    head, dot, tail = log.rpartition(".p")
    return head if dot and tail.isdigit() else log

