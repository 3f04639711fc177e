"""The local mirror of a remote prefix's success records.

Model: Snakemake checks outputs as local files, many times per job; on a `gs://` prefix
it sees `.snakemake/marin-mirror/<scheme>/<bucket/path>/<name>/<version>/.artifact.json`
instead. `refresh_mirror` makes that folder hold exactly the records found on the
prefix: ONE listing of the prefix (with sizes and generations), then only the records
that are new or changed since the last refresh are fetched, all in one concurrent
`cat` of many paths (with them the pointer `.history/.rebuilding` of a forced rebuild
under way, which planning reads). Records gone from the prefix are removed from the mirror. The
listing's per-record signature (generation or etag, size) is kept in
`<mirror>/.index.json`, so a refresh of an unchanged prefix fetches nothing. Shard
records (`shards/*/shard.json` of a sharded step) are mirrored alike, so a run on
another machine sees which shards are finished.
The real records and all data live on the prefix, written by the steps.
"""

from __future__ import annotations

import os

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import decode_json
from marin_rules.artifacts.files import HISTORY_DIR, REBUILDING
from marin_rules.artifacts.identity import RECORD_FILE
from marin_rules.artifacts.records import snakemake_path
from marin_rules.artifacts.shards import SHARD_RECORD, SHARDS_DIR

INDEX_FILE = ".index.json"  # relative record path -> signature of the remote object


def records_root(prefix: str) -> str:
    """Where Snakemake sees the records of `prefix`: the prefix itself, or the local
    mirror of a remote one."""
    return snakemake_path(prefix)


def _signature(info: dict) -> str:
    """What changes whenever a remote object is rewritten: generation (GCS), else etag/
    md5, always with the size."""
    tag = info.get("generation") or info.get("etag") or info.get("md5Hash") or info.get("mtime") or ""
    return f"{tag}:{info.get('size')}"


def _read_index(mirror: str) -> dict[str, str]:
    try:
        with open(os.path.join(mirror, INDEX_FILE), encoding="utf-8") as f:
            index = decode_json(f.read())
        return index if isinstance(index, dict) else {}
    except (FileNotFoundError, ValueError):
        return {}


def _is_record(path: str) -> bool:
    """A success record, or a shard record, not kept history; or the pointer of a forced
    rebuild under way (`workflow/forcing.py`: planning schedules such an artifact)."""
    if path.endswith(f"/{HISTORY_DIR}/{REBUILDING}"):
        return True
    if f"/{HISTORY_DIR}/" in path:
        return False
    return path.endswith("/" + RECORD_FILE) or (path.endswith("/" + SHARD_RECORD) and f"/{SHARDS_DIR}/" in path)


def refresh_mirror(prefix: str, mirror: str) -> None:
    """Make the local mirror hold exactly the records found on a remote prefix (one listing,
    one bulk fetch of the new or changed ones)."""
    fs, root = storage.filesystem(prefix)
    root = root.rstrip("/")
    fs.invalidate_cache(root)  # another process may have written since this one listed
    try:
        listing = fs.find(root, detail=True)
    except FileNotFoundError:
        listing = {}
    remote = {
        path[len(root) + 1 :]: (path, _signature(info))
        for path, info in listing.items()
        if _is_record(path)
    }
    known = _read_index(mirror)
    present = set()
    if os.path.isdir(mirror):
        for dirpath, _, files in os.walk(mirror):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), mirror).replace(os.sep, "/")
                if not _is_record("/" + rel):
                    continue
                if rel in remote:
                    present.add(rel)
                else:
                    os.remove(os.path.join(dirpath, f))
    stale = {rel: path for rel, (path, sig) in remote.items() if rel not in present or known.get(rel) != sig}
    fetched = fs.cat(list(stale.values()), on_error="omit") if stale else {}
    index = {rel: sig for rel, (_, sig) in remote.items() if rel not in stale}
    for rel, path in stale.items():
        data = fetched.get(path)
        if data is None:  # deleted between the listing and the fetch
            local = os.path.join(mirror, rel)
            if os.path.exists(local):
                os.remove(local)
            continue
        storage.write_bytes_atomic(os.path.join(mirror, rel), data, durable=False)
        index[rel] = remote[rel][1]
    if remote or os.path.isdir(mirror):
        storage.write_json_atomic(os.path.join(mirror, INDEX_FILE), index)
