"""The published JSON Schema of experiment files: current, valid, and in agreement with
the loader (what the schema refuses, `load_experiment` refuses too)."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml

from conftest import REPO
from marin_rules.artifacts.errors import MarinError
from marin_rules.experiment import ENTRY_FIELDS, TOP_FIELDS, build_experiment
from marin_rules.schema import SCHEMA_FILE, experiment_schema, schema_text
from marin_rules.steps import BUILTIN_STEPS
from marin_rules.sweeps import SWEEP_ONLY_FIELDS

DEFAULT = yaml.safe_load((REPO / "experiments" / "default.yaml").read_text())
TRAIN = "checkpoints/nano-moe@v1"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((REPO / "schema" / "experiment.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_committed_schema_is_the_generated_one():
    with open(SCHEMA_FILE, encoding="utf-8") as f:
        assert f.read() == schema_text(), "schema is out of date: run python -m marin_rules.schema --write"


def test_schema_lists_exactly_the_loaders_fields_and_every_builtin_step():
    s = experiment_schema()
    assert set(s["properties"]) == TOP_FIELDS
    assert set(s["definitions"]["entry"]["properties"]) == ENTRY_FIELDS
    assert set(s["definitions"]["sweep"]["properties"]) == ENTRY_FIELDS | SWEEP_ONLY_FIELDS
    steps = [case["if"]["properties"]["step"]["const"] for case in s["definitions"]["entry"]["allOf"]]
    assert sorted(steps) == sorted(BUILTIN_STEPS)


def test_shipped_experiments_validate_against_the_schema(validator):
    files = sorted((REPO / "experiments").glob("*.yaml"))
    assert files
    for f in files:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(f.read_text()))]
        assert errors == [], f"{f.name}: {errors}"


def _train(**changes) -> dict:
    data = copy.deepcopy(DEFAULT)
    config = data["artifacts"][TRAIN]["config"]
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = config
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


@pytest.mark.parametrize(
    "data,path",
    [
        (_train(**{"optimizer.learning_rate": "3e-4"}), ["config", "optimizer", "learning_rate"]),
        (_train(**{"model.d_modle": 64}), ["config", "model"]),
        (_train(**{"model.moe_impl": "fast"}), ["config", "model", "moe_impl"]),
        (_train(**{"batch_size": 0}), ["config", "batch_size"]),
        (_train(**{"mesh.expert": True}), ["config", "mesh", "expert"]),
        (_train(**{"optimizer.learning_rate": float("inf")}), ["config", "optimizer", "learning_rate"]),  # YAML .inf
    ],
)  # fmt: skip
def test_schema_and_loader_refuse_the_same_bad_train_config(validator, data, path):
    errors = list(validator.iter_errors(data))
    assert [list(e.absolute_path) for e in errors] == [["artifacts", TRAIN, *path]]
    with pytest.raises(MarinError, match=f"^{TRAIN}: config"):
        build_experiment(data)


def test_schema_refuses_bad_keys_roles_and_missing_steps(validator):
    bad_key = {"artifacts": {"Checkpoints/x": {"step": "download"}}}
    wrong_role = copy.deepcopy(DEFAULT)
    wrong_role["artifacts"][TRAIN]["deps"] = {"corpus": "raw/shakespeare@v1"}
    no_step = {"artifacts": {"raw/x@v1": {"config": {}}}}
    for data in (bad_key, wrong_role, no_step):
        assert list(validator.iter_errors(data)), data
        with pytest.raises(MarinError):
            build_experiment(data)


def test_every_setting_of_every_builtin_step_has_a_description_for_editors():
    undocumented = []

    def walk(schema: dict, path: str) -> None:
        for name, prop in schema.get("properties", {}).items():
            if "description" not in prop:
                undocumented.append(f"{path}.{name}")
            walk(prop, f"{path}.{name}")

    for case in experiment_schema()["definitions"]["entry"]["allOf"]:
        walk(case["then"]["properties"]["config"], case["if"]["properties"]["step"]["const"])
    assert undocumented == []


def test_sections_written_null_are_accepted_by_schema_and_loader_alike(validator):
    """`optimizer: ~`, `runtime: ~`, ... load as left out; the schema says so too, while
    `model: ~` (a section with required settings) is refused by both."""
    data = _train(optimizer=None, mesh=None)
    data["artifacts"][TRAIN].update(runtime=None, expect_fingerprint=None)
    data["artifacts"]["tokenized/shakespeare@v1"]["deps"]["corpus"] = "raw/shakespeare@v1"
    data["artifacts"]["raw/shakespeare@v1"]["deps"] = None
    alone = {"artifacts": {"raw/x@v1": {"step": "download", "config": None}}}
    for accepted in (data, alone):
        assert list(validator.iter_errors(accepted)) == []
        build_experiment(accepted)
    refused = _train(model=None)
    assert [list(e.absolute_path) for e in validator.iter_errors(refused)] == [["artifacts", TRAIN, "config", "model"]]
    with pytest.raises(MarinError, match=f"^{TRAIN}: config.model"):
        build_experiment(refused)


def test_a_whole_number_written_with_a_point_is_told_how_to_write_it(validator):
    # JSON Schema's "integer" takes 300.0 (one number in JSON); the loader reads YAML's
    # float and refuses it, naming the spelling it takes
    data = _train(num_train_steps=300.0)
    assert list(validator.iter_errors(data)) == []
    with pytest.raises(MarinError) as refused:
        build_experiment(data)
    assert str(refused.value) == (f"{TRAIN}: config.num_train_steps: expected an integer >= 1, got 300.0 "
                                  "(a float: write 300, without the point)")  # fmt: skip
