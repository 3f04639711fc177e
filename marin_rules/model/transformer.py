"""A decoder-only mixture-of-experts transformer in flax nnx, readable top to bottom.

Model: token embedding -> n_layers x [RMSNorm -> causal grouped-query attention with
rotary positions -> residual; RMSNorm -> SwiGLU or MoE -> residual] -> RMSNorm ->
logits (tied to the embedding by default). `MoETransformer(config, rngs=...)(tokens)`
returns (logits f32 [B, T, V], aux) where aux holds the routers' statistics averaged
over MoE layers (`balance_loss`, `z_loss`, `dropped_fraction`, `routing_entropy`),
per layer `expert_load` [L_moe, E], and `quantile_beta` [L_moe, E] when
balance='quantile'. `loss_and_aux` is the training and evaluation objective;
`update_router_bias` applies quantile balancing after each optimizer step.

Inference uses the same layers through `trunk(tokens, positions=..., cache=...)`: each
token sits at an explicit absolute position, and attention reads and writes a
key/value cache (`KVCache`, keys and values of every layer at positions 0..S-1). A
query at position p attends to every cached key at a position <= p, so one prefill
followed by one-token steps (generation) gives the logits of one causal forward
pass. Cache entries at positions beyond a row's own tokens are never attended: they
are masked until written. Scoring packs several sequences into a row instead:
`trunk(tokens, positions=..., mask=...)`, each token at its position in its own
sequence, attending where `mask` says (a shared context and the continuations after
it, each seeing the context and itself). `logits(hidden)` applies the output head,
only where it is needed.

Precision: parameters are float32 and each matmul casts its weight to `compute_dtype`.
With `compute_dtype: bfloat16` the residual stream itself is bfloat16: the embedding
lookup is cast on entry and every attention/FFN output added to it is bfloat16; RMSNorm
and rotary embeddings compute in float32 and cast back; the router runs in float32;
the output head multiplies bfloat16 operands but accumulates in float32
(`preferred_element_type`), so the logits and the loss are float32.

Attention: causal attention without a mask or cache (training, plain scoring) runs
cuDNN's fused flash attention on an NVIDIA GPU when it applies (compute capability
8.0 or later, 16-bit compute, head_dim a multiple of 8 up to 128:
`attention_implementation`), else XLA's, which builds the
[T, T] scores in memory. Both compute the same function; they round differently.
References: nanoGPT model.py, Llama (RMSNorm, rotary, SwiGLU, GQA), GShard
and Switch Transformer (MoE), Marin grug MoE (router bias).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from marin_rules.model.config import ModelConfig
from marin_rules.model.head_loss import head_cross_entropy
from marin_rules.model.moe import DISPATCH
from marin_rules.model.router import Router, new_router_bias
from marin_rules.model.sharding import constrain_batch


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], std: float) -> nnx.Param:
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * self.scale[...]).astype(x.dtype)


def linear(x: jax.Array, w: jax.Array, preferred_element_type=None) -> jax.Array:
    """x [..., in] @ w [in, out] as one 2-D matmul over the flattened tokens. Same
    values as the batched product, but XLA:CPU lays out the backward of a [B, T, in]
    product badly (a transposed copy of each activation for the weight gradient):
    measured 3.7x slower for a SwiGLU's forward + backward at [8, 128, 128] -> 512."""
    y = jnp.matmul(x.reshape(-1, x.shape[-1]), w, preferred_element_type=preferred_element_type)
    return y.reshape(*x.shape[:-1], w.shape[-1])


