"""The optimizer: AdamW, or Muon for hidden matrices with AdamW for the rest.

Model: one optax transformation over the model's `nnx.Param` state. Each weight gets
a group from its path and rank (`param_group`):
- `adamw`: token embedding, output head, norms, router, biases (and, with
  `name: adamw`, everything);
- `muon` (only with `name: muon`): hidden 2-D matrices (attention and dense
  feed-forward projections, [in, out]) and stacked expert weights ([E, in, out]:
  the leading axes are batch axes, orthogonalised one matrix at a time).
Weight decay is decoupled and skips norms, biases and the router. Both groups follow
the same schedule shape: linear warmup from 0 to the peak over `warmup_steps`, then
cosine decay to `peak * min_lr_ratio` at `num_train_steps`. Gradients are clipped
by their global norm first. Gradient accumulation happens in the train step (the
optimizer sees one averaged gradient per step), and the quantile router bias is
not a parameter, so it never reaches the optimizer.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from marin_rules.train.config import OptimizerConfig

ADAMW_ONLY = ("embed", "head", "norm", "router", "bias", "scale")
NO_DECAY = ("norm", "router", "bias", "scale")


def path_names(path: tuple) -> tuple[str, ...]:
    """Lower-cased names of a pytree path (`DictKey`, `GetAttrKey`, `SequenceKey`)."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)).lower())
                break
    return tuple(n for n in names if n != "value")


def param_group(path: tuple, leaf: Any, optimizer: str) -> str:
    """`muon` or `adamw` for one weight (see the module docstring)."""
    if optimizer != "muon":
        return "adamw"
    names = path_names(path)
    if any(word in name for name in names for word in ADAMW_ONLY):
        return "adamw"
    return "muon" if leaf.ndim in (2, 3) else "adamw"


def decays(path: tuple, leaf: Any) -> bool:
    names = path_names(path)
    return leaf.ndim >= 2 and not any(word in name for name in names for word in NO_DECAY)


def schedule(peak: float, config: OptimizerConfig, num_train_steps: int) -> Callable[[Any], Any]:
    """Linear warmup to `peak`, then cosine to `peak * min_lr_ratio` at the last step."""
    warmup = config.warmup_steps
    decay_steps = max(1, num_train_steps - warmup)
    cosine = optax.cosine_decay_schedule(peak, decay_steps, alpha=config.min_lr_ratio)
    if warmup == 0:
        return cosine
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), cosine], [warmup])


def _muon_dims(params: Any) -> Any:
    from optax.contrib import MuonDimensionNumbers

    # the last two axes are [in, out]; any leading axes (experts) are batch axes
    return jax.tree.map(lambda x: MuonDimensionNumbers(x.ndim - 2, x.ndim - 1), params)


def make_optimizer(config: OptimizerConfig, num_train_steps: int) -> optax.GradientTransformation:
    """The gradient transformation for a parameter pytree (an `nnx.State` or dict)."""
    b1, b2 = config.betas
    adamw_lr = schedule(config.learning_rate, config, num_train_steps)
    adamw = optax.adamw(
        adamw_lr,
        b1=b1,
        b2=b2,
        weight_decay=config.weight_decay,
        mask=lambda params: jax.tree_util.tree_map_with_path(decays, params),
    )
    if config.name == "muon":
        muon = optax.contrib.muon(
            schedule(config.muon_lr, config, num_train_steps),
            beta=b1,
            weight_decay=config.weight_decay,
            muon_weight_dimension_numbers=_muon_dims,
        )
        inner = optax.partition(
            {"adamw": adamw, "muon": muon},
            lambda params: jax.tree_util.tree_map_with_path(
                lambda p, x: param_group(p, x, config.name), params
            ),
        )
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
