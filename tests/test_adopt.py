"""Adopted data: existing folders declared as `name@version` of a kind (marin_rules/adopt.py).

Real Snakemake runs: a corpus built by `download` in one workspace is adopted in
another and tokenized from there; bad layouts and missing sources are refused while
planning (`snakemake -n`), one line, nothing written.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from marin_rules.adopt import check_layout, listing_digest
from marin_rules.artifacts.errors import ConfigError
from marin_rules.artifacts.files import list_data_files
from marin_rules.cli import main as cli_main
from marin_rules.experiment import build_experiment

WORDS = "the king queen castle sword river night morning ghost crown love war peace letter ship storm".split()


def write_texts(folder: Path, n: int = 24) -> Path:
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for i in range(n):
        lines = [" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(30)]
        (folder / f"doc{i:02d}.txt").write_text("\n".join(lines))
    return folder


def run(snakemake, cwd: Path, experiment: dict, *args: str, check: bool = True):
    (cwd / "exp.yaml").write_text(yaml.safe_dump({"artifacts": experiment}, sort_keys=False))
    return snakemake("--configfile", "exp.yaml", "--config", f"prefix={cwd / 'art'}", "--cores", "2", *args,
                     cwd=cwd, check=check)  # fmt: skip


def record(cwd: Path, path: str) -> dict:
    return json.loads((cwd / "art" / path / ".artifact.json").read_text())


@pytest.fixture(scope="module")
def built_corpus(tmp_path_factory):
    """A corpus folder built by a real `download` run (a colleague's, elsewhere)."""
    from conftest import run_snakemake

    root = tmp_path_factory.mktemp("colleague")
    texts = write_texts(root / "texts")
    run(run_snakemake, root, {"raw/src@v1": {"step": "download", "config": {"source": f"{texts}/*.txt"}}})
    return root / "art" / "raw" / "src" / "v1"


def test_adopted_corpus_is_tokenized_in_place_through_a_real_run(tmp_path, snakemake_cmd, built_corpus, capsys):
    experiment = {
        "corpus/adopted@v1": {"adopt": {"source": str(built_corpus), "kind": "corpus"}},
        "tok/bpe@v1": {"step": "train_tokenizer", "deps": {"corpus": "corpus/adopted@v1"}, "config": {"vocab_size": 400}},
        "tokenized/x@v1": {
            "step": "tokenize", "deps": {"corpus": "corpus/adopted@v1", "tokenizer": "tok/bpe@v1"},
            "config": {"validation_fraction": 0.1},
        },
    }  # fmt: skip
    run(snakemake_cmd, tmp_path, experiment)
    adopted = record(tmp_path, "corpus/adopted/v1")
    listing = list_data_files(str(built_corpus))
    assert adopted["step"] == "adopt" and adopted["files"] == {}  # nothing copied
    assert adopted["result"]["source"] == str(built_corpus)
    assert adopted["result"]["listing"] == listing and "manifest.json" in listing
    assert adopted["result"]["listing_digest"] == listing_digest(listing)
    assert sorted(p.name for p in (tmp_path / "art/corpus/adopted/v1").iterdir() if not p.name.startswith(".lease")) == [
        ".artifact.json"
    ]
    index = json.loads((tmp_path / "art/tokenized/x/v1/index.json").read_text())
    assert (tmp_path / "art/tokenized/x/v1" / index["corpus"]).resolve() == built_corpus.resolve()
    manifest = json.loads((built_corpus / "manifest.json").read_text())
    assert record(tmp_path, "tokenized/x/v1")["result"]["documents"] == manifest["train_documents"]
    assert record(tmp_path, "tokenized/x/v1")["deps"]["corpus"]["fingerprint"] == adopted["fingerprint"]

    # the source changes under the adopted version: a consumer is refused, not fed
    shard = sorted(built_corpus.glob("train/shard-*.jsonl.gz"))[0]
    saved = shard.read_bytes()
    try:
        shard.write_bytes(saved + b"x")
        proc = run(snakemake_cmd, tmp_path, experiment, "--forcerun", "tokenize", check=False)
        assert proc.returncode != 0
        refusal = next(line for line in (proc.stdout + proc.stderr).splitlines() if "upstream corpus/adopted@v1: " in line)
        assert (f"upstream corpus/adopted@v1: the adopted source {built_corpus} changed since it was adopted "
                f"(changed train/{shard.name}") in refusal  # fmt: skip
        assert refusal.endswith("; restore it, or adopt it under a new version")  # not a rebuild: it would adopt the change
        assert f"corpus/adopted@v1: the adopted source {built_corpus} changed since it was adopted (changed train/" in proc.stderr
        # the inspection commands say so too (they read the record alone)
        prefix = ["--prefix", str(tmp_path / "art"), "--configfile", str(tmp_path / "exp.yaml")]
        assert cli_main(["verify", "corpus/adopted@v1", *prefix]) == 1
        captured = capsys.readouterr()
        assert f"corpus/adopted@v1: adopted source {built_corpus}: changed train/{shard.name}" in captured.out
        assert captured.err.startswith(f"corpus/adopted@v1: 1 problem(s); the adopted source {built_corpus} changed")
        assert captured.err.endswith("; consumers will refuse it: restore it, or adopt it under a new version\n")
        assert "snakemake -f" not in captured.err  # a rebuild would adopt the change under the same version
        assert cli_main(["status", *prefix, "--json"]) == 0
        rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)}
        assert rows["corpus/adopted@v1"]["state"] == "source changed"
        assert rows["corpus/adopted@v1"]["reason"].startswith(f"the adopted source {built_corpus} changed since")
    finally:
        shard.write_bytes(saved)
    assert cli_main(["verify", "corpus/adopted@v1", "--prefix", str(tmp_path / "art"), "--configfile", str(tmp_path / "exp.yaml")]) == 0
    assert f"its adopted source {built_corpus} holds its {len(listing)} file(s)" in capsys.readouterr().out