def rotary_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [..., T, head_dim/2] at integer `positions` [..., T] (RoFormer)."""
    freqs = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = positions.astype(jnp.float32)[..., None] * freqs
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate pairs (first half, second half) of each head: x [B, T, N, H], cos and
    sin [T, H/2] (shared by the batch) or [B, T, H/2] (per row)."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    c, s = cos[..., None, :], sin[..., None, :]
    return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).astype(x.dtype)


class KVCache(NamedTuple):
    """Keys and values of every layer at absolute positions 0..S-1: k, v [L, B, S, N_kv, H]."""

    k: jax.Array
    v: jax.Array

    def rows(self, index: jax.Array) -> "KVCache":
        """The cache of rows `index` [R] (rows may repeat: continuations sharing a prefix)."""
        return KVCache(self.k[:, index], self.v[:, index])


def empty_cache(config: ModelConfig, batch: int, length: int) -> KVCache:
    shape = (config.n_layers, batch, length, config.n_kv_heads, config.head_dim)
    zeros = jnp.zeros(shape, jnp.dtype(config.compute_dtype))
    return KVCache(zeros, zeros)


def cached_attention(q, k, v, kv: tuple[jax.Array, jax.Array], positions: jax.Array):
    """Write this call's keys/values [B, T, N_kv, H] into the layer's cache at
    `positions` [B, T] (positions past the cache are dropped), then attend each query
    to every cached key at a position <= its own. Returns (y [B, T, N, H], (k, v))."""
    k_cache, v_cache = kv
    rows = jnp.arange(q.shape[0])[:, None]
    k_cache = k_cache.at[rows, positions].set(k.astype(k_cache.dtype), mode="drop")
    v_cache = v_cache.at[rows, positions].set(v.astype(v_cache.dtype), mode="drop")
    visible = jnp.arange(k_cache.shape[1])[None, None, :] <= positions[:, :, None]  # [B, T, S]
    y = jax.nn.dot_product_attention(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), mask=visible[:, None])
    return y, (k_cache, v_cache)


def attention_implementation(device: Any, compute_dtype: str, head_dim: int) -> str:
    """`cudnn` (fused flash attention) where it applies, else `xla`: see the module
    docstring. cuDNN's flash attention needs an NVIDIA GPU of compute capability 8.0 or
    later (a ROCm GPU has none; a V100 or T4 is older)."""
    capability = getattr(device, "compute_capability", None) if device.platform == "gpu" else None
    try:
        major = int(str(capability).split(".")[0])
    except ValueError:
        return "xla"
    if major >= 8 and jnp.dtype(compute_dtype).itemsize == 2 and head_dim % 8 == 0 and head_dim <= 128:
        return "cudnn"
    return "xla"


class Attention(nnx.Module):
    """Causal grouped-query attention: n_heads queries share n_kv_heads keys/values."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.dtype = jnp.dtype(c.compute_dtype)
        self.w_q = _normal(rngs, (c.d_model, c.n_heads * c.head_dim), c.init_std)
        self.w_k = _normal(rngs, (c.d_model, c.n_kv_heads * c.head_dim), c.init_std)
        self.w_v = _normal(rngs, (c.d_model, c.n_kv_heads * c.head_dim), c.init_std)
        self.w_o = _normal(rngs, (c.n_heads * c.head_dim, c.d_model), c.init_std / (2 * c.n_layers) ** 0.5)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, kv=None, positions=None, mask=None):
        """Causal self-attention over x [B, T, D]; with `mask` [B, T, T] (query, key),
        attention where it is True instead (packed sequences); with a layer cache `kv`
        (k, v [B, S, N_kv, H]) and `positions` [B, T], attention over the cache.
        Returns (y [B, T, D], the updated layer cache or None)."""
        B, T, _ = x.shape
        dt = self.dtype
        q = linear(x, self.w_q[...].astype(dt)).reshape(B, T, self.n_heads, self.head_dim)
        k = linear(x, self.w_k[...].astype(dt)).reshape(B, T, self.n_kv_heads, self.head_dim)
        v = linear(x, self.w_v[...].astype(dt)).reshape(B, T, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if kv is None and mask is None:
            impl = attention_implementation(jax.devices()[0], str(self.dtype), self.head_dim)
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)  # [B, T, n_heads, head_dim]
        elif kv is None:
            y = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])
        else:
            y, kv = cached_attention(q, k, v, kv, positions)
        return linear(y.reshape(B, T, -1), self.w_o[...].astype(dt)), kv


