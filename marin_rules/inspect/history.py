"""An artifact's history: every attempt and every forced rebuild, oldest first.

Model: the history of `{prefix}/{name}/{version}` is the union of its success record
(the current build), its failure records (`.failures/*.json`), and the earlier
success records a forced rebuild kept under `.history/` (as `.history/<x>.json` or
`.history/<time>/.artifact.json`, with any `.history/<time>/.failures/*.json`), and the
attempt its lease names, which has no record yet: building now, or killed without one
(`_leased`, as `marin status` tells them). Each
becomes one `Event` with its time, outcome, host, duration, fingerprint and, for a
failure, the error's first line (said last, after its exit status: a command it ends
with is followed by nothing). The failure records the processes of one pod attempt
each wrote (naming it: `provenance.pod_attempt`) are one event, the earliest one's. Events that appear twice (a failure copied into a
history folder) are shown once. A failure record (or the current record) that cannot
be read is an `unreadable` event naming the file (`reading.UnreadableRecord`), listed
last: an attempt is never left out unsaid. A record a forced rebuild kept
(`.history/<time>/...`) that cannot be read is a `REPLACED_UNREADABLE` event: usually
the corrupt record that was the reason to force the rebuild, now history that nothing
reads, so nothing to repair. The record a forced rebuild saved before it runs
(`.history/.forced-record`, `files.FORCED_MARKER`) is no replaced build: its rebuild is
pending, and a rebuild that fails puts it back as the current record. It is shown as
`PENDING` (when it is not the current record itself), or `PENDING_UNREADABLE` with its
rebuild command. The text form shows each value `printable`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.files import FORCED_MARKER
from marin_rules.artifacts.identity import ArtifactId
from marin_rules.artifacts.lease import LeaseHolder, held_live, holder_gone
from marin_rules.artifacts.records import rebuild_hint
from marin_rules.inspect import reading
from marin_rules.inspect.status import first_line, gone_builder, read_holder

UNREADABLE = "unreadable"
REPLACED_UNREADABLE = "replaced, its record unreadable"  # a build a forced rebuild replaced
REPLACED = "built (replaced by a forced rebuild)"
PENDING = "built (pending forced rebuild)"  # the record `.history/.forced-record` saved
PENDING_UNREADABLE = "pending forced rebuild, its saved record unreadable"
BUILDING = "building now (lease held)"  # the attempts a lease names (`_leased`)
KILLED = "killed (no record)"
STALE = "stopped? (lease stale)"


@dataclass(frozen=True)
class Event:
    started: str
    ended: str
    outcome: str  # "built (current)", REPLACED, PENDING, "failed", BUILDING, KILLED, STALE, or an *UNREADABLE
    host: str
    user: str
    duration_s: float | None
    fingerprint: str
    error: str = ""
    pod_attempt: str = ""  # the pod attempt its record names (`pod_start.attempt_id`)
    processes: int = 1  # the pod processes whose failure records make this one attempt

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _event(record: Mapping[str, Any], outcome: str) -> Event:
    provenance = record.get("provenance") or {}
    error = record.get("error") or {}
    message = ""
    if error:
        status = error.get("exit_status")
        shown = "" if status in (None, "", 1) else f" (exit status {status})"
        message = f"{error.get('type', 'Error')}{shown}: {first_line(error.get('message'))}"
    duration = reading.took_s(provenance)
    return Event(
        started=str(provenance.get("started") or "?"),
        ended=str(provenance.get("ended") or "?"),
        outcome=outcome,
        host=str(provenance.get("host") or "?"),
        user=str(provenance.get("user") or "?"),
        duration_s=duration,
        fingerprint=str(record.get("fingerprint") or "-"),
        error=message,
        pod_attempt=str(provenance.get("pod_attempt") or ""),
    )


def _one_per_pod_attempt(events: list[Event]) -> list[Event]:
    """The failure records of one pod attempt (each process writes its own, naming the
    attempt) as one event: the earliest one's (the cause; the others were stopped with
    it), spanning them all, with their count."""
    groups: dict[str, list[Event]] = {}
    for e in events:
        if e.pod_attempt and e.outcome == "failed":
            groups.setdefault(e.pod_attempt, []).append(e)
    out = [e for e in events if not (e.pod_attempt and e.outcome == "failed")]
    for group in groups.values():
        first = min(group, key=lambda e: (e.ended, e.started))
        durations = [e.duration_s for e in group if e.duration_s is not None]
        out.append(replace(first, started=min(e.started for e in group), ended=max(e.ended for e in group),
                           duration_s=max(durations) if durations else None, processes=len(group)))  # fmt: skip
    return out


def artifact_history(location: str, expected: ArtifactId | None = None, hint_flags: str | None = "") -> list[Event]:
    """Every attempt at the artifact at `location`, oldest first; a record that cannot
    be read (the current one included) is listed last as unreadable, with its one line
    (a corrupt current record's rebuild command followed by `hint_flags`: `CorruptRecord.with_flags`;
    None: the artifact is not the experiment's, no command of it rebuilds it)."""
    events: list[Event] = []
    try:
        current = reading.record_dict(location, expected)
    except MarinError as e:  # a corrupt current record: the earlier attempts are still worth seeing
        current = None
        line = str(e.with_flags(hint_flags))
        events.append(Event("?", "?", UNREADABLE, "?", "?", None, "-", line))
    if current is not None:
        events.append(_event(current, "built (current)"))
    kept = [
        *((path, "failed") for path in reading.failure_files(location)),
        *((path, _kept_outcome(path)) for path in reading.history_files(location)),
        *((path, "failed") for path in reading.history_failure_files(location)),
    ]
    for path, outcome in kept:
        try:
            old = reading.read_json_file(path)
        except reading.UnreadableRecord as e:
            events.append(_unreadable(e, outcome, rebuild_hint(location, hint_flags)))
            continue
        if old is not None and not (outcome != "failed" and old == current):  # a forced build's marker
            events.append(_event(old, outcome))  # holding the record still in place is not another attempt
    holder = read_holder(location)
    if holder is not None:  # an attempt that has no record yet: running, or killed without one
        events.append(_leased(holder))
    unique = {(e.started, e.ended, e.outcome, e.host, e.error): e for e in events}
    return sorted(_one_per_pod_attempt(list(unique.values())), key=lambda e: (e.started, e.ended))  # unreadable ("?") last


def _leased(holder: LeaseHolder) -> Event:
    """The attempt the artifact's lease names: BUILDING while renewed, KILLED when its
    process is gone (`lease.holder_gone`: killed on this host, as by the OOM killer's
    SIGKILL, which leaves no failure record), STALE when not renewed for its stale time (`lease.held_live`)."""
    if holder_gone(holder):
        outcome, note = KILLED, gone_builder(f"its builder (pid {holder.pid})")
    elif not held_live(holder):
        outcome, note = STALE, f"lease not renewed for {holder.age_s():.0f} s: the next run takes it over"
    else:
        outcome, note = BUILDING, ""
    return Event(holder.since, "-", outcome, holder.host, holder.user or "?", None, "-", note)


def _kept_outcome(path: str) -> str:
    """The outcome of a record under `.history/` (`reading.history_files`): a build a
    forced rebuild replaced, or the record a pending forced rebuild saved (the marker)."""
    return PENDING if path.rsplit("/", 1)[-1] == FORCED_MARKER else REPLACED


def _unreadable(error: reading.UnreadableRecord, outcome: str, hint: str) -> Event:
    """The event of a failure record (`outcome` "failed") that cannot be read; of a record
    a forced rebuild kept under `.history/<time>/` (REPLACED): that build is history, so
    its line says what it is and that nothing needs it, instead of asking for a repair;
    or of the record a pending forced rebuild saved (PENDING): put back as the current
    record if that rebuild fails, so its line ends with the rebuild (`hint`)."""
    if outcome == REPLACED:
        text = (f"{error.path} ({error.problem}): kept as found when a forced rebuild replaced that build (likely "
                "because this record was corrupt); nothing reads it, nothing to repair")  # fmt: skip
        return Event("?", "?", REPLACED_UNREADABLE, "?", "?", None, "-", text)
    if outcome == PENDING:
        text = (f"{error.path} ({error.problem}): saved by a forced rebuild that has not run yet, and put back as "
                f"the current record if that rebuild fails; {hint}")  # fmt: skip
        return Event("?", "?", PENDING_UNREADABLE, "?", "?", None, "-", text)
    return Event("?", "?", UNREADABLE, "?", "?", None, "-", str(error))


def format_history(key: str, events: list[Event], unbuilt: str = "never built") -> str:
    """The events as lines under a headline; `unbuilt`: why there are none
    (`status.never_built_reason`: a folder whose record was deleted still holds data)."""
    if not events:
        return f"{key}: no attempts recorded ({unbuilt})"
    unreadable = sum(e.outcome == UNREADABLE for e in events)
    replaced = sum(e.outcome == REPLACED_UNREADABLE for e in events)
    notes = [f"{unreadable} with an unreadable record"] if unreadable else []
    if replaced:
        notes.append(f"{replaced} replaced build{'s' if replaced != 1 else ''} whose record is unreadable")
    if any(e.outcome == PENDING_UNREADABLE for e in events):
        notes.append("a pending forced rebuild whose saved record is unreadable")
    lines = [f"{key}: {len(events)} attempt{'s' if len(events) != 1 else ''}"
             + (f" ({', '.join(notes)}, listed last)" if notes else "")]  # fmt: skip
    for e in events:
        if e.outcome in (UNREADABLE, REPLACED_UNREADABLE, PENDING_UNREADABLE):
            lines.append(f"  {e.outcome}: {printable(e.error)}")
            continue
        took = "-" if e.duration_s is None else f"{e.duration_s:.1f}s"
        when = e.started.replace("T", " ")[:19]
        outcome = e.outcome if e.processes == 1 else f"{e.outcome} ({e.processes} pod processes)"
        line = printable(f"  {when}  {outcome:<38} host {e.host}  took {took}  fingerprint {e.fingerprint}")
        lines.append(line + (f"\n      error: {printable(e.error)}" if e.error else ""))
    return "\n".join(lines)
