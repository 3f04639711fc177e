"""Reading what a prefix holds, for the `marin` inspection commands.

Model: an artifact `name@version` lives at `{prefix}/{name}/{version}`; its success
record is read through the records module and handed on as a plain JSON dict
(`record_dict`, `Record.to_json()`); a corrupt one raises the records module's
one-line `MarinError` (`CorruptRecord`). Failure records (`failure_files`,
`last_failure`) and the records forced rebuilds kept (`history_files`,
`history_failure_files`) are read by `read_json_file`, which raises `UnreadableRecord`
(one line naming the file) for a file that is not a JSON object or whose `error` or
`provenance` is not a mapping (`records.lenient_problem`): no attempt is left out
unsaid. `versions_on_prefix` lists every version folder of
a name found on the prefix (a folder holding a record, failures, history, a lease or an
attempt file: a build killed before it wrote any record is found too),
`builds_on_prefix` the artifact each holds (a dev version's `version-user` folder is
that user's dev version: `dev_versions.folder_identities`; built or not), and
`resolve_key` turns what a user typed into a key, or one line with the nearest
known key ("did you mean checkpoints/nano-moe@v1?").
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Iterable, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import ConfigError, MarinError, decode_json, json_problem
from marin_rules.artifacts.identity import FAILURES_DIR, RECORD_FILE, VERSION, ArtifactId, parse_key
from marin_rules.artifacts.files import ATTEMPT_FILE, FORCED_MARKER, HISTORY_DIR, REBUILDING
from marin_rules.artifacts.lease import LEASE_FILE
from marin_rules.artifacts.records import failures_location, lenient_problem, read_record
from marin_rules.dev_versions import folder_identities
from marin_rules.validation import suggest_key


def record_dict(location: str, expected: ArtifactId | None = None) -> dict[str, Any] | None:
    """The success record at an artifact location as a dict; None when never built.
    Raises CorruptRecord (one line naming the file and the fix) when it is corrupt."""
    record = read_record(location, expected)
    return None if record is None else record.to_json()


def _history_listing(location: str) -> tuple[list[str], str]:
    """Every file under the artifact's `.history/` (none when it has none), and the
    prefix to strip from them to get paths relative to `.history/`."""
    root = storage.join(location, HISTORY_DIR)
    try:
        return list(storage.walk_files(root)), _relative_base(root)
    except FileNotFoundError:
        return [], ""


def history_files(location: str) -> list[str]:
    """Locations of earlier success records kept by forced rebuilds: `.history/<x>.json`,
    `.history/<time>/.artifact.json`, or the record a forced build saved before its job
    moved the old build away (`.history/.forced-record`, holding `null` when none)."""
    found, base = _history_listing(location)
    out = []
    for path in found:
        rel = path[len(base) :].lstrip("/") if path.startswith(base) else posixpath.basename(path)
        parts = rel.split("/")
        kept_record = len(parts) == 1 and parts[0].endswith((".json", FORCED_MARKER))
        if kept_record or (len(parts) == 2 and parts[1] == RECORD_FILE):
            out.append(path)
    return sorted(out)


def forced_rebuild_owed(location: str) -> bool:
    """Was the artifact marked forced by a run that has not rebuilt it (yet)?"""
    return storage.exists(storage.join(location, HISTORY_DIR, FORCED_MARKER))


def owed_through(
    upstream_keys: Iterable[str], location: str, record: Mapping[str, Any] | None, is_dev: bool,
    records: Mapping[str, Mapping[str, Any] | None], owed: Mapping[str, str],
) -> str | None:  # fmt: skip
    """The upstream a built artifact's rebuild follows when a forced run stopped before
    rebuilding it, as planning judges (`Session._left_pending`, `is_forced`): with its
    marker still there, an upstream rebuilt since it was built or one unbuilt; marker
    or not, an upstream itself owed a rebuild (`owed`, from upstream to downstream:
    planning forces every consumer of a forced artifact). Else None. `records`: each
    upstream's record now (None: unbuilt)."""
    from marin_rules.artifacts.builds import build_of, rebuilt_upstreams

    if record is None or is_dev:
        return None
    keys = list(upstream_keys)
    through = next((u for u in keys if u in owed), None)
    if through is not None or not forced_rebuild_owed(location):
        return through
    now = {u: None if records.get(u) is None else build_of(records[u]) for u in keys}
    rebuilt = rebuilt_upstreams(record.get("deps") or {}, now)
    if rebuilt:
        return rebuilt[0][0]
    return next((u for u in keys if records.get(u) is None), None)


