"""The jitted functions a training run is made of: init, train step, eval step, batches.

Model: the model lives as three pytrees, `params` (the `nnx.Param`s the optimizer
updates), `state` (other model variables, e.g. the quantile router bias) and the
optimizer state, all placed on a ('data', 'expert') mesh. One jitted train step
takes them and a batch [grad_accum_steps, micro_batch, seq_len + 1], averages the
micro-batches' gradients, applies one optimizer update (clipping, AdamW or Muon as
configured: `optim.py`), then lets the model package replace its router bias
(`update_router_bias`). Micro-batch j is the same set of global rows whatever the
number of processes (`global_batch`, `TokenLoader.batch(..., micro_batches=)`), so
per-micro-batch statistics (balance loss, quantile beta, capacity drops) do not
depend on how many hosts run the step. `benchmarks/train_throughput.py` times this
very step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from marin_rules.model.sharding import BATCH_AXES, state_shardings
from marin_rules.model.transformer import MoETransformer, loss_and_aux, update_router_bias


def init_model(model_config: Any, seed: int, mesh: Any) -> tuple[Any, Any, Any]:
    """(graphdef, params, state) of a freshly initialised model, created in one jitted
    call directly into its shardings (one compilation instead of one per weight;
    every process gets its part of the same global arrays)."""

    def create():
        return MoETransformer(model_config, rngs=nnx.Rngs(params=seed))

    abstract = nnx.eval_shape(create)
    shardings = state_shardings(abstract, mesh)
    graphdef, _ = nnx.split(abstract)
    weights = jax.jit(lambda: nnx.state(create()), out_shardings=shardings)()
    model = nnx.merge(graphdef, weights)
    return nnx.split(model, nnx.Param, ...)


def batch_sharding(mesh: Any) -> NamedSharding:
    """[accum, rows, seq_len+1]: rows split over ('data', 'expert') like the model wants."""
    return NamedSharding(mesh, P(None, BATCH_AXES, None))


def global_batch(local: np.ndarray, accum: int, sharding: NamedSharding) -> jax.Array:
    """This process's rows [accum * r, T+1] (micro-batch after micro-batch, as
    `TokenLoader.batch(..., micro_batches=accum)` returns them) as its part of the
    global [accum, r * processes, T+1]."""
    rows, width = local.shape
    local = np.ascontiguousarray(local.reshape(accum, rows // accum, width), dtype=np.int32)
    global_shape = (accum, rows * jax.process_count() // accum, width)
    return jax.make_array_from_process_local_data(sharding, local, global_shape)


def make_train_step(graphdef: Any, tx: optax.GradientTransformation, accum: int):
    """jit((params, state, opt_state, batch) -> (params, state, opt_state, metrics))."""

    def loss_fn(params, state, tokens):
        return loss_and_aux(nnx.merge(graphdef, params, state), tokens)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(params, state, opt_state, batch):
        if accum == 1:
            (_, metrics), grads = grad_fn(params, state, batch[0])
        else:

            def micro(total, tokens):
                (_, m), g = grad_fn(params, state, tokens)
                return jax.tree.map(jnp.add, total, g), m

            zeros = jax.tree.map(jnp.zeros_like, params)
            grads, ms = jax.lax.scan(micro, zeros, batch)
            grads = jax.tree.map(lambda g: g / accum, grads)
            metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), ms)
        metrics["grad_norm"] = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        model = nnx.merge(graphdef, params, state)
        update_router_bias(model, metrics)
        _, _, state = nnx.split(model, nnx.Param, ...)
        metrics.pop("quantile_beta", None)
        return params, state, opt_state, metrics

    return jax.jit(train_step)


def make_eval_step(model_config: Any):
    """jit((params, state, tokens [B, T+1]) -> mean cross-entropy) through a dropless MoE
    dispatch (`ModelConfig.dropless`: a `capacity` model's same weights in its `ragged` layer),
    as evaluation and `load_trained` score it: with capacity drops a sequence's
    validation loss would depend on the other rows of its batch and on the mesh."""
    evaluated = model_config.dropless()
    graphdef, _, _ = nnx.split(nnx.eval_shape(lambda: MoETransformer(evaluated, rngs=nnx.Rngs(0))), nnx.Param, ...)

    def eval_step(params, state, tokens):
        _, metrics = loss_and_aux(nnx.merge(graphdef, params, state), tokens)
        return metrics["ce_loss"]

    return jax.jit(eval_step)
