"""Leases: at most one build of an artifact at a time, across folders and machines.

Model: `{location}/.lease.json` names its holder (user, host, pid, since, renewed, a
random token, and who submitted its job when another process did: `submitted_by`, as
the executor named it, opaque here; `held_for`). The holder renews it every
`heartbeat_s` (30 s); a lease not renewed for `stale_s` (90 s) is taken over, as Marin
does. The lease also gives its holder's own `stale_s`, and a waiter takes over only
after the longer of its own and the holder's: two machines whose runs set other lease
timings (`--config lease_stale_s=`) never take over each other's live builds. Every
change is conditional on what the writer last saw, so of two contenders exactly one
wins:

- local folders: creation is atomic create-if-absent (the full JSON is written to a
  temporary file, then `os.link`ed to `.lease.json`, which fails with EEXIST if the lease
  exists: O_EXCL semantics, and nobody ever reads a half-written lease). Renewal,
  takeover and release hold an exclusive `fcntl.flock` on the sidecar `.lease.json.lock`
  and, under it, re-read the lease and replace (`os.replace`) or delete it only if its
  bytes are still the ones the writer last saw. Creation never touches an existing file,
  and every write to an existing file is such a check-and-set under the lock: race-free
  on one host and on network filesystems with working flock. Creation holds the lock
  too, so a lock (or lease file) that cannot be opened, a folder in its place or no
  permission, stops a build in one line (`lease_stores.LeaseFileUnusable`) before any
  lease is written, instead of leaving a lease nobody can release.
- `gs://` (google-cloud-storage client, its public preconditions): create with
  `if_generation_match=0`; renew, take over and delete with `if_generation_match=` the
  generation last seen. A 412 means someone else moved first. NOTE: the local GCS
  emulator (gcp-storage-emulator 2026.7.19) ignores all preconditions (it never reads
  `ifGenerationMatch`); acquisition therefore also reads the lease back and proceeds
  only when its own token is there, which narrows but cannot close that window.

Trust in what a lease says: a lease that is garbled, whose `since`/`renewed` is not an
ISO time with a zone, or whose `renewed` lies more than `SKEW_S` (5 min) in the future
(a wrong clock: it would never go stale) is unreadable. It names no holder to ask, so it
is taken over once unchanged for `stale_s` (the file's age: `LeaseStore.age_s`), as a
stale lease is: a run whose lease was garbled under it cannot renew it (its check-and-set
fails) and stops at its next heartbeat, before then; a live holder whose clock runs
ahead does renew it, and is waited for as long as it does. One line naming
`.lease.json` says so. A holder on this host (`host` is `socket.gethostname()`)
and in this pid namespace (`pid_namespace`) whose pid no longer exists is dead: its
lease is taken over at once instead of after `stale_s`. Each takeover prints one line on stderr.

Beyond Marin (#8107): the heartbeat notices when the lease was taken over or deleted
and calls `on_lost(reason)` once; `still_held()` re-reads the lease right before the
success record is written (fencing), so a holder that lost its lease never records a
success. Other URL schemes have no conditional writes here and are refused.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable

from marin_rules.artifacts import storage
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import MarinError, decode_json
from marin_rules.artifacts.lease_stores import LeaseStore, store_for
from marin_rules.artifacts.provenance import iso, user, utc_now

LEASE_FILE = ".lease.json"
HEARTBEAT_S = 30.0
STALE_S = 90.0
POLL_S = 5.0
SKEW_S = 300.0  # a lease renewed further in the future than this is unreadable, not live
MAX_PID = 2**31  # pids are positive C ints (Linux allows at most 2**22)
MAX_LEASE_S = 86400.0  # lease timings are at most a day: a lease may not outlive its holder by more


@dataclass(frozen=True)
class LeaseHolder:
    user: str | None
    host: str
    pid: int
    since: str
    renewed: str
    token: str
    pid_namespace: str = ""  # this process's /proc/self/ns/pid ("" where there is none, or in older leases)
    submitted_by: str = ""  # the process that submitted the holder's job (a pod job's run), if told; "" in older leases
    stale_s: float = 0.0  # the holder's own stale_s, which its heartbeat keeps under; 0 in older leases

    def describe(self) -> str:
        """Who holds it, for messages (read from a lease file: shown `printable`)."""
        return printable(f"{self.user or 'unknown'}@{self.host} pid {self.pid} since {self.since}")

    def age_s(self, now: dt.datetime | None = None) -> float:
        """Seconds since the last renewal (by this machine's clock)."""
        return ((now or utc_now()) - _instant(self.renewed)).total_seconds()

    def problem(self) -> str | None:
        """Why this lease cannot be trusted, or None: a time that is not an ISO time with
        a zone, a renewal further in the future than clocks disagree (`SKEW_S`), or a pid
        no process can have."""
        for name in ("since", "renewed"):
            try:
                _instant(getattr(self, name))
            except (ValueError, TypeError, AttributeError):
                return f"{name} {getattr(self, name)!r} is not an ISO time with a zone"
        if self.age_s() < -SKEW_S:
            return f"renewed {self.renewed}, more than {SKEW_S:.0f} s in the future"
        if not isinstance(self.pid, int) or isinstance(self.pid, bool) or not isinstance(self.host, str):
            return "pid or host is not a number or a name"
        if not 0 < self.pid < MAX_PID:  # os.kill(0 or -1, ...) means a group; a huge one overflows
            return f"pid {self.pid} is not a process id (1 to {MAX_PID - 1})"
        if isinstance(self.stale_s, bool) or not isinstance(self.stale_s, (int, float)) \
                or not 0 <= self.stale_s <= MAX_LEASE_S:  # fmt: skip  (a huge one would never go stale)
            return f"stale_s {self.stale_s!r} is not a number of seconds from 0 to {MAX_LEASE_S:.0f}"
        return None

    def stale_after(self, stale_s: float) -> float:
        """Seconds without renewal after which this lease is stale for a waiter whose own
        setting is `stale_s`: the longer of it and the holder's."""
        return max(stale_s, self.stale_s)


def _instant(text: str) -> dt.datetime:
    instant = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if instant.tzinfo is None:
        raise ValueError(f"{text!r} has no zone")
    return instant


class LeaseHeld(MarinError):
    """wait=False (or the deadline passed) and a live holder exists; `holder` None: the
    lease is unreadable but was written less than `stale_s` ago (`unreadable_age_s`)."""

    def __init__(self, location: str, holder: LeaseHolder | None, detail: str = "",
                 unreadable: tuple[str, float] | None = None):  # fmt: skip
        self.holder = holder
        if holder is None:
            why, age = unreadable or ("unreadable", 0.0)
            self.who = "an unknown run (its lease is unreadable)"
            super().__init__(
                f"{location}: its lease is unreadable ({why}) and was written {age:.0f} s ago{detail}: a run may be "
                "building under it; run again once it has been unchanged for the lease's stale_s, or delete "
                f"{storage.join(location, LEASE_FILE)} if no run is"
            )
            return
        self.who = holder.describe()
        super().__init__(
            f"{location}: being built by {holder.describe()} (lease renewed {max(0.0, holder.age_s()):.0f} s ago){detail}; "
            "wait for it to finish, or run again later"
        )


class LeaseLost(MarinError):
    """The lease was taken over or deleted while its holder was building (callers raise it
    from on_lost), or could not be written at all."""


def encode_holder(holder: LeaseHolder) -> bytes:
    return (json.dumps(asdict(holder), sort_keys=True) + "\n").encode("utf-8")


def _unreadable(data: bytes | None) -> str | None:
    """Why a lease file's bytes hold no usable holder (None: absent or fine)."""
    if data is None:
        return None
    try:
        fields = decode_json(data)
        holder = _holder(fields)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return f"not a lease ({type(e).__name__})"
    return holder.problem()


def decode_holder(data: bytes | None) -> LeaseHolder | None:
    """The holder in a lease file's bytes; None when there is none or it is unreadable
    (`_unreadable`: garbled, bad times, renewed in the future)."""
    if data is None or _unreadable(data) is not None:
        return None
    return _holder(decode_json(data))


_OPTIONAL_FIELDS = ("pid_namespace", "submitted_by", "stale_s")  # older leases lack them


def _holder(fields: dict) -> LeaseHolder:
    """A LeaseHolder from a lease's JSON fields (`_OPTIONAL_FIELDS` may be missing)."""
    return LeaseHolder(
        **{k: fields[k] for k in LeaseHolder.__dataclass_fields__ if k not in _OPTIONAL_FIELDS},
        **{k: fields.get(k, LeaseHolder.__dataclass_fields__[k].default) for k in _OPTIONAL_FIELDS},
    )


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")  # e.g. pid:[4026531836]
    except OSError:
        return ""


def holder_gone(holder: LeaseHolder) -> bool:
    """True when the holder ran on this host, in this pid namespace (containers sharing a
    host name, e.g. docker --network host, number their processes apart), and its
    process no longer exists (also read by `marin status`)."""
    if not _in_this_namespace(holder) or holder.pid <= 0:
        return False
    return not process_exists(holder.pid)


def _in_this_namespace(holder: LeaseHolder) -> bool:
    """Did the holder run on this host, in this pid namespace (where its pid names a
    process we can look up)?"""
    here = pid_namespace()
    return holder.host == socket.gethostname() and bool(here) and holder.pid_namespace == here


def running_here(holder: LeaseHolder) -> bool:
    """Is the holder's process known to be running: on this host, in this pid namespace,
    its process exists, and it started before the holder's `since` (a process that took
    the pid over later is another one)? Elsewhere nobody can tell from here."""
    if not _in_this_namespace(holder) or not process_exists(holder.pid):
        return False
    started = process_started(holder.pid)
    try:
        return started is None or started <= _instant(holder.since) + dt.timedelta(seconds=2)
    except (ValueError, TypeError, AttributeError):
        return False


def process_started(pid: int) -> dt.datetime | None:
    """When process `pid` of this machine started (Linux /proc), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime (clock ticks after boot)
        with open("/proc/stat", encoding="ascii") as f:
            boot = int(next(line.split()[1] for line in f if line.startswith("btime ")))
        return dt.datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"), tz=dt.timezone.utc)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def held_live(holder: LeaseHolder | None, stale_s: float = STALE_S) -> bool:
    """Is there a holder, renewed within `stale_s` (or its own longer stale_s), not known
    to be gone (`holder_gone`)?"""
    return holder is not None and holder.age_s() < holder.stale_after(stale_s) and not holder_gone(holder)


def held_here_by(holder: LeaseHolder, pids: Iterable[int]) -> bool:
    """Is the holder one of the processes `pids` of this host and pid namespace?"""
    here = pid_namespace()
    return holder.host == socket.gethostname() and holder.pid_namespace == here and holder.pid in set(pids)


def held_for(holder: LeaseHolder, submitter: str) -> bool:
    """Is the holder's job one that `submitter` submitted (a pod job holds its lease
    from a TPU worker, a process no registry of the submitting host lists)?"""
    return bool(submitter) and holder.submitted_by == submitter


def process_exists(pid: int) -> bool:
    """Does process `pid` exist on this machine (another user's too)?"""
    if not 0 < pid < MAX_PID:  # no process has it (and os.kill(0 or -1) would probe a group)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def _takeover_reason(
    location: str, data: bytes | None, current: LeaseHolder | None, stale_s: float, unreadable_age: float = 0.0
) -> str | None:
    """One line on why the lease in `data` may be taken over; None when it may not
    (a live holder, or an unreadable lease written `unreadable_age` < `stale_s` seconds
    ago). No lease at all: an empty reason."""
    where = storage.join(location, LEASE_FILE)
    if data is None:
        return ""
    if current is None:
        if unreadable_age < stale_s:
            return None
        return f"{where}: unreadable lease ({_unreadable(data)}), unchanged for {unreadable_age:.0f} s; taking it over"
    if holder_gone(current):
        return f"{where}: holder {current.describe()} is no longer running on this host; taking the lease over"
    age, limit = current.age_s(), current.stale_after(stale_s)
    if age >= limit:
        return f"{where}: lease of {current.describe()} not renewed for {age:.0f} s; taking it over"
    return None