class SwiGLU(nnx.Module):
    """The dense feed-forward: w_down(silu(x w_gate) * x w_up)."""

    def __init__(self, config: ModelConfig, hidden: int, *, rngs: nnx.Rngs):
        c = config
        self.dtype = jnp.dtype(c.compute_dtype)
        self.w_gate = _normal(rngs, (c.d_model, hidden), c.init_std)
        self.w_up = _normal(rngs, (c.d_model, hidden), c.init_std)
        self.w_down = _normal(rngs, (hidden, c.d_model), c.init_std / (2 * c.n_layers) ** 0.5)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = self.dtype
        h = jax.nn.silu(linear(x, self.w_gate[...].astype(dt))) * linear(x, self.w_up[...].astype(dt))
        return linear(h, self.w_down[...].astype(dt))


class MoE(nnx.Module):
    """Router + n_experts stacked SwiGLU experts (+ an optional shared expert); the
    dispatch backend (`moe_impl`, see moe.py) only changes how the work is laid out."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.dtype = jnp.dtype(c.compute_dtype)
        self.dispatch = DISPATCH[c.moe_impl]
        self.capacity_factor = c.capacity_factor
        self.router = Router(c, rngs=rngs)
        self.w_gate = _normal(rngs, (c.n_experts, c.d_model, c.d_expert), c.init_std)
        self.w_up = _normal(rngs, (c.n_experts, c.d_model, c.d_expert), c.init_std)
        self.w_down = _normal(rngs, (c.n_experts, c.d_expert, c.d_model), c.init_std / (2 * c.n_layers) ** 0.5)
        self.shared = SwiGLU(c, c.d_expert, rngs=rngs) if c.shared_expert else None

    def __call__(self, x: jax.Array, live: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """`live` [B, T] (or None: all): the inputs whose outputs are used; a dispatch
        backend may skip the others' expert work (moe.py)."""
        B, T, D = x.shape
        tokens = x.reshape(B * T, D)
        route = self.router(tokens)
        dt = self.dtype
        y, dropped = self.dispatch(
            tokens,
            route.experts,
            route.weights,
            self.w_gate[...].astype(dt),
            self.w_up[...].astype(dt),
            self.w_down[...].astype(dt),
            capacity_factor=self.capacity_factor,
            live=None if live is None else live.reshape(B * T),
        )
        if self.shared is not None:
            y = y + self.shared(tokens)
        stats = {
            "balance_loss": route.balance_loss,
            "z_loss": route.z_loss,
            "dropped_fraction": dropped,
            "routing_entropy": route.entropy,
            "expert_load": route.load,
        }
        if route.quantile_beta is not None:
            stats["quantile_beta"] = route.quantile_beta
        return y.reshape(B, T, D), stats


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        c = config
        self.attn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.attn = Attention(c, rngs=rngs)
        self.ffn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.is_moe = c.is_moe_layer(layer)
        self.ffn = MoE(c, rngs=rngs) if self.is_moe else SwiGLU(c, c.d_ff, rngs=rngs)

    def __call__(self, x, cos, sin, kv=None, positions=None, mask=None, live=None):
        """Returns (x, the MoE layer's stats or None, the updated layer cache or None)."""
        attended, kv = self.attn(self.attn_norm(x), cos, sin, kv, positions, mask)
        x = x + attended
        if self.is_moe:
            y, stats = self.ffn(self.ffn_norm(x), live)
        else:
            y, stats = self.ffn(self.ffn_norm(x)), None
        return constrain_batch(x + y), stats, kv


