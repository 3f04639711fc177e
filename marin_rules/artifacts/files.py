"""The data files of an artifact, with their sizes.

Model: an artifact's data is every file under its folder except the bookkeeping: the
success record (and its temporary siblings), `.failures/`, `.history/`, `.attempt.json` and the lease
(`.lease.json` and its `.lock`, `.tmp-*` siblings), at the top and in shard folders
(`shards/*/`, which hold their own lease and `.failures/`). The success record lists them with
their sizes (one listing, local or remote); `file_problems` compares a listing made now
against that list.
"""

from __future__ import annotations

from marin_rules.artifacts import storage
from marin_rules.artifacts.identity import FAILURES_DIR, RECORD_FILE
from marin_rules.artifacts.lease import LEASE_FILE

HISTORY_DIR = ".history"
# in HISTORY_DIR, written by the workflow glue (`workflow/forcing.py`), read by inspection and the mirror:
FORCED_MARKER = ".forced-record"  # a forced build's saved record, until its job moves the old build
REBUILDING = ".rebuilding"  # a forced rebuild under way: where the old build went
ATTEMPT_FILE = ".attempt.json"  # the upstream builds the data in place was made from (`job/attempt.py`)
NOT_DATA = (RECORD_FILE, FAILURES_DIR, HISTORY_DIR, LEASE_FILE, ATTEMPT_FILE)


def is_inside(rel: str) -> bool:
    """Is `rel` (a path a record or an index lists) a path inside the artifact folder:
    relative, not empty, without `..` segments (a listing must never send a reader elsewhere)?"""
    return bool(rel) and not rel.startswith("/") and ".." not in rel.split("/")


def list_data_files(location: str) -> dict[str, int]:
    """Every data file under an artifact folder (relative path -> size), from one listing."""
    fs, root = storage.filesystem(location)
    root = root.rstrip("/")
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    files = {}
    for path, info in found.items():
        rel = path[len(root) + 1 :] if path.startswith(root + "/") else path
        parts = rel.split("/")
        if (
            parts[0] in NOT_DATA
            or parts[0].startswith(RECORD_FILE)
            or parts[-1].startswith(LEASE_FILE)
            or any(p in (FAILURES_DIR, HISTORY_DIR) for p in parts[:-1])
            or info.get("type") == "directory"
        ):
            continue
        files[rel] = int(info.get("size") or 0)
    return dict(sorted(files.items()))


def file_problems(location: str, expected: dict[str, int]) -> list[str]:
    """One line per expected file that is missing, shorter ("truncated") or of another
    size ("changed") than expected; [] when all are there as expected."""
    found = list_data_files(location)
    problems = []
    for rel, size in expected.items():
        if rel not in found:
            problems.append(f"missing {rel}")
        elif found[rel] < size:
            problems.append(f"truncated {rel}: {found[rel]} of {size} bytes")
        elif found[rel] != size:
            problems.append(f"changed {rel}: {found[rel]} bytes, recorded {size}")
    return problems