class Lease:
    """A held lease; renew it with `start_heartbeat`, check it with `still_held`."""

    def __init__(self, location: str, holder: LeaseHolder, store: LeaseStore, version: Any,
                 heartbeat_s: float, stale_s: float):  # fmt: skip
        self.location = location
        self.holder = holder
        self._store = store
        self._version = version  # what we last wrote: bytes locally, a generation on gs://
        self._heartbeat_s = heartbeat_s
        self._stale_s = stale_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None
        self.taken_over: LeaseHolder | None = None  # the gone or stale holder this lease replaced

    def renew(self) -> bool:
        """Write a fresh `renewed` if the lease is still ours; False when it is not."""
        with self._lock:
            if self.lost:
                return False
            holder = replace(self.holder, renewed=iso(utc_now()))
            version = self._store.replace(encode_holder(holder), self._version)
            if version is None:
                return False
            self.holder, self._version = holder, version
            return True

    def start_heartbeat(self, on_lost: Callable[[str], None]) -> None:
        """Renew every heartbeat_s in a daemon thread; when the lease is gone or another
        holder's, call on_lost(reason) once and stop renewing. Errors (network) are
        retried on the next beat until the lease would be stale, then it counts as lost."""

        def beat() -> None:
            last_ok = time.monotonic()
            while not self._stop.wait(self._heartbeat_s):
                try:
                    if self.renew():
                        last_ok = time.monotonic()
                        continue
                    data = self._store.read()[0]
                    now = decode_holder(data)
                    reason = ("deleted" if data is None else "replaced by an unreadable lease") if now is None \
                        else f"taken over by {now.describe()}"
                except Exception as e:  # noqa: BLE001 - a failed renewal is retried, then lost
                    if time.monotonic() - last_ok < self._stale_s:
                        continue
                    reason = f"not renewed for {self._stale_s:.0f} s ({type(e).__name__}: {e})"
                if self._stop.is_set():
                    return
                self.lost = f"{self.location}: lease lost: {reason}"
                on_lost(self.lost)
                return

        self._thread = threading.Thread(target=beat, name=f"lease-heartbeat {self.location}", daemon=True)
        self._thread.start()

    def still_held(self) -> bool:
        """Re-read the lease now: True iff it is ours and not stale (fencing check)."""
        if self.lost:
            return False
        current = decode_holder(self._store.read()[0])
        return current is not None and current.token == self.holder.token and current.age_s() < self._stale_s

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours; idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(10.0, self._heartbeat_s))
        with self._lock:
            if not self.lost:
                self._store.delete(self._version)
            self.lost = self.lost or "released"


