"""Bad input files for `download` and bad Dolma shards for its consumers: each is one
StepError line naming the file (and the field), saying how to fix it, never a bare
UnicodeDecodeError / EOFError / BadGzipFile / AttributeError / KeyError; a failed
download leaves no manifest.json (nothing that looks done)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.data import dolma
from marin_rules.data.dedup import dedup
from marin_rules.data.download import download
from marin_rules.data.tokenizer import train_tokenizer

GOOD_RECORDS = [{"id": f"d{i}", "text": f"document {i}: " + "some words of text " * 20} for i in range(40)]
GOOD_GZ = gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in GOOD_RECORDS), mtime=0)


def exactly(message: str) -> str:
    """A `match=` pattern for the whole one-line message."""
    return "^" + re.escape(message) + "$"


def failed_download(tmp_path: Path, write: Callable[[Path], Path], expected: str) -> None:
    """Write one bad file under `src/`, download that folder and check the exact message
    (`{src}` in `expected` stands for the folder) and that no manifest was written."""
    src = tmp_path / "src"
    src.mkdir()
    write(src)
    out = tmp_path / "raw"
    with pytest.raises(StepError, match=exactly(expected.replace("{src}", str(src)))):
        download(StepContext("raw/bad", "v1", {"source": str(src)}, {}, {}, str(out)))
    assert not (out / dolma.MANIFEST).exists()


# ---- download: bad source files ------------------------------------------------------


def test_latin1_txt_is_named_with_the_byte_and_line(tmp_path):
    failed_download(
        tmp_path,
        lambda src: (src / "cafe.txt").write_bytes("first line\ncafé au lait\n".encode("latin-1")),
        "config.source: {src}/cafe.txt is not UTF-8 (byte 0xe9 on line 2): re-encode it as UTF-8",
    )


def test_latin1_jsonl_is_named_with_the_byte_and_line(tmp_path):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n'),
        "config.source: {src}/a.jsonl is not UTF-8 (byte 0xe9 on line 2): re-encode it as UTF-8",
    )


def test_truncated_jsonl_gz_says_copy_it_again(tmp_path):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl.gz").write_bytes(GOOD_GZ[: len(GOOD_GZ) // 2]),
        "config.source: {src}/a.jsonl.gz is truncated (its gzip data ends before the end-of-stream marker): "
        "copy it again",
    )


def test_an_empty_json_gz_is_an_interrupted_copy_not_an_empty_file(tmp_path):
    failed_download(
        tmp_path,
        lambda src: ((src / "x.jsonl").write_text('{"text": "kept"}\n'), (src / "part-0001.json.gz").write_bytes(b"")),
        "config.source: {src}/part-0001.json.gz is empty (0 bytes: gzip data has at least a header): copy it again",
    )


def test_plain_text_named_jsonl_gz_says_rename_or_compress(tmp_path):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl.gz").write_bytes(b'{"text": "not compressed"}\n'),
        "config.source: {src}/a.jsonl.gz is not gzip-compressed (it starts with b'{\"'): "
        "rename it to .jsonl, or compress it with gzip",
    )


def test_corrupt_jsonl_gz_is_named_as_damaged(tmp_path):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl.gz").write_bytes(GOOD_GZ[:20] + b"\x00" * 40 + GOOD_GZ[60:]),
        "config.source: {src}/a.jsonl.gz is corrupt (zlib.error: Error -3 while decompressing data: "
        "invalid bit length repeat): the file is damaged: copy it again",
    )


@pytest.mark.parametrize(
    ("line", "kind"), [(b"[1, 2]", "an array"), (b'"just text"', "a string"), (b"7", "a number"), (b"null", "null")]
)
def test_a_json_line_that_is_not_an_object_is_named_by_line(tmp_path, line, kind):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl").write_bytes(b'{"text": "ok"}\n\n' + line + b"\n"),
        f"config.source: {{src}}/a.jsonl line 3 is {kind}, not a JSON object: "
        'each line must be one document, an object like {"text": "..."}',
    )


def test_a_record_without_text_is_named_by_line(tmp_path):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl").write_bytes(b'{"text": "ok"}\n{"body": "no text"}\n'),
        "config.source: {src}/a.jsonl line 2 has no string `text` field: give each document a string `text`",
    )


def test_a_lone_surrogate_in_text_is_named_by_line_not_raised_when_writing(tmp_path):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "bad \\ud800 here"}\n'),
        "config.source: {src}/a.jsonl line 2 has a lone surrogate '\\ud800' in `text` (UTF-8 cannot encode it): "
        "replace or remove it in the source",
    )


@pytest.mark.parametrize(
    ("record", "key", "field"),
    [
        ({"id": "x1", "text": "ok", "metadata": {"title": "bad \ud800"}}, "x1", "metadata.title"),
        ({"text": "ok", "metadata": {"author": ["fine", "bad \udfff"]}}, "a:0", "metadata.author"),
        ({"id": "bad \ud800", "text": "ok"}, "bad \\ud800", "id"),
    ],
)
def test_a_lone_surrogate_in_metadata_is_named_by_document_and_field(tmp_path, record, key, field):
    char = "\\udfff" if field == "metadata.author" else "\\ud800"
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl").write_text(json.dumps(record) + "\n"),  # json.dumps escapes: "\ud800"
        f"config.source: {{src}}/a.jsonl document '{key}' has a lone surrogate '{char}' in `{field}` "
        "(UTF-8 cannot encode it): replace or remove it in the source",
    )


NO_JSON_FORM = "has no stable JSON form for the corpus shards; use a finite number or a string in the source"


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        (b'{"text": "t", "metadata": {"score": NaN}}', "metadata.score", "nan"),
        (b'{"text": "t", "metadata": {"stats": {"loss": [1.5, -Infinity]}}}', "metadata.stats.loss[1]", "-inf"),
        (b'{"text": "t", "metadata": {"big": 1e999}}', "metadata.big", "inf"),  # read as Infinity
    ],
    ids=["nan", "nested-infinity", "overflowing-number"],
)
def test_nan_in_source_metadata_is_refused_naming_document_and_field(tmp_path, line, field, value):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl").write_bytes(b'{"text": "ok", "metadata": {"score": 0.5}}\n' + line + b"\n"),
        f"config.source: {{src}}/a.jsonl document 'a:1', `{field}`: {value} {NO_JSON_FORM}",
    )


def test_nan_in_parquet_metadata_is_refused_naming_document_and_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": ["a", "b"], "metadata": [{"score": 1.0}, {"score": float("nan")}]})
    failed_download(
        tmp_path,
        lambda src: pq.write_table(table, src / "p.parquet"),
        f"config.source: {{src}}/p.parquet document 'p:1', `metadata.score`: nan {NO_JSON_FORM}",
    )


def test_shards_are_standard_json_and_nan_outside_the_copied_metadata_is_not_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_bytes(b'{"text": "t", "meta": {"score": NaN}, "metadata": {"score": 0.25}}\n')
    download(StepContext("raw/good", "v1", {"source": str(src)}, {}, {}, str(tmp_path / "raw")))

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in a shard")

    lines = gzip.decompress((tmp_path / "raw" / "train" / dolma.shard_name(0)).read_bytes()).splitlines()
    assert [json.loads(line, parse_constant=refuse)["metadata"]["score"] for line in lines] == [0.25]


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system that takes any bytes in names")
def test_a_file_name_that_is_not_utf8_says_rename_it(tmp_path):
    def write(src: Path) -> None:
        with open(os.path.join(os.fsencode(src), b"\xff\xfe.txt"), "wb") as f:
            f.write(b"hello there")

    failed_download(
        tmp_path,
        write,
        "config.source: the file name {src}/\\xff\\xfe.txt is not valid UTF-8 (bytes \\xff\\xfe): rename the file",
    )


def test_a_parquet_file_that_is_not_parquet_is_named(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.parquet").write_bytes(b"this is not parquet at all")
    start = re.escape(f"config.source: {src}/a.parquet is not a readable Parquet file (")
    expected = rf"^{start}.+\): the file is damaged: copy it again$"
    with pytest.raises(StepError, match=expected):
        download(StepContext("raw/bad", "v1", {"source": str(src)}, {}, {}, str(tmp_path / "raw")))
    assert not (tmp_path / "raw" / dolma.MANIFEST).exists()


def test_good_files_beside_the_bad_ones_still_download(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl.gz").write_bytes(GOOD_GZ)
    (src / "b.txt").write_text("naïve café — “quoted”\n")
    pair = json.dumps({"text": "escaped \\u00e9 and a pair \ud83d\ude00", "metadata": {"title": "T"}})  # valid escapes
    (src / "c.jsonl").write_text(pair + "\n")
    result = download(StepContext("raw/good", "v1", {"source": str(src)}, {}, {}, str(tmp_path / "raw")))
    assert result["documents"] == len(GOOD_RECORDS) + 2
    texts = {d["text"] for d in dolma.read_split(str(tmp_path / "raw"), "train")}
    assert "naïve café — “quoted”\n" in texts and "escaped \\u00e9 and a pair 😀" in texts


def test_a_byte_order_mark_is_not_part_of_the_first_document_or_json_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "bom.txt").write_bytes(b"\xef\xbb\xbfWritten by Notepad\n")
    (src / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "first line"}\n')  # json.loads would refuse the mark
    download(StepContext("raw/bom", "v1", {"source": str(src)}, {}, {}, str(tmp_path / "raw")))
    texts = {d["text"] for d in dolma.read_split(str(tmp_path / "raw"), "train")}
    assert texts == {"Written by Notepad\n", "first line"}


# ---- Dolma shards (a downloaded or adopted corpus) read by consumers -----------------


@pytest.fixture(scope="module")
def built_corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    (root / "src").mkdir()
    (root / "src" / "a.jsonl.gz").write_bytes(GOOD_GZ)
    download(StepContext("raw/good", "v1", {"source": str(root / "src"), "heldout": ["d0"]}, {}, {}, str(root / "raw")))
    return root / "raw"


@pytest.fixture
def corpus(built_corpus, tmp_path) -> Path:
    """A fresh copy of a good corpus, as an adopted folder would be, to damage by hand."""
    copy = tmp_path / "corpus"
    shutil.copytree(built_corpus, copy)
    return copy


def shard(corpus: Path) -> Path:
    return corpus / "train" / dolma.shard_name(0)


def set_shard_lines(corpus: Path, lines: list[bytes]) -> None:
    shard(corpus).write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines)))


def shard_lines(corpus: Path) -> list[bytes]:
    return gzip.decompress(shard(corpus).read_bytes()).splitlines()


def every_reader(corpus: Path) -> list[Callable[[], object]]:
    """Each way the corpus is read: whole split, a range (streamed, and after a skip),
    unparsed lines (dedup's gather), and the consumer steps themselves."""
    location = str(corpus)
    tok, dedup_out = str(corpus.parent / "tok"), str(corpus.parent / "dedup")
    return [
        lambda: list(dolma.read_split(location, "train")),
        lambda: list(dolma.read_range(location, "train", 0, 39)),
        lambda: list(dolma.read_range(location, "train", 5, 39)),
        lambda: train_tokenizer(StepContext("tokenizers/t", "v1", {"vocab_size": 400}, {"corpus": location}, {}, tok)),
        lambda: dedup(StepContext("dedup/d", "v1", {}, {"corpus": location}, {}, dedup_out)),
    ]


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda data: data[: len(data) // 2], "is truncated (its gzip data ends before the end-of-stream marker)"),
        (gzip.decompress, "is not gzip-compressed (it starts with b'{\"')"),
    ],
    ids=["truncated", "not-gzipped"],
)  # fmt: skip
def test_a_damaged_shard_file_is_named_by_every_reader(corpus, damage, problem):
    shard(corpus).write_bytes(damage(shard(corpus).read_bytes()))
    expected = exactly(f"deps.corpus: {shard(corpus)} {problem}: the shard is damaged; copy it again or rebuild the corpus")
    for read in [*every_reader(corpus), lambda: list(dolma.read_lines(str(corpus), "train"))]:
        with pytest.raises(StepError, match=expected):
            read()


