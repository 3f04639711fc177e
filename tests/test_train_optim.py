"""The optimizer and the jitted train step, on the real model at a tiny size."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from marin_rules.model.roles import param_roles
from marin_rules.model.sharding import make_mesh, path_names
from marin_rules.model.transformer import MoETransformer
from marin_rules.train.config import OptimizerConfig, parse_train_config
from marin_rules.train.optim import decay_mask, learning_rates, make_optimizer, param_groups, schedule
from marin_rules.train.steps import init_model, make_train_step

MODEL = {
    "vocab_size": 64, "max_seq_len": 16, "d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
    "d_ff": 64, "n_experts": 4, "top_k": 2, "d_expert": 16, "moe_every": 2, "balance": "quantile",
}  # fmt: skip
ONE_MOE_LAYER = {**{k: v for k, v in MODEL.items() if k != "d_ff"}, "n_layers": 1, "moe_every": 1}  # half the compile time


def model_config(model=MODEL):
    return parse_train_config({"model": model, "num_train_steps": 10, "batch_size": 8, "seq_len": 16}).model


def model_parts():
    """Real weights, created in one jitted call (as training does) on a 1x1 mesh."""
    return init_model(model_config(ONE_MOE_LAYER), 0, make_mesh(1, 1))


def abstract_params(config):
    abstract = nnx.eval_shape(lambda: MoETransformer(config, rngs=nnx.Rngs(0)))
    return nnx.split(abstract, nnx.Param, ...)[1]


def by_name(tree) -> dict:
    return {"/".join(path_names(p)): v for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def test_muon_takes_every_matrix_by_role_adamw_the_rest_and_decay_skips_norms_and_router():
    # every kind of weight at once: dense and MoE layers, a shared expert, an untied head
    config = dataclasses.replace(model_config(), shared_expert=True, tie_embeddings=False)
    params = abstract_params(config)
    groups, decays = by_name(param_groups(params, "muon")), by_name(decay_mask(params))
    assert groups == {name: ("muon" if name.split("/")[-1].startswith("w_") else "adamw") for name in groups}
    assert {n for n, g in groups.items() if g == "adamw"} == {
        "embed", "head", "norm/scale", "blocks/1/ffn/router/w",
        *(f"blocks/{i}/{norm}/scale" for i in (0, 1) for norm in ("attn_norm", "ffn_norm")),
    }  # fmt: skip
    assert groups["blocks/1/ffn/w_gate"] == "muon" and groups["blocks/1/ffn/shared/w_gate"] == "muon"
    assert not decays["norm/scale"] and not decays["blocks/1/ffn/router/w"]
    assert decays["embed"] and decays["head"] and decays["blocks/0/attn/w_q"]
    assert set(by_name(param_groups(params, "adamw")).values()) == {"adamw"}


def test_a_parameter_without_a_declared_role_is_refused_not_grouped_silently():
    params = {"blocks": {"0": {"attn": {"w_q": jnp.zeros((4, 4)), "w_qk_gate": jnp.zeros((4, 4))}}}}
    with pytest.raises(ValueError, match=r"parameter blocks/0/attn/w_qk_gate has no role; add its name to ROLES"):
        param_roles(params)
    with pytest.raises(ValueError, match="w_qk_gate has no role"):
        make_optimizer(OptimizerConfig(name="muon"), 10).init(params)


def test_schedule_starts_above_zero_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    config = OptimizerConfig(learning_rate=1.0, warmup_steps=4, min_lr_ratio=0.1)
    lr = schedule(1.0, config, 20)
    assert [float(lr(s)) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # update 0 already learns
    assert float(lr(4)) == pytest.approx(1.0)
    values = [float(lr(s)) for s in range(4, 21)]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert float(lr(12)) == pytest.approx(0.1 + 0.9 * 0.5)  # half way down the cosine
    assert float(lr(20)) == pytest.approx(0.1)
    assert float(schedule(1.0, OptimizerConfig(warmup_steps=0), 20)(0)) == pytest.approx(1.0)
    assert learning_rates(OptimizerConfig(name="muon", learning_rate=1.0, muon_lr=2.0, warmup_steps=4), 20, 0) == {
        "lr": 0.25, "muon_lr": 0.5,
    }  # fmt: skip


def test_our_muon_update_equals_optax_muon_to_float_rounding():
    """train/muon.py rewrites optax's Muon without copies (a tall matrix uses the Gram
    matrix on its other side); the update must stay optax's: measured at most 3.3e-6 of the
    largest entry at these shapes, over three updates so momentum counts."""
    from optax.contrib import MuonDimensionNumbers

    from marin_rules.train.muon import scale_by_muon

    shapes = {"tall": (96, 32), "wide": (32, 96), "square": (48, 48), "experts_tall": (3, 64, 24), "experts_wide": (3, 24, 64)}
    params = {name: jnp.zeros(shape) for name, shape in shapes.items()}
    dims = lambda tree: jax.tree.map(lambda x: MuonDimensionNumbers(x.ndim - 2, x.ndim - 1), tree)  # noqa: E731
    reference = optax.contrib.muon(1.0, beta=0.9, muon_weight_dimension_numbers=dims)
    ours = optax.chain(scale_by_muon(beta=0.9), optax.scale_by_learning_rate(1.0))
    ref_state, our_state = reference.init(params), ours.init(params)
    for seed in range(3):
        grads = {n: jax.random.normal(jax.random.key(seed), s) for n, s in shapes.items()}
        expected, ref_state = reference.update(grads, ref_state, params)
        got, our_state = ours.update(grads, our_state, params)
        for name in shapes:
            scale = float(jnp.abs(expected[name]).max())
            assert scale > 0.01
            assert float(jnp.abs(got[name] - expected[name]).max()) <= 1e-5 * scale, name


@pytest.mark.slow
def test_the_first_update_moves_the_weights_even_with_warmup():
    graphdef, params, state = model_parts()
    tx = make_optimizer(OptimizerConfig(learning_rate=0.01, warmup_steps=100), 200)
    rows = np.random.default_rng(0).integers(0, 64, (1, 4, 17)).astype(np.int32)
    new = make_train_step(graphdef, tx, 1)(params, state, tx.init(params), jnp.asarray(rows))[0]
    moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new))]
    assert min(moved) > 0


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
