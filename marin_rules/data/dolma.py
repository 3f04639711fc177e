"""Dolma-style document shards: what `download` writes and everything else reads.

Model: a split of a raw-data artifact is a folder of gzipped JSON-lines shards
`{artifact}/{split}/shard-00000.jsonl.gz`, ... Each line is one document
`{id, text, source, added, metadata}` (the Dolma format). Shards are read in name
order and lines in file order, so a split is one deterministic sequence of
documents. Lines are standard JSON (UTF-8, no NaN or Infinity). Works on any
fsspec location (local path, `gs://...`). A damaged shard (truncated or corrupt
gzip, not gzip at all, a line that is not JSON, a document that is not an object
with a string `text`, a shard the manifest lists but lacks) is one StepError line naming
the field (`deps.corpus`), the shard and the document, never a bare EOFError or KeyError;
a damaged `manifest.json` (not JSON, or without the fields its readers use:
`manifest_problem`) is one `unreadable_file` line naming it.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import zlib
from typing import Any, Iterable, Iterator

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import StepError, decode_json, json_problem
from marin_rules.artifacts.files import bytes_digest
from marin_rules.artifacts.records import unreadable_file

MANIFEST = "manifest.json"  # written last by `download`: lists the shards of each split
SPLITS = ("train", "heldout")
SHARD_PATTERN = "shard-*.jsonl.gz"
SHARD_BYTES = 64 * 2**20  # start a new shard after this much uncompressed JSON


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.jsonl.gz"


def write_split(location: str, split: str, docs: Iterable[dict[str, Any]], compresslevel: int = 5,
                digests: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    """Write documents as shards under `{location}/{split}/`; returns the shard
    names (relative to the split). Always writes at least one (maybe empty) shard,
    so every split of an artifact has the same layout. `compresslevel` (gzip's 1-9)
    trades size for speed. Lines are standard JSON, which other readers accept: a NaN
    or infinite number raises ValueError, as a lone surrogate does (UnicodeEncodeError),
    and the caller names the document. The check is the encoder's own (no extra pass)."""
    lines = (json.dumps(doc, ensure_ascii=False, sort_keys=True, allow_nan=False).encode("utf-8") for doc in docs)
    return write_lines(location, split, lines, compresslevel, digests)


def write_lines(location: str, split: str, lines: Iterable[bytes], compresslevel: int = 5,
                digests: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    """`write_split` for documents that are JSON lines already (copied unchanged). With
    `digests`, each shard's `file_digests` entry (`{split}/{name}`) is added to it, from
    the bytes written (no second read)."""
    names: list[str] = []
    buffer = io.BytesIO()

    def flush() -> None:
        name = shard_name(len(names))
        data = gzip.compress(buffer.getvalue(), compresslevel=compresslevel, mtime=0)
        storage.write_bytes_atomic(storage.join(location, split, name), data)
        if digests is not None:
            digests[f"{split}/{name}"] = bytes_digest(data)
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
    """The manifest of the corpus at `location`, with the fields its readers use checked
    (`manifest_problem`); a damaged one is one `unreadable_file` line naming it. `field`:
    how the step names the corpus (`deps.corpus`, `deps.data`)."""
    manifest = storage.join(location, MANIFEST)
    if not storage.exists(manifest):
        raise StepError(f"{field}: {manifest} is missing: is {location} a finished `download` artifact?")
    try:
        value = storage.read_json(manifest)
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise unreadable_file(field, manifest, location, e) from None
    problem = manifest_problem(value)
    if problem:
        raise unreadable_file(field, manifest, location, problem)
    return value


def manifest_problem(manifest: Any) -> str | None:
    """What is wrong with a parsed manifest for its readers, or None: it must be an object
    with `shards` ({split: [shard file name, ...]}) and a `train_documents` count (and, where
    present, a `heldout_documents` count)."""
    if type(manifest) is not dict:
        return f"it is {json_kind(manifest)}, not a JSON object"
    shards = manifest.get("shards")
    if type(shards) is not dict:
        return "no `shards` object ({split: [shard file names]})"
    for split, names in shards.items():
        if type(names) is not list or not all(type(n) is str and _plain_name(n) for n in names):
            return f"shards.{split} is not a list of shard file names"
    for key in ("train_documents", "heldout_documents"):
        count = manifest.get(key)
        if (key == "train_documents" or key in manifest) and (type(count) is not int or count < 0):
            return f"`{key}` is {json_kind(count) if key in manifest else 'missing'}, not a count of documents"
    return None


def split_documents(location: str, manifest: dict[str, Any], split: str, field: str = "deps.corpus") -> int:
    """How many documents `split` of the corpus at `location` holds: its manifest's
    `{split}_documents` where it has one (a checked one: `manifest_problem`); else, as
    only `train_documents` is required (data adopted from elsewhere may lack the
    held-out count, or the held-out split), the documents of the shards it lists for
    `split` counted, 0 when it lists none."""
    key = f"{split}_documents"
    if key in manifest:
        return manifest[key]
    if split not in manifest["shards"]:
        return 0
    return sum(1 for _ in read_lines(location, split, field))


def _plain_name(name: str) -> bool:
    """A file name inside its split folder (no folder part, no `..`)."""
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def shard_names(location: str, split: str, field: str = "deps.corpus") -> list[str]:
    """The shard file names the manifest lists for `split`, in order."""
    shards = read_manifest(location, field)["shards"]
    if split not in shards:
        raise unreadable_file(field, storage.join(location, MANIFEST), location, f"it lists no {split!r} shards")
    return shards[split]


def read_split(location: str, split: str, field: str = "deps.corpus") -> Iterator[dict[str, Any]]:
    """Every document of a split, in order (the shards its manifest lists)."""
    for name in shard_names(location, split, field):
        path = storage.join(location, split, name)
        yield from _documents(path, _lines(path, field), field)


def read_lines(location: str, split: str, field: str = "deps.corpus") -> Iterator[bytes]:
    """Every document of a split as its JSON line, unparsed, in order."""
    for name in shard_names(location, split, field):
        yield from _lines(storage.join(location, split, name), field)


def remove(location: str) -> None:
    """Delete a file if it is there (another job may delete it at the same time)."""
    fs, path = storage.filesystem(location)
    try:
        fs.rm(path)
    except FileNotFoundError:
        pass


GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)  # what a damaged or mislabelled .gz raises
GZIP_MAGIC = b"\x1f\x8b"


def gzip_problem(e: BaseException, is_gzip: bool) -> str:
    """What is wrong with a file whose decompression raised one of `GZIP_ERRORS`, as the
    end of "<file> ...": "is truncated (...)", "is not gzip-compressed (...)", "is corrupt
    (...)". `is_gzip`: the file starts as gzip does (then "Not a gzipped file" is about
    bytes after its gzip data)."""
    if isinstance(e, EOFError):
        return "is truncated (its gzip data ends before the end-of-stream marker)"
    text = str(e)
    if text.startswith("Not a gzipped file") and not is_gzip:  # "Not a gzipped file (b'{\"')": its first bytes
        return f"is not gzip-compressed (it starts with {text[len('Not a gzipped file') :].strip(' ()')})"
    kind = "zlib.error" if isinstance(e, zlib.error) else type(e).__name__
    return f"is corrupt ({kind}: {' '.join(text.split())[:200]})"


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words ("an array", "a string")."""
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


DAMAGED = "the shard is damaged; copy it again or rebuild the corpus"
NO_TEXT = "every document needs a string `text`; fix the shard or rebuild the corpus"


def shard_error(field: str, path: str, problem: str, fix: str = DAMAGED) -> StepError:
    return StepError(f"{field}: {path} {problem}: {fix}")


MISSING = f"is missing, though {MANIFEST} lists it"


def _lines(location: str, field: str = "deps.corpus") -> list[bytes]:
    try:
        data = storage.read_bytes(location)
    except FileNotFoundError:
        raise shard_error(field, location, MISSING) from None
    try:
        data = gzip.decompress(data)
    except GZIP_ERRORS as e:
        raise shard_error(field, location, gzip_problem(e, data[:2] == GZIP_MAGIC)) from None
    return [line for line in data.splitlines() if line.strip()]


def _streamed_lines(location: str) -> Iterator[bytes]:
    """`_lines`, decompressed while they are read (the first come before the file ends);
    a damaged file raises one of `GZIP_ERRORS` when its damage is reached."""
    with storage.open_file(location, "rb") as raw, gzip.GzipFile(fileobj=raw) as lines:
        for line in lines:
            if line.strip():
                yield line


def _documents(path: str, lines: Iterable[bytes], field: str, first: int = 0) -> Iterator[dict[str, Any]]:
    """The documents of JSON `lines` of the shard `path` (`first`: the index of the first
    line among the shard's non-blank lines); a line that is not a JSON object with a
    string `text`, or a damaged gzip stream, is a StepError naming the shard."""
    index = first - 1
    try:
        for index, line in enumerate(lines, first):
            doc = decode_json(line, max_depth=None)  # only `text` is read
            if type(doc) is not dict or type(doc.get("text")) is not str:
                what = "has no string `text` field" if type(doc) is dict else f"is {json_kind(doc)}, not a JSON object"
                raise shard_error(field, path, f"document {index + 1} {what}", NO_TEXT)
            if (b"\\ud" in line or b"\\uD" in line) and not _utf8_encodable(doc["text"]):  # only an escape makes one
                raise shard_error(field, path, f"document {index + 1} has a lone surrogate in `text` (a JSON \\ud800-"
                                  "\\udfff escape UTF-8 cannot encode)", "replace or remove it in the shard")  # fmt: skip
            yield doc
    except FileNotFoundError:  # opened when first read (`_streamed_lines`)
        raise shard_error(field, path, MISSING) from None
    except GZIP_ERRORS as e:  # decompressed while read (`_streamed_lines`): gzip if lines came out
        raise shard_error(field, path, gzip_problem(e, index >= first)) from None
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise shard_error(field, path, f"document {index + 1} is {json_problem(e)}") from None


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_range(
    location: str, split: str, start: int, stop: int, field: str = "deps.corpus", *, last: bool = False
) -> Iterator[dict[str, Any]]:
    """Documents `start` .. `stop - 1` of a split, in order. Files and lines before
    `start` are counted, not parsed (a shard job reads only its share as JSON). With
    `last` (`stop` is the count the manifest gives), a line after them is `surplus_error`:
    a manifest that undercounts its shards would otherwise cut the split short unseen."""
    position = 0
    names = shard_names(location, split, field)
    for at, name in enumerate(names):
        if position >= stop:
            if last:
                _check_no_more(location, split, names[at:], stop, field)
            return
        path = storage.join(location, split, name)
        if position >= start:  # nothing to skip in this file: parse lines as they are decompressed
            streamed = _streamed_lines(path)
            for doc in _documents(path, itertools.islice(streamed, stop - position), field):
                yield doc
                position += 1
            if last and position >= stop and _has_more(streamed, path, field):
                raise surplus_error(location, split, stop, path, field)
            continue
        lines = _lines(path, field)
        if position + len(lines) <= start:
            position += len(lines)
            continue
        first = max(0, start - position)
        yield from _documents(path, lines[first : stop - position], field, first)
        if last and position + len(lines) > stop:
            raise surplus_error(location, split, stop, path, field)
        position += len(lines)


def _check_no_more(location: str, split: str, names: list[str], stop: int, field: str) -> None:
    for name in names:
        path = storage.join(location, split, name)
        if _has_more(_streamed_lines(path), path, field):
            raise surplus_error(location, split, stop, path, field)


def _has_more(lines: Iterator[bytes], path: str, field: str) -> bool:
    """Does `lines` (`_streamed_lines` of `path`) hold another line? A missing or damaged
    shard is `shard_error`, as for the lines read before."""
    try:
        return next(lines, None) is not None
    except FileNotFoundError:
        raise shard_error(field, path, MISSING) from None
    except GZIP_ERRORS as e:
        raise shard_error(field, path, gzip_problem(e, True)) from None


def surplus_error(location: str, split: str, count: int, path: str, field: str = "deps.corpus") -> StepError:
    """A split whose shards hold more documents than its manifest's count (data adopted
    from elsewhere, a manifest edited by hand): reading stops nowhere silently."""
    return StepError(
        f"{field}: {storage.join(location, MANIFEST)} gives {count} {split} document(s), but its {split} shards hold "
        f"more (the next one is in {path}); correct `{split}_documents` in manifest.json to the shards' count"
    )