def _without_text(line: bytes) -> bytes:
    doc = json.loads(line)
    del doc["text"]
    return json.dumps(doc).encode()


NO_TEXT = "every document needs a string `text`; fix the shard or rebuild the corpus"


@pytest.mark.parametrize(
    "damage, problem",
    [
        (_without_text, f"has no string `text` field: {NO_TEXT}"),
        (lambda line: b"[1, 2]", f"is an array, not a JSON object: {NO_TEXT}"),
        (lambda line: b'{"text": "x",}', "is not valid JSON (Expecting property name enclosed in double quotes at "
                                         "line 1, column 14): the shard is damaged; copy it again or rebuild the corpus"),
        (lambda line: b'{"id": "s", "text": "a lone \\ud800 surrogate"}',  # an adopted corpus: download never writes one
         "has a lone surrogate in `text` (a JSON \\ud800-\\udfff escape UTF-8 cannot encode): replace or remove it in the shard"),
    ],
    ids=["no-text", "not-an-object", "not-json", "lone-surrogate"],
)  # fmt: skip
def test_a_bad_document_is_named_by_every_reader(corpus, damage, problem):
    lines = shard_lines(corpus)
    set_shard_lines(corpus, [*lines[:30], damage(lines[30]), *lines[31:]])
    expected = exactly(f"deps.corpus: {shard(corpus)} document 31 {problem}")
    for read in every_reader(corpus):
        with pytest.raises(StepError, match=expected):
            read()


