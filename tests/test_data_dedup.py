"""The `dedup` step on a corpus with planted near-duplicates (edited copies whose exact
shingle Jaccard similarity to their original is computed here), through the real
`download` step, real rensa MinHash LSH, and a real Snakemake run feeding `tokenize`."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
from pathlib import Path

import pytest
import yaml

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.data import dolma
from marin_rules.data.dedup import dedup, load_signatures, stable_key
from marin_rules.data.dedup_config import candidate_probability, lsh_bands
from marin_rules.data.dedup_lsh import UnionFind, shingle_pieces, shingles, signature
from marin_rules.data.download import download
from marin_rules.experiment import build_experiment

THRESHOLD = 0.7
CONFIG = {"threshold": THRESHOLD, "ngram": 5, "ngram_unit": "word", "num_perm": 128, "seed": 1}
N_ORIGINALS = 40
N_BACKGROUND = 30
WORDS_PER_DOC = 150
EDITS = list(range(1, 15))  # words replaced per copy: 1 -> Jaccard ~0.94, 14 -> ~0.35


def ctx(name: str, output, config=None, deps=None) -> StepContext:
    return StepContext(name, "v1", config or {}, deps or {}, {}, str(output))


def jaccard(a: str, b: str) -> float:
    sa, sb = set(shingles(a, 5, "word")), set(shingles(b, 5, "word"))
    return len(sa & sb) / len(sa | sb)


def planted_corpus(seed: int = 12) -> tuple[list[dict], list[tuple[str, str, float]]]:
    """Records {id, text} and the planted (original, copy, exact Jaccard) pairs: each
    original gets one copy with `EDITS[i % 14]` words replaced at random positions,
    some originals a second copy; background documents share nothing planted."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8))) for _ in range(4000)]
    records, pairs = [], []

    def edited(words: list[str], k: int) -> list[str]:
        out = list(words)
        for pos in rng.sample(range(len(out)), k):
            out[pos] = rng.choice(vocab)
        return out

    for i in range(N_ORIGINALS):
        words = [rng.choice(vocab) for _ in range(WORDS_PER_DOC)]
        original = " ".join(words)
        records.append({"id": f"orig-{i}", "text": original})
        copies = [EDITS[i % len(EDITS)]] + ([1] if i % 5 == 0 else [])
        for c, k in enumerate(copies):
            text = " ".join(edited(words, k))
            records.append({"id": f"copy-{i}-{c}", "text": text})
            pairs.append((f"orig-{i}", f"copy-{i}-{c}", jaccard(original, text)))
    for i in range(N_BACKGROUND):
        records.append({"id": f"bg-{i}", "text": " ".join(rng.choice(vocab) for _ in range(WORDS_PER_DOC))})
    rng.shuffle(records)
    return records, pairs


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def docs_by_key(location: str) -> dict[str, dict]:
    return {d["metadata"]["key"]: d for split in dolma.SPLITS for d in dolma.read_split(location, split)}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("planted")
    records, pairs = planted_corpus()
    source = write_jsonl(root / "corpus.jsonl", records)
    raw = str(root / "raw")
    download(ctx("raw/planted", raw, {"source": str(source), "heldout": ["orig-0"]}))
    out = str(root / "dedup")
    result = dedup(ctx("dedup/planted", out, CONFIG, {"corpus": raw}))
    return {"root": root, "raw": raw, "out": out, "result": result, "pairs": pairs}


def expected_removed(raw: str, pairs: list[tuple[str, str, float]], at_least: float = THRESHOLD) -> set[str]:
    """Keys a perfect deduplicator removes: per cluster of planted pairs at or above
    `at_least`, all but the smallest stable key, or every training member when the
    cluster holds the held-out document."""
    docs = docs_by_key(raw)
    heldout = {d["metadata"]["key"] for d in dolma.read_split(raw, "heldout")}
    keys = sorted(docs)
    sets = UnionFind()
    for _ in keys:
        sets.add()
    for a, b, j in pairs:
        if j >= at_least:
            sets.union(keys.index(a), keys.index(b))
    clusters: dict[int, list[str]] = {}
    for i, key in enumerate(keys):
        clusters.setdefault(sets.find(i), []).append(key)
    removed = set()
    for members in clusters.values():
        if heldout & set(members):
            removed |= set(members) - heldout
        else:
            removed |= set(members) - {min(members, key=lambda k: stable_key(docs[k]))}
    return removed


