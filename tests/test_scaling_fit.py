"""The scaling fits recover known laws from synthetic losses (numpy/scipy only)."""

from __future__ import annotations

import numpy as np
import pytest

from marin_rules.scaling import fit as F
from marin_rules.scaling.recipe import plan

TRUE = {"E": 1.8, "A": 300.0, "B": 900.0, "a": 0.45, "b": 0.40}
BUDGETS = (3e10, 7.5e10, 1.8e11, 4.2e11, 1e12)


def isoflop_runs(law: dict, noise: float = 0.0, seed: int = 0) -> list[F.Run]:
    """The recipe's IsoFLOP grid (5 budgets x 3 sizes), losses from `law`."""
    rng = np.random.default_rng(seed)
    runs = []
    for budget in BUDGETS:
        for offset in (-1, 0, 1):
            p = plan(budget, 512, offset)
            loss = float(F.chinchilla_loss(law, p.params, p.tokens)) * (1 + noise * rng.standard_normal())
            runs.append(F.Run(f"c{budget:g}-{offset}", budget, p.flops, p.params, p.tokens, loss))
    return runs


def test_power_law_fit_recovers_e_a_alpha_from_exact_and_noisy_losses():
    flops = np.geomspace(3e10, 1e12, 5)
    loss = 2.0 + 40.0 * flops**-0.12
    exact = F.fit_power_law(flops, loss)
    assert exact["E"] == pytest.approx(2.0, rel=1e-3)
    assert exact["alpha"] == pytest.approx(0.12, rel=1e-3)
    assert exact["A"] == pytest.approx(40.0, rel=1e-2)
    noisy = F.fit_power_law(flops, loss * (1 + 1e-3 * np.random.default_rng(1).standard_normal(5)))
    assert float(F.power_law_loss(noisy, 1e13)) == pytest.approx(float(2.0 + 40.0 * 1e13**-0.12), rel=0.01)


def test_approach_3_recovers_the_exponents_and_the_10x_optimum_from_exact_losses():
    runs = isoflop_runs(TRUE)
    fitted = F.fit_all(runs, 1e13)
    ch = fitted["chinchilla"]
    assert ch["a"] == pytest.approx(TRUE["a"], abs=0.01) and ch["b"] == pytest.approx(TRUE["b"], abs=0.01)
    assert ch["E"] == pytest.approx(TRUE["E"], rel=0.02)
    truth = F.chinchilla_optimum(TRUE, 1e13)
    assert fitted["prediction"]["chinchilla"]["loss"] == pytest.approx(truth["loss"], rel=1e-3)
    assert fitted["prediction"]["chinchilla"]["params"] == pytest.approx(truth["params"], rel=0.05)


def test_frontier_takes_each_budgets_parabola_vertex_inside_the_sampled_sizes():
    runs = isoflop_runs(TRUE)
    points = F.frontier(runs)
    assert [p["budget"] for p in points] == list(BUDGETS)
    for point in points:
        group = [r for r in runs if r.budget == point["budget"]]
        assert min(r.params for r in group) <= point["params"] <= max(r.params for r in group)
        assert point["loss"] <= min(r.loss for r in group)
        truth = F.chinchilla_optimum(TRUE, point["flops"])["loss"]
        assert point["loss"] == pytest.approx(truth, rel=0.01)  # a parabola in log N, 3 points


def test_bootstrap_intervals_cover_the_true_exponents_and_loo_moves_little_at_02_percent_noise():
    runs = isoflop_runs(TRUE, noise=0.002, seed=3)
    fitted = F.fit_all(runs, 1e13)
    boot = F.bootstrap(runs, 1e13, fitted, samples=60, seed=0)
    ci = boot["interval95"]
    assert ci["ch_a"][0] <= TRUE["a"] <= ci["ch_a"][1] and ci["ch_b"][0] <= TRUE["b"] <= ci["ch_b"][1]
    truth = F.chinchilla_optimum(TRUE, 1e13)["loss"]
    assert ci["ch_loss"][0] <= truth <= ci["ch_loss"][1]
    assert ci["loss"][0] < fitted["prediction"]["loss"] < ci["loss"][1]
    assert len(boot["draws"]["alpha"]) == 60
    loo = F.leave_one_budget_out(runs, 1e13, fitted)
    assert [x["dropped_budget"] for x in loo] == list(BUDGETS)
    assert max(abs(x["chinchilla_relative_change"]) for x in loo) < 0.03


def test_a_budget_with_sizes_on_one_side_of_its_optimum_uses_its_best_run():
    runs = [F.Run(f"r{n}", 1e12, 1e12, n, 1e12 / (6 * n), 5.0 - 0.1 * i) for i, n in enumerate((1e4, 2e4, 4e4))]
    (point,) = F.frontier(runs)
    assert point["method"] == "best run" and point["params"] == 4e4 and point["loss"] == pytest.approx(4.8)