def test_copy_true_copies_the_source_and_records_the_copy(tmp_path, snakemake_cmd, built_corpus):
    run(snakemake_cmd, tmp_path, {"corpus/copied@v1": {"adopt": {"source": str(built_corpus), "kind": "corpus", "copy": True}}})
    copied = record(tmp_path, "corpus/copied/v1")
    assert copied["result"]["copied"] is True
    assert copied["files"] == list_data_files(str(built_corpus)) == copied["result"]["listing"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: (d / "train").mkdir(parents=True) or (d / "train" / "shard-00000.jsonl.gz").write_bytes(b"x"),
         "is not a 'corpus' layout: missing manifest.json"),
        (lambda d: d.mkdir(parents=True) or (d / "manifest.json").write_text('{"shards": '),
         "is not a 'corpus' layout: manifest.json is not valid JSON (Expecting value at line 1, column 12)"),
        (lambda d: None, "nothing at"),
    ],
    ids=["bad-layout", "unparsable-manifest", "missing-source"],
)  # fmt: skip
def test_bad_layout_or_missing_source_is_refused_while_planning_in_one_line(tmp_path, snakemake_cmd, make, message):
    source = tmp_path / "data" / "x"
    make(source)
    experiment = {
        "corpus/bad@v1": {"adopt": {"source": str(source), "kind": "corpus"}},
        "tok/bpe@v1": {"step": "train_tokenizer", "deps": {"corpus": "corpus/bad@v1"}, "config": {"vocab_size": 400}},
    }
    proc = run(snakemake_cmd, tmp_path, experiment, "-n", check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("marin-rules:")]
    assert len(lines) == 1 and lines[0].startswith("marin-rules: corpus/bad@v1: adopt.source: ") and message in lines[0]
    assert not (tmp_path / "art").exists()


