"""The artifact core without Snakemake: identity, fingerprints, drift diffs, experiment files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from marin_rules.artifacts.canonical import canonical_json, fingerprint
from marin_rules.artifacts.drift import drift_message, printable, recipe_diff
from marin_rules.artifacts.errors import ConfigError, ExperimentError, MarinError
from marin_rules.artifacts.identity import parse_key
from marin_rules.experiment import build_experiment, load_experiment


@pytest.mark.parametrize(
    "key",
    ["raw/../etc@v1", "/abs/path@v1", "raw/has space@v1", "raw//x@v1", "Raw/Upper@v1", "raw/x", "raw/x@",
     "raw/x@.hidden", "raw/x@v 1", "@v1", "raw/./x@v1",
     "raw/a@v1\n", "raw/a\n@v1"],  # a final newline: Python's $ matches before it, \Z does not
)  # fmt: skip
def test_bad_artifact_keys_are_rejected(key):
    with pytest.raises(ConfigError):
        parse_key(key)


def test_good_keys_parse_into_name_and_version():
    a = parse_key("checkpoints/nano-moe.small_2@2026.12.02-rc1")
    assert (a.name, a.version, a.path) == ("checkpoints/nano-moe.small_2", "2026.12.02-rc1", "checkpoints/nano-moe.small_2/2026.12.02-rc1")


def test_fingerprint_ignores_key_order():
    a = fingerprint("train", {"b": 1, "a": {"y": 2, "x": [1, 2.5]}}, {"data": "tok/x@v1"})
    b = fingerprint("train", {"a": {"x": [1, 2.5], "y": 2}, "b": 1}, {"data": "tok/x@v1"})
    assert a == b and len(a) == 16


def test_fingerprint_is_stable_across_processes_and_hash_seeds():
    code = (
        "from marin_rules.artifacts.canonical import fingerprint;"
        "print(fingerprint('train', {'lr': 0.001, 'tags': ['a', 'b'], 'm': {'z': 1, 'a': None}}, {'d': 'x/y@v1'}))"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                       capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        for seed in ("0", "1", "12345")
    }  # fmt: skip
    assert len(outs) == 1
    assert outs.pop() == fingerprint("train", {"m": {"a": None, "z": 1}, "tags": ["a", "b"], "lr": 0.001}, {"d": "x/y@v1"})


def test_fingerprint_changes_with_step_config_and_deps():
    base = fingerprint("train", {"lr": 0.1}, {"data": "t/x@v1"})
    assert base != fingerprint("tokenize", {"lr": 0.1}, {"data": "t/x@v1"})
    assert base != fingerprint("train", {"lr": 0.2}, {"data": "t/x@v1"})
    assert base != fingerprint("train", {"lr": 0.1}, {"data": "t/x@v2"})
    assert fingerprint("train", {"n": 1}, {}) != fingerprint("train", {"n": 1.0}, {})


@pytest.mark.parametrize(
    "value,field",
    [({"lr": float("nan")}, "config.lr"), ({"x": {"s": {1, 2}}}, "config.x.s"), ({"f": [1, float("inf")]}, "config.f[1]"),
     ({"o": object()}, "config.o")],
)  # fmt: skip
def test_values_without_stable_form_are_refused_naming_the_field(value, field):
    with pytest.raises(ConfigError) as e:
        fingerprint("train", value, {})
    assert e.value.field == field


def test_canonical_json_has_fixed_separators_and_sorted_keys():
    assert canonical_json({"b": [1, {"d": 1, "c": 2}], "a": "é"}) == '{"a":"é","b":[1,{"c":2,"d":1}]}'


def test_recipe_diff_lists_changed_added_and_removed_fields():
    old = {"step": "train", "config": {"optimizer": {"learning_rate": 0.003}, "model": {"n_experts": 4, "gone": 1}}, "deps": {"data": "t/x@v1"}}
    new = {"step": "train", "config": {"optimizer": {"learning_rate": 0.001}, "model": {"n_experts": 8, "router": "sigmoid"}}, "deps": {"data": "t/x@v2"}}
    assert recipe_diff(old, new) == [
        "model.gone (removed)",
        "model.n_experts: 4 -> 8",
        "model.router (added)",
        "optimizer.learning_rate: 0.003 -> 0.001",
        "deps.data: t/x@v1 -> t/x@v2",
    ]


EVIL = "1\x1b[2J\n  n: 1 -> 1\u202eé中"  # clears the screen, forges a drift line, reverses the text
ESCAPED = "1\\x1b[2J\\n  n: 1 -> 1\\u202eé中"  # as repr() writes it; é and 中 as they are


def test_printable_escapes_control_and_bidi_override_characters_and_keeps_other_unicode():
    assert printable(EVIL) == ESCAPED
    assert printable("\t\r\x00\x7f\x85\u2028\u2066") == "\\t\\r\\x00\\x7f\\x85\\u2028\\u2066"
    assert printable("é 中 ü-ß") == "é 中 ü-ß"


def test_recipe_diff_lines_show_record_values_and_keys_printable():
    lines = recipe_diff({"step": "s\x1b[0m", "config": {"n": EVIL, "k\n": 1}}, {"step": "s", "config": {"n": 1}})
    assert lines == ["step: s\\x1b[0m -> s", "k\\n (removed)", f"n: {ESCAPED} -> 1"]


def test_drift_message_caps_field_lines_at_twenty():
    lines = [f"f{i}: 1 -> 2" for i in range(34)]
    message = drift_message("ck/m@v1", "3f2a", "91c0", lines).splitlines()
    assert message[0] == "ck/m@v1: recipe drift: recorded fingerprint 3f2a, now 91c0;"
    assert message[1] == "serving the cached output. Bump the version to build the new recipe."
    assert len(message) == 2 + 20 + 1 and message[-1] == "  ...and 14 more"


def _exp(artifacts=None, sweeps=None):
    data = {}
    if artifacts is not None:
        data["artifacts"] = artifacts
    if sweeps is not None:
        data["sweeps"] = sweeps
    return data


USER = "mypkg.steps:make"


@pytest.fixture(autouse=True, scope="module")
def _user_package(user_step_package):
    return user_step_package


@pytest.mark.parametrize(
    "data,message",
    [
        (_exp({"raw/a@v1": {"step": "nosuch"}}), "raw/a@v1: step: expected a built-in step"),
        (_exp({"raw/a@v1": {"step": USER, "colour": 1}}), "raw/a@v1: colour: unknown field"),
        (_exp({"raw/a@v1": {"step": USER, "deps": {"src": "raw/missing@v1"}}}),
         "raw/a@v1: deps.src: raw/missing@v1 is not defined in this experiment"),
        (_exp({"raw/a@v1": {"step": USER, "deps": {"src": "raw/b@v1"}}, "raw/b@v1": {"step": USER, "deps": {"src": "raw/a@v1"}}}),
         "deps form a cycle: raw/a@v1 -> raw/b@v1 -> raw/a@v1"),
        (_exp({"raw/a@v1": {"step": USER, "deps": {"src": "raw/a@v1"}}}), "raw/a@v1: deps.src: raw/a@v1 depends on itself"),
        (_exp({"raw/a@v1": {"step": USER, "config": {"x": float("nan")}}}), "raw/a@v1: config.x: nan has no stable JSON form"),
        (_exp({"raw/a@v1": {"step": USER, "config": [1]}}), "raw/a@v1: config: expected a mapping"),
        (_exp({"raw/a@v1": {"step": USER}, "raw/b@v1": {"step": USER, "deps": {"d": {"raw/a@v1": 0}}}}),
         "raw/b@v1: deps.d: mixture weights must sum to a positive number"),
        (_exp({"raw/a@v1": {"step": USER}, "raw/b@v1": {"step": USER, "deps": {"d": {"raw/a@v1": "lots"}}}}),
         "raw/b@v1: deps.d.raw/a@v1: expected a weight >= 0, got 'lots'"),
        (_exp({"raw/a@v1": {"step": USER, "expect_fingerprint": "0000000000000000"}}),
         "raw/a@v1: expect_fingerprint: pinned 0000000000000000 but the recipe fingerprints to"),
        (_exp({"raw/../x@v1": {"step": USER}}), "bad artifact name 'raw/../x'"),
        (_exp({}), "no artifacts defined"),
        ({"artifacts": {}, "extra": 1}, "unknown top-level key 'extra'"),
        (_exp(sweeps={"m/x-{lr}@v1": {"step": USER, "grid": {"lr": []}}}), "grid.lr: expected a non-empty list"),
        (_exp(sweeps={"m/x-{lr}@v1": {"step": USER, "cases": [{"other": 1}]}}), "case 0: no value for {lr}"),
        (_exp(sweeps={"m/x-{tag}@v1": {"step": USER, "grid": {"tag": ["a\n", "b"]}}}), "bad artifact name"),
        (_exp({"raw/a@v1": {"step": "my_steps:f\n"}}), "raw/a@v1: step:"),
    ],
)  # fmt: skip
def test_bad_experiments_fail_with_one_line_naming_artifact_and_field(data, message):
    with pytest.raises(MarinError) as e:
        build_experiment(data)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_sweep_grid_expands_to_typed_entries_with_distinct_fingerprints():
    exp = build_experiment(
        _exp(
            {"tok/x@v1": {"step": USER}},
            {
                "ck/moe-lr{lr}-e{experts}@v1": {
                    "step": USER,
                    "deps": {"data": "tok/x@v1"},
                    "config": {"optimizer": {"learning_rate": "{lr}"}, "model": {"n_experts": "{experts}"}, "tag": "e{experts}"},
                    "grid": {"lr": [0.001, 0.003], "experts": [4, 8]},
                }
            },
        )
    )
    keys = list(exp.artifacts)
    assert keys[0] == "tok/x@v1"
    assert set(keys[1:]) == {f"ck/moe-lr{lr}-e{e}@v1" for lr in (0.001, 0.003) for e in (4, 8)}
    entry = exp["ck/moe-lr0.003-e8@v1"]
    assert entry.config == {"optimizer": {"learning_rate": 0.003}, "model": {"n_experts": 8}, "tag": "e8"}
    assert len({a.fingerprint for a in exp.artifacts.values()}) == 5


def test_sweep_range_and_cases_forms():
    exp = build_experiment(_exp(sweeps={"s/n{i}@v1": {"step": USER, "config": {"i": "{i}"}, "grid": {"i": {"range": [0, 3]}}}}))
    assert [a.config["i"] for a in exp.artifacts.values()] == [0, 1, 2]
    exp = build_experiment(_exp(sweeps={"s/{a}-{b}@v2": {"step": USER, "cases": [{"a": "x", "b": 1}, {"a": "y", "b": 2}]}}))
    assert list(exp.artifacts) == ["s/x-1@v2", "s/y-2@v2"]


def test_dependency_order_puts_upstreams_first_and_keeps_file_order():
    exp = build_experiment(
        _exp({"e/c@v1": {"step": USER, "deps": {"a": "r/b@v1"}}, "r/a@v1": {"step": USER}, "r/b@v1": {"step": USER, "deps": {"x": "r/a@v1"}}})
    )
    assert list(exp.artifacts) == ["r/a@v1", "r/b@v1", "e/c@v1"]


def test_runtime_is_recorded_but_not_fingerprinted():
    a = build_experiment(_exp({"r/a@v1": {"step": USER, "runtime": {"tpu": "v5p-8"}}}))["r/a@v1"]
    b = build_experiment(_exp({"r/a@v1": {"step": USER, "runtime": {"tpu": "v4-32", "zone": "us-central2-b"}}}))["r/a@v1"]
    assert a.fingerprint == b.fingerprint and a.runtime == {"tpu": "v5p-8"}


def test_load_experiment_reports_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ExperimentError, match="experiment file not found"):
        load_experiment(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("artifacts: [unclosed\n")
    with pytest.raises(ExperimentError, match="not valid YAML"):
        load_experiment(str(bad))


def test_shipped_experiments_validate():
    from conftest import REPO

    files = sorted((REPO / "experiments").glob("*.yaml"))
    assert files, "experiments/ has no YAML files"
    for f in files:
        assert load_experiment(str(f)).artifacts
