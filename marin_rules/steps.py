"""The built-in step kinds and how a step name becomes a function.

Model: a step kind is either a built-in name (`download`, `train_tokenizer`,
`tokenize`, `train`, `evaluate`) or a user step `pkg.module:function`. Each built-in
names its run function and a config checker by dotted path, imported lazily: loading
an experiment (dry runs, `--dag`) never imports JAX. A checker is
`check(config: dict, deps: dict) -> None` raising `ConfigError(field, message)` with
`field` relative to the artifact entry (`config.vocab_size`, `deps.corpus`).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable

from marin_rules.artifacts.errors import ConfigError


@dataclass(frozen=True)
class BuiltinStep:
    run: str  # "module:function" called as function(ctx)
    check: str  # "module:function" called as check(config, deps) before anything runs
    family: str  # rules/<family>.smk; also the Snakemake rule name is the step kind


BUILTIN_STEPS: dict[str, BuiltinStep] = {
    "download": BuiltinStep(
        "marin_rules.data.download:download", "marin_rules.data.checks:check_download", "data"
    ),
    "train_tokenizer": BuiltinStep(
        "marin_rules.data.tokenizer:train_tokenizer",
        "marin_rules.data.checks:check_train_tokenizer",
        "data",
    ),
    "tokenize": BuiltinStep(
        "marin_rules.data.tokenize:tokenize", "marin_rules.data.checks:check_tokenize", "data"
    ),
    "train": BuiltinStep("marin_rules.train.step:train", "marin_rules.train.config:check_train", "train"),
    "evaluate": BuiltinStep(
        "marin_rules.eval.step:evaluate", "marin_rules.eval.config:check_evaluate", "evaluate"
    ),
}

USER_STEP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_valid_step(step: Any) -> bool:
    return isinstance(step, str) and (step in BUILTIN_STEPS or bool(USER_STEP.match(step)))


def import_function(dotted: str) -> Callable[..., Any]:
    """Import `pkg.module:function`, with an error that says what is missing."""
    module_name, _, attr = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError("step", f"cannot import module {module_name!r} ({e})") from e
    try:
        function = getattr(module, attr)
    except AttributeError:
        raise ConfigError("step", f"module {module_name!r} has no function {attr!r}") from None
    if not callable(function):
        raise ConfigError("step", f"{dotted!r} is not callable")
    return function


def step_function(step: str) -> Callable[..., Any]:
    """The function that runs a step kind."""
    builtin = BUILTIN_STEPS.get(step)
    return import_function(builtin.run if builtin else step)


def check_step_config(step: str, config: dict, deps: dict) -> None:
    """Run the built-in checker for a step kind (user steps have none)."""
    builtin = BUILTIN_STEPS.get(step)
    if builtin is not None:
        import_function(builtin.check)(config, deps)