def new_holder(submitted_by: str = "", stale_s: float = 0.0) -> LeaseHolder:
    now = iso(utc_now())
    return LeaseHolder(user(), socket.gethostname(), os.getpid(), now, now, uuid.uuid4().hex, pid_namespace(),
                       submitted_by, stale_s)  # fmt: skip


def read_lease(location: str) -> LeaseHolder | None:
    """The current holder of an artifact's lease, or None."""
    return decode_holder(store_for(location, LEASE_FILE).read()[0])


def lease_problem(location: str) -> str | None:
    """Why the artifact's lease file holds no usable holder (garbled, bad times, renewed
    in the future: a job takes it over once it is unchanged for stale_s), or None: no
    lease file, or a good one."""
    return _unreadable(store_for(location, LEASE_FILE).read()[0])


def fresh_unreadable_lease(location: str, stale_s: float) -> tuple[str, float] | None:
    """(why, seconds since written) of an unreadable lease file written less than
    `stale_s` ago, which a run may still be building under (`acquire` waits for it);
    None otherwise."""
    store = store_for(location, LEASE_FILE)
    why = _unreadable(store.read()[0])
    age = None if why is None else store.age_s()
    return None if why is None or age is None or age >= stale_s else (why, age)


def _take(location: str, store: LeaseStore, data: bytes | None, version: Any, tried: LeaseHolder | None,
          heartbeat_s: float, stale_s: float, submitted_by: str,
          ) -> tuple[Lease | None, LeaseHolder | None]:  # fmt: skip
    """One try to make the lease ours: create it if absent, else replace the stale or
    unreadable one we saw. Returns (the Lease or None, the holder tried)."""
    if tried is not None and decode_holder(data) == tried:  # an earlier write reported lost (retried) did land
        return Lease(location, tried, store, version, heartbeat_s, stale_s), tried
    holder = new_holder(submitted_by, stale_s)
    written = store.create(encode_holder(holder)) if data is None else store.replace(encode_holder(holder), version)
    if written is None or decode_holder(store.read()[0]) != holder:  # read back: see the NOTE on the emulator
        return None, holder
    return Lease(location, holder, store, written, heartbeat_s, stale_s), holder


