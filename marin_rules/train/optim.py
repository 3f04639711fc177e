"""The optimizer: AdamW, or Muon for hidden matrices with AdamW for the rest.

Model: one optax transformation over the model's `nnx.Param` state. Each weight gets
its group from its declared role (`marin_rules/model/roles.py`), never from a name
pattern, so a new weight without a role is refused instead of silently switching
optimizer:
- `muon` (only with `name: muon`): role `matrix`, i.e. hidden projections [in, out]
  and stacked expert weights [E, in, out] (the leading axes are batch axes,
  orthogonalised one matrix at a time; `train/muon.py`: optax's Muon update, written
  without copies), then decoupled weight decay and the `muon_lr` schedule;
- `adamw`: roles `embedding`, `head`, `norm`, `router` (and, with `name: adamw`,
  everything).
Weight decay is decoupled and applies to roles `matrix`, `embedding` and `head` (not
to norms or the router).

Schedule (both groups, peak = `learning_rate` or `muon_lr`, W = `warmup_steps`,
N = `num_train_steps`, r = `min_lr_ratio`): update s = 0, 1, ... uses
    lr(s) = peak * (s + 1) / W                                  for s < W
    lr(s) = peak * (r + (1 - r) * (1 + cos(pi * (s - W) / (N - W))) / 2)   for s >= W
so the first update already moves the weights (peak / W, never 0), the peak is
reached at update W - 1, and the cosine falls towards r * peak, which it reaches
at s = N, one past the last update. Gradients are clipped by their global norm
first. Gradient accumulation happens in the train step (the optimizer sees one
averaged gradient per step), and the quantile router bias is not a parameter, so it
never reaches the optimizer.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from marin_rules.model.roles import EMBEDDING, HEAD, MATRIX, param_roles
from marin_rules.train.config import OptimizerConfig
from marin_rules.train.muon import muon_transform

MUON_ROLES = (MATRIX,)
DECAY_ROLES = (MATRIX, EMBEDDING, HEAD)


def param_groups(params: Any, optimizer: str) -> Any:
    """A pytree shaped like `params` of `muon` or `adamw` (see the module docstring)."""
    muon = optimizer == "muon"
    return jax.tree.map(lambda role: "muon" if muon and role in MUON_ROLES else "adamw", param_roles(params))


def decay_mask(params: Any) -> Any:
    """True where weight decay applies (roles in `DECAY_ROLES`)."""
    return jax.tree.map(lambda role: role in DECAY_ROLES, param_roles(params))


def schedule(peak: float, config: OptimizerConfig, num_train_steps: int) -> Callable[[Any], Any]:
    """The learning rate of update `s` (0-based), as the module docstring states."""
    warmup = config.warmup_steps
    decay_steps = max(1, num_train_steps - warmup)
    floor = config.min_lr_ratio

    def lr(step):
        s = jnp.asarray(step, jnp.float32)
        warm = peak * (s + 1.0) / max(warmup, 1)
        progress = jnp.clip((s - warmup) / decay_steps, 0.0, 1.0)
        cosine = peak * (floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(math.pi * progress)))
        return jnp.where(s < warmup, warm, cosine)

    return lr


def make_optimizer(config: OptimizerConfig, num_train_steps: int) -> optax.GradientTransformation:
    """The gradient transformation for a parameter pytree (an `nnx.State` or dict)."""
    b1, b2 = config.betas
    adamw_lr = schedule(config.learning_rate, config, num_train_steps)
    adamw = optax.adamw(
        adamw_lr,
        b1=b1,
        b2=b2,
        weight_decay=config.weight_decay,
        mask=decay_mask,
    )
    if config.name == "muon":
        muon = muon_transform(b1, config.weight_decay, schedule(config.muon_lr, config, num_train_steps))
        inner = optax.partition({"adamw": adamw, "muon": muon}, lambda params: param_groups(params, "muon"))
    else:
        inner = adamw
    if config.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(config.grad_clip), inner)
    return inner


def learning_rates(config: OptimizerConfig, num_train_steps: int, step: int) -> dict[str, float]:
    """The learning rates in effect at `step` (for the metrics log)."""
    rates = {"lr": float(schedule(config.learning_rate, config, num_train_steps)(step))}
    if config.name == "muon":
        rates["muon_lr"] = float(schedule(config.muon_lr, config, num_train_steps)(step))
    return rates
