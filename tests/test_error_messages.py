"""docs/errors.md tells the truth: every message listed for the experiment loader and
the step configs is produced, word for word, by the bad input beside it, and every
such bad input here is listed there. Paths of the test's folder read `<folder>`, a
recipe's fingerprint `<fingerprint>`; the experiment file is `exp.yaml`."""

from __future__ import annotations

import copy
import sysconfig
import re
import sys

import pytest

from conftest import REPO
from marin_rules.artifacts.errors import MarinError
from marin_rules.experiment import build_experiment, load_experiment

DOC = REPO / "docs" / "errors.md"
# the doc's sections whose messages come from the loader and the config layer
CHECKED_SECTIONS = ("Experiment file", "Keys and names", "Deps", "User steps", "Sweeps", "Step configs")

RAW = {"step": "download", "config": {"heldout": ["hamlet"]}}
TOK = {"step": "train_tokenizer", "deps": {"corpus": "raw/a@v1"}, "config": {"vocab_size": 512}}
TOKENIZED = {"step": "tokenize", "deps": {"corpus": "raw/a@v1", "tokenizer": "tokenizers/t@v1"}}
TRAIN_CONFIG = {"model": {"d_model": 64, "n_heads": 4}, "num_train_steps": 10, "batch_size": 4, "seq_len": 32}
TRAIN = {"step": "train", "deps": {"data": "tokenized/a@v1"}, "config": TRAIN_CONFIG}
EVAL = {"step": "evaluate", "deps": {"model": "checkpoints/m@v1", "data": "raw/a@v1"}}
CHAIN = {"raw/a@v1": RAW, "tokenizers/t@v1": TOK, "tokenized/a@v1": TOKENIZED, "checkpoints/m@v1": TRAIN,
         "evaluations/m@v1": EVAL}  # fmt: skip


def chain(key: str, **fields) -> dict:
    """The built-in chain with fields of one entry replaced (`config__x` sets config.x)."""
    artifacts = copy.deepcopy(CHAIN)
    entry = artifacts.setdefault(key, {})
    for name, value in fields.items():
        if "__" in name:
            *parents, leaf = name.split("__")
            node = entry
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        else:
            entry[name] = value
    return {"artifacts": artifacts}


def user(**entries) -> dict:
    return {"artifacts": {k.replace("_", "/") + "@v1": v for k, v in entries.items()}}


def sweep(template: str, body: dict) -> dict:
    return {"sweeps": {template: {"step": "mysteps:make", **body}}}


STEPS_PY = "count = 3\ndef make(ctx):\n    return {}\ndef count_words(ctx):\n    return {}\n"

