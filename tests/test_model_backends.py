"""The three expert dispatch backends compute the same function: `capacity` (when
nothing is dropped) and `ragged` match the `dense` reference in loss and gradients;
`capacity` with a small factor drops assignments and reports how many."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from marin_rules.model.config import ModelConfig
from marin_rules.model.moe import (
    LIVE_CAPACITY,
    SPECULATIVE_CAPACITY,
    _bucket_slots,
    blocked_layout,
    capacity,
    dispatch_dense,
    dispatch_ragged,
    grouped_ffn_blocked,
    grouped_ffn_ragged_dot,
)
from marin_rules.model.transformer import MoETransformer, loss_and_aux

CONFIG = dict(
    vocab_size=97, max_seq_len=16, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
    d_ff=64, n_experts=4, top_k=2, d_expert=32, shared_expert=True, router_gate="softmax",
)
BATCH = jax.random.randint(jax.random.key(0), (4, 17), 0, 97, dtype=jnp.int32)


def _loss_and_grads(moe_impl: str, capacity_factor: float = 1.25):
    config = ModelConfig(**CONFIG, moe_impl=moe_impl, capacity_factor=capacity_factor)
    model = MoETransformer(config, rngs=nnx.Rngs(0))  # same seed: same weights for every backend
    fn = nnx.jit(nnx.value_and_grad(loss_and_aux, has_aux=True))
    (loss, metrics), grads = fn(model, BATCH)
    return float(loss), metrics, nnx.to_pure_dict(grads)


@pytest.fixture(scope="module")
def dense_reference():
    return _loss_and_grads("dense")


@pytest.mark.parametrize("impl, capacity_factor", [("ragged", 1.0), ("capacity", 4.0), ("capacity", 1e300)])
def test_backend_matches_dense_in_loss_and_gradients(dense_reference, impl, capacity_factor):
    ref_loss, ref_metrics, ref_grads = dense_reference
    loss, metrics, grads = _loss_and_grads(impl, capacity_factor)
    assert float(metrics["dropped_fraction"]) == 0.0
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["expert_load"], ref_metrics["expert_load"])
    flat_ref = jax.tree_util.tree_leaves_with_path(ref_grads)
    flat = jax.tree_util.tree_leaves(grads)
    assert len(flat) == len(flat_ref)
    for (path, g_ref), g in zip(flat_ref, flat):
        assert np.all(np.isfinite(g)), jax.tree_util.keystr(path)
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    names = {jax.tree_util.keystr(p) for p, g in flat_ref if np.max(np.abs(g)) > 0}
    for part in ("embed", "w_q", "router", "w_gate", "w_down", "shared", "scale"):
        assert any(part in n for n in names), f"no gradient reaches {part}"


def test_capacity_buckets_keep_first_choices_first_and_drop_the_overflow():
    experts = jnp.array([[0, 1], [0, 2], [0, 1]], jnp.int32)  # expert 0 is everyone's first choice
    slots = np.asarray(_bucket_slots(experts, n_experts=3, cap=2))
    dropped = 3 * 2
    # first choices fill expert 0's two slots in token order; token 2's first choice overflows
    assert slots[:, 0].tolist() == [0, 1, dropped]
    # second choices: expert 1 slots 2, 3 and expert 2 slot 4
    assert slots[:, 1].tolist() == [2, 4, 3]


def test_capacity_is_at_most_one_slot_per_token():
    # an expert is chosen at most once per token: a huge factor asks for no more slots
    # (1e8 once overflowed the jitted program's int argument)
    assert capacity(64, 2, 4, 1.25) == 40
    assert capacity(64, 2, 4, 1e300) == capacity(64, 2, 4, 2.0) == 64


def test_capacity_with_a_small_factor_reports_dropped_assignments():
    config = ModelConfig(**CONFIG, moe_impl="capacity", capacity_factor=0.5)
    loss, metrics = nnx.jit(loss_and_aux)(MoETransformer(config, rngs=nnx.Rngs(0)), BATCH)  # forward only
    assert 0.45 <= float(metrics["dropped_fraction"]) < 1.0  # at least half over capacity
    assert np.isfinite(loss)


def test_blocked_grouped_matmul_matches_ragged_dot_on_uneven_and_empty_groups():
    E, D, I = 4, 8, 16
    group_sizes = jnp.array([13, 0, 2, 25], jnp.int32)  # uneven, one expert empty
    xs = jax.random.normal(jax.random.key(1), (40, D))
    ws = [0.3 * jax.random.normal(jax.random.key(i), s) for i, s in enumerate([(E, D, I), (E, D, I), (E, I, D)], 2)]

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda xs, ws: jnp.sum(fn(xs, group_sizes, *ws) ** 2), argnums=(0, 1)))

    blocked = loss(lambda *a: grouped_ffn_blocked(*a, block=4))(xs, ws)
    reference = loss(grouped_ffn_ragged_dot)(xs, ws)
    for got, want in zip(jax.tree.leaves(blocked), jax.tree.leaves(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _assignments(T: int, E: int, skewed: bool):
    """[T, 2] distinct experts per token: spread evenly, or every token on experts 0 and 1."""
    if skewed:
        return jnp.tile(jnp.array([[0, 1]], jnp.int32), (T, 1))
    first = jnp.arange(T, dtype=jnp.int32) % E
    return jnp.stack([first, (first + 1 + jnp.arange(T, dtype=jnp.int32) // E % (E - 1)) % E], axis=1)


@pytest.mark.parametrize("T", [64, 2048])  # exact path: buckets of T rows (64), padded blocks (2048)
@pytest.mark.parametrize("skewed", [False, True], ids=["buckets-fit", "buckets-overflow"])
def test_padded_ragged_drops_nothing_whether_its_speculative_buckets_fit_or_not(T, skewed):
    E, D, I = 4, 8, 16
    experts = _assignments(T, E, skewed)
    loads = np.bincount(np.asarray(experts).ravel(), minlength=E)
    assert (loads.max() > capacity(T, 2, E, SPECULATIVE_CAPACITY)) == skewed  # the case it claims to be
    assert (E * T <= np.prod(blocked_layout(2 * T, E))) == (T == 64)
    x = jax.random.normal(jax.random.key(1), (T, D))
    weights = jax.random.uniform(jax.random.key(2), (T, 2))
    ws = [0.3 * jax.random.normal(jax.random.key(i), s) for i, s in enumerate([(E, D, I), (E, D, I), (E, I, D)], 3)]

    def run(dispatch):
        def loss(x, weights, ws):
            y, dropped = dispatch(x, experts, weights, *ws, capacity_factor=1.0)
            return jnp.sum(y**2), (y, dropped)

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(x, weights, ws)

    (_, (y, dropped)), grads = run(dispatch_ragged)
    (_, (y_ref, _)), grads_ref = run(dispatch_dense)
    assert float(dropped) == 0.0
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)  # the forward pass: speculative or exact
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):  # the backward: exact path
        # f32 sums in another order: errors scale with the largest entry (a 1.7e-5 one was seen beside 491)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(want))))


@pytest.mark.parametrize("case", ["both-bucketed", "live-overflows", "only-live-fits", "live-fits-at-1.25"])
def test_ragged_with_live_inputs_gives_the_same_live_outputs(case):
    """Padding takes no slot of the factor-1.0 buckets (its output is 0 there); when the
    live inputs overflow them, the path without `live` runs. Live outputs are bitwise
    the same where both take buckets, within float rounding where only the live inputs
    fit them (the path without `live` is then the exact one, laid out otherwise)."""
    T, E, D, I = 256, 4, 8, 16
    live = np.arange(T) % 8 < (6 if case == "live-overflows" else 5)  # 1/4-3/8 padding, as at the end of packed rows
    experts = np.array(_assignments(T, E, skewed=case == "live-overflows"))
    if case == "only-live-fits":  # the padding all on experts 0 and 1: every input overflows the 1.25 buckets
        experts[~live] = [0, 1]
    if case == "live-fits-at-1.25":  # 100 live inputs on experts 0 and 1: past 1.0, within 1.25
        experts[np.flatnonzero(live)[:100]] = [0, 1]
    loads = np.bincount(experts.ravel(), minlength=E)
    live_loads = np.bincount(experts[live].ravel(), minlength=E)
    assert (live_loads.max() > capacity(T, 2, E, LIVE_CAPACITY)) == (case in ("live-overflows", "live-fits-at-1.25"))
    assert (live_loads.max() > capacity(T, 2, E, SPECULATIVE_CAPACITY)) == (case == "live-overflows")  # as claimed
    assert (loads.max() > capacity(T, 2, E, SPECULATIVE_CAPACITY)) == (case != "both-bucketed")
    x = jax.random.normal(jax.random.key(1), (T, D))
    weights = jax.random.uniform(jax.random.key(2), (T, 2))
    ws = [0.3 * jax.random.normal(jax.random.key(i), s) for i, s in enumerate([(E, D, I), (E, D, I), (E, I, D)], 3)]
    run = jax.jit(lambda live: dispatch_ragged(x, jnp.asarray(experts), weights, *ws, capacity_factor=1.0, live=live)[0])
    y, y_all = np.asarray(run(jnp.asarray(live))), np.asarray(run(None))
    if case == "only-live-fits":
        np.testing.assert_allclose(y[live], y_all[live], rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(y[live], y_all[live])
    if case == "live-overflows":  # computed like every input
        np.testing.assert_array_equal(y[~live], y_all[~live])
    else:  # the padding skipped
        assert np.all(y[~live] == 0)
