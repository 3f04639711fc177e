"""The scaling recipe and the experiment it writes (no JAX, no training)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marin_rules.artifacts.errors import ConfigError
from marin_rules.experiment import build_experiment, load_experiment
from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import flops_per_token
from marin_rules.scaling.recipe import BATCH, TOKENS_PER_PARAM, WIDTHS, grid_rungs, learning_rate, optimal_rung, plan
from marin_rules.scaling.sweep import scaling_experiment
from marin_rules.train.config import check_train

REPO = Path(__file__).resolve().parent.parent
BUDGETS = [3e10 * 1.7**i for i in range(12)]  # 3e10 .. about 1e13


def test_recipe_hits_the_budget_within_one_percent_counted_as_the_trainer_counts():
    for budget in BUDGETS:
        for offset in (-1, 0, 1):
            p = plan(budget, 512, offset)
            c = p.config
            fpt = flops_per_token(ModelConfig.from_dict(c["model"]), c["seq_len"])
            flops = fpt * c["num_train_steps"] * c["batch_size"] * c["seq_len"]
            assert flops == pytest.approx(p.flops)
            assert abs(flops / budget - 1) < 0.01, (budget, offset, flops)


def test_recipe_grows_the_model_with_the_budget_and_keeps_tokens_per_parameter_near_its_rule():
    plans = [plan(b, 512) for b in BUDGETS]
    for small, large in zip(plans, plans[1:]):
        assert large.params >= small.params
        assert large.config["model"]["d_model"] >= small.config["model"]["d_model"]
        assert large.config["model"]["n_layers"] >= small.config["model"]["n_layers"]
        assert large.config["optimizer"]["learning_rate"] <= small.config["optimizer"]["learning_rate"]
    assert plans[-1].params > 10 * plans[0].params
    for p in plans:  # nearest rung in log space: within the ladder's half-step (N x 1.25) of the rule
        assert TOKENS_PER_PARAM / 1.6 < p.tokens / p.params < TOKENS_PER_PARAM * 1.6, p
        assert p.config["batch_size"] == BATCH and p.config["num_train_steps"] == p.tokens // (BATCH * 128)


def test_learning_rate_falls_gently_with_width_as_the_rule_states():
    assert learning_rate(32) == 0.045
    assert learning_rate(512) == pytest.approx(0.045 / 2, rel=1e-2)  # 16x wider: 2x lower
    rates = [learning_rate(w) for w in WIDTHS]
    assert rates == sorted(rates, reverse=True)


def test_isoflop_grid_is_consecutive_rungs_around_the_choice_shifted_inward_at_the_ladder_ends():
    for budget in BUDGETS:
        rungs = grid_rungs(budget, 512, 5)
        assert rungs == list(range(rungs[0], rungs[0] + 5)) and optimal_rung(budget, 512) in rungs
        if 2 <= optimal_rung(budget, 512) <= len(WIDTHS) - 3:
            assert rungs[2] == optimal_rung(budget, 512)
    assert grid_rungs(1e9, 512, 5) == [0, 1, 2, 3, 4]  # the choice is the smallest width


def test_isoflop_neighbours_trade_size_for_tokens_at_the_same_budget():
    low, mid, high = (plan(4.2e11, 512, o) for o in (-1, 0, 1))
    assert low.params < mid.params < high.params
    assert low.tokens > mid.tokens > high.tokens
    assert len({low.rung, mid.rung, high.rung}) == 3


def test_every_recipe_config_passes_the_train_checker_and_validates_the_same_sequences():
    for budget in BUDGETS:
        c = plan(budget, 512).config
        check_train(c, {"data": "tokenized/x@v1"})
        assert c["eval_batches"] * c["batch_size"] == 512


def test_budgets_off_the_ladder_are_refused_with_the_ladder_named():
    with pytest.raises(ValueError, match="off the width ladder"):
        plan(1e8, 512, -1)
    with pytest.raises(ValueError, match="budget"):
        plan(-1.0, 512)
    assert WIDTHS == tuple(sorted(WIDTHS))


def test_the_committed_experiment_is_what_the_recipe_writes():
    committed = yaml.safe_load((REPO / "experiments" / "scaling.yaml").read_text())
    assert committed == scaling_experiment(), "run: .venv/bin/python -m marin_rules.scaling.sweep"


def test_the_experiment_is_an_isoflop_sweep_over_one_tokenization_with_a_10x_verification():
    exp = load_experiment(str(REPO / "experiments" / "scaling.yaml"))
    runs = [a for a in exp.artifacts.values() if a.step == "train" and "/c" in a.key]
    of_step = {step: [a for a in exp.artifacts.values() if a.step == step] for step in ("tokenize", "train_tokenizer")}
    assert len(of_step["tokenize"]) == 1 and len(of_step["train_tokenizer"]) == 1
    tokenizer = of_step["train_tokenizer"][0]
    assert 512 <= tokenizer.config["vocab_size"] <= 1024
    fit = exp["scaling/fit@v1"]
    budgets = fit.config["budgets"]
    assert len(budgets) >= 5 and max(budgets) / min(budgets) >= 30
    assert set(fit.deps["runs"]) == {a.key for a in runs}
    for b in budgets:
        sizes = {r.config["model"]["d_model"] for r in runs if f"/c{_label(b)}-" in r.key}
        assert len(sizes) >= 3, b
    verify = exp[exp["scaling/check@v1"].deps["run"]]
    assert verify.step == "train" and fit.config["predict_budget"] == 10 * max(budgets)
    assert verify.config == plan(10 * max(budgets), 512).config


def _label(b: float) -> str:
    from marin_rules.scaling.sweep import label

    return label(b)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda e: e["artifacts"]["scaling/fit@v1"]["config"].update(budgets=[1e10]), "config.budgets"),
        (lambda e: e["artifacts"]["scaling/fit@v1"]["config"].update(predict_budget=1.0), "config.predict_budget"),
        (lambda e: e["artifacts"]["scaling/fit@v1"]["config"].update(bootstrap="lots"), "config.bootstrap"),
        (lambda e: e["artifacts"]["scaling/check@v1"]["config"].update(target_relative_error=5), "config.target_relative_error"),
        (lambda e: e["artifacts"]["scaling/check@v1"]["deps"].update(run="tokenized/shakespeare-bpe512@v1"), "deps.run"),
    ],
)
def test_bad_scaling_config_is_one_error_naming_artifact_and_field(change, field):
    exp = scaling_experiment()
    change(exp)
    with pytest.raises(ConfigError) as err:
        build_experiment(exp)
    assert str(err.value).startswith("scaling/") and field in str(err.value)
    assert "\n" not in str(err.value)


def test_fewer_budgets_than_the_frontier_laws_parameters_plus_one_are_refused_at_load():
    exp = scaling_experiment()
    exp["artifacts"]["scaling/fit@v1"]["config"]["budgets"] = [1e10, 2.34e10, 5.48e10]
    with pytest.raises(ConfigError) as err:
        build_experiment(exp)
    assert str(err.value) == (
        "scaling/fit@v1: config.budgets: expected at least 4 budgets (the frontier law fits 3 parameters, E, A and "
        "alpha, through one point per budget: 3 leave its bootstrap no uncertainty to measure); add budgets, each "
        "with its runs, got [10000000000.0, 23400000000.0, 54800000000.0]"
    )
    exp["artifacts"]["scaling/fit@v1"]["config"]["budgets"] = [1e10, 2.34e10, 5.48e10, 1.28e11]
    with pytest.raises(ConfigError) as err:  # four are enough, but the runs at 3e11 now fit no budget
        build_experiment(exp)
    assert str(err.value).startswith("scaling/fit@v1: deps.runs: 5 run(s) cost more than 10% from every budget")
    exp["artifacts"]["scaling/fit@v1"]["deps"]["runs"] = {
        key: 1 for key in exp["artifacts"]["scaling/fit@v1"]["deps"]["runs"] if "/c3e11-" not in key
    }
    build_experiment(exp)


def test_runs_whose_steps_miss_every_budget_are_all_named_at_load_before_any_trains():
    exp = scaling_experiment()
    cases = exp["sweeps"]["checkpoints/scaling/c{budget}-d{d_model}@v1"]["cases"]
    for c in cases[:2]:  # two runs of the smallest budget, at 0.8x and 1.15x its FLOPs
        c["steps"] = round(c["steps"] * (0.8 if c is cases[0] else 1.15))
    with pytest.raises(ConfigError) as err:
        build_experiment(exp)
    message = str(err.value)
    assert message.startswith("scaling/fit@v1: deps.runs: 2 run(s) cost more than 10% from every budget in config.budgets")
    for c in cases[:2]:
        assert f"checkpoints/scaling/c{c['budget']}-d{c['d_model']}@v1 costs " in message
    assert message.count("% from 1e+10)") == 2 and "\n" not in message


def test_a_budget_no_run_lands_on_is_refused_at_load_before_the_sweep_trains():
    exp = scaling_experiment()
    runs = exp["artifacts"]["scaling/fit@v1"]["deps"]["runs"]
    exp["artifacts"]["scaling/fit@v1"]["deps"]["runs"] = {key: 1 for key in runs if "/c5.48e10-" not in key}
    with pytest.raises(ConfigError) as err:
        build_experiment(exp)
    assert str(err.value) == (
        "scaling/fit@v1: config.budgets: no run of deps.runs costs within 10% of 5.48e+10, so the fit would have no "
        "point there; add runs at those budgets to deps.runs, or drop them"
    )


def test_a_checked_run_that_does_not_cost_the_fits_predict_budget_is_refused_at_load():
    exp = scaling_experiment()
    fit = exp["artifacts"]["scaling/fit@v1"]
    small = next(iter(fit["deps"]["runs"]))
    exp["artifacts"]["scaling/check@v1"]["deps"]["run"] = small
    with pytest.raises(ConfigError) as err:
        build_experiment(exp)
    message = str(err.value)
    assert message.startswith(f"scaling/check@v1: deps.run: {small} costs ") and "\n" not in message
    assert f"not within 10% of the predict_budget {fit['config']['predict_budget']:g} of scaling/fit@v1" in message


def test_the_writer_refuses_budgets_too_small_for_whole_steps_naming_every_run_off_by_more_than_10_percent():
    with pytest.raises(ValueError) as err:
        scaling_experiment(budgets=(2e8, 4e8, 8e8, 1.6e9), sizes=3, predict_factor=1.25)
    assert str(err.value) == (
        "whole steps of 16 sequences miss these runs' budgets by more than 10%, which scaling_fit refuses: "
        "checkpoints/scaling/c2e8-d6@v1 -14.7%, checkpoints/scaling/c2e8-d8@v1 +17.7%, "
        "checkpoints/scaling/c4e8-d8@v1 -11.7%; raise the smallest budgets"
    )


def test_label_writes_budgets_as_name_segments():
    assert _label(1.25e11) == "1.25e11" and _label(3e10) == "3e10" and _label(1e13) == "1e13"