# bad input -> its message; a str is an experiment file's text, a dict its parsed form
CASES: list[tuple[str, object]] = [
    # experiment file
    ("missing file", None),
    ("a folder", "<folder>"),
    ("not UTF-8", b"artifacts: {}\n\xff\n"),
    ("YAML syntax", "artifacts:\n  raw/a@v1:\n    step: download\n   config: {}\n"),
    ("a tab", "artifacts:\n\traw/a@v1: {step: download}\n"),
    ("unclosed flow", "artifacts: {raw/a@v1: {step: download}\n"),
    ("duplicate key", "artifacts:\n  raw/a@v1: {step: download}\n  raw/a@v1: {step: download}\n"),
    ("duplicate nested key", "artifacts:\n  raw/a@v1:\n    step: download\n    step: download\n"),
    ("a value holding itself", "artifacts:\n  raw/a@v1:\n    step: download\n    config:\n      text: &t [*t]\n"),
    ("not a mapping", "- raw/a@v1\n"),
    ("unknown top-level key", {"artifact": {"raw/a@v1": RAW}}),
    ("artifacts not a mapping", {"artifacts": ["raw/a@v1"]}),
    ("no artifacts", {"artifacts": {}}),
    ("description not text", {"description": ["a"], "artifacts": {"raw/a@v1": RAW}}),
    ("a YAML boolean word as a list item", "artifacts:\n  raw/a@v1:\n    step: download\n    config: {heldout: [no, hamlet]}\n"),
    ("a YAML boolean word as a key", "artifacts:\n  raw/a@v1:\n    step: download\n    on: true\n"),
    # keys and names
    ("key without version", {"artifacts": {"raw/a": RAW}}),
    ("bad name", {"artifacts": {"Raw/a@v1": RAW}}),
    ("name escaping the prefix", {"artifacts": {"raw/../a@v1": RAW}}),
    ("bad version", {"artifacts": {"raw/a@v/1": RAW}}),
    ("key defined twice", {"artifacts": {"s/n1@v1": RAW}, "sweeps": {"s/n{i}@v1": {"step": "download", "grid": {"i": [1]}}}}),
    ("entry not a mapping", {"artifacts": {"raw/a@v1": "download"}}),
    ("unknown entry field", chain("raw/a@v1", confg={})),
    ("unknown step", chain("raw/a@v1", step="downlaod")),
    ("config not a mapping", chain("raw/a@v1", config=["hamlet"])),
    ("config value without stable form", chain("raw/a@v1", config__sample_count=float("nan"))),
    ("config key not a string", chain("raw/a@v1", config={1: "x"})),
    ("malformed pin", chain("raw/a@v1", expect_fingerprint="abc")),
    ("a pin of digits only, unquoted", chain("raw/a@v1", expect_fingerprint=0)),
    ("pin that does not match", chain("raw/a@v1", expect_fingerprint="0000000000000000")),
    ("shards on a step that has none", chain("raw/a@v1", runtime={"shards": 2})),
    ("a runtime key its step never reads", chain("evaluations/m@v1", runtime={"batch_size": 8})),
    ("shards not a whole number", chain("tokenized/a@v1", runtime={"shards": 2.5})),
    ("runtime key unknown", chain("checkpoints/m@v1", runtime={"zoen": "us-east5-a"})),
    ("tpu with a newline", chain("checkpoints/m@v1", runtime={"tpu": "v5p-8\ntouch /tmp/pwned #"})),
    ("zone with shell characters", chain("checkpoints/m@v1", runtime={"zone": "us-east5-a$(touch /tmp/pwned)"})),
    ("num_workers not a whole number", chain("tokenized/a@v1", runtime={"num_workers": "lots"})),
    # deps
    ("role not an identifier", chain("evaluations/m@v1", deps={"2x": "raw/a@v1"})),
    ("dep without version", chain("evaluations/m@v1", deps__model="checkpoints/m")),
    ("dep with a bad name", chain("evaluations/m@v1", deps__model="Checkpoints/M")),
    ("misspelled dep", chain("evaluations/m@v1", deps__model="checkpoints/n@v1")),
    ("dep nowhere near a key", chain("evaluations/m@v1", deps__model="zzzzzz@v9")),
    ("depends on itself", chain("evaluations/m@v1", deps__model="evaluations/m@v1")),
    ("cycle", user(a_x={"step": "mysteps:make", "deps": {"in": "b/y@v1"}},
                   b_y={"step": "mysteps:make", "deps": {"in": "a/x@v1"}})),  # fmt: skip
    ("mixture weight not a number", chain("checkpoints/m@v1", deps__data={"tokenized/a@v1": "lots"})),
    ("mixture weights sum to zero", chain("checkpoints/m@v1", deps__data={"tokenized/a@v1": 0})),
    ("upstream of the wrong kind", chain("checkpoints/m@v1", deps__data="raw/a@v1")),
    ("role the step does not take", chain("tokenizers/t@v1", deps__text="raw/a@v1")),
    ("train without data", chain("checkpoints/m@v1", deps={})),
    ("train with another role", chain("checkpoints/m@v1", deps__corpus="raw/a@v1")),
    ("evaluate without a model", chain("evaluations/m@v1", deps={"data": "raw/a@v1"})),
    ("evaluate with a mixture", chain("evaluations/m@v1", deps__data={"raw/a@v1": 1})),
    ("download with deps", {"artifacts": {"raw/a@v1": {**RAW, "deps": {"src": "x/y@v1"}}, "x/y@v1": {"step": "mysteps:make"}}}),
    ("tokenize without a tokenizer", chain("tokenized/a@v1", deps={"corpus": "raw/a@v1"})),
    ("tokenize with a mixture corpus", chain("tokenized/a@v1", deps__corpus={"raw/a@v1": 1})),
    # user steps
    ("module not found", user(features_x={"step": "nomodule_zz.steps:count"})),
    ("package fails to import", user(features_x={"step": "brokenpkg_zz.steps:count"})),
    ("function not defined", user(features_x={"step": "mysteps:count_word"})),
    ("bound to a literal", user(features_x={"step": "mysteps:count"})),
    ("a working-folder module named like a library one", user(features_x={"step": "tokenize:count"})),
    # sweeps
    ("neither grid nor cases", sweep("s/n{i}@v1", {})),
    ("grid not a mapping", sweep("s/n{i}@v1", {"grid": [1, 2]})),
    ("grid variable without values", sweep("s/n{i}@v1", {"grid": {"i": []}})),
    ("cases not a list of mappings", sweep("s/n{i}@v1", {"cases": [1]})),
    ("case without a key variable", sweep("s/n{i}@v1", {"cases": [{"j": 1}]})),
    ("variable missing from the key", sweep("s/x@v1", {"config": {"i": "{i}"}, "grid": {"i": [1, 2]}})),
    ("values that print alike", sweep("s/n{i}@v1", {"grid": {"i": [1, "1"]}})),
    ("placeholder without a value", sweep("s/n{i}@v1", {"config": {"x": "{j}"}, "grid": {"i": [1]}})),
    ("unknown sweep field", sweep("s/n{i}@v1", {"grid": {"i": [1]}, "grdi": {}})),
    ("sweep not a mapping", {"sweeps": {"s/n{i}@v1": ["grid"]}}),
    ("range of fractions", sweep("s/n{i}@v1", {"grid": {"i": {"range": [0.5, 3]}}})),
    ("range written as text", sweep("s/n{i}@v1", {"grid": {"i": {"range": "1-5"}}})),
    ("range of three numbers", sweep("s/n{i}@v1", {"grid": {"i": {"range": [0, 6, 2]}}})),
    ("range that is empty", sweep("s/n{i}@v1", {"grid": {"i": {"range": [3, 3]}}})),
    ("range too long", sweep("s/n{i}@v1", {"grid": {"i": {"range": [0, 10000000]}}})),
    ("grid too large", sweep("s/n{i}-{j}@v1", {"grid": {"i": {"range": [0, 200]}, "j": {"range": [0, 200]}}})),
    ("too many cases", sweep("s/n{i}@v1", {"cases": [{"i": i} for i in range(10001)]})),
    # step configs
    ("text where a number goes", chain("checkpoints/m@v1", config__optimizer__learning_rate="fast")),
    ("3e-4 read as text", chain("checkpoints/m@v1", config__optimizer__learning_rate="3e-4")),
    ("quoted number", chain("checkpoints/m@v1", config__optimizer__learning_rate="0.001")),
    ("integer too small", chain("checkpoints/m@v1", config__num_train_steps=0)),
    ("float where an integer goes", chain("checkpoints/m@v1", config__batch_size=4.0)),
    ("required setting missing", chain("checkpoints/m@v1", config={k: v for k, v in TRAIN_CONFIG.items() if k != "seq_len"})),
    ("model missing", chain("checkpoints/m@v1", config={k: v for k, v in TRAIN_CONFIG.items() if k != "model"})),
    ("unknown setting", chain("checkpoints/m@v1", config__mesh__exper=2)),
    ("unknown model setting", chain("checkpoints/m@v1", config__model__n_layer=2)),
    ("model size above int32", chain("checkpoints/m@v1", config__model__d_model=10**23)),
    ("not one of the choices", chain("checkpoints/m@v1", config__model__moe_impl="fast")),
    ("not true or false", chain("checkpoints/m@v1", config__model__shared_expert="yes")),
    ("section not a mapping", chain("checkpoints/m@v1", config__optimizer=["adamw"])),
    ("n_heads against an unwritten default", chain("checkpoints/m@v1", config__model={"d_model": 32})),
    ("top_k above n_experts", chain("checkpoints/m@v1", config__model__n_experts=1)),
    ("rotary head size odd", chain("checkpoints/m@v1", config__model={"d_model": 36, "n_heads": 4})),
    ("quantile balance with top_k = n_experts", chain("checkpoints/m@v1", config__model__balance="quantile",
                                                      config__model__top_k=4)),  # fmt: skip
    ("seq_len above the model's default", chain("checkpoints/m@v1", config__seq_len=512)),
    ("batch not divisible", chain("checkpoints/m@v1", config__grad_accum_steps=3)),
    ("warmup longer than training", chain("checkpoints/m@v1", config__optimizer__warmup_steps=20)),
    ("moe_every above n_layers", chain("checkpoints/m@v1", config__model={"d_model": 64, "n_heads": 4, "n_layers": 2,
                                                                         "moe_every": 3})),  # fmt: skip
    ("muon_lr without muon", chain("checkpoints/m@v1", config__optimizer__muon_lr=0.02)),
    ("d_ff when every layer is MoE", chain("checkpoints/m@v1", config__model__d_ff=1024)),
    ("capacity_factor without capacity buckets", chain("checkpoints/m@v1", config__model__capacity_factor=2.0)),
    ("balance_loss_coef with quantile balance", chain("checkpoints/m@v1", config__model__balance="quantile",
                                                      config__model__balance_loss_coef=0.02)),  # fmt: skip
    ("MoE setting on a dense model", chain("checkpoints/m@v1", config__model__moe_every=0, config__model__top_k=1)),
    ("betas", chain("checkpoints/m@v1", config__optimizer__betas=[0.9])),
    ("vocabulary too small", chain("tokenizers/t@v1", config__vocab_size=300)),
    ("vocabulary missing", chain("tokenizers/t@v1", config={})),
    ("vocabulary and pretrained", chain("tokenizers/t@v1", config__pretrained="tokenizer.json")),
    ("special token empty", chain("tokenizers/t@v1", config__special_tokens__eos="")),
    ("validation fraction", chain("tokenized/a@v1", config__validation_fraction=1)),
    ("token dtype", chain("tokenized/a@v1", config__dtype="int8")),
    ("unknown package source", chain("raw/a@v1", config__source="package:tolstoy")),
    ("hf source not a dataset", chain("raw/a@v1", config__source="hf://models/gpt2")),
    ("held-out key twice", chain("raw/a@v1", config__heldout=["hamlet", "hamlet"])),
    ("held-out not a list", chain("raw/a@v1", config__heldout="hamlet")),
    ("unknown task", chain("evaluations/m@v1", config__tasks=["hellaswagg"])),
    ("task listed twice", chain("evaluations/m@v1", config__tasks=["hellaswag", "hellaswag"])),
    ("few-shot bits per byte", chain("evaluations/m@v1", config__tasks=[{"name": "marin_shakespeare_bpb", "num_fewshot": 2}])),
    ("unknown baseline", chain("evaluations/m@v1", config__baseline="bigram")),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    (root / "mysteps.py").write_text(STEPS_PY)
    (root / "brokenpkg_zz").mkdir()
    (root / "brokenpkg_zz" / "__init__.py").write_text("raise RuntimeError('boom')\n")
    (root / "brokenpkg_zz" / "steps.py").write_text("def count(ctx):\n    return {}\n")
    (root / "tokenize.py").write_text("def count(ctx):\n    return {}\n")  # the standard library has a tokenize
    return root


def produce(case: str, data: object, root) -> str:
    """The one-line message the loader gives for this bad input (`exp.yaml` in `root`)."""
    path = root / case.replace(" ", "_")
    path.mkdir()
    exp = path / "exp.yaml"
    if isinstance(data, str) and data == "<folder>":
        exp.mkdir()
    elif isinstance(data, bytes):
        exp.write_bytes(data)
    elif isinstance(data, str):
        exp.write_text(data)
    with pytest.raises(MarinError) as e:
        load_experiment(str(exp)) if data is None or isinstance(data, (str, bytes)) else build_experiment(data, str(exp))
    message = str(e.value)
    assert "\n" not in message
    if case == "pin that does not match":
        unpinned = copy.deepcopy(data)
        del unpinned["artifacts"]["raw/a@v1"]["expect_fingerprint"]
        message = message.replace(build_experiment(unpinned)["raw/a@v1"].fingerprint, "<fingerprint>")
    stdlib = sysconfig.get_paths()["stdlib"]
    message = message.replace(str(exp), "exp.yaml").replace(str(path), "<folder>").replace(str(root), "<folder>")
    return message.replace(stdlib, "<stdlib>")


@pytest.fixture(scope="module")
def produced(workdir) -> dict[str, str]:
    before = list(sys.path)
    sys.path.insert(0, str(workdir))
    try:
        import os

        cwd = os.getcwd()
        os.chdir(workdir)
        try:
            return {case: produce(case, data, workdir) for case, data in CASES}
        finally:
            os.chdir(cwd)
    finally:
        sys.path[:] = before
        for name in ("mysteps", "brokenpkg_zz", "brokenpkg_zz.steps"):
            sys.modules.pop(name, None)


def documented() -> dict[str, list[str]]:
    """Section heading -> the messages of its table rows (`| input | `message` |`)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif line.startswith("|") and current and not set(line) <= set("|- "):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            m = re.fullmatch(r"(`+) ?(.*?) ?\1", cells[-1])
            if m:
                sections[current].append(m.group(2))
    return sections


def test_every_case_is_listed_in_the_doc_with_its_exact_message(produced):
    sections = documented()
    listed = {m for s in CHECKED_SECTIONS for m in sections.get(s, [])}
    missing = {case: message for case, message in produced.items() if message not in listed}
    assert not missing, "\n".join(f"{case}: {message}" for case, message in missing.items())


def test_every_message_listed_for_the_loader_is_produced(produced):
    made = set(produced.values())
    for section in CHECKED_SECTIONS:
        stale = [m for m in documented()[section] if m not in made]
        assert not stale, f"{section}: listed but not produced: {stale}"


def test_the_doc_lists_at_least_forty_refused_inputs():
    assert sum(len(v) for v in documented().values()) >= 40
