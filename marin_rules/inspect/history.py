"""An artifact's history: every attempt and every forced rebuild, oldest first.

Model: the history of `{prefix}/{name}/{version}` is the union of its success record
(the current build), its failure records (`.failures/*.json`), and the earlier
success records a forced rebuild kept under `.history/` (as `.history/<x>.json` or
`.history/<time>/.artifact.json`, with any `.history/<time>/.failures/*.json`). Each
becomes one `Event` with its time, outcome, host, duration, fingerprint and, for a
failure, the error's first line. Events that appear twice (a failure copied into a
history folder) are shown once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from marin_rules.artifacts.identity import ArtifactId
from marin_rules.artifacts.records import read_failures
from marin_rules.inspect import reading
from marin_rules.inspect.status import first_line


@dataclass(frozen=True)
class Event:
    started: str
    ended: str
    outcome: str  # "built (current)", "built (replaced by a forced rebuild)", "failed"
    host: str
    user: str
    duration_s: float | None
    fingerprint: str
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _event(record: Mapping[str, Any], outcome: str) -> Event:
    provenance = record.get("provenance") or {}
    error = record.get("error") or {}
    message = ""
    if error:
        status = error.get("exit_status")
        message = f"{error.get('type', 'Error')}: {first_line(error.get('message'))}"
        if status not in (None, "", 1):
            message += f" (exit status {status})"
    duration = provenance.get("duration_s")
    return Event(
        started=str(provenance.get("started") or "?"),
        ended=str(provenance.get("ended") or "?"),
        outcome=outcome,
        host=str(provenance.get("host") or "?"),
        user=str(provenance.get("user") or "?"),
        duration_s=duration if isinstance(duration, (int, float)) else None,
        fingerprint=str(record.get("fingerprint") or "-"),
        error=message,
    )


def artifact_history(location: str, expected: ArtifactId | None = None) -> list[Event]:
    """Every attempt at the artifact at `location`, oldest first. Raises MarinError
    when the current record is corrupt (the one line says what to do)."""
    events: list[Event] = []
    current = reading.record_dict(location, expected)
    if current is not None:
        events.append(_event(current, "built (current)"))
    for failure in read_failures(location):
        events.append(_event(failure, "failed"))
    for path in reading.history_files(location):
        old = reading.read_json_file(path)
        if old is not None:
            events.append(_event(old, "built (replaced by a forced rebuild)"))
    for path in reading.history_failure_files(location):
        old = reading.read_json_file(path)
        if old is not None:
            events.append(_event(old, "failed"))
    unique = {(e.started, e.ended, e.outcome, e.host): e for e in events}
    return sorted(unique.values(), key=lambda e: (e.started, e.ended))


def format_history(key: str, events: list[Event]) -> str:
    if not events:
        return f"{key}: no attempts recorded (never built)"
    lines = [f"{key}: {len(events)} attempt{'s' if len(events) != 1 else ''}"]
    for e in events:
        took = "-" if e.duration_s is None else f"{e.duration_s:.1f}s"
        when = e.started.replace("T", " ")[:19]
        line = f"  {when}  {e.outcome:<38} host {e.host}  took {took}  fingerprint {e.fingerprint}"
        lines.append(line + (f"\n      error: {e.error}" if e.error else ""))
    return "\n".join(lines)
