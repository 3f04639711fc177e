"""Config checkers for `scaling_fit` and `scaling_check` (no JAX, no scipy).

Model: the settings are frozen dataclasses on the one validation layer
(marin_rules/validation), so messages, defaults and the JSON Schema come from the
same rules as every other step; what relates fields (the prediction above the fitted
budgets) and the deps are checked here. Each fitted law needs more points than it has
parameters, or its bootstrap has no uncertainty to measure (the fit goes through
every point, and every resample): the frontier law (E, A, alpha) gets one point per
budget, so at least MIN_BUDGETS budgets; approach 3 (five parameters) takes every
run, so at least MIN_RUNS runs; the size law (two) is covered by the budgets
(`scaling_fit` refuses the same in the step, for a caller that skipped this
checker). `scaling_fit` takes its runs as one mixture-shaped role, `runs: {name@version: 1, ...}` (the weights are ignored);
`scaling_check` takes `fit` and `run`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from marin_rules.artifacts.errors import ConfigError, got
from marin_rules.validation import Int, ListOf, Number, check_fields

FRONTIER_LAW_PARAMS = 3  # L(C) = E + A * C^-alpha, one point per budget
APPROACH_3_PARAMS = 5  # L(N, D) = E + A/N^a + B/D^b, on every run
MIN_BUDGETS = FRONTIER_LAW_PARAMS + 1
MIN_RUNS = APPROACH_3_PARAMS + 1


def too_few_budgets(count: int) -> str:
    """Why `count` budgets are too few, and the fix (shared by the checker and the step)."""
    return (f"expected at least {MIN_BUDGETS} budgets (the frontier law fits {FRONTIER_LAW_PARAMS} parameters, "
            f"E, A and alpha, through one point per budget: {count} leave its bootstrap no uncertainty to measure); "
            "add budgets, each with its runs")


@dataclass(frozen=True)
class ScalingFitConfig:
    budgets: Annotated[
        tuple[float, ...],
        ListOf(Number(gt=0), f"a list of at least {MIN_BUDGETS} FLOP counts > 0", unique=True),
        "the training budgets of the sweep, in FLOPs",
    ]
    predict_budget: Annotated[float, Number(gt=0), "the budget to predict, above the largest fitted one"]
    bootstrap: Annotated[int, Int(min=0, max=10000), "residual-bootstrap resamples for the uncertainty"] = 200
    seed: Annotated[int, Int(min=0), "seed of the bootstrap"] = 0


@dataclass(frozen=True)
class ScalingCheckConfig:
    target_relative_error: Annotated[
        float, Number(gt=0, lt=1), "the relative error the check calls a pass"
    ] = 0.05


def check_scaling_fit(config: Any, deps: Any) -> None:
    values = check_fields(ScalingFitConfig, config, "config")
    budgets = values["budgets"]
    if len(budgets) < MIN_BUDGETS:
        raise ConfigError("config.budgets", f"{too_few_budgets(len(budgets))}, got {got(config['budgets'])}")
    if values["predict_budget"] <= max(budgets):
        raise ConfigError(
            "config.predict_budget",
            f"expected a FLOP count above the largest budget {max(budgets):g}, got {got(config['predict_budget'])}",
        )
    runs = deps.get("runs")
    if not isinstance(runs, Mapping) or len(runs) < MIN_RUNS:
        raise ConfigError(
            "deps.runs",
            f"expected a mapping of at least {MIN_RUNS} train artifacts 'name@version: 1', got {got(runs)}",
        )


def check_scaling_check(config: Any, deps: Any) -> None:
    check_fields(ScalingCheckConfig, config, "config")
    for role, what in (("fit", "the scaling_fit artifact"), ("run", "the train artifact it predicts")):
        if not isinstance(deps.get(role), str):
            raise ConfigError(f"deps.{role}", f"expected one 'name@version' ({what}), got {got(deps.get(role))}")
