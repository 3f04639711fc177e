"""The scaling recipe: a compute budget (FLOPs) -> a full `train` config. No JAX.

Model: FLOPs are counted as the training benchmark counts them
(`marin_rules.model.flops.flops_per_token`: 6 per active matmul parameter per token,
MoE counting the `top_k` chosen experts, plus the attention term), so a run's
compute is `C = flops_per_token * steps * batch_size * seq_len`. We call
`N = flops_per_token / 6` the model's compute parameters, so `C = 6 N D` exactly
with `D` the tokens trained on.

The rule (its constants measured by pilot runs over 3e10-3e11 FLOPs, see README):
- Shapes come from one ladder of widths (`WIDTHS`, a factor 1.3-1.5 in N apart).
  Depth follows width, `n_layers = max(2, round(d_model / 32))`; `head_dim` below; 4
  experts, top-2, `d_expert = d_model`; multi-head attention (no grouped keys);
  sequences of `SEQ_LEN` tokens.
- Tokens per parameter: the target size is `N* = sqrt(C / (6 * TOKENS_PER_PARAM))`
  with 60 tokens per compute parameter (at 3e11 FLOPs, 60 beat 38 and 106; at 3e10,
  55 beat 21); the recipe picks the rung whose `N` is nearest to `N*` in log space.
  `offset` moves along the ladder; `grid_rungs` gives an IsoFLOP grid of consecutive
  rungs centred on the choice.
- Batch: always `BATCH` sequences, so steps grow with tokens,
  `steps = round(C / (flops_per_token * BATCH * SEQ_LEN))`: the budget is hit to
  within half a step. (A batch that grows with the budget in powers of two made
  the step count jump between neighbouring runs.)
- Learning rate: peak AdamW `4.5e-2 * (32 / d_model)^(1/4)`, nearly flat in width
  (the output head, 512 x d_model, is a large part of these models); pilots at
  widths 8-32 found 2-4x the former `8e-3 * sqrt(64 / d_model)` better. Warmup 5%
  of the steps, cosine to 10%, weight decay 0.1.
- Validation always scores the same `VAL_SEQUENCES` sequences (eval_batches *
  batch_size is constant), so losses of different runs are comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import flops_per_token

WIDTHS = (4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 384, 512)
SEQ_LEN = 128
TOKENS_PER_PARAM = 60.0
BATCH = 16  # sequences per step, at every budget
WARMUP_FRACTION = 0.05
VAL_SEQUENCES = 512
BASE_LR, BASE_WIDTH, LR_EXPONENT = 4.5e-2, 32, 0.25


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


def head_dim(d_model: int) -> int:
    """One head below width 8; 16 wide from width 32 when 16 divides, else 8, else 4."""
    if d_model < 8:
        return d_model
    return 16 if d_model >= 32 and d_model % 16 == 0 else 8 if d_model % 8 == 0 else 4


def model_dict(d_model: int, vocab_size: int) -> dict[str, Any]:
    n_heads = d_model // head_dim(d_model)
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


def grid_rungs(budget: float, vocab_size: int, sizes: int) -> list[int]:
    """`sizes` consecutive rungs centred on the recipe's choice for `budget` (an IsoFLOP
    grid), shifted inward where the ladder ends so that all of them exist."""
    low = optimal_rung(budget, vocab_size) - (sizes - 1) // 2
    low = min(max(0, low), len(WIDTHS) - sizes)
    return list(range(low, low + sizes))


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
    return plan_rung(budget, vocab_size, rung, seed)


def plan_rung(budget: float, vocab_size: int, rung: int, seed: int = 0) -> Plan:
    """The run of width `WIDTHS[rung]` that spends `budget` FLOPs."""
    model = model_dict(WIDTHS[rung], vocab_size)
    fpt = flops_per_token(ModelConfig.from_dict(model), SEQ_LEN)
    steps = max(1, round(budget / (fpt * BATCH * SEQ_LEN)))
    d_model = model["d_model"]
    config = {
        "model": model,
        "optimizer": {
            "name": "adamw",
            "learning_rate": learning_rate(d_model),
            "warmup_steps": max(1, round(WARMUP_FRACTION * steps)),
        },
        "num_train_steps": steps,
        "batch_size": BATCH,
        "seq_len": SEQ_LEN,
        "seed": seed,
        "checkpoint_every": steps,
        "eval_batches": VAL_SEQUENCES // BATCH,
        "log_every": max(1, steps // 50),
    }
    tokens = steps * BATCH * SEQ_LEN
    return Plan(budget, rung, config, float(fpt * tokens), fpt / 6, tokens)


def learning_rate(d_model: int) -> float:
    """Peak AdamW rate: BASE_LR at BASE_WIDTH, times (BASE_WIDTH / width)^LR_EXPONENT
    (3 significant digits)."""
    return float(f"{BASE_LR * (BASE_WIDTH / d_model) ** LR_EXPONENT:.3g}")
