"""Dolma-style document shards: what `download` writes and everything else reads.

Model: a split of a raw-data artifact is a folder of gzipped JSON-lines shards
`{artifact}/{split}/shard-00000.jsonl.gz`, ... Each line is one document
`{id, text, source, added, metadata}` (the Dolma format). Shards are read in name
order and lines in file order, so a split is one deterministic sequence of
documents. Works on any fsspec location (local path, `gs://...`).
"""

from __future__ import annotations

import gzip
import io
import json
from typing import Any, Iterable, Iterator

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import StepError

MANIFEST = "manifest.json"  # written last by `download`: lists the shards of each split
SPLITS = ("train", "heldout")
SHARD_PATTERN = "shard-*.jsonl.gz"
SHARD_BYTES = 64 * 2**20  # start a new shard after this much uncompressed JSON


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.jsonl.gz"


def write_split(location: str, split: str, docs: Iterable[dict[str, Any]], compresslevel: int = 5) -> list[str]:
    """Write documents as shards under `{location}/{split}/`; returns the shard
    names (relative to the split). Always writes at least one (maybe empty) shard,
    so every split of an artifact has the same layout. `compresslevel` (gzip's 1-9)
    trades size for speed."""
    lines = (json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8") for doc in docs)
    return write_lines(location, split, lines, compresslevel)


def write_lines(location: str, split: str, lines: Iterable[bytes], compresslevel: int = 5) -> list[str]:
    """`write_split` for documents that are JSON lines already (copied unchanged)."""
    names: list[str] = []
    buffer = io.BytesIO()

    def flush() -> None:
        name = shard_name(len(names))
        data = gzip.compress(buffer.getvalue(), compresslevel=compresslevel, mtime=0)
        storage.write_bytes_atomic(storage.join(location, split, name), data)
        names.append(name)
        buffer.seek(0)
        buffer.truncate()

    for line in lines:
        buffer.write(line + b"\n")
        if buffer.tell() >= SHARD_BYTES:
            flush()
    if buffer.tell() or not names:
        flush()
    return names


def split_shards(location: str, split: str) -> list[str]:
    """The shard files present under a split folder, in name order."""
    folder = storage.join(location, split)
    return storage.list_files(folder, SHARD_PATTERN) if storage.exists(folder) else []


def read_manifest(location: str, field: str = "deps.corpus") -> dict[str, Any]:
    manifest = storage.join(location, MANIFEST)
    if not storage.exists(manifest):
        raise StepError(f"{field}: {manifest} is missing: is {location} a finished `download` artifact?")
    return storage.read_json(manifest)


def read_split(location: str, split: str, field: str = "deps.corpus") -> Iterator[dict[str, Any]]:
    """Every document of a split, in order (the shards its manifest lists)."""
    for line in read_lines(location, split, field):
        yield json.loads(line)


def read_lines(location: str, split: str, field: str = "deps.corpus") -> Iterator[bytes]:
    """Every document of a split as its JSON line, unparsed, in order."""
    for name in read_manifest(location, field)["shards"][split]:
        yield from _lines(storage.join(location, split, name))


def remove(location: str) -> None:
    """Delete a file if it is there (another job may delete it at the same time)."""
    fs, path = storage.filesystem(location)
    try:
        fs.rm(path)
    except FileNotFoundError:
        pass


def _lines(location: str) -> list[bytes]:
    return [line for line in gzip.decompress(storage.read_bytes(location)).splitlines() if line.strip()]


def _streamed_lines(location: str) -> Iterator[bytes]:
    """`_lines`, decompressed while they are read (the first come before the file ends)."""
    with storage.open_file(location, "rb") as raw, gzip.GzipFile(fileobj=raw) as lines:
        for line in lines:
            if line.strip():
                yield line


def read_range(location: str, split: str, start: int, stop: int, field: str = "deps.corpus") -> Iterator[dict[str, Any]]:
    """Documents `start` .. `stop - 1` of a split, in order. Files and lines before
    `start` are counted, not parsed (a shard job reads only its share as JSON)."""
    position = 0
    for name in read_manifest(location, field)["shards"][split]:
        if position >= stop:
            return
        if position >= start:  # nothing to skip in this file: parse lines as they are decompressed
            for line in _streamed_lines(storage.join(location, split, name)):
                if position >= stop:
                    return
                yield json.loads(line)
                position += 1
            continue
        lines = _lines(storage.join(location, split, name))
        if position + len(lines) <= start:
            position += len(lines)
            continue
        for line in lines[max(0, start - position) : stop - position]:
            yield json.loads(line)
        position += len(lines)