def record_or_none(location: str, expected: ArtifactId | None = None) -> dict[str, Any] | None:
    """`record_dict`, with a corrupt record read as none (its own row or check names it)."""
    try:
        return record_dict(location, expected)
    except MarinError:
        return None


def owed_rebuilds(experiment: Any, prefix: str) -> dict[str, str]:
    """Every built artifact of `experiment` the next run rebuilds to finish a forced run
    that stopped (`owed_through`), with the upstream it follows; records that cannot be
    read count as unbuilt (planning stops on them anyway)."""
    from marin_rules.artifacts.identity import artifact_location

    records: dict[str, Mapping[str, Any] | None] = {}
    owed: dict[str, str] = {}
    for key, artifact in experiment.artifacts.items():  # upstreams first
        location = artifact_location(prefix, artifact.id)
        records[key] = record_or_none(location, artifact.id)
        through = owed_through(artifact.upstream_keys(), location, records[key], artifact.id.is_dev, records, owed)
        if through is not None:
            owed[key] = through
    return owed


def unended_rebuild(location: str) -> str | None:
    """Where the old build of a forced rebuild that neither succeeded nor was restored
    went (`.history/<name>`: its process was killed, or still runs), else None."""
    try:
        name = storage.read_json(storage.join(location, HISTORY_DIR, REBUILDING)).get("moved")
    except (OSError, ValueError, AttributeError):
        return None
    return f"{HISTORY_DIR}/{name}" if isinstance(name, str) and name and "/" not in name else None


def unended_move(location: str) -> bool:
    """Was the unended forced rebuild (`unended_rebuild`) stopped while its old build was
    being set aside (`forcing.move_old_build`): the next job puts it back, then rebuilds?"""
    try:
        return storage.read_json(storage.join(location, HISTORY_DIR, REBUILDING)).get("moving") is True
    except (OSError, ValueError, AttributeError):
        return False


def unended_rebuild_owed(location: str) -> bool:
    """Was the unended forced rebuild (`unended_rebuild`) owed by a cascade, so that the
    job restoring its old build rebuilds it after all (`forcing.restore_old_build`)?"""
    try:
        return storage.read_json(storage.join(location, HISTORY_DIR, REBUILDING)).get("owed") is True
    except (OSError, ValueError, AttributeError):
        return False


def history_failure_files(location: str) -> list[str]:
    """Failure records moved under `.history/<time>/.failures/` by a forced rebuild."""
    found, base = _history_listing(location)
    return sorted(
        p for p in found if p.startswith(base) and p[len(base) :].lstrip("/").split("/")[1:2] == [FAILURES_DIR]
    )


def _relative_base(root: str) -> str:
    """`root` in the spelling `walk_files` returns (local paths are not normalised there)."""
    if storage.is_remote(root):
        return root.rstrip("/")
    return storage.filesystem(root)[1].rstrip("/")


class UnreadableRecord(MarinError):
    """A failure or history record that is not a JSON object: one line naming the file."""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: unreadable record ({problem}); repair or delete the file")


def failure_files(location: str) -> list[str]:
    """The artifact's failure records (`.failures/*.json`), oldest first."""
    try:
        return storage.list_files(failures_location(location), "*.json")
    except FileNotFoundError:
        return []


def read_json_file(location: str) -> dict[str, Any] | None:
    """A failure or history record as a dict; None when the file is gone since it was
    listed, or is a `.forced-record` holding null (no earlier build was kept). Raises
    UnreadableRecord when it is empty, not UTF-8, not JSON, not a JSON object, or of
    the wrong shape (`records.lenient_problem`: an `error` or `provenance` that is not
    a mapping)."""
    try:
        raw = storage.read_bytes(location)
        data = decode_json(raw)
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise UnreadableRecord(location, "not UTF-8 text") from None
    except ValueError as e:  # json.JSONDecodeError, nested too deeply, a huge integer
        problem = "empty file" if not raw.strip() else json_problem(e)
        raise UnreadableRecord(location, problem) from None
    except OSError as e:
        raise UnreadableRecord(location, f"{type(e).__name__}: {e}") from None
    if data is None and location.endswith(FORCED_MARKER):
        return None
    problem = lenient_problem(data)
    if problem is not None:
        raise UnreadableRecord(location, problem)
    return data


def last_failure(location: str) -> dict[str, Any] | None:
    """The newest failure record (None when there is none); UnreadableRecord when the
    newest file is unreadable (an older one is not the last failure)."""
    files = failure_files(location)
    return read_json_file(files[-1]) if files else None