def test_planted_similarities_straddle_the_threshold(planted):
    sims = sorted(j for _, _, j in planted["pairs"])
    above = [j for j in sims if j >= THRESHOLD]
    below = [j for j in sims if j < THRESHOLD]
    assert len(above) >= 15 and len(below) >= 15, sims
    assert min(sims) < 0.45 and max(sims) > 0.9  # the plant spans both sides
    assert min(above) < 0.76 and max(below) > 0.64  # and comes within 0.06 of the threshold on both


def test_precision_and_recall_against_the_plant(planted):
    """Precision 1.0 and recall 0.875 (21 of 24) at threshold 0.7: the misses are copies
    at Jaccard 0.70-0.76, where the derived S-curve (midpoint at the threshold) gives
    only 44-71% candidate probability; every copy at 0.8 or above is removed."""
    raw_keys, out_keys = set(docs_by_key(planted["raw"])), set(docs_by_key(planted["out"]))
    removed = raw_keys - out_keys
    expected = expected_removed(planted["raw"], planted["pairs"])
    hits = removed & expected
    precision, recall = len(hits) / len(removed), len(hits) / len(expected)
    print(f"dedup precision {precision:.3f} recall {recall:.3f} ({len(removed)} removed, {len(expected)} planted)")
    assert len(expected) == 24
    assert precision == 1.0 and recall >= 0.875, (sorted(removed - expected), sorted(expected - removed))
    assert expected_removed(planted["raw"], planted["pairs"], at_least=0.8) <= removed
    assert "copy-0-0" in removed and "orig-0" in out_keys  # a training copy of a held-out text goes


def test_result_counts_clusters_and_records_the_derived_lsh(planted):
    r = planted["result"]
    assert r["documents_in"] == N_ORIGINALS * 2 + N_ORIGINALS // 5 + N_BACKGROUND
    assert r["documents_out"] == r["documents_in"] - r["duplicates_removed"]
    assert r["duplicates_removed"] == len(set(docs_by_key(planted["raw"])) - set(docs_by_key(planted["out"])))
    assert r["train_copies_of_heldout_removed"] == 2  # orig-0 has two copies at ~0.93
    assert sum(int(size) * n for size, n in r["cluster_sizes"].items()) == r["documents_in"]
    assert r["clusters"] == sum(r["cluster_sizes"].values())
    assert r["clusters"] == r["documents_out"]  # one kept per cluster (orig-0: its held-out document)
    lsh = r["lsh"]
    assert (lsh["bands"], lsh["rows"]) == lsh_bands(THRESHOLD, 128) == (14, 9)
    assert lsh["permutations_used"] == 126 and lsh["library"].startswith("rensa 0.5")
    assert lsh["candidate_probability_at_threshold"] == pytest.approx(0.438, abs=1e-3)  # the S-curve rises through the threshold
    assert candidate_probability(0.9, 14, 9) > 0.99 and candidate_probability(0.4, 14, 9) < 0.01
    manifest = json.loads((Path(planted["out"]) / "manifest.json").read_text())
    assert manifest["train_documents"] + manifest["heldout_documents"] == r["documents_out"]
    assert manifest["heldout_keys"] == ["orig-0"] and manifest["dedup"]["lsh"] == lsh


def test_same_output_twice_and_kept_set_independent_of_shard_order(planted, tmp_path):
    again = tmp_path / "again"
    dedup(ctx("dedup/planted", again, CONFIG, {"corpus": planted["raw"]}))
    for split in dolma.SPLITS:
        first = sorted((Path(planted["out"]) / split).iterdir())
        assert [p.read_bytes() for p in first] == [(again / split / p.name).read_bytes() for p in first]
    # the same documents in three shards listed in reverse order
    shuffled = tmp_path / "shuffled"
    train = list(dolma.read_split(planted["raw"], "train"))
    thirds = [train[i::3] for i in range(3)]
    names = []
    for i, part in enumerate(reversed(thirds)):
        name = dolma.shard_name(i)
        storage.write_bytes_atomic(str(shuffled / "train" / name), gzip.compress("".join(json.dumps(d) + "\n" for d in part).encode()))
        names.append(name)
    heldout = dolma.write_split(str(shuffled), "heldout", dolma.read_split(planted["raw"], "heldout"))
    manifest = json.loads((Path(planted["raw"]) / "manifest.json").read_text())
    storage.write_json_atomic(str(shuffled / "manifest.json"), {**manifest, "shards": {"train": names[::-1], "heldout": heldout}})
    reordered = tmp_path / "reordered"
    dedup(ctx("dedup/planted", reordered, CONFIG, {"corpus": str(shuffled)}))
    assert set(docs_by_key(str(reordered))) == set(docs_by_key(planted["out"]))
    assert [d["id"] for d in dolma.read_split(str(reordered), "train")] != [d["id"] for d in dolma.read_split(planted["out"], "train")]


