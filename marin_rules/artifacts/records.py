"""Success and failure records, written next to the data.

Model: `{location}/.artifact.json` is the success record, one `Record`. It is written
last, in one atomic write, after the step returned; its existence means "built". It
holds identity (name, version, step, fingerprint), the recipe (`config`, `deps` with the
upstream fingerprints seen at build time), `runtime`, the step's `result`, `provenance`
(code version, who, where, when, how long) and `files`: every data file of the
artifact with its size, so a missing or truncated file is found (`verify_files`).
Every path in a record is relative to the prefix (`name/version`), so a prefix can be
moved or copied to a bucket. Reading validates: bad JSON, a missing or mistyped field,
a `files` entry outside the artifact folder (absolute, or with `..` segments), or a
name/version that disagrees with the record's place raise `CorruptRecord`, one line
naming the file and how to fix it (`snakemake -f RECORD`, which the layers that know
the run's experiment and prefix complete: `CorruptRecord.with_flags`); a corrupt record
is never served as built. A data file of a built artifact that a step cannot read
(damaged in place, its size kept) is an `UnreadableFile`, whose rebuild command the
job completes the same way; where `location` has no record (data adopted in place),
the line says to restore the files or adopt a good copy instead.

A record is judged against the recipe now by its fingerprint and by its own recipe
fields (`recipe_drift`): a record whose `step`, `config` or `deps` were edited by hand
(they no longer make its fingerprint, `edited_note`) is drift as an edited
fingerprint is, never served as if built from today's recipe. Serving a record says so
in one wording wherever it happens (`drift_warning`: planning, and a job that serves
another run's build).

A failed attempt writes `{location}/.failures/<UTC time>.json` with the same identity
and recipe plus the error and its traceback; failures are history, never deleted and
read leniently (plain dicts, whose `error` and `provenance` are mappings where
present: `lenient_problem`). Nothing here copies environment variables, so no
credential can reach a record.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import traceback as tb
from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.canonical import fingerprint
from marin_rules.artifacts.drift import (
    EDITED_FIX, DefaultLookup, ProgressLookup, drift_notice, only_respelled, printable, recipe_diff,
)
from marin_rules.artifacts.errors import ConfigError, MarinError, StepError, decode_json, json_problem
from marin_rules.artifacts.identity import FAILURES_DIR, RECORD_FILE, ArtifactId
from marin_rules.artifacts.files import (
    content_problems, history_stamp, is_inside, list_data_files, recorded_digests, size_problems,
)
from marin_rules.artifacts.provenance import Provenance, iso, utc_now

__all__ = [
    "CorruptRecord", "UnreadableFile", "Record", "Provenance", "read_record", "read_record_file", "write_success",
    "write_failure", "read_failures", "verify_files", "list_data_files", "utc_now", "iso",
]  # fmt: skip

RECORD_SCHEMA = 2  # 2: `files` added, `path` prefix-relative
MIRROR_DIR = ".snakemake/marin-mirror"  # where Snakemake sees a remote prefix's records (`marin_rules.mirror`)


def mirror_root(prefix: str) -> str:
    """The local mirror of remote `prefix` (relative to the workflow's working directory)."""
    scheme, _, rest = prefix.partition("://")
    return f"{MIRROR_DIR}/{scheme}/{rest.strip('/')}"


def snakemake_path(path: str) -> str:
    """A record's path as Snakemake sees it, for the commands messages suggest: a local
    one as it is, a remote one (gs://) in the local mirror."""
    return mirror_root(path) if storage.is_remote(path) else path


def stored_path(path: str) -> str:
    """Where a record Snakemake sees really is: the remote one behind a mirror path."""
    head = MIRROR_DIR + "/"
    if not path.startswith(head):
        return path
    scheme, _, rest = path[len(head) :].partition("/")
    return f"{scheme}://{rest}"


def rebuild_command(record_file: str, flags: str = "") -> str:
    """`snakemake -f RECORD FLAGS`, shell-quoted (a prefix may hold spaces): RECORD as
    Snakemake sees it (`snakemake_path`), `flags` what else it needs to plan the same
    experiment on the same prefix (`workflow.options.rerun_flags`, which the layers
    that know the run add: this core does not)."""
    return shlex.join(["snakemake", "-f", snakemake_path(stored_path(record_file)), *shlex.split(flags)])


class CorruptRecord(MarinError):
    """A success record that cannot be trusted; the message is one line:
    `<record file>: <what is wrong>; <how to fix>`. The layers that know the run's
    experiment and prefix complete its command with `with_flags`; `flags` None: the
    artifact is not the experiment's (an older version), which no command of it rebuilds."""

    def __init__(self, record_file: str, problem: str, flags: str | None = ""):
        self.record_file = record_file
        self.problem = problem
        stored = stored_path(record_file)  # a mirror's copy is fetched again: the remote one is to delete
        fix = OTHER_EXPERIMENT_HINT if flags is None else f"rebuild the artifact with: {rebuild_command(record_file, flags)}"
        super().__init__(f"{stored}: {printable(problem)}; delete it and {fix}")
        self.flags = flags

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (a worker process may raise it), flags kept
        return (CorruptRecord, (self.record_file, self.problem, self.flags))

    def with_flags(self, flags: str | None) -> CorruptRecord:
        """The same line, its `snakemake -f RECORD` followed by `flags`
        (`workflow.options.rerun_flags`), so that it runs as printed; None: no command."""
        return CorruptRecord(self.record_file, self.problem, flags)


@dataclass(frozen=True)
class Record:
    """The one type that reads, validates and writes `.artifact.json`."""

    schema: int
    name: str
    version: str
    step: str
    fingerprint: str
    config: dict
    deps: dict
    runtime: dict
    path: str  # prefix-relative: "name/version"
    status: str  # "success"
    result: Any
    provenance: dict
    files: dict  # relative data file path -> size in bytes

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def built(self) -> str | None:
        ended = self.provenance.get("ended")
        return ended if isinstance(ended, str) else None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# field -> (accepted types, how to name them in a message)
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "schema": ((int,), "an integer"),
    "name": ((str,), "a string"),
    "version": ((str,), "a string"),
    "step": ((str,), "a string"),
    "fingerprint": ((str,), "a string"),
    "config": ((dict,), "a mapping"),
    "deps": ((dict,), "a mapping"),
    "runtime": ((dict,), "a mapping"),
    "path": ((str,), "a string"),
    "status": ((str,), "a string"),
    "result": ((dict,), "a mapping"),  # a step returns a dict (job/run.py)
    "provenance": ((dict,), "a mapping"),
    "files": ((dict,), "a mapping"),
}


