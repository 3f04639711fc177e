"""Config checkers for `scaling_fit` and `scaling_check` (no JAX, no scipy).

Model: the experiment loader calls `check(config, deps)` before anything runs; errors
are `ConfigError(field, message)` with the field relative to the artifact entry.
`scaling_fit` takes its runs as one mixture-shaped role, `runs: {name@version: 1,
...}` (the weights are ignored); `scaling_check` takes `fit` and `run`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError, got

MIN_RUNS = 6  # approach 3 has five parameters
MIN_BUDGETS = 3  # the frontier law has three


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _unknown(config: Mapping, allowed: set[str]) -> None:
    for key in config:
        if key not in allowed:
            raise ConfigError(f"config.{key}", f"unknown key; expected one of {', '.join(sorted(allowed))}")


def check_scaling_fit(config: Any, deps: Any) -> None:
    _unknown(config, {"budgets", "predict_budget", "bootstrap", "seed"})
    budgets = config.get("budgets")
    if not isinstance(budgets, list) or len(budgets) < MIN_BUDGETS or not all(_number(b) and b > 0 for b in budgets):
        raise ConfigError(
            "config.budgets", f"expected a list of at least {MIN_BUDGETS} FLOP counts > 0, got {got(budgets)}"
        )
    if len(set(budgets)) != len(budgets):
        raise ConfigError("config.budgets", f"expected distinct budgets, got {budgets}")
    target = config.get("predict_budget")
    if not _number(target) or target <= max(budgets):
        raise ConfigError(
            "config.predict_budget",
            f"expected a FLOP count above the largest budget {max(budgets):g}, got {got(target)}",
        )
    samples = config.get("bootstrap", 200)
    if not isinstance(samples, int) or isinstance(samples, bool) or not 0 <= samples <= 10000:
        raise ConfigError("config.bootstrap", f"expected an integer in [0, 10000] (resamples), got {got(samples)}")
    seed = config.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError("config.seed", f"expected an integer >= 0, got {got(seed)}")
    for role in deps:
        if role != "runs":
            raise ConfigError(f"deps.{role}", "unknown role; scaling_fit takes only 'runs'")
    runs = deps.get("runs")
    if not isinstance(runs, Mapping) or len(runs) < MIN_RUNS:
        raise ConfigError(
            "deps.runs",
            f"expected a mapping of at least {MIN_RUNS} train artifacts 'name@version: 1', got {got(runs)}",
        )


def check_scaling_check(config: Any, deps: Any) -> None:
    _unknown(config, {"target_relative_error"})
    target = config.get("target_relative_error", 0.05)
    if not _number(target) or not 0 < target < 1:
        raise ConfigError("config.target_relative_error", f"expected a number in (0, 1), got {got(target)}")
    for role in deps:
        if role not in ("fit", "run"):
            raise ConfigError(f"deps.{role}", "unknown role; scaling_check takes 'fit' and 'run'")
    for role, what in (("fit", "the scaling_fit artifact"), ("run", "the train artifact it predicts")):
        if not isinstance(deps.get(role), str):
            raise ConfigError(f"deps.{role}", f"expected one 'name@version' ({what}), got {got(deps.get(role))}")
