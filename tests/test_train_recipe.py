"""The recipe a train run's checkpoints belong to: recorded afresh, checked on resume.

Plain files only (no JAX): the end-to-end refusal of a changed recipe is in
`test_train_run.py`. `memory://` stands in for gs://, as both go through fsspec.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from marin_rules.artifacts.errors import StepError
from marin_rules.train.recipe import (
    check_recipe,
    claim_checkpoints,
    make_recipe,
    recipe_changes,
    recipe_location,
    record_recipe,
)

CONFIG = {
    "model": {"d_model": 32, "n_layers": 2},
    "optimizer": {"name": "adamw", "learning_rate": 0.003},
    "num_train_steps": 40000,
    "batch_size": 8,
    "seq_len": 32,
    "checkpoint_every": 1000,
    "log_every": 10,
    "eval_every": 500,
}


def deps(tmp_path, version="v1") -> dict:
    return {"data": str(tmp_path / "tokenized" / "x" / version)}


def changed(**overrides) -> dict:
    return {**CONFIG, **overrides}


def refusal(output: str, recipe: dict) -> str:
    with pytest.raises(StepError) as e:
        check_recipe(output, recipe)
    return str(e.value)


def test_changed_learning_rate_and_steps_are_named_with_the_ways_out(tmp_path):
    output = str(tmp_path / "out")
    record_recipe(output, make_recipe(CONFIG, deps(tmp_path), output))
    new = changed(num_train_steps=21010, optimizer={"name": "adamw", "learning_rate": 0.0005})
    message = refusal(output, make_recipe(new, deps(tmp_path), output))
    assert message == (
        f"config: the checkpoints in {output} were written by another recipe "
        "(num_train_steps: 40000 -> 21010; optimizer.learning_rate: 0.003 -> 0.0005); "
        "bump the version to train the new recipe, force this artifact (snakemake -f on its record, as marin path "
        f"prints it) to set them aside and train afresh, or delete {output}/checkpoints to start over"
    )
    assert "\n" not in message


def test_the_same_recipe_a_number_respelled_and_logging_or_checkpoint_frequency_changes_resume(tmp_path):
    output = str(tmp_path / "out")
    record_recipe(output, make_recipe(CONFIG, deps(tmp_path), output))
    check_recipe(output, make_recipe(dict(CONFIG), deps(tmp_path), output))
    check_recipe(output, make_recipe(changed(log_every=1, checkpoint_every=7, eval_every=0), deps(tmp_path), output))
    without = {k: v for k, v in CONFIG.items() if k not in ("log_every", "eval_every")}
    check_recipe(output, make_recipe(without, deps(tmp_path), output))
    respelled = changed(optimizer={"name": "adamw", "learning_rate": 0.003, "min_lr_ratio": 0})
    record_recipe(output, make_recipe(respelled, deps(tmp_path), output))
    check_recipe(output, make_recipe(changed(optimizer={**respelled["optimizer"], "min_lr_ratio": 0.0}), deps(tmp_path), output))


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"seed": 0}, "seed (added: 0)"),  # an explicit default is a change, as for the fingerprint
        ({"eval_batches": 8}, "eval_batches (added: 8)"),
        ({"mesh": {"expert": 2}}, 'mesh (added: {"expert": 2})'),
        ({"model": {"d_model": 64, "n_layers": 2}}, "model.d_model: 32 -> 64"),
        ({"batch_size": 16}, "batch_size: 8 -> 16"),
    ],
)
def test_anything_that_changes_the_math_is_refused(tmp_path, override, field):
    output = str(tmp_path / "out")
    record_recipe(output, make_recipe(CONFIG, deps(tmp_path), output))
    assert recipe_changes(make_recipe(CONFIG, deps(tmp_path), output), make_recipe(changed(**override), deps(tmp_path), output)) == [
        field
    ]
    assert f"({field})" in refusal(output, make_recipe(changed(**override), deps(tmp_path), output))


def test_other_data_is_refused_naming_deps_but_one_folder_spelled_two_ways_is_not(tmp_path, monkeypatch):
    output = str(tmp_path / "out")
    record_recipe(output, make_recipe(CONFIG, deps(tmp_path), output))
    message = refusal(output, make_recipe(CONFIG, deps(tmp_path, "v2"), output))
    assert message.startswith(f"deps: the checkpoints in {output} were written by another recipe (deps.data: ")
    assert message.count("tokenized/x/v1 -> ") == 1 and "tokenized/x/v2)" in message
    monkeypatch.chdir(tmp_path)
    check_recipe(output, make_recipe(CONFIG, {"data": "tokenized/x/v1/"}, output))
    check_recipe(output, make_recipe(CONFIG, {"data": f"file://{tmp_path}/tokenized/x/v1"}, output))


def test_a_recipe_moved_with_its_prefix_still_matches_and_an_absolute_one_from_older_code_too(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    output = str(old / "checkpoints" / "m" / "v1")
    record_recipe(output, make_recipe(CONFIG, {"data": str(old / "tokenized" / "x" / "v1")}, output))
    assert str(tmp_path) not in recipe_path(output).read_text()
    old.rename(new)
    moved = str(new / "checkpoints" / "m" / "v1")
    check_recipe(moved, make_recipe(CONFIG, {"data": str(new / "tokenized" / "x" / "v1")}, moved))
    recipe_path(moved).write_text(json.dumps({"config": CONFIG, "deps": {"data": str(new / "tokenized" / "x" / "v1")}}))
    check_recipe(moved, make_recipe(CONFIG, {"data": str(new / "tokenized" / "x" / "v1")}, moved))
    assert "deps.data: ../../../tokenized/x/v1 -> ../../../tokenized/x/v2" in refusal(
        moved, make_recipe(CONFIG, {"data": str(new / "tokenized" / "x" / "v2")}, moved)
    )


def recipe_path(output: str):
    from pathlib import Path

    return Path(recipe_location(output))


def test_a_changed_mixture_weight_is_refused(tmp_path):
    output = str(tmp_path / "out")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    record_recipe(output, make_recipe(CONFIG, {"data": {a: 0.7, b: 0.3}}, output))
    check_recipe(output, make_recipe(CONFIG, {"data": {b: 0.3, a: 0.7}}, output))
    assert "deps.data.../a: 0.7 -> 0.5" in refusal(output, make_recipe(CONFIG, {"data": {a: 0.5, b: 0.3}}, output))


def test_checkpoints_without_a_recipe_resume_unchecked(tmp_path):
    output = str(tmp_path / "out")
    check_recipe(output, make_recipe(changed(batch_size=16), deps(tmp_path), output))


def test_claim_records_on_a_fresh_start_by_the_writer_only_and_never_on_resume(tmp_path):
    output = str(tmp_path / "out")
    recipe = make_recipe(CONFIG, deps(tmp_path), output)
    claim_checkpoints(output, recipe, resuming=False, writer=False)
    assert not (tmp_path / "out" / "checkpoints" / "recipe.json").exists()
    claim_checkpoints(output, recipe, resuming=False, writer=True)
    stored = json.loads((tmp_path / "out" / "checkpoints" / "recipe.json").read_text())
    assert stored == {"config": CONFIG, "deps": {"data": "../tokenized/x/v1"}}  # relative: the prefix may move
    before = (tmp_path / "out" / "checkpoints" / "recipe.json").read_bytes()
    claim_checkpoints(output, make_recipe(changed(log_every=1), deps(tmp_path), output), resuming=True, writer=True)
    with pytest.raises(StepError, match="optimizer.learning_rate: 0.003 -> 0.1"):
        new = changed(optimizer={"name": "adamw", "learning_rate": 0.1})
        claim_checkpoints(output, make_recipe(new, deps(tmp_path), output), resuming=True, writer=True)
    assert (tmp_path / "out" / "checkpoints" / "recipe.json").read_bytes() == before


def test_recipe_round_trips_on_an_object_store():
    output = f"memory://recipe-{uuid.uuid4().hex[:8]}/checkpoints/m/v1"
    remote_deps = {"data": "memory://bucket/tokenized/x/v1/"}
    record_recipe(output, make_recipe(CONFIG, remote_deps, output))
    assert recipe_location(output) == f"{output}/checkpoints/recipe.json"
    check_recipe(output, make_recipe(CONFIG, {"data": "memory://bucket/tokenized/x/v1"}, output))
    assert "learning_rate: 0.003 -> 0.1" in refusal(
        output, make_recipe(changed(optimizer={"name": "adamw", "learning_rate": 0.1}), remote_deps, output)
    )


def test_an_unreadable_recipe_says_how_to_start_over(tmp_path):
    output = str(tmp_path / "out")
    (tmp_path / "out" / "checkpoints").mkdir(parents=True)
    (tmp_path / "out" / "checkpoints" / "recipe.json").write_text("{not json")
    message = refusal(output, make_recipe(CONFIG, deps(tmp_path), output))
    assert "unreadable" in message and f"delete {output}/checkpoints to start the run over" in message


def test_recipe_module_imports_no_jax():
    code = (
        "import sys; import marin_rules.train.recipe; "
        "print([m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax', 'orbax')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