def acquire(location: str, *, is_done: Callable[[], bool], wait: bool = True,
            on_wait: Callable[[LeaseHolder | None], None] | None = None, heartbeat_s: float = HEARTBEAT_S,
            stale_s: float = STALE_S, poll_s: float = POLL_S, deadline_s: float | None = None,
            submitted_by: str = "") -> Lease | None:  # fmt: skip
    """The lease of `location`, or None when is_done() turned true (serve the finished
    artifact). A live holder is waited for (on_wait once per distinct holder), or with
    wait=False reported by LeaseHeld; a stale one (renewed over stale_s ago) is taken over.
    An unreadable lease is waited for until its file has been unchanged for stale_s
    (on_wait(None) once), or with wait=False reported by LeaseHeld with no holder.
    `submitted_by`: who submitted this job, recorded in the lease (`LeaseHolder`)."""
    store = store_for(location, LEASE_FILE)
    storage.makedirs(location)
    give_up = None if deadline_s is None else time.monotonic() + deadline_s
    seen_tokens: set[str] = set()
    raced, tried = 0, None
    while True:
        data, version = store.read()
        current = decode_holder(data)
        # an unreadable lease names no holder to ask: a run building under it cannot renew it (and
        # stops at its next heartbeat), so it is taken over once unchanged for stale_s, as a stale one
        unreadable_age = store.age_s() if data is not None and current is None else None
        if data is not None and current is None and unreadable_age is None:
            raced += 1  # gone (or replaced) since the read: look again
            if raced > 100:
                raise LeaseLost(f"{location}: its lease file kept changing while being read; check the prefix")
            time.sleep(poll_s)
            continue
        why = "" if current is not None and current == tried else \
            _takeover_reason(location, data, current, stale_s, unreadable_age or 0.0)  # fmt: skip
        if why is not None:
            if why:
                print(why, file=sys.stderr, flush=True)
            lease, tried = _take(location, store, data, version, tried, heartbeat_s, stale_s, submitted_by)
            if lease is not None:
                lease.taken_over = current if why else None
                try:
                    done = is_done()  # built by a holder that released just before we took it?
                except BaseException:  # is_done refused what it found: the lease is not left behind
                    lease.release()
                    raise
                if done:
                    lease.release()
                    return None
                if lease.renew():  # is_done() may have been slow: start the clock afresh
                    return lease
            raced += 1  # someone else moved first: look again (bounded, in case writes keep failing)
            if raced > 100:
                raise LeaseLost(f"{location}: could not write the lease after {raced} tries; check the prefix")
            continue
        if is_done():
            return None
        unreadable = None if current is not None else (_unreadable(data) or "unreadable", unreadable_age or 0.0)
        if not wait:
            raise LeaseHeld(location, current, unreadable=unreadable)
        token = current.token if current is not None else "unreadable"  # said once, however often it changes
        if token not in seen_tokens:
            seen_tokens.add(token)
            if current is None:
                print(f"{storage.join(location, LEASE_FILE)}: unreadable lease ({unreadable[0]}), written "
                      f"{unreadable[1]:.0f} s ago: waiting until no run has renewed it for {stale_s:.0f} s, then "
                      "taking it over", file=sys.stderr, flush=True)  # fmt: skip
            if on_wait is not None:
                on_wait(current)
        pause = poll_s
        if give_up is not None:
            left = give_up - time.monotonic()
            if left <= 0:
                raise LeaseHeld(location, current, f", still after waiting {deadline_s:g} s", unreadable=unreadable)
            pause = min(pause, left)
        time.sleep(pause)
