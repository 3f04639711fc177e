"""ModelConfig validation names the field, round-trips through dicts, imports no JAX;
the FLOP and parameter counts agree with the model's real parameters."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from marin_rules.artifacts.errors import ConfigError
from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import active_params, flops_per_token, total_params


@pytest.mark.parametrize("bad, field, words", [
    ({"n_experts": 0}, "n_experts", "expected an integer >= 1, got 0"),
    ({"d_model": "big"}, "d_model", "expected an integer"),
    ({"top_k": 5}, "top_k", "at most n_experts=4"),
    ({"n_heads": 5}, "n_heads", "must divide d_model"),
    ({"n_kv_heads": 4, "n_heads": 6}, "n_kv_heads", "must divide n_heads"),
    ({"moe_impl": "fast"}, "moe_impl", "'dense', 'capacity', 'ragged'"),
    ({"router_gate": "relu"}, "router_gate", "'softmax', 'sigmoid'"),
    ({"balance": "quantile", "top_k": 4}, "balance", "top_k < n_experts"),
    ({"capacity_factor": 0}, "capacity_factor", "> 0"),
    ({"shared_expert": "yes"}, "shared_expert", "true or false"),
    ({"moe_every": -1}, "moe_every", ">= 0"),
    ({"n_expert": 4, "dmodel": 3}, "dmodel", "unknown setting (did you mean d_model?); known: balance,"),
])
def test_bad_values_raise_config_error_naming_the_field(bad, field, words):
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict({"vocab_size": 100, "n_experts": 4, **bad})
    assert info.value.field == field
    assert words in info.value.message
    assert str(info.value.within("config.model")).startswith(f"config.model.{field}: ")


def test_from_dict_round_trips_and_takes_vocab_size_from_the_tokenizer():
    config = ModelConfig.from_dict({"d_model": 64, "n_heads": 4, "n_kv_heads": 2}, vocab_size=321)
    assert config.vocab_size == 321 and config.d_model == 64
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert ModelConfig.from_dict({"vocab_size": 7}, vocab_size=321).vocab_size == 7  # explicit wins


def test_config_module_imports_no_jax():
    code = (
        "import sys; import marin_rules.model.config, marin_rules.model.flops, marin_rules.model;"
        "bad = [m for m in ('jax', 'flax', 'optax') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_moe_every_chooses_which_layers_are_moe():
    assert [ModelConfig(n_layers=4, moe_every=1).is_moe_layer(i) for i in range(4)] == [True] * 4
    assert [ModelConfig(n_layers=4, moe_every=2).is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert ModelConfig(n_layers=4, moe_every=0).n_moe_layers == 0


def test_moe_every_above_n_layers_is_refused_not_silently_dense():
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict({"n_layers": 2, "moe_every": 3})
    assert str(info.value.within("config.model")) == (
        "config.model.moe_every: 3 makes no layer MoE with n_layers=2; use moe_every: 0 for a dense model, or at most 2"
    )
    with pytest.raises(ConfigError, match=r"^moe_every: 5 makes no layer MoE with n_layers=4 \(the default\);"):
        ModelConfig.from_dict({"moe_every": 5})
    assert ModelConfig.from_dict({"n_layers": 2, "moe_every": 2}).n_moe_layers == 1


def test_parameter_counts_match_the_model_and_active_equals_dense_baseline():
    from flax import nnx
    import jax

    from marin_rules.model.transformer import MoETransformer

    moe = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4,
                      top_k=2, d_expert=16, d_ff=32, moe_every=1, tie_embeddings=False, shared_expert=True)
    model = nnx.eval_shape(lambda: MoETransformer(moe, rngs=nnx.Rngs(0)))  # shapes only
    real = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert total_params(moe) == real
    dense = ModelConfig(**{**moe.to_dict(), "moe_every": 0, "d_ff": 3 * 16})  # top_k + shared experts
    router = 2 * 32 * 4
    assert active_params(moe) == active_params(dense) + router
    # nanoGPT: 6 * matmul params + 12 * L * d_model * T; the input embedding is no matmul
    assert flops_per_token(dense, 16) == 6 * (active_params(dense) - 50 * 32) + 12 * 2 * 32 * 16
