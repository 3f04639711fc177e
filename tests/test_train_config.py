"""The train step's recipe checker: errors name the field, and no JAX is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marin_rules.artifacts.errors import ConfigError
from marin_rules.train.config import check_train, parse_train_config
from marin_rules.train.distributed import parse_distributed

GOOD = {
    "model": {"d_model": 64, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
    "optimizer": {"name": "muon", "learning_rate": 0.003, "muon_lr": 0.02, "warmup_steps": 10},
    "num_train_steps": 100,
    "batch_size": 16,
    "seq_len": 64,
    "grad_accum_steps": 2,
    "mesh": {"data": 2, "expert": 2},
}
DEPS = {"data": "tokenized/shakespeare@v1"}


def error_of(config, deps=DEPS) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        check_train(config, deps)
    return e.value


def test_a_full_recipe_parses_with_defaults_filled_in():
    check_train(GOOD, DEPS)
    tc = parse_train_config(GOOD, vocab_size=4096)
    assert tc.model.vocab_size == 4096 and tc.micro_batch_size == 8
    assert tc.optimizer.betas == (0.9, 0.95) and tc.mesh.expert == 2


def test_bad_learning_rate_names_the_field_and_the_value():
    e = error_of({**GOOD, "optimizer": {"learning_rate": "fast"}})
    assert e.field == "config.optimizer.learning_rate"
    assert e.message == "expected a number > 0, got 'fast'"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"optimizer": {"name": "sgd"}}, "config.optimizer.name"),
        ({"optimizer": {"betas": [0.9]}}, "config.optimizer.betas"),
        ({"optimizer": {"warmup_steps": 1000}}, "config.optimizer.warmup_steps"),
        ({"num_train_steps": 0}, "config.num_train_steps"),
        ({"batch_size": 15}, "config.grad_accum_steps"),
        ({"seq_len": 128}, "config.seq_len"),
        ({"mesh": {"expert": 0}}, "config.mesh.expert"),
        ({"learning_rate": 0.1}, "config.learning_rate"),
        ({"model": {"n_heads": 5}}, "config.model.n_heads"),
        ({"model": {"d_modle": 64}}, "config.model.d_modle"),
    ],
)
def test_each_bad_value_is_reported_at_its_field(change, field):
    assert error_of({**GOOD, **change}).field == field


def test_muon_lr_written_without_muon_is_refused_not_silently_ignored():
    e = error_of({**GOOD, "optimizer": {"name": "adamw", "muon_lr": 0.02}})
    assert str(e) == (
        "config.optimizer.muon_lr: used only with name: muon (name is adamw); remove it or set name: muon"
    )
    assert error_of({**GOOD, "optimizer": {"muon_lr": 0.02}}).message.startswith(
        "used only with name: muon (name is adamw, the default);"
    )
    assert parse_train_config({**GOOD, "optimizer": {"name": "adamw"}}).optimizer.muon_lr == 0.02  # default: fine


def test_deps_need_exactly_a_data_role():
    assert error_of(GOOD, {}).field == "deps.data"
    assert error_of(GOOD, {**DEPS, "corpus": "raw/x@v1"}).field == "deps.corpus"
    assert error_of(GOOD, {"data": {"a@v1": -1.0}}).field == "deps.data"
    check_train(GOOD, {"data": {"tokenized/a@v1": 0.7, "tokenized/b@v1": 0.3}})


def test_runtime_distributed_settings_are_validated():
    assert not parse_distributed(None).enabled
    assert parse_distributed("auto").auto
    d = parse_distributed({"coordinator": "127.0.0.1:1234", "num_processes": 2, "process_id": 1})
    assert d.enabled and d.process_id == 1
    with pytest.raises(ConfigError) as e:
        parse_distributed({"coordinator": "127.0.0.1:1234", "num_processes": 2, "process_id": 2})
    assert e.value.field == "runtime.distributed.process_id"


def test_checker_imports_no_jax():
    code = (
        "import sys; from marin_rules.train.config import check_train; "
        f"check_train({GOOD!r}, {DEPS!r}); "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax', 'orbax', 'tokenizers')]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