def record_location(artifact_location: str) -> str:
    return storage.join(artifact_location, RECORD_FILE)


def failures_location(artifact_location: str) -> str:
    return storage.join(artifact_location, FAILURES_DIR)


def record_from_json(data: Any, record_file: str, expected: ArtifactId | None = None) -> Record:
    """Validate parsed JSON into a Record, or raise CorruptRecord naming the problem."""
    if not isinstance(data, dict):
        raise CorruptRecord(record_file, f"expected a JSON object, got {type(data).__name__}")
    if "schema" in data and data["schema"] != RECORD_SCHEMA:
        raise CorruptRecord(
            record_file, f"record schema {data['schema']!r} is not the schema {RECORD_SCHEMA} this marin-rules reads"
        )
    missing = [f for f in _FIELDS if f not in data]
    if missing:
        raise CorruptRecord(record_file, f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    for name, (types, described) in _FIELDS.items():
        value = data[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types and int in types):
            raise CorruptRecord(record_file, f"field {name} should be {described}, got {json.dumps(value)[:60]}")
    for role, dep in data["deps"].items():  # an upstream seen, or a mixture's members: mappings
        if not isinstance(dep, dict) and not (isinstance(dep, list) and all(isinstance(d, dict) for d in dep)):
            raise CorruptRecord(
                record_file, f"deps.{role} should be a mapping (a list of them for a mixture), got {json.dumps(dep)[:60]}"
            )
    if data["status"] != "success":
        raise CorruptRecord(record_file, f"status is {data['status']!r}, not 'success'")
    for rel, size in data["files"].items():
        if not is_inside(rel):
            raise CorruptRecord(
                record_file, f"files.{rel} should be a file inside the artifact: a relative path without '..' segments"
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CorruptRecord(record_file, f"files.{rel} should be a size in bytes, got {json.dumps(size)[:40]}")
    if data["path"] != f"{data['name']}/{data['version']}":
        raise CorruptRecord(
            record_file, f"path {data['path']!r} disagrees with its name@version {data['name']}@{data['version']}"
        )
    if expected is not None and (data["name"], data["version"]) != (expected.name, expected.version):
        raise CorruptRecord(
            record_file, f"it records {data['name']}@{data['version']} but sits where {expected.key} belongs"
        )
    return Record(**{f: data[f] for f in _FIELDS})


def read_record_file(record_file: str, expected: ArtifactId | None = None) -> Record | None:
    """The Record in a record file (local path or URL); None when the file does not exist."""
    try:
        raw = storage.read_bytes(record_file)
    except FileNotFoundError:
        return None
    except IsADirectoryError:  # a folder named like a record file
        raise CorruptRecord(record_file, "a folder, not a record file") from None
    except NotADirectoryError:  # a file where the artifact's folder (or a folder above it) should be
        raise CorruptRecord(record_file, f"{_file_on_path(record_file)} is a file where a folder should be") from None
    try:
        data = decode_json(raw)
    except UnicodeDecodeError:
        raise CorruptRecord(record_file, "not UTF-8 text") from None
    except ValueError as e:  # json.JSONDecodeError, nested too deeply, a huge integer
        raise CorruptRecord(record_file, json_problem(e)) from None
    return record_from_json(data, record_file, expected)


def _file_on_path(location: str) -> str:
    """The first file among the folders leading to local `location` (the path itself
    when none is found: the file went away meanwhile)."""
    path = os.path.dirname(storage.local_path(location))
    parents = []
    while path and path not in parents:
        parents.append(path)
        path = os.path.dirname(path)
    return next((p for p in reversed(parents) if os.path.isfile(p)), location)


def read_record(location: str, expected: ArtifactId | None = None) -> Record | None:
    """The success record of an artifact folder, or None when it was never built."""
    return read_record_file(record_location(location), expected)


def recorded_payload(record: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint payload a success record's own fields make: its `step`, `config`,
    and `deps` by name@version (a mixture as {name@version: weight}), for diffs and for
    `edited_note`. Entries of another shape are left out (the diff then shows them)."""
    deps: dict[str, Any] = {}
    for role, dep in (record.get("deps") or {}).items():
        if isinstance(dep, list):
            deps[role] = {f"{d.get('name')}@{d.get('version')}": d.get("weight") for d in dep if isinstance(d, Mapping)}
        elif isinstance(dep, Mapping):
            deps[role] = f"{dep.get('name')}@{dep.get('version')}"
    return {"step": record.get("step"), "config": record.get("config") or {}, "deps": deps}


def edited_note(record: Mapping[str, Any]) -> str | None:
    """One line when a success record's fingerprint is not that of its own step, config
    and deps (`recorded_payload`: the record was edited by hand after it was written);
    None when they agree, as every record this package writes does."""
    payload = recorded_payload(record)
    try:
        made = fingerprint(payload["step"], payload["config"], payload["deps"])
    except (ConfigError, TypeError):  # a value with no canonical form (NaN): not what was fingerprinted
        made = None
    if made == record.get("fingerprint"):
        return None
    return printable(f"its step, config and deps are not those its fingerprint {record.get('fingerprint')} was "
                     f"made from: was the record edited? ({EDITED_FIX})")  # fmt: skip


def recipe_drift(
    record: Mapping[str, Any], payload: Mapping[str, Any], fingerprint_now: str, default: DefaultLookup | None = None,
    typed_numbers: bool = False, progress: ProgressLookup | None = None,
) -> list[str] | None:
    """How a success record's recipe differs from the recipe now (`payload`, whose
    fingerprint is `fingerprint_now`): None when its fingerprint and its own recipe
    fields both match, or when (`typed_numbers`: a built-in step, whose settings read
    `0` and `0.0` as one number; a user step's function sees the spelling) its recipe
    differs only in numbers spelled another way and its fingerprint is its own recipe's; else the
    field lines (`recipe_diff`, with the step's config `default`s and `progress`
    settings when given) of its
    recorded recipe against `payload`, [] when only its fingerprint differs. So a record
    whose `step`, `config` or `deps` were edited is drift, as one whose fingerprint was
    edited is."""
    lines = recipe_diff(recorded_payload(record), payload, default, progress=progress)
    if record.get("fingerprint") == fingerprint_now and not lines:
        return None
    if typed_numbers and only_respelled(lines) and edited_note(record) is None:
        return None
    return lines


def drift_warning(record: Record, artifact: Any) -> str | None:
    """What serving `record` as `artifact` (an `experiment.Artifact`: its `key`,
    `payload()`, `fingerprint` and `expect_fingerprint`) tells: None when the record holds
    the recipe now; else the drift warning of its `recipe_drift` lines and `edited_note`
    (`drift.drift_notice`), or DriftError when the artifact pins its fingerprint. One
    wording for planning and for a job serving another run's build."""
    data = record.to_json()
    lines = recipe_drift(data, artifact.payload(), artifact.fingerprint, getattr(artifact, "config_default", None),
                         getattr(artifact, "typed_numbers", False), getattr(artifact, "progress_setting", None))  # fmt: skip
    if lines is None:
        return None
    note = edited_note(data)
    lines = lines + ([note] if note else [])
    return drift_notice(artifact.key, record.fingerprint, artifact.fingerprint, lines, artifact.expect_fingerprint)


def identity_fields(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a record shared by success and failure: identity and recipe. Paths
    (the artifact's and each upstream's) are written prefix-relative, `name/version`."""
    return {
        "schema": RECORD_SCHEMA,
        "name": entry["name"],
        "version": entry["version"],
        "step": entry["step"],
        "fingerprint": entry["fingerprint"],
        "config": entry["config"],
        "deps": {role: _relative_dep(dep) for role, dep in entry["deps"].items()},
        "runtime": entry["runtime"],
        "path": f"{entry['name']}/{entry['version']}",
    }


def _relative_dep(dep: Any) -> Any:
    if isinstance(dep, list):
        return [_relative_dep(d) for d in dep]
    if isinstance(dep, Mapping) and "name" in dep and "version" in dep:
        return {**dep, "path": f"{dep['name']}/{dep['version']}"}
    return dep


def write_success(location: str, entry: Mapping[str, Any], result: Any, provenance: dict[str, Any]) -> Record:
    """List the artifact's files, then write its success record: one atomic write, the last."""
    data = {
        **identity_fields(entry), "status": "success", "result": result, "provenance": provenance,
        "files": list_data_files(location),
    }  # fmt: skip
    record = record_from_json(data, record_location(location))
    storage.write_json_atomic(record_location(location), record.to_json())
    return record


OTHER_EXPERIMENT_HINT = "rebuild it with the experiment that defines it (this one does not)"


def rebuild_hint(location: str, flags: str | None = "") -> str:
    """How to rebuild the artifact at `location` alone (its built consumers are served as
    they are): the end of a one-line error. `flags`: what else the command needs to plan
    the same experiment on the same prefix (`workflow.options.rerun_flags`); None: the
    artifact is not the experiment's (an older version), which no command of it rebuilds."""
    if flags is None:
        return OTHER_EXPERIMENT_HINT
    return f"rebuild it with: {rebuild_command(record_location(location), flags)}"


class UnreadableFile(StepError):
    """A file of the built artifact at `location` that cannot be read (`unreadable_file`).
    Raised inside a step; the job completes its rebuild command with `with_flags`, as
    a `CorruptRecord`'s. `built`: whether `location` holds a record (decided once, by
    `unreadable_file`); without one (data adopted in place) there is nothing to rebuild."""

    def __init__(self, field: str, path: str, location: str, reason: str, built: bool = True, flags: str = ""):
        self.field, self.path, self.location, self.reason, self.built = field, path, location, reason, built
        self.flags = flags
        if built:
            fix = f"the artifact is damaged; {rebuild_hint(location, flags)}"
        else:  # data adopted in place (`adopt`, copy false): no step of this workflow writes them
            fix = (f"the data are damaged, and {location} is not built by this workflow (no {RECORD_FILE}: "
                   "an adopted source?); restore its files there, or adopt a good copy under a new version")
        super().__init__(f"{field}: {path} is unreadable ({reason}): {fix}")

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (a worker process may raise it), flags kept
        return (UnreadableFile, (self.field, self.path, self.location, self.reason, self.built, self.flags))

    def with_flags(self, flags: str | None) -> UnreadableFile:
        """The same line, its `snakemake -f RECORD` followed by `flags`
        (`workflow.options.rerun_flags`), so that it runs as printed."""
        return UnreadableFile(self.field, self.path, self.location, self.reason, self.built, flags)


def unreadable_file(field: str, path: str, location: str, why: BaseException | str) -> UnreadableFile:
    """A file of the built artifact at `location` that cannot be read (corrupt, though
    of its recorded size): one line naming the field, the file and the fix."""
    reason = f"{type(why).__name__}: {why}" if isinstance(why, BaseException) else why
    try:
        built = storage.exists(record_location(location))
    except Exception:  # noqa: BLE001 - the storage cannot say (a network error): the usual fix
        built = True
    return UnreadableFile(field, path, location, " ".join(str(reason).split())[:200], built)


def verify_files(location: str, record: Record, contents: bool = False) -> list[str]:
    """One line per data file that is missing or whose size differs from the record
    ("missing model.json", "truncated tokens/train.bin: 100 of 4000 bytes"), and with
    `contents` (`marin verify`; consumers check what they load themselves) per file whose
    content differs from the digest its result holds (`files.recorded_digests`: a train
    run's final checkpoint, a tokenizer's files); [] when all agree."""
    problems = size_problems(location, record.files)
    if not contents:
        return list(problems.values())
    digests = {rel: d for rel, d in recorded_digests(record.result).items() if rel not in problems}
    changed = [line for line in content_problems(location, digests).values() if not line.startswith("missing ")]
    return [*problems.values(), *changed]


def write_failure(
    location: str,
    entry: Mapping[str, Any],
    error: BaseException,
    provenance: dict[str, Any],
    exit_status: int | str | None = None,
    process: int | None = None,
) -> str:
    """Write one failure record; returns its location. On a pod every process that
    fails writes its own (`process` is its index; the file name ends `-p<index>`
    except for process 0), so the cause is recorded even where it was not process 0."""
    stamp = history_stamp(when=provenance.get("ended") or None)
    record = {
        **identity_fields(entry),
        **({} if process is None else {"process": process}),
        **({"shard": entry["shard"]} if "shard" in entry else {}),
        "status": "failed",
        "error": {
            "type": type(error).__name__,
            "message": error_message(error),
            "traceback": "".join(tb.format_exception(type(error), error, error.__traceback__)),
            "exit_status": exit_status,
        },
        "provenance": provenance,
    }
    suffix = f"-p{process}" if process else ""
    target = storage.join(failures_location(location), f"{stamp}{suffix}.json")
    storage.write_json_atomic(target, record)
    return target


def error_message(error: BaseException) -> str:
    """`str(error)`, or a stand-in when the exception's own `__str__` raises (a failure
    must still be recorded)."""
    try:
        return str(error)
    except Exception as e:  # noqa: BLE001 - any error of a user's __str__
        return f"<the {type(error).__name__}'s message could not be made: {type(e).__name__}>"


def lenient_problem(data: Any) -> str | None:
    """Why a failure record (or a success record a forced rebuild kept), read leniently
    as a plain dict of any schema, cannot be used: it is not a JSON object, or its
    `error` or `provenance` is neither a mapping nor null (its readers look inside
    them); None when it can be."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {json.dumps(data)[:40]}"
    for name in ("error", "provenance"):
        if data.get(name) is not None and not isinstance(data[name], dict):
            return f"field {name} should be a mapping, got {json.dumps(data[name])[:40]}"
    return None


def read_failures(location: str) -> list[dict[str, Any]]:
    """All failure records, oldest first, as plain dicts: history of any schema is kept
    readable; an unreadable one (`lenient_problem`) is skipped."""
    folder = failures_location(location)
    try:
        files = storage.list_files(folder, "*.json")
    except FileNotFoundError:
        return []
    out = []
    for f in files:
        try:
            data = storage.read_json(f)
        except (FileNotFoundError, ValueError):
            continue
        if lenient_problem(data) is None:
            out.append(data)
    return out
