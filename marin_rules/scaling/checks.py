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

import math
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from marin_rules.artifacts.errors import ConfigError, got
from marin_rules.validation import Int, ListOf, Number, check_fields

FRONTIER_LAW_PARAMS = 3  # L(C) = E + A * C^-alpha, one point per budget
APPROACH_3_PARAMS = 5  # L(N, D) = E + A/N^a + B/D^b, on every run
MIN_BUDGETS = FRONTIER_LAW_PARAMS + 1
MIN_RUNS = APPROACH_3_PARAMS + 1
BUDGET_TOLERANCE = 0.10  # a run belongs to the budget its FLOPs are within 10% of


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


def run_flops(run: Any) -> float | None:
    """A train entry's FLOPs as its record will count them (steps x batch x seq_len x
    `flops_per_token`); None when its vocabulary is not settled by the recipes (no
    `model.vocab_size`, no tokenizer entry with one) or it is not a `train` entry."""
    from marin_rules.model.flops import flops_per_token
    from marin_rules.train.config import parse_train_config

    if run.step != "train":
        return None
    vocab = next((t.get("vocab_size") for d in run.upstreams("data") for t in d.upstreams("tokenizer")), None)
    if not isinstance(vocab, int) and "vocab_size" not in (run.get("model") or {}):
        return None
    train = parse_train_config(dict(run.config), vocab_size=vocab if isinstance(vocab, int) else None)
    return float(flops_per_token(train.model, train.seq_len) * train.num_train_steps * train.batch_size * train.seq_len)


def check_scaling_fit_upstream(config: Mapping[str, Any], upstream: Mapping[str, Any]) -> None:
    """At load, what the runs' train recipes settle (`run_flops`): each run must lie
    within BUDGET_TOLERANCE of one of `config.budgets`, and each budget must get a run,
    or `scaling_fit` refuses them after every run has trained. All the misfits are named
    at once. A run whose FLOPs are not settled here is checked when the fit runs (and
    budgets without a run are then not known here either)."""
    budgets = [float(b) for b in config["budgets"]]
    misfits, placed, unsettled = [], set(), False
    for key, run in (upstream.get("runs") or {}).items():
        flops = run_flops(run)
        if flops is None:
            unsettled = True
            continue
        budget = min(budgets, key=lambda b: abs(math.log(flops / b)))  # as scaling_fit places it
        if abs(flops / budget - 1) > BUDGET_TOLERANCE:
            misfits.append(f"{key} costs {flops:.3g} ({flops / budget - 1:+.1%} from {budget:g})")
        else:
            placed.add(budget)
    if misfits:
        raise ConfigError(
            "deps.runs",
            f"{len(misfits)} run(s) cost more than {BUDGET_TOLERANCE:.0%} from every budget in config.budgets, "
            f"so the fit could not place them: {'; '.join(misfits)}; change their num_train_steps "
            "(whole steps miss a small budget by more) or the budgets",
        )
    empty = [b for b in budgets if b not in placed]
    if empty and not unsettled:
        raise ConfigError(
            "config.budgets",
            f"no run of deps.runs costs within {BUDGET_TOLERANCE:.0%} of {', '.join(f'{b:g}' for b in empty)}, so the "
            "fit would have no point there; add runs at those budgets to deps.runs, or drop them",
        )


def check_scaling_check_upstream(config: Mapping[str, Any], upstream: Mapping[str, Any]) -> None:
    """At load: the checked run must cost the fit's `predict_budget` (within
    BUDGET_TOLERANCE), or `scaling_check` refuses it after it has trained (the most
    expensive run of a sweep, as a rule). Skipped where the recipes do not settle it."""
    fit, run = upstream.get("fit"), upstream.get("run")
    if fit is None or run is None or fit.step != "scaling_fit":
        return
    target, flops = fit.get("predict_budget"), run_flops(run)
    if not isinstance(target, (int, float)) or isinstance(target, bool) or flops is None:
        return
    if abs(flops / target - 1) > BUDGET_TOLERANCE:
        raise ConfigError(
            "deps.run",
            f"{run.key} costs {flops:.3g} FLOPs ({flops / target - 1:+.1%}), not within {BUDGET_TOLERANCE:.0%} of the "
            f"predict_budget {target:g} of {fit.key}; check the run the fit predicts (change its num_train_steps "
            "or model), or another fit",
        )


def check_scaling_check(config: Any, deps: Any) -> None:
    check_fields(ScalingCheckConfig, config, "config")
    for role, what in (("fit", "the scaling_fit artifact"), ("run", "the train artifact it predicts")):
        if not isinstance(deps.get(role), str):
            raise ConfigError(f"deps.{role}", f"expected one 'name@version' ({what}), got {got(deps.get(role))}")