class MoETransformer(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.embed = _normal(rngs, (c.vocab_size, c.d_model), c.init_std)
        self.blocks = nnx.List([Block(c, i, rngs=rngs) for i in range(c.n_layers)])
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.head = None if c.tie_embeddings else _normal(rngs, (c.d_model, c.vocab_size), c.init_std)

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        hidden, aux, _ = self.trunk(tokens)
        return self.logits(hidden), aux

    def trunk(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        cache: KVCache | None = None,
        mask: jax.Array | None = None,
        live: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array], KVCache | None]:
        """Final-normed hidden states [B, T, D], aux, and the updated cache. Without a
        cache: one causal pass over positions 0..T-1, or with `mask` [B, T, T] (which
        inputs each input sees) and `positions` [B, T] several packed sequences in a
        row. With a cache: tokens at `positions` attend to it (module docstring).
        `live` [B, T] (None: all) marks the inputs whose outputs are used: the others
        (padding no live input sees) may come out as anything finite."""
        c = self.config
        B, T = tokens.shape
        dt = jnp.dtype(c.compute_dtype)
        if positions is None:
            if T > c.max_seq_len:
                raise ValueError(f"sequence length {T} exceeds max_seq_len={c.max_seq_len}")
            cos, sin = rotary_tables(jnp.arange(T), c.head_dim, c.rope_theta)
        else:
            cos, sin = rotary_tables(positions, c.head_dim, c.rope_theta)
        x = constrain_batch(self.embed[...][tokens].astype(dt))
        layer_stats, keys, values = [], [], []
        for i, block in enumerate(self.blocks):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            x, stats, kv = block(x, cos, sin, kv, positions, mask, live)
            if stats is not None:
                layer_stats.append(stats)
            if kv is not None:
                keys.append(kv[0])
                values.append(kv[1])
        new_cache = None if cache is None else KVCache(jnp.stack(keys), jnp.stack(values))
        return self.norm(x), _collect_aux(layer_stats, c.n_experts), new_cache

    def head_matrix(self) -> jax.Array:
        """The output head [D, V] in the compute dtype (the embedding's transpose when tied)."""
        head = self.embed[...].T if self.head is None else self.head[...]
        return head.astype(jnp.dtype(self.config.compute_dtype))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The output head: hidden [..., D] -> logits f32 [..., V]."""
        dt = jnp.dtype(self.config.compute_dtype)
        return linear(hidden.astype(dt), self.head_matrix(), preferred_element_type=jnp.float32)


def _collect_aux(layer_stats: list[dict], n_experts: int) -> dict[str, jax.Array]:
    """Average scalar statistics over MoE layers; stack per-expert ones [L_moe, E]."""
    if not layer_stats:  # a dense model: zeros of the same structure
        zero = jnp.zeros((), jnp.float32)
        return {
            "balance_loss": zero,
            "z_loss": zero,
            "dropped_fraction": zero,
            "routing_entropy": zero,
            "expert_load": jnp.zeros((0, n_experts), jnp.float32),
        }
    aux = {}
    for key in layer_stats[0]:
        values = jnp.stack([s[key] for s in layer_stats])
        aux[key] = values if values.ndim == 2 else jnp.mean(values)
    return aux


def loss_and_aux(model: MoETransformer, tokens_with_targets: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The objective on windows of seq_len+1 tokens [B, T+1]: inputs [:, :-1], targets
    [:, 1:]. loss = cross-entropy + z_loss_coef * z_loss, + balance_loss_coef *
    balance_loss when balance='aux_loss' (under 'quantile' the bias balances; the
    Switch loss is only reported). Metrics: `loss`, `ce_loss` and every aux entry.
    The cross-entropy is `head_cross_entropy` (head_loss.py): the mean of logsumexp
    (logits) - logits[target] over the model's logits, never all in memory at once."""
    c = model.config
    inputs, targets = tokens_with_targets[:, :-1], tokens_with_targets[:, 1:]
    hidden, aux, _ = model.trunk(inputs)
    ce = head_cross_entropy(hidden.astype(jnp.dtype(c.compute_dtype)), model.head_matrix(), targets)
    loss = ce + c.z_loss_coef * aux["z_loss"]
    if c.balance == "aux_loss":
        loss = loss + c.balance_loss_coef * aux["balance_loss"]
    return loss, {"loss": loss, "ce_loss": ce, **aux}


def moe_layers(model: MoETransformer) -> list[MoE]:
    return [block.ffn for block in model.blocks if block.is_moe]


def update_router_bias(model: MoETransformer, aux: dict[str, jax.Array]) -> None:
    """Quantile balancing, after the optimizer step: each MoE layer's router bias is
    REPLACED by -(beta - mean(beta)) from this step's aux. A no-op unless
    balance='quantile'. Works eagerly or inside `nnx.jit` (it mutates the model)."""
    if model.config.balance != "quantile" or "quantile_beta" not in aux:
        return
    for layer, beta in zip(moe_layers(model), aux["quantile_beta"]):
        layer.router.bias[...] = new_router_bias(beta)
