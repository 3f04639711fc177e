"""The MoE router: which `top_k` experts each token goes to, with what weight.

Model (all in float32): logits s = x W_r over `n_experts`. Selection takes the top k
of s, or, with quantile balancing, of s + stop_gradient(b) where b is a per-expert
bias that is NOT a parameter (`RouterBias`, no gradient, no optimizer state) and is
replaced after each optimizer step by `new_router_bias`: Marin grug's rule, where the
(k+1)-th biased logit alpha_t is a per-token threshold, m[t, e] = s[t, e] - alpha_t, and
beta_e = the q-th largest m[:, e] with q = max(1, tokens * k / E) (the balanced load);
then b = -(beta - mean(beta)). Combine weights are softmax(s) or sigmoid(s) of the
UNBIASED logits at the chosen experts, renormalised over the k chosen when k > 1
(with k = 1 renormalising would give 1 and cut the router's gradient).

Statistics returned per layer: expert load fractions f_e (of the T*k assignments), the
Switch balance loss E * sum_e f_e * mean_t softmax(s)_e (1.0 when balanced), the z-loss
mean_t logsumexp(s)^2, the mean per-token routing entropy, and beta for quantile.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from marin_rules.model.config import ModelConfig


class RouterBias(nnx.Variable):
    """Quantile-balancing bias: a model variable that is saved and sharded but is not an
    `nnx.Param`, so `nnx.Optimizer(model, tx, wrt=nnx.Param)` and `nnx.grad` skip it."""


class Routing(NamedTuple):
    experts: jax.Array  # int32 [T, k] chosen expert ids, best first
    weights: jax.Array  # float32 [T, k] combine weights
    load: jax.Array  # float32 [E] fraction of the T*k assignments each expert got
    balance_loss: jax.Array  # float32 [] Switch loss, 1.0 when perfectly balanced
    z_loss: jax.Array  # float32 [] mean squared logsumexp of the logits
    entropy: jax.Array  # float32 [] mean per-token entropy of softmax(logits)
    quantile_beta: jax.Array | None  # float32 [E] target for the next bias (quantile only)


class Router(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.n_experts = config.n_experts
        self.top_k = config.top_k
        self.gate = config.router_gate
        self.quantile = config.balance == "quantile"
        shape = (config.d_model, config.n_experts)
        self.w = nnx.Param(config.init_std * jax.random.normal(rngs.params(), shape, jnp.float32))
        self.bias = RouterBias(jnp.zeros((config.n_experts,), jnp.float32))

    def __call__(self, x: jax.Array) -> Routing:
        """x: [T, D] tokens (any float dtype)."""
        E, k = self.n_experts, self.top_k
        logits = x.astype(jnp.float32) @ self.w[...]
        if self.quantile:
            biased = logits + jax.lax.stop_gradient(self.bias[...])
            top_values, top_experts = jax.lax.top_k(biased, k + 1)
            experts = top_experts[:, :k]
        else:
            _, experts = jax.lax.top_k(logits, k)
        chosen = jnp.take_along_axis(logits, experts, axis=-1)
        probs = jax.nn.softmax(logits, axis=-1)
        if self.gate == "softmax":
            weights = jnp.take_along_axis(probs, experts, axis=-1)
        else:
            weights = jax.nn.sigmoid(chosen)
        if k > 1:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)

        T = x.shape[0]
        counts = jnp.zeros((E,), jnp.float32).at[experts.reshape(-1)].add(1.0)
        load = counts / (T * k)
        balance_loss = E * jnp.sum(load * jnp.mean(probs, axis=0))
        z_loss = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
        entropy = -jnp.mean(jnp.sum(probs * jax.nn.log_softmax(logits, axis=-1), axis=-1))
        beta = None
        if self.quantile:
            alpha = top_values[:, k]  # the (k+1)-th biased logit: a per-token threshold
            margins = jax.lax.stop_gradient(logits - alpha[:, None])  # [T, E]
            q = max(1, (T * k) // E)
            beta = jax.lax.top_k(margins.T, q)[0][:, q - 1]  # q-th largest margin per expert
        return Routing(experts.astype(jnp.int32), weights, load, balance_loss, z_loss, entropy, beta)


def new_router_bias(beta: jax.Array) -> jax.Array:
    """The replacement bias for a layer given its beta [E]: b = -(beta - mean(beta))."""
    return -(beta - jnp.mean(beta))