def test_two_signing_processes_give_the_same_output(planted, tmp_path):
    out = tmp_path / "two"
    result = dedup(StepContext("dedup/planted", "v1", CONFIG, {"corpus": planted["raw"]}, {"num_workers": 2}, str(out)))
    assert result["num_workers"] == 2 and result["lsh"] == planted["result"]["lsh"]
    for split in dolma.SPLITS:
        assert (out / split / dolma.shard_name(0)).read_bytes() == (Path(planted["out"]) / split / dolma.shard_name(0)).read_bytes()


def test_any_shard_count_gives_the_same_output(planted, tmp_path):
    # 111 documents (train, then held-out) signed in 4 ranges; the held-out document is
    # in the last range: the gather clusters them in the same order as one range
    out = tmp_path / "four"
    result = dedup(StepContext("dedup/planted", "v1", CONFIG, {"corpus": planted["raw"]}, {"shards": 4}, str(out)))
    assert result["shards"] == 4
    assert {k: v for k, v in result.items() if k not in ("seconds", "shards")} == {
        k: v for k, v in planted["result"].items() if k not in ("seconds", "shards")
    }
    for split in dolma.SPLITS:
        assert (out / split / dolma.shard_name(0)).read_bytes() == (Path(planted["out"]) / split / dolma.shard_name(0)).read_bytes()
    assert sorted(p.name for p in (out / "shards").iterdir()) == [f"0000{k}-of-00004" for k in range(4)]


def test_a_planted_signature_file_is_refused_not_unpickled(tmp_path):
    import pickle

    canary = tmp_path / "canary"

    class Evil:
        def __reduce__(self):
            return (open, (str(canary), "w"))

    with pytest.raises(StepError, match=r"^runtime\.shards: a signature file is damaged .*io\.open is not a MinHash signature"):
        load_signatures(pickle.dumps([Evil()]))
    assert not canary.exists()
    with pytest.raises(StepError, match=r"^runtime\.shards: a signature file is damaged"):
        load_signatures(b"not a pickle")


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"config": {"threshold": 1.5}}, "dd/x@v1: config.threshold: expected a number in (0, 1), got 1.5"),
        ({"config": {"ngram_unit": "byte"}}, "dd/x@v1: config.ngram_unit: expected one of 'word', 'char', got 'byte'"),
        ({"config": {"treshold": 0.5}}, "dd/x@v1: config.treshold: unknown setting (did you mean threshold?)"),
        ({"deps": {"corpus": "tok/t@v1"}}, "dd/x@v1: deps.corpus: expected a 'download' or 'dedup' artifact, got tok/t@v1"),
        ({"deps": {}}, "dd/x@v1: deps.corpus: missing"),
    ],
)
def test_bad_config_is_one_line_naming_artifact_and_field(entry, message):
    artifacts = {
        "raw/r@v1": {"step": "download"},
        "tok/t@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/r@v1"}, "config": {"vocab_size": 400}},
        "dd/x@v1": {"step": "dedup", "deps": {"corpus": "raw/r@v1"}, **entry},
    }
    with pytest.raises(ConfigError) as e:
        build_experiment({"artifacts": artifacts})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_step_refuses_bad_config_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="config.num_perm: expected an integer in \\[16, 1024\\], got 8"):
        dedup(ctx("dedup/x", tmp_path / "out", {"num_perm": 8}, {"corpus": str(tmp_path / "raw")}))
    assert not (tmp_path / "out").exists()


def test_char_shingles_collapse_whitespace_and_short_texts_are_one_shingle():
    assert shingles("Ab  c\nD", 3, "char") == ["ab ", "b c", " c ", "c d"]
    assert shingles("To be", 5, "word") == ["to be"]


def whole_text_shingles(text: str, ngram: int, unit: str) -> list[str]:
    """The model's definition, over the whole text at once (what pieces must add up to)."""
    units = text.lower().split() if unit == "word" else list(" ".join(text.lower().split()))
    sep = " " if unit == "word" else ""
    if len(units) <= ngram:
        return [sep.join(units)]
    return [sep.join(units[i : i + ngram]) for i in range(len(units) - ngram + 1)]