def test_tokenized_layout_names_the_shard_its_index_lists_but_lacks(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "tokens-00000.npy").write_bytes(b"0" * 10)
    index = {"vocab_size": 400, "dtype": "uint16", "bos_id": 0, "eos_id": 1, "pad_id": 2, "tokenizer_digest": "0" * 16, "tokenizer": "tokenizer.json",
             "splits": {"train": {"shards": [{"path": "train/tokens-00000.npy", "tokens": 5}, {"path": "train/tokens-00001.npy", "tokens": 0}]}}}  # fmt: skip
    (tmp_path / "index.json").write_text(json.dumps(index))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"d@v1: adopt.source: .* missing train/tokens-00001.npy \(listed in index.json\)"):
        check_layout("d@v1", {"source": str(tmp_path), "kind": "tokenized"})
    (tmp_path / "train" / "tokens-00001.npy").write_bytes(b"0")
    assert set(check_layout("d@v1", {"source": str(tmp_path), "kind": "tokenized"})) == {
        "index.json", "tokenizer.json", "train/tokens-00000.npy", "train/tokens-00001.npy"
    }  # fmt: skip


def test_a_tokenized_or_trained_folder_copied_away_from_its_tokenizer_is_refused_naming_where_it_points(tmp_path):
    """Our steps store the tokenizer relative to the artifact (`../../../tokenizers/..`):
    a folder copied out of its prefix points nowhere, and a model trained on it would too."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "tokens-00000.npy").write_bytes(b"0" * 10)
    index = {"vocab_size": 400, "dtype": "uint16", "bos_id": 0, "eos_id": 1, "pad_id": 2, "tokenizer_digest": "0" * 16, "tokenizer": "../../../tokenizers/t/v1/tokenizer.json",
             "splits": {"train": {"shards": [{"path": "train/tokens-00000.npy", "tokens": 5}]}}}  # fmt: skip
    (tmp_path / "index.json").write_text(json.dumps(index))
    gone = (tmp_path / "../../../tokenizers/t/v1/tokenizer.json").resolve()
    with pytest.raises(ConfigError) as error:
        check_layout("d@v1", {"source": str(tmp_path), "kind": "tokenized"})
    assert f"tokenizer in index.json is '../../../tokenizers/t/v1/tokenizer.json', which is {gone} from this source and does not exist" in str(error.value)
    model = tmp_path / "model"
    (model / "checkpoints" / "4").mkdir(parents=True)
    (model / "checkpoints" / "4" / "x").write_text("x")
    (model / "model.json").write_text(json.dumps({"tokenizer": "../tok/tokenizer.json"}))
    with pytest.raises(ConfigError, match=r"tokenizer in model.json is '../tok/tokenizer.json', which is .* does not exist"):
        check_layout("m@v1", {"source": str(model), "kind": "train"})
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    check_layout("m@v1", {"source": str(model), "kind": "train"})


def test_shard_lists_that_are_not_lists_of_names_are_refused_naming_them(tmp_path):
    # a string was walked as its characters: the consumer failed on '<source>/train/s'
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "shard-00000.jsonl.gz").write_bytes(b"x")
    manifest = {"train_documents": 1, "shards": {"train": "shard-00000.jsonl.gz"}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"d@v1: adopt.source: .* manifest.json: shards.train is not a list of shard file names"):
        check_layout("d@v1", {"source": str(tmp_path), "kind": "corpus"})
    index = {"vocab_size": 400, "dtype": "uint16", "bos_id": 0, "eos_id": 1, "pad_id": 2, "tokenizer_digest": "0" * 16, "tokenizer": "t.json", "splits": {"train": {"shards": "train/t.npy"}}}
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"splits.train in index.json is not an object with a list of 'shards'"):
        check_layout("d@v1", {"source": str(tmp_path), "kind": "tokenized"})
    index["splits"]["train"]["shards"] = [{"path": 5}]
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"splits.train.shards\[0\] in index.json is not an object with a 'path'"):
        check_layout("d@v1", {"source": str(tmp_path), "kind": "tokenized"})
    index["splits"]["train"]["shards"] = [{"path": "train/t.npy"}]  # the loader reads each shard's token count
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"splits.train.shards\[0\] in index.json has no 'tokens' \(its token count\)"):
        check_layout("d@v1", {"source": str(tmp_path), "kind": "tokenized"})
    del index["tokenizer_digest"]
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"missing tokenizer_digest in index.json"):
        check_layout("d@v1", {"source": str(tmp_path), "kind": "tokenized"})


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"adopt": {"source": "/x", "kind": "corpus"}, "step": "download"}, "x@v1: step: an entry with 'adopt:'"),
        ({"adopt": {"source": "/x", "kind": "corpos"}}, "x@v1: adopt.kind:"),
        ({"adopt": {"kind": "corpus"}}, "x@v1: adopt.source:"),
        ({"adopt": "/x"}, "x@v1: adopt: expected a mapping"),
        ({"step": "adopt"}, "x@v1: step: write existing data as 'adopt:"),
    ],
)
def test_malformed_adopt_entries_are_refused_at_load(entry, message):
    with pytest.raises(ConfigError) as e:
        build_experiment({"artifacts": {"x@v1": entry}})
    assert str(e.value).startswith(message)


def test_adopted_kind_fits_where_its_step_fits_and_nowhere_else():
    arts = {
        "t@v1": {"adopt": {"source": "/x", "kind": "tokenized"}},
        "tok@v1": {"step": "train_tokenizer", "deps": {"corpus": "t@v1"}, "config": {"vocab_size": 400}},
    }
    with pytest.raises(ConfigError, match=r"tok@v1: deps.corpus: expected a 'download' or 'dedup' artifact, got t@v1"):
        build_experiment({"artifacts": arts})
    arts["t@v1"]["adopt"]["kind"] = "corpus"
    assert build_experiment({"artifacts": arts})["t@v1"].step == "adopt"


def test_schema_accepts_adopt_entries_and_refuses_what_the_loader_refuses():
    import jsonschema

    from marin_rules.schema import experiment_schema

    validator = jsonschema.Draft7Validator(experiment_schema())
    good = {"adopt": {"source": "gs://b/x", "kind": "tokenized", "copy": True}}
    assert not list(validator.iter_errors({"artifacts": {"x@v1": good}}))
    build_experiment({"artifacts": {"x@v1": good}})
    for bad in ({**good, "step": "download"}, {"adopt": {"source": "/x", "kind": "corpos"}}, {"step": "adopt"}):
        assert list(validator.iter_errors({"artifacts": {"x@v1": bad}})), bad
        with pytest.raises(ConfigError):
            build_experiment({"artifacts": {"x@v1": bad}})


def test_a_bucket_folder_is_adopted_in_place_or_copied(tmp_path, snakemake_cmd, gcs_prefix, gcs_env):
    from marin_rules.artifacts import storage

    source = f"{gcs_prefix}/their/tokenizer"
    storage.write_text_atomic(f"{source}/tokenizer.json", '{"model": {}}')
    storage.write_text_atomic(f"{source}/special_tokens.json", "{}")
    experiment = {
        "tok/in-place@v1": {"adopt": {"source": source, "kind": "tokenizer"}},
        "tok/copied@v1": {"adopt": {"source": source, "kind": "tokenizer", "copy": True}},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"artifacts": experiment}))
    snakemake_cmd("--configfile", "exp.yaml", "--config", f"prefix={tmp_path / 'art'}", cwd=tmp_path, env=gcs_env)
    listing = {"special_tokens.json": 2, "tokenizer.json": 13}
    in_place, copied = record(tmp_path, "tok/in-place/v1"), record(tmp_path, "tok/copied/v1")
    assert in_place["result"]["source"] == source and in_place["result"]["listing"] == listing
    assert in_place["files"] == {} and copied["files"] == listing
    assert (tmp_path / "art/tok/copied/v1/tokenizer.json").read_text() == '{"model": {}}'


@pytest.mark.parametrize(
    "manifest, problem",
    [({"train_documents": "6"}, "manifest.json: `train_documents` is a string, not a count of documents"),
     ({"train_documents": 6, "rename": "validation"}, "manifest.json lists no train shards (shards.train)")],
)  # fmt: skip
def test_a_corpus_manifest_its_readers_would_refuse_is_refused_at_adoption(tmp_path, manifest, problem):
    source = their_corpus(tmp_path / "theirs", heldout_split=False)
    written = json.loads((source / "manifest.json").read_text())
    if manifest.pop("rename", None):
        (source / "train").rename(source / "validation")
        written["shards"] = {"validation": written["shards"]["train"]}
    (source / "manifest.json").write_text(json.dumps({**written, **manifest}))
    with pytest.raises(ConfigError) as e:
        check_layout("c@v1", {"source": str(source), "kind": "corpus"})
    assert f"is not a 'corpus' layout: {problem}" in str(e.value)


def test_a_manifest_that_undercounts_its_shards_stops_tokenize_and_dedup_instead_of_cutting_the_split(tmp_path):
    """Adopted data whose manifest gives fewer training documents than its shards hold:
    tokenize read only the first ones, and dedup numbered the rest as held-out documents."""
    from marin_rules.artifacts.context import StepContext
    from marin_rules.artifacts.errors import StepError
    from marin_rules.data import dolma
    from marin_rules.data.dedup import dedup

    source = their_corpus(tmp_path / "theirs", heldout_split=True)
    manifest = json.loads((source / "manifest.json").read_text())
    (source / "manifest.json").write_text(json.dumps({**manifest, "train_documents": 4}))
    surplus = (f"deps.corpus: {source}/manifest.json gives 4 train document(s), but its train shards hold more (the "
               f"next one is in {source}/train")  # fmt: skip
    with pytest.raises(StepError, match=re.escape(surplus)):
        list(dolma.read_range(str(source), "train", 0, 4, last=True))
    assert len(list(dolma.read_range(str(source), "train", 0, 4))) == 4  # a share of the split: no end to check
    assert len(list(dolma.read_range(str(source), "train", 2, 4))) == 2
    with pytest.raises(StepError, match=re.escape(surplus)):
        list(dolma.read_range(str(source), "train", 2, 4, last=True))
    with pytest.raises(StepError, match=re.escape(surplus)):
        dedup(StepContext("dedup/x", "v1", {"threshold": 0.8}, {"corpus": str(source)}, output=str(tmp_path / "d")))


def their_corpus(folder: Path, heldout_split: bool) -> Path:
    """A corpus written by another tool in the `download` layout, whose manifest has only
    what adoption requires (`shards`, `train_documents`): no `heldout_documents`, and with
    `heldout_split` false no held-out split at all. A training document is an edited copy
    of the held-out one, which dedup must drop (it reads the held-out split to know)."""
    from marin_rules.data import dolma

    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(200)) for _ in range(6)]
    heldout = texts[0]
    train = texts[1:] + [heldout.replace(heldout.split()[5], "edited", 1)]

    def docs(texts: list[str], first: int) -> list[dict]:
        return [{"id": f"d{i}", "text": t, "source": "theirs", "added": "", "metadata": {"title": f"d{i}"}}
                for i, t in enumerate(texts, first)]  # fmt: skip

    shards = {"train": dolma.write_split(str(folder), "train", docs(train, 0))}
    if heldout_split:
        shards["heldout"] = dolma.write_split(str(folder), "heldout", docs([heldout], 99))
    (folder / "manifest.json").write_text(json.dumps({"shards": shards, "train_documents": len(train)}))
    return folder


@pytest.mark.parametrize("heldout_split", [True, False], ids=["no-heldout-count", "no-heldout-split"])
def test_dedup_reads_an_adopted_corpus_whose_manifest_lacks_heldout_documents(tmp_path, snakemake_cmd, heldout_split):
    # dedup raised a raw KeyError: 'heldout_documents', which adoption does not require
    source = their_corpus(tmp_path / "theirs", heldout_split)
    experiment = {
        "corpus/theirs@v1": {"adopt": {"source": str(source), "kind": "corpus"}},
        "dedup/theirs@v1": {"step": "dedup", "deps": {"corpus": "corpus/theirs@v1"}, "config": {"threshold": 0.8},
                            "runtime": {"shards": 2}},
    }  # fmt: skip
    run(snakemake_cmd, tmp_path, experiment)
    result = record(tmp_path, "dedup/theirs/v1")["result"]
    manifest = json.loads((tmp_path / "art/dedup/theirs/v1/manifest.json").read_text())
    if heldout_split:  # its held-out document counted and kept; its training copy dropped
        assert result["documents_in"] == 7 and result["train_copies_of_heldout_removed"] == 1
        assert (manifest["train_documents"], manifest["heldout_documents"]) == (5, 1)
    else:  # no held-out split: an empty one, nothing to protect
        assert result["documents_in"] == 6 and result["duplicates_removed"] == 0
        assert (manifest["train_documents"], manifest["heldout_documents"]) == (6, 0)


def test_a_changed_source_without_a_version_bump_is_drift_and_consumers_read_the_recorded_one(
    tmp_path, snakemake_cmd, built_corpus
):
    """`source:` is the recipe: changing it under the same version serves the recorded
    build, so consumers read the source it adopted, and nothing calls that one changed."""
    experiment = {
        "corpus/adopted@v1": {"adopt": {"source": str(built_corpus), "kind": "corpus"}},
        "tok/bpe@v1": {"step": "train_tokenizer", "deps": {"corpus": "corpus/adopted@v1"}, "config": {"vocab_size": 400}},
    }  # fmt: skip
    run(snakemake_cmd, tmp_path, experiment, str(tmp_path / "art/corpus/adopted/v1/.artifact.json"))
    assert not (tmp_path / "art/tok").exists()
    elsewhere = tmp_path / "not-adopted"  # nothing there: a consumer reading it would fail
    moved = {**experiment, "corpus/adopted@v1": {"adopt": {"source": str(elsewhere), "kind": "corpus"}}}
    proc = run(snakemake_cmd, tmp_path, moved)
    out = proc.stdout + proc.stderr
    assert "corpus/adopted@v1: recipe drift" in out and "changed since it was adopted" not in out, out[-3000:]
    tok = record(tmp_path, "tok/bpe/v1")  # trained on the recorded source
    assert tok["deps"]["corpus"]["fingerprint"] == record(tmp_path, "corpus/adopted/v1")["fingerprint"]


def test_verify_checks_adopted_tokens_against_the_digests_their_own_index_gives(tmp_path):
    # an edit that keeps a token file's size: the adopted listing (sizes) cannot tell
    import xxhash

    from marin_rules.adopt import recorded_source_content_problems

    (tmp_path / "train").mkdir()
    shard = tmp_path / "train/tokens-00000.npy"
    shard.write_bytes(b"\x93NUMPY fake token bytes")
    digest = f"xxh3:{xxhash.xxh3_64_hexdigest(shard.read_bytes())}"
    index = {"splits": {"train": {"shards": [{"path": "train/tokens-00000.npy", "tokens": 3, "digest": digest}]},
                        "validation": {"shards": []}}}  # fmt: skip
    (tmp_path / "index.json").write_text(json.dumps(index))
    result = {"kind": "tokenized", "source": str(tmp_path), "copied": False, "listing": {}}
    assert recorded_source_content_problems("adopt", result) == []
    shard.write_bytes(b"\x93NUMPY fake token bytez")  # the same size
    assert recorded_source_content_problems("adopt", result) == [
        f"changed train/tokens-00000.npy: its content is not what was recorded ({digest})"
    ]
    assert recorded_source_content_problems("adopt", {**result, "kind": "corpus"}) == []
    assert recorded_source_content_problems("adopt", {**result, "copied": True}) == []


def test_a_relative_source_written_as_before_is_read_where_the_run_is_not_where_it_was_adopted(tmp_path, monkeypatch):
    # a checkout moved, or a colleague sharing the prefix: the same recipe, so the same data here
    from types import SimpleNamespace

    from marin_rules.adopt import served_source

    monkeypatch.chdir(tmp_path)
    artifact = SimpleNamespace(config={"source": "data/tok", "kind": "tokenized"})
    record = SimpleNamespace(step="adopt", config={"source": "data/tok", "kind": "tokenized"},
                             result={"source": "/home/alice/proj/data/tok", "copied": False})  # fmt: skip
    assert served_source(artifact, record) == str(tmp_path / "data/tok")
    moved = SimpleNamespace(config={"source": "elsewhere/tok", "kind": "tokenized"})  # changed, no version bump
    assert served_source(moved, record) == "/home/alice/proj/data/tok"  # drift: the recorded build is served
    assert served_source(moved, None) == str(tmp_path / "elsewhere/tok")  # not built yet