def test_good_shards_read_the_same_through_every_path(built_corpus):
    location = str(built_corpus)
    whole = list(dolma.read_split(location, "train"))
    assert len(whole) == 39 and all(isinstance(d["text"], str) for d in whole)
    assert list(dolma.read_range(location, "train", 0, 39)) == whole
    assert list(dolma.read_range(location, "train", 5, 20)) == whole[5:20]
    assert [json.loads(line) for line in dolma.read_lines(location, "train")] == whole


def test_junk_after_the_gzip_data_is_corrupt_not_uncompressed(tmp_path, corpus):
    failed_download(
        tmp_path,
        lambda src: (src / "a.jsonl.gz").write_bytes(GOOD_GZ + b"junk!"),
        "config.source: {src}/a.jsonl.gz is corrupt (BadGzipFile: Not a gzipped file (b'ju')): "
        "the file is damaged: copy it again",
    )
    shard(corpus).write_bytes(shard(corpus).read_bytes() + b"junk!")
    expected = exactly(
        f"deps.corpus: {shard(corpus)} is corrupt (BadGzipFile: Not a gzipped file (b'ju')): "
        "the shard is damaged; copy it again or rebuild the corpus"
    )
    whole_split, streamed_range, *others = every_reader(corpus)
    assert len(streamed_range()) == 39  # a range read as it is decompressed stops at its last document
    for read in [whole_split, *others, lambda: list(dolma.read_lines(str(corpus), "train"))]:
        with pytest.raises(StepError, match=expected):
            read()


def test_a_damaged_held_out_shard_is_named_by_evaluation(corpus):
    from marin_rules.eval.tasks import read_heldout

    assert [play.name for play in read_heldout(str(corpus))]  # the good copy reads
    heldout = corpus / "heldout" / dolma.shard_name(0)
    heldout.write_bytes(gzip.compress(b"[1]\n"))
    expected = exactly(f"deps.data: {heldout} document 1 is an array, not a JSON object: {NO_TEXT}")
    with pytest.raises(StepError, match=expected):
        read_heldout(str(corpus))
