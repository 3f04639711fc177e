"""The scaling recipe: a compute budget (FLOPs) -> a full `train` config. No JAX.

Model: FLOPs are counted as the training benchmark counts them
(`marin_rules.model.flops.flops_per_token`: 6 per active matmul parameter per token,
MoE counting the `top_k` chosen experts, plus the attention term), so a run's
compute is `C = flops_per_token * steps * batch_size * seq_len`. We call
`N = flops_per_token / 6` the model's compute parameters, so `C = 6 N D` exactly
with `D` the tokens trained on.

The rule:
- Shapes come from one ladder of widths (`WIDTHS`, ratio about 1.5). Depth follows
  width, `n_layers = max(2, round(d_model / 32))`; heads are 8 wide up to
  `d_model` 24, then 16; 4 experts, top-2, `d_expert = d_model`; multi-head
  attention (no grouped keys); sequences of `SEQ_LEN` tokens.
- Tokens per parameter: the target size is `N* = sqrt(C / (6 * TOKENS_PER_PARAM))`
  (Chinchilla's 20 tokens per parameter); the recipe picks the rung whose `N` is
  nearest to `N*` in log space. `offset` moves along the ladder (an IsoFLOP grid
  trains the same budget at rungs -1, 0, +1).
- Batch: the largest power of two <= D / (SEQ_LEN * MIN_STEPS), clipped to
  [8, 64] sequences; steps = round(D / (batch * SEQ_LEN)), so the budget is hit to
  within half a step (under 1% at 200 steps or more).
- Learning rate scales as 1/sqrt(width): `8e-3 * sqrt(64 / d_model)` (AdamW,
  cosine to 10%, weight decay 0.1), warmup 5% of the steps.
- Validation always scores the same `VAL_SEQUENCES` sequences (eval_batches *
  batch_size is constant), so losses of different runs are comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import flops_per_token

WIDTHS = (8, 16, 24, 32, 48, 64, 80, 96, 128, 192, 256, 384, 512)
SEQ_LEN = 128
TOKENS_PER_PARAM = 20.0
MIN_STEPS = 200
MIN_BATCH, MAX_BATCH = 8, 64
VAL_SEQUENCES = 512
BASE_LR, BASE_WIDTH = 8e-3, 64


@dataclass(frozen=True)
class Plan:
    """One run of the recipe: its train config and the figures behind it."""

    budget: float  # FLOPs asked for
    rung: int  # index into WIDTHS
    config: dict[str, Any]  # the `train` step's config
    flops: float  # FLOPs the config really costs
    params: float  # N = flops_per_token / 6
    tokens: int  # D = steps * batch_size * seq_len

    @property
    def budget_error(self) -> float:
        return self.flops / self.budget - 1


def model_dict(d_model: int, vocab_size: int) -> dict[str, Any]:
    head_dim = 8 if d_model <= 24 else 16
    n_heads = d_model // head_dim
    return {
        "vocab_size": vocab_size,
        "max_seq_len": SEQ_LEN,
        "d_model": d_model,
        "n_layers": max(2, round(d_model / 32)),
        "n_heads": n_heads,
        "n_kv_heads": n_heads,
        "n_experts": 4,
        "top_k": 2,
        "d_expert": d_model,
        "moe_impl": "ragged",
    }


def compute_params(rung: int, vocab_size: int) -> float:
    """N of a rung: its training FLOPs per token / 6."""
    model = ModelConfig.from_dict(model_dict(WIDTHS[rung], vocab_size))
    return flops_per_token(model, SEQ_LEN) / 6


def optimal_rung(budget: float, vocab_size: int) -> int:
    """The rung nearest in log space to N* = sqrt(C / (6 * TOKENS_PER_PARAM))."""
    target = math.log(math.sqrt(budget / (6 * TOKENS_PER_PARAM)))
    return min(range(len(WIDTHS)), key=lambda r: abs(math.log(compute_params(r, vocab_size)) - target))


def plan(budget: float, vocab_size: int, offset: int = 0, seed: int = 0) -> Plan:
    """The recipe's run for `budget` FLOPs, `offset` rungs away from its chosen size."""
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget: expected a number of FLOPs > 0, got {budget!r}")
    rung = optimal_rung(budget, vocab_size) + offset
    if not 0 <= rung < len(WIDTHS):
        raise ValueError(
            f"budget {budget:.3g} with offset {offset}: rung {rung} is off the width ladder "
            f"{WIDTHS}; pick a budget whose sizes stay on it"
        )
    model = model_dict(WIDTHS[rung], vocab_size)
    fpt = flops_per_token(ModelConfig.from_dict(model), SEQ_LEN)
    tokens_wanted = budget / fpt
    batch = 2 ** math.floor(math.log2(max(1.0, tokens_wanted / (SEQ_LEN * MIN_STEPS))))
    batch = min(MAX_BATCH, max(MIN_BATCH, batch))
    steps = max(1, round(tokens_wanted / (batch * SEQ_LEN)))
    d_model = model["d_model"]
    config = {
        "model": model,
        "optimizer": {
            "name": "adamw",
            "learning_rate": float(f"{BASE_LR * math.sqrt(BASE_WIDTH / d_model):.3g}"),
            "warmup_steps": max(1, round(0.05 * steps)),
        },
        "num_train_steps": steps,
        "batch_size": batch,
        "seq_len": SEQ_LEN,
        "seed": seed,
        "checkpoint_every": steps,
        "eval_batches": VAL_SEQUENCES // batch,
        "log_every": max(1, steps // 50),
    }
    tokens = steps * batch * SEQ_LEN
    return Plan(budget, rung, config, float(fpt * tokens), fpt / 6, tokens)