def attempt_after(location: str, failure: Mapping[str, Any]) -> bool:
    """Did an attempt of the artifact begin after `failure` (its newest failure record)
    ended, by the start its `.attempt.json` notes (`job.attempt.begin`; times written
    inside the files, so copying a prefix changes nothing)? With no success record, no
    lease and no failure since, that attempt ended without failing: its record was
    deleted (`snakemake --delete-all-output`), so the artifact is not a failed one.
    Sharded steps keep no attempt file: False."""
    provenance = failure.get("provenance")
    ended = provenance.get("ended") if isinstance(provenance, Mapping) else None
    try:
        started = storage.read_json(storage.join(location, ATTEMPT_FILE)).get("started")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(started, str) and isinstance(ended, str) and started > ended  # both `provenance.iso`


FOUND_BY = (RECORD_FILE, FAILURES_DIR, HISTORY_DIR, LEASE_FILE, ATTEMPT_FILE)  # what marks a version folder


def versions_on_prefix(prefix: str, name: str) -> list[str]:
    """Every version of `name` found on the prefix: a folder holding one of `FOUND_BY` (a
    record, failure records, history, or what an attempt writes first: its lease and
    attempt file). Sorted."""
    root = f"{prefix.rstrip('/')}/{name}"
    fs, path = storage.filesystem(root)
    try:
        entries = fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        if entry.get("type") != "directory":
            continue
        version = posixpath.basename(entry["name"].rstrip("/"))
        if not VERSION.fullmatch(version):
            continue
        folder = entry["name"].rstrip("/")
        if any(fs.exists(f"{folder}/{marker}") for marker in FOUND_BY):
            found.append(version)
    return sorted(found)


def builds_on_prefix(prefix: str, name: str) -> list[ArtifactId]:
    """The artifact in each version folder of `name` on the prefix (`versions_on_prefix`):
    a fixed version, or a dev version with its owner (`dev_versions.folder_identities`;
    where a folder may hold either, the version its files name decides, `_recorded_version`;
    where none does, as after a dev build killed before it wrote any record, it is read as
    the dev version, of the shortest version where the name allows several). Sorted by folder."""
    found = []
    for folder in versions_on_prefix(prefix, name):
        fixed, *dev = folder_identities(name, folder)
        said = _recorded_version(f"{prefix.rstrip('/')}/{name}/{folder}") if dev else None
        named = [c for c in (fixed, *dev) if c.version == said]
        found.append(named[0] if named else dev[0] if dev and said is None else fixed)
    return found


def _recorded_version(location: str) -> str | None:
    """The version the files at `location` name: its success record, else its newest
    failure record, else the build a rebuild moved aside (`.history/.rebuilding`, then the
    newest record kept under `.history/`); None when none can be read or says."""
    rebuilding = storage.join(location, HISTORY_DIR, REBUILDING)

    def paths():  # listed lazily: `.history/` may hold a long walk of set-aside checkpoints
        yield storage.join(location, RECORD_FILE)
        yield from failure_files(location)[-1:]
        yield rebuilding
        yield from reversed(history_files(location))

    for path in paths():
        try:
            data = storage.read_json(path)
            version = (data.get("entry") if path == rebuilding else data).get("version")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(version, str):
            return version
    return None


def took_s(provenance: Mapping[str, Any]) -> float | None:
    """How long a build took, as a record's provenance says: its job's `duration_s`, plus
    for a sharded step's gather the shard jobs' (`shards_duration_s`, summed: jobs that
    ran side by side count each, so this is work, not wall time); None when not recorded."""
    took = provenance.get("duration_s")
    if not isinstance(took, (int, float)) or isinstance(took, bool):
        return None
    shards = provenance.get("shards_duration_s")
    return took + shards if isinstance(shards, (int, float)) and not isinstance(shards, bool) else took


def suggestion(text: str, keys: Iterable[str]) -> str:
    """" (did you mean KEY?)" for the nearest key, or "" (see `suggest_key`)."""
    return suggest_key(text, keys, cutoff=0.5)


def refuse_empty_key(text: str, known: Iterable[str]) -> None:
    """An empty (or blank) KEY as typed (`marin show ""`): one line saying so."""
    if not text.strip():
        example = next(iter(known), "checkpoints/nano-moe@v1")
        raise MarinError(f"an empty key was given ({text!r}); expected name@version, such as {example}")


def resolve_key(text: str, known: Iterable[str]) -> ArtifactId:
    """Parse `name@version` as typed; one line with the nearest known key otherwise."""
    known = list(known)
    refuse_empty_key(text, known)
    try:
        return parse_key(text)
    except ConfigError as e:
        hint = suggestion(text, known)
        shown = printable(text)  # as typed: may hold control characters
        raise MarinError(f"{shown}: expected name@version{hint}" if hint else f"{shown}: {printable(e.message)}") from None


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True)