@pytest.mark.parametrize("unit", ["word", "char"])
def test_long_texts_are_shingled_in_pieces_with_the_whole_texts_shingles_and_signature(unit):
    rng = random.Random(3)
    parts = ["ΟΔΟΣ", "Σ", "word", "İx", "a", " ", "  ", "\n", "\u3000", "\t\x1c"]  # final sigma, Unicode spaces
    texts = ["", " ", "To be", "ab", *("".join(rng.choices(parts, k=rng.randint(1, 400))) for _ in range(150))]
    for text in texts:
        for ngram in (1, 2, 5):
            pieces = list(shingle_pieces(text, ngram, unit, piece_chars=16))
            whole = whole_text_shingles(text, ngram, unit)
            assert [s for piece in pieces for s in piece] == whole, (text, ngram)
            if len(text) > 200:
                assert len(pieces) > 1
            if unit == "char":
                assert max(len(piece) for piece in pieces) <= 16
            assert signature(pieces, 64, 1).digest() == signature([whole], 64, 1).digest()


def signing_peak(text: str) -> int:
    """Bytes allocated at most while signing `text` (word 5-grams), the text aside."""
    tracemalloc.start()
    try:
        signature(shingle_pieces(text, 5, "word"), 128, 1)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_signing_memory_does_not_grow_with_the_document():
    short, long = (" ".join(f"w{i % 5000}" for i in range(n)) for n in (300_000, 1_200_000))  # 1.7 and 6.9 MB
    short_peak, long_peak = signing_peak(short), signing_peak(long)
    assert long_peak < 1.2 * short_peak and long_peak < len(long) / 2  # all shingles at once: 35x the text


def test_dedup_artifact_feeds_train_tokenizer_and_tokenize_in_a_snakemake_run(tmp_path, snakemake_cmd):
    records, _ = planted_corpus()
    write_jsonl(tmp_path / "corpus.jsonl", records[:60])
    prefix = tmp_path / "art"
    artifacts = {
        "raw/p@v1": {"step": "download", "config": {"source": str(tmp_path / "corpus.jsonl")}},
        "dedup/p@v1": {"step": "dedup", "deps": {"corpus": "raw/p@v1"}, "config": {"threshold": THRESHOLD}},
        "tok/p@v1": {"step": "train_tokenizer", "deps": {"corpus": "dedup/p@v1"}, "config": {"vocab_size": 400}},
        "tokens/p@v1": {"step": "tokenize", "deps": {"corpus": "dedup/p@v1", "tokenizer": "tok/p@v1"}, "config": {"validation_fraction": 0.1}},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"artifacts": artifacts}))
    snakemake_cmd("--configfile", "exp.yaml", "--config", f"prefix={prefix}", "-c1", cwd=tmp_path, timeout=400)
    record = json.loads((prefix / "dedup/p/v1/.artifact.json").read_text())
    result = record["result"]
    assert record["step"] == "dedup" and result["documents_in"] == 60 and result["duplicates_removed"] > 0
    index = json.loads((prefix / "tokens/p/v1/index.json").read_text())
    assert index["corpus"].endswith("dedup/p/v1")
    docs = index["splits"]["train"]["documents"] + index["splits"]["validation"]["documents"]
    assert docs == result["documents_out"]


def test_corpus_roles_take_a_dedup_artifact_and_train_data_does_not():
    artifacts = {
        "raw/r@v1": {"step": "download"},
        "dd/a@v1": {"step": "dedup", "deps": {"corpus": "raw/r@v1"}},
        "dd/b@v1": {"step": "dedup", "deps": {"corpus": "dd/a@v1"}, "config": {"ngram_unit": "char", "ngram": 8}},
        "tok/t@v1": {"step": "train_tokenizer", "deps": {"corpus": "dd/b@v1"}, "config": {"vocab_size": 400}},
        "tokens/t@v1": {"step": "tokenize", "deps": {"corpus": "dd/b@v1", "tokenizer": "tok/t@v1"}},
    }
    assert build_experiment({"artifacts": artifacts})["tokens/t@v1"].deps["corpus"] == "dd/b@v1"
    train = {"model": {"d_model": 64, "n_heads": 4}, "num_train_steps": 10, "batch_size": 4, "seq_len": 32}
    artifacts["ck/c@v1"] = {"step": "train", "deps": {"data": "dd/a@v1"}, "config": train}
    with pytest.raises(ConfigError, match=r"^ck/c@v1: deps.data: expected a 'tokenize' artifact, got dd/a@v1 \(a 'dedup' artifact\)$"):
        build_experiment({"artifacts": artifacts})
