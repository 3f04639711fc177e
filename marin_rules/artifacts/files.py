"""The data files of an artifact, with their sizes.

Model: an artifact's data is every file under its folder except the bookkeeping: the
success record (and its temporary siblings), `.failures/`, `.history/`, `.attempt.json` and the lease
(`.lease.json` and its `.lock`, `.tmp-*` siblings), at the top and in shard folders
(`shards/*/`, which hold their own lease and `.failures/`), and the temporary file of
an atomic write a killed writer left (`storage.INTERRUPTED_WRITE`: the next attempt
removes them, `remove_interrupted_writes`). The success record lists them with
their sizes (one listing, local or remote); `size_problems` compares a listing made now
against that list (`file_problems`: its lines). A size cannot see a file garbled in place: where a step records the
contents of files its consumers must trust (the final checkpoint of a `train` run),
`file_digests` gives each one's digest, `xxh3:<hex>` of its bytes, or `crc32c:<base64>`
where the listing already carries the store's own checksum (GCS: no download), and
`content_problems` compares them again.

What an artifact keeps but does not serve (old builds, stale leftovers, damaged
checkpoints) goes under `.history/<UTC time>[-why]/`, at the place it had in the artifact
folder: `history_stamp` names the entry (failure records are named by the same
stamp), `move_into_history` moves one file or folder there; an artifact that keeps no
history (a dev version, `dev_versions.keeps_history`) has it deleted instead (`discard`).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Mapping

import xxhash

from marin_rules.artifacts import storage
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.identity import FAILURES_DIR, RECORD_FILE
from marin_rules.artifacts.lease import LEASE_FILE
from marin_rules.artifacts.provenance import iso, utc_now

HISTORY_DIR = ".history"
# in HISTORY_DIR, written by the workflow glue (`workflow/forcing.py`), read by inspection and the mirror:
FORCED_MARKER = ".forced-record"  # a forced build's saved record, until its job moves the old build
REBUILDING = ".rebuilding"  # a forced rebuild under way: where the old build went
FORCING_RUN = ".forced-by-run"  # beside FORCED_MARKER: the run that marked it (a lease holder's JSON)
ATTEMPT_FILE = ".attempt.json"  # the upstream builds the data in place was made from (`job/attempt.py`)
NOT_DATA = (RECORD_FILE, FAILURES_DIR, HISTORY_DIR, LEASE_FILE, ATTEMPT_FILE)


def is_inside(rel: str) -> bool:
    """Is `rel` (a path a record or an index lists) a path inside the artifact folder:
    relative, not empty, without `..` segments (a listing must never send a reader elsewhere)?"""
    return bool(rel) and not rel.startswith("/") and ".." not in rel.split("/")


def remove_interrupted_writes(location: str, under: str = "") -> list[str]:
    """Delete the temporary files that writers killed before their rename left in the
    artifact folder at `location` (or in its subfolder `under`, a shard's), outside its
    bookkeeping: never data, never read. Only the lease holder calls this, before its
    step, so no writer of this artifact is running. Local folders only (a gs:// write is
    one PUT). Returns their paths, relative to `location`."""
    if storage.is_remote(location):
        return []
    root = storage.local_path(location)
    removed = []
    for folder, subfolders, names in os.walk(os.path.join(root, under) if under else root):
        subfolders[:] = [d for d in subfolders if d not in (FAILURES_DIR, HISTORY_DIR)]
        for name in names:
            if storage.INTERRUPTED_WRITE.fullmatch(name) and not name.startswith((LEASE_FILE, RECORD_FILE)):
                os.remove(os.path.join(folder, name))
                removed.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(removed)


def removed_writes_phrase(removed: list[str]) -> str:
    """What `remove_interrupted_writes` removed, for the job's log line."""
    shown = ", ".join(removed[:3]) + (", ..." if len(removed) > 3 else "")
    return f"removed {len(removed)} temporary file(s) of writes an earlier attempt did not finish ({shown})"


def list_data_files(location: str) -> dict[str, int]:
    """Every data file under an artifact folder (relative path -> size), from one listing."""
    fs, root = storage.filesystem(location)
    root = root.rstrip("/")
    files = {}
    for rel, (_, info) in _relative(_listing(fs, root), root).items():
        parts = rel.split("/")
        if (
            parts[0] in NOT_DATA
            or parts[0].startswith(RECORD_FILE)
            or parts[-1].startswith(LEASE_FILE)
            or any(p in (FAILURES_DIR, HISTORY_DIR) for p in parts[:-1])
            or storage.INTERRUPTED_WRITE.fullmatch(parts[-1])
        ):
            continue
        files[rel] = int(info.get("size") or 0)
    return dict(sorted(files.items()))


def size_problems(location: str, expected: dict[str, int]) -> dict[str, str]:
    """For each expected file that is missing, shorter ("truncated") or of another size
    ("changed") than expected, its line, by relative path; {} when all are as expected."""
    found = list_data_files(location)
    problems = {}
    for rel, size in expected.items():
        if storage.INTERRUPTED_WRITE.fullmatch(rel.rsplit("/", 1)[-1]):
            continue  # a killed writer's leftover an older record listed: never data, and removed since
        if rel not in found:
            problems[rel] = f"missing {printable(rel)}"
        elif found[rel] < size:
            problems[rel] = f"truncated {printable(rel)}: {found[rel]} of {size} bytes"
        elif found[rel] != size:
            problems[rel] = f"changed {printable(rel)}: {found[rel]} bytes, recorded {size}"
    return problems


def file_problems(location: str, expected: dict[str, int]) -> list[str]:
    """The lines of `size_problems`; [] when all are there as expected."""
    return list(size_problems(location, expected).values())


def nested_records(location: str) -> list[str]:
    """The records of other artifacts in subfolders of the artifact folder `location`
    (`raw/a/v1@x`, of another experiment on the prefix, lies at raw/a/v1/x), relative,
    outside the bookkeeping folders: one listing."""
    fs, root = storage.filesystem(location)
    relative = _relative(_listing(fs, root.rstrip("/")), root.rstrip("/"))
    return sorted(rel for rel in relative if rel.endswith("/" + RECORD_FILE) and rel.split("/")[0] not in NOT_DATA)


def enclosing_record(prefix: str, path: str) -> str | None:
    """The folder above the artifact folder `path` (`name/version`) on `prefix` that holds
    another artifact's record (`raw/a/v1` for `raw/a/v1/x`), relative; None when none does."""
    parts = path.split("/")
    for depth in range(2, len(parts)):  # the folders above `name/version` that could be `name/version`
        outer = "/".join(parts[:depth])
        if storage.exists(storage.join(prefix, outer, RECORD_FILE)):
            return outer
    return None


DIGESTS = ("xxh3", "crc32c")
FINAL_CHECKPOINT_DIGESTS = "final_checkpoint_digests"  # in a train record's result: {path: digest}
FILE_DIGESTS = "file_digests"  # in a record's result: {path: digest} of the files a step names (`named_digests`)
RECORDED_DIGESTS = (FINAL_CHECKPOINT_DIGESTS, FILE_DIGESTS)  # the result fields that hold digests


def bytes_digest(data: bytes) -> str:
    """`file_digests`' xxh3 form of a file's bytes, from the bytes a step wrote (no second read)."""
    return _xxh3_form(xxhash.xxh3_64(data))


class DigestingWriter:
    """A binary file that digests what is written through it (`digest`: `file_digests`'
    xxh3 form of the whole file), so a step records a file's content at no second read."""

    def __init__(self, file: Any):
        self._file, self._hasher = file, xxhash.xxh3_64()

    def write(self, data: Any) -> int:
        self._hasher.update(data)
        return self._file.write(data)

    @property
    def digest(self) -> str:
        return _xxh3_form(self._hasher)


def named_digests(location: str, names: Any) -> dict[str, str]:
    """`file_digests`' form for the files `names` (paths relative to the artifact folder
    `location`; those not there are left out)."""
    fs, root = storage.filesystem(location)
    root = root.rstrip("/")
    wanted = set(names)
    return _digests(fs, {rel: pair for rel, pair in _relative(_listing(fs, root), root).items() if rel in wanted})


def recorded_digests(result: Any) -> dict[str, str]:
    """Every digest a record's result holds (`RECORDED_DIGESTS`), by relative path."""
    out: dict[str, str] = {}
    for key in RECORDED_DIGESTS:
        value = result.get(key) if isinstance(result, Mapping) else None
        if isinstance(value, Mapping):
            out.update({str(k): str(v) for k, v in value.items()})
    return out


def file_digests(location: str, under: str, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """The digest of every file under `under` (a folder inside the artifact folder
    `location`) but those in its subfolders `leave_out`: {path relative to `location`:
    `crc32c:<base64>` where the listing gives the store's checksum, else `xxh3:<hex>`}."""
    fs, root = storage.filesystem(location)
    root = root.rstrip("/")
    found = _relative(_listing(fs, f"{root}/{under.strip('/')}"), root)
    skipped = tuple(f"{under.strip('/')}/{name}/" for name in leave_out)
    return _digests(fs, {rel: pair for rel, pair in found.items() if not rel.startswith(skipped)})


def content_problems(location: str, expected: Mapping[str, str]) -> dict[str, str]:
    """For each file of `expected` (`file_digests`' form) that is missing or whose digest
    is not the one expected ("changed <rel>: its content is not what was recorded"), its
    line, by relative path; {} when all match. An entry this store cannot check without
    reading another's checksum (`crc32c` on a store whose listing has none: a local copy)
    is skipped."""
    if not expected:
        return {}
    fs, root = storage.filesystem(location)
    root = root.rstrip("/")
    common = posixpath.commonpath([posixpath.dirname(rel) for rel in expected])  # one listing of what they share
    found = _relative(_listing(fs, f"{root}/{common}" if common else root), root)
    problems = {}
    for rel, digest in expected.items():
        algorithm = str(digest).partition(":")[0]
        if rel not in found:
            problems[rel] = f"missing {printable(rel)}"
        elif algorithm not in DIGESTS or (algorithm == "crc32c" and not found[rel][1].get("crc32c")):
            continue
        elif _digest(fs, *found[rel], algorithm) != digest:
            problems[rel] = f"changed {printable(rel)}: its content is not what was recorded ({printable(str(digest))})"
    return problems


def _listing(fs: Any, folder: str) -> dict[str, dict]:
    try:
        return {p: i for p, i in fs.find(folder, detail=True).items() if i.get("type") != "directory"}
    except FileNotFoundError:
        return {}


def _relative(found: dict[str, dict], root: str) -> dict[str, tuple[str, dict]]:
    return {p[len(root) + 1 :]: (p, i) for p, i in found.items() if p.startswith(root + "/")}


def _digests(fs: Any, found: dict[str, tuple[str, dict]]) -> dict[str, str]:
    """`file_digests`' form of `found` (relative path -> (path, listing info)): the store's
    crc32c where the listing has it, else xxh3 of the bytes."""
    return {rel: _digest(fs, path, info, "crc32c" if info.get("crc32c") else "xxh3")
            for rel, (path, info) in sorted(found.items())}  # fmt: skip


def _digest(fs: Any, path: str, info: dict, algorithm: str) -> str:
    if algorithm == "crc32c":
        return f"crc32c:{info.get('crc32c')}"
    hasher = xxhash.xxh3_64()
    with fs.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            hasher.update(block)
    return _xxh3_form(hasher)


def _xxh3_form(hasher: Any) -> str:
    """`file_digests`' spelling of an xxh3 digest."""
    return f"xxh3:{hasher.hexdigest()}"


def history_stamp(why: str = "", when: str | None = None) -> str:
    """The name of a new entry under `.history/` (and of a failure record): the UTC time
    `when` (ISO, as `provenance.iso` writes it; now by default) without `-` and `:`
    (`20261204T231341.123Z`), then `-why` where given (`stale`, `damaged`)."""
    stamp = (when or iso(utc_now())).replace(":", "").replace("-", "")
    return f"{stamp}-{why}" if why else stamp


def move_into_history(location: str, part: str, why: str) -> str:
    """Move `part` (a file or folder inside the artifact folder `location`, such as
    `checkpoints/12`) to the same place under a new `.history/<history_stamp(why)>/`;
    returns where it went."""
    target = storage.join(location, HISTORY_DIR, history_stamp(why), part)
    storage.makedirs(storage.parent(target))
    storage.move(storage.join(location, part), target)
    return target


def history_entry(moved: str) -> str:
    """The `.history/<stamp>` folder that `moved` (a path under it) lies in: what to
    `discard` whole when an artifact keeps no history, so no emptied folder stays behind."""
    head, sep, rest = moved.rpartition(f"/{HISTORY_DIR}/")
    return f"{head}{sep}{rest.split('/', 1)[0]}" if sep else moved


def discard(location: str) -> None:
    """Delete a file or folder (recursively); nothing when it is gone already."""
    fs, path = storage.filesystem(location)
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass
