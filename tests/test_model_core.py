"""Model core: shapes and aux structure, causality, two AdamW steps lower the loss,
quantile balancing moves load the right way and its bias gets no gradient.

Compiles dominate the time on CPU (5-10 s each here): each test jits one function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from marin_rules.model.config import ModelConfig
from marin_rules.model.router import RouterBias
from marin_rules.model.transformer import (
    MoETransformer,
    attention_implementation,
    empty_cache,
    loss_and_aux,
    moe_layers,
    update_router_bias,
)

TINY = dict(
    vocab_size=97, max_seq_len=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
    d_ff=64, n_experts=4, top_k=2, d_expert=32,
)


def tiny(**overrides) -> ModelConfig:
    return ModelConfig(**{**TINY, **overrides})


def tokens(batch=4, length=17, seed=0, vocab=97):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, dtype=jnp.int32)


forward = nnx.jit(lambda model, x: model(x))
objective = nnx.jit(loss_and_aux)


def test_forward_shapes_and_aux_of_a_mixed_dense_and_moe_stack():
    # layer 0 dense SwiGLU, layer 1 MoE with a shared expert; untied head, sigmoid gates
    config = tiny(moe_every=2, shared_expert=True, tie_embeddings=False, router_gate="sigmoid", balance="quantile")
    model = MoETransformer(config, rngs=nnx.Rngs(0))
    logits, aux = forward(model, tokens(length=16))
    assert logits.shape == (4, 16, 97) and logits.dtype == jnp.float32
    assert aux["expert_load"].shape == (1, 4) and aux["quantile_beta"].shape == (1, 4)
    np.testing.assert_allclose(np.sum(aux["expert_load"], axis=-1), 1.0, rtol=1e-6)
    for key in ("balance_loss", "z_loss", "dropped_fraction", "routing_entropy"):
        assert aux[key].shape == () and np.isfinite(aux[key])
    assert 0 < float(aux["routing_entropy"]) <= np.log(4) + 1e-5
    assert float(aux["balance_loss"]) >= 0.9  # E * sum f P is about 1 when balanced, more when not


def test_a_model_without_moe_layers_is_a_plain_dense_transformer():
    model = MoETransformer(tiny(moe_every=0, compute_dtype="bfloat16"), rngs=nnx.Rngs(0))
    assert moe_layers(model) == []
    loss, metrics = objective(model, tokens())
    assert metrics["expert_load"].shape == (0, 4)
    assert float(metrics["balance_loss"]) == 0.0
    assert abs(float(loss) - np.log(97)) < 0.5  # near-uniform at init


def test_future_tokens_do_not_change_past_logits():
    model = MoETransformer(tiny(moe_impl="ragged"), rngs=nnx.Rngs(0))
    a = tokens(batch=4, length=16)
    b = a.at[:, 10:].set((a[:, 10:] + 1) % 97)
    la, _ = forward(model, a)
    lb, _ = forward(model, b)
    np.testing.assert_allclose(la[:, :10], lb[:, :10], atol=1e-5)
    assert not np.allclose(la[:, 10:], lb[:, 10:], atol=1e-3)


def test_two_adamw_steps_lower_the_loss_with_quantile_bias_updates():
    model = MoETransformer(tiny(moe_impl="capacity", balance="quantile"), rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    batch = tokens(batch=8)

    @nnx.jit
    def step(model, optimizer, batch):
        (loss, metrics), grads = nnx.value_and_grad(loss_and_aux, has_aux=True)(model, batch)
        optimizer.update(model, grads)
        update_router_bias(model, metrics)
        return loss

    losses = [float(step(model, optimizer, batch)) for _ in range(3)]
    assert losses[2] < losses[1] < losses[0], losses
    bias = np.asarray(moe_layers(model)[0].router.bias[...])
    assert np.any(bias != 0) and abs(bias.mean()) < 1e-5  # updated inside jit, zero-mean


def test_router_bias_is_not_a_param_and_gets_no_gradient():
    model = MoETransformer(tiny(balance="quantile"), rngs=nnx.Rngs(0))
    for layer in moe_layers(model):
        assert isinstance(layer.router.bias, RouterBias) and not isinstance(layer.router.bias, nnx.Param)
        layer.router.bias[...] = jnp.array([1.0, -1.0, 0.5, -0.5])
    params = nnx.state(model, nnx.Param)
    assert not any("bias" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params))
    grad_bias = nnx.jit(nnx.grad(lambda m, t: loss_and_aux(m, t)[0], argnums=nnx.DiffState(0, RouterBias)))
    grads = jax.tree.leaves(grad_bias(model, tokens()))
    assert len(grads) == 2
    for g in grads:
        np.testing.assert_array_equal(g, 0.0)


def test_quantile_bias_update_moves_load_toward_balance():
    model = MoETransformer(tiny(balance="quantile", n_experts=8, n_layers=1), rngs=nnx.Rngs(0))
    layer = moe_layers(model)[0]
    layer.router.w[...] = layer.router.w[...].at[:, :2].add(0.3)  # skew toward experts 0, 1
    batch = tokens(batch=16, seed=3)
    _, before = objective(model, batch)
    load0 = np.asarray(before["expert_load"][0])
    update_router_bias(model, before)
    bias = np.asarray(layer.router.bias[...])
    assert abs(bias.mean()) < 1e-5
    assert bias[np.argmax(load0)] < 0 < bias[np.argmin(load0)]
    _, after = objective(model, batch)
    load1 = np.asarray(after["expert_load"][0])
    assert load1.max() - load1.min() < 0.5 * (load0.max() - load0.min()), (load0, load1)
    # replaced, not accumulated: the same stats give the same bias again
    update_router_bias(model, before)
    np.testing.assert_allclose(layer.router.bias[...], bias)


def test_update_router_bias_is_a_no_op_without_quantile_balancing():
    model = MoETransformer(tiny(moe_impl="ragged"), rngs=nnx.Rngs(0))
    _, aux = forward(model, tokens(length=16))  # same shapes as the causality test: no new compile
    before = jax.tree.map(np.asarray, nnx.state(model))
    update_router_bias(model, aux)
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, nnx.state(model)))


def test_kv_cache_prefill_then_single_steps_equals_one_causal_pass():
    # rows of different prompt lengths (right-padded), then one-token steps at per-row
    # positions: the logits are those of one plain causal pass over each full row
    model = MoETransformer(tiny(moe_impl="ragged"), rngs=nnx.Rngs(0))
    full = tokens(batch=2, length=12, seed=3)
    lengths = jnp.asarray([5, 9], jnp.int32)
    expected, _ = forward(model, full)

    @nnx.jit
    def cached(model, full, lengths):
        prompt = jnp.where(jnp.arange(12)[None] < lengths[:, None], full, 0)  # padding past each length
        hidden, _, cache = model.trunk(prompt, positions=jnp.broadcast_to(jnp.arange(12), (2, 12)), cache=empty_cache(model.config, 2, 16))
        rows = [model.logits(hidden)]
        for step in range(3):
            position = lengths + step
            token = jnp.take_along_axis(full, position[:, None], axis=1)
            hidden, _, cache = model.trunk(token, positions=position[:, None], cache=cache)
            rows.append(model.logits(hidden))
        return rows

    prefill, *steps = cached(model, full, lengths)
    for r, n in enumerate([5, 9]):
        np.testing.assert_allclose(prefill[r, :n], expected[r, :n], atol=1e-5)
        for step, logits in enumerate(steps):
            np.testing.assert_allclose(logits[r, 0], expected[r, n + step], atol=1e-5)


def test_bfloat16_head_accumulates_in_float32():
    model = MoETransformer(tiny(compute_dtype="bfloat16", tie_embeddings=False), rngs=nnx.Rngs(0))
    hidden = jax.random.normal(jax.random.key(1), (4, 8, 32), jnp.float32).astype(jnp.bfloat16)
    logits = jax.jit(model.logits)(hidden)
    assert logits.dtype == jnp.float32
    exact = np.asarray(hidden, np.float64) @ np.asarray(model.head[...].astype(jnp.bfloat16), np.float64)
    np.testing.assert_allclose(logits, exact, rtol=1e-5, atol=1e-6)  # f32 sums of bf16 products
    rounded = np.asarray(jnp.asarray(logits).astype(jnp.bfloat16).astype(jnp.float32))
    assert np.mean(rounded != np.asarray(logits)) > 0.5  # not bf16 results cast to f32


def test_capacity_drops_let_a_later_token_change_an_earlier_output_and_dropless_does_not():
    # capacity 1.0 with every token wanting the same experts: later rows push earlier ones out
    a = tokens(batch=4, length=16)
    b = a.at[1:].set((a[1:] + 7) % 97)  # only rows 1..3 change
    outputs = {}
    for impl in ("capacity", tiny(moe_impl="capacity").dropless().moe_impl):
        model = MoETransformer(tiny(moe_impl=impl, capacity_factor=0.5), rngs=nnx.Rngs(0))
        outputs[impl] = (forward(model, a)[0][0], forward(model, b)[0][0])  # row 0's logits
    assert tiny(moe_impl="capacity").dropless().moe_impl == "ragged"
    assert (dense := tiny(moe_impl="dense")).dropless() is dense  # dropless already: the same config
    assert not np.allclose(*outputs["capacity"], atol=1e-4)  # row 0 depends on its batch
    np.testing.assert_allclose(*outputs["ragged"], atol=1e-5)  # row 0 is row 0's alone


def test_attention_uses_cudnn_only_on_recent_nvidia_gpus_in_16_bit_with_heads_it_supports():
    # cuDNN's fused attention needs an NVIDIA GPU of compute capability >= 8.0, 16-bit
    # operands and head_dim a multiple of 8 up to 128; everything else (this CPU, TPU,
    # ROCm, a V100, float32) keeps XLA's. The cuDNN path itself is checked on a GPU by
    # benchmarks/attention_check.py (no GPU in CI).
    from types import SimpleNamespace

    def gpu(capability):
        return SimpleNamespace(platform="gpu", compute_capability=capability)

    assert attention_implementation(gpu("9.0"), "bfloat16", 128) == "cudnn"
    assert attention_implementation(gpu("8.0"), "bfloat16", 32) == "cudnn"
    assert attention_implementation(gpu("7.0"), "bfloat16", 128) == "xla"  # V100
    assert attention_implementation(SimpleNamespace(platform="gpu"), "bfloat16", 128) == "xla"  # ROCm
    assert attention_implementation(gpu("9.0"), "float32", 128) == "xla"
    assert attention_implementation(gpu("9.0"), "bfloat16", 12) == "xla"
    assert attention_implementation(gpu("9.0"), "bfloat16", 256) == "xla"
    assert attention_implementation(SimpleNamespace(platform="tpu"), "bfloat16", 128) == "xla"
    assert attention_implementation(jax.devices()[0], "bfloat16", 128) == "xla"  # this CPU
