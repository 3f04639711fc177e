"""The optimizer and the jitted train step, on the real model at a tiny size."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from marin_rules.model.transformer import MoETransformer
from marin_rules.train.config import OptimizerConfig, parse_train_config
from marin_rules.model.sharding import make_mesh
from marin_rules.train.loop import init_model, make_train_step
from marin_rules.train.optim import make_optimizer, param_group, path_names, schedule

MODEL = {
    "vocab_size": 64, "max_seq_len": 16, "d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
    "d_ff": 64, "n_experts": 4, "top_k": 2, "d_expert": 16, "moe_every": 2, "balance": "quantile",
}  # fmt: skip
ONE_MOE_LAYER = {**MODEL, "n_layers": 1, "moe_every": 1}  # half the compile time


def model_config(model=MODEL):
    return parse_train_config({"model": model, "num_train_steps": 10, "batch_size": 8, "seq_len": 16}).model


def model_parts():
    """Real weights, created in one jitted call (as training does) on a 1x1 mesh."""
    return init_model(model_config(ONE_MOE_LAYER), 0, make_mesh(1, 1))


def test_muon_takes_hidden_and_expert_matrices_adamw_the_rest():
    abstract = nnx.eval_shape(lambda: MoETransformer(model_config(), rngs=nnx.Rngs(0)))
    _, params, _ = nnx.split(abstract, nnx.Param, ...)
    groups = {
        "/".join(path_names(path)): param_group(path, leaf, "muon")
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }
    assert groups["embed"] == "adamw"
    assert groups["norm/scale"] == "adamw"
    assert groups["blocks/1/ffn/router/w"] == "adamw"
    assert groups["blocks/0/attn/w_q"] == "muon"
    assert groups["blocks/0/ffn/w_gate"] == "muon"  # dense layer [D, F]
    assert groups["blocks/1/ffn/w_gate"] == "muon"  # stacked experts [E, D, I]
    assert all(group == "adamw" for name, group in groups.items() if "norm" in name)
    assert {param_group(p, x, "adamw") for p, x in jax.tree_util.tree_leaves_with_path(params)} == {"adamw"}


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    config = OptimizerConfig(learning_rate=1.0, warmup_steps=4, min_lr_ratio=0.1)
    lr = schedule(1.0, config, 20)
    assert float(lr(0)) == 0.0 and float(lr(2)) == pytest.approx(0.5)
    assert float(lr(4)) == pytest.approx(1.0)
    values = [float(lr(s)) for s in range(4, 21)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert float(lr(20)) == pytest.approx(0.1)


@pytest.mark.slow
def test_two_accumulated_micro_batches_equal_one_full_batch_with_muon():
    graphdef, params, state = model_parts()
    tx = make_optimizer(OptimizerConfig(name="muon", learning_rate=0.01, muon_lr=0.02), 10)
    opt_state = tx.init(params)
    rows = np.random.default_rng(0).integers(0, 64, (8, 17)).astype(np.int32)
    whole = make_train_step(graphdef, tx, 1)(params, state, opt_state, jnp.asarray(rows[None]))
    halves = make_train_step(graphdef, tx, 2)(params, state, opt_state, jnp.asarray(rows.reshape(2, 4, 17)))
    for a, b in zip(jax.tree.leaves(whole[0]), jax.tree.leaves(halves[0])):
        np.testing.assert_allclose(a, b, atol=2e-5)
    before = params["blocks"][0]["ffn"]["w_gate"][...]
    after = whole[0]["blocks"][0]["ffn"]["w_gate"][...]
    assert float(jnp.abs(after - before).max()) > 1e-4  # Muon moved the stacked expert weights
    bias = whole[1]["blocks"][0]["ffn"]["router"]["bias"][...]
    assert float(jnp.abs(bias).max()) > 0  # quantile balancing replaced the router bias
    assert "bias" not in {n for p, _ in jax.tree_util.tree_leaves_with_path(whole[2]) for n in path_names(p)}
    assert np.isfinite(float(whole[3]["loss"])) and float(whole[3]["grad_norm"]) > 0
