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


def test_bootstrap_intervals_cover_the_true_exponents_loo_moves_little_and_nothing_is_flagged_at_02_percent_noise():
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
    assert fitted["at_bound"] == {} and boot["at_bound"] == {} and F.fit_warnings(fitted, boot) == []


def test_a_budget_with_sizes_on_one_side_of_its_optimum_uses_its_best_run():
    runs = [F.Run(f"r{n}", 1e12, 1e12, n, 1e12 / (6 * n), 5.0 - 0.1 * i) for i, n in enumerate((1e4, 2e4, 4e4))]
    (point,) = F.frontier(runs)
    assert point["method"] == "best run" and point["params"] == 4e4 and point["loss"] == pytest.approx(4.8)


def test_the_checkers_minimums_are_one_more_than_each_laws_parameters():
    from marin_rules.scaling.checks import MIN_BUDGETS, MIN_RUNS

    assert MIN_BUDGETS == len(F.POWER_LAW_PARAMS) + 1  # the frontier law: one point per budget
    assert MIN_RUNS == len(F.CHINCHILLA_PARAMS) + 1  # approach 3: every run


def test_a_law_with_no_floor_is_flagged_on_its_lower_bound_in_the_fit_and_the_bootstrap():
    runs = [r for r in isoflop_runs({**TRUE, "E": 0.0}) if r.budget in BUDGETS[:4]]
    fitted = F.fit_all(runs, 1e13)
    boot = F.bootstrap(runs, 1e13, fitted, samples=20, seed=0)
    assert fitted["at_bound"]["E"] == "lower" and boot["at_bound"]["E"] == {"lower": 20}
    warnings = F.fit_warnings(fitted, boot)
    on_bound = f"power_law.E = {fitted['power_law']['E']:.4g}: on the optimiser's lower bound (0); the bound, not the data, set it"
    assert on_bound in warnings
    lo, hi = min(boot["draws"]["E"]), max(boot["draws"]["E"])  # the refits themselves
    assert (f"power_law.E: the bootstrap refits span {lo:.4g}-{hi:.4g} and touch the optimiser's lower bound (0): "
            "20 of 20 bootstrap fits ended on it") in warnings
    assert not any(w.startswith("power_law.alpha") for w in warnings)  # the exponent is still pinned


def test_an_estimate_outside_its_interval_and_an_interval_cut_by_a_bound_are_flagged_once_each():
    fitted = F.fit_all(isoflop_runs(TRUE), 1e13)
    alpha = fitted["power_law"]["alpha"]
    boot = {"samples": 50, "interval95": {"alpha": [alpha + 0.01, alpha + 1.9], "ch_a": [0.2, 2.99999], "ch_b": [0.3, 0.5]},
            "draws": {"ch_a": [0.2, 1.0, 3.0], "ch_b": [0.3, 0.5]},
            "at_bound": {"ch_a": {"upper": 2}, "ch_b": {"lower": 1}}}  # fmt: skip
    assert F.fit_warnings(fitted, boot) == [
        f"power_law.alpha = {alpha:.4g} lies outside its bootstrap 95% interval {alpha + 0.01:.4g}-{alpha + 1.9:.4g}: "
        "bootstrap disagrees with the fit: the data do not pin this parameter",
        "chinchilla.a: the bootstrap refits span 0.2-3 and touch the optimiser's upper bound (3): 2 of 50 bootstrap "
        "fits ended on it",
    ]  # ch_b: 1 of 50 refits on a bound is under 2.5%, so its interval's end is not the bound


def test_budgets_of_one_size_each_are_flagged_not_reported_as_a_located_frontier():
    # every budget's runs at one size: no parabola, so "compute-optimal" would be just that size
    runs = [F.Run(f"c{b:g}-{k}", b, b, p.params, p.tokens, float(F.chinchilla_loss(TRUE, p.params, p.tokens)))
            for b in BUDGETS for k, p in enumerate([plan(b, 512, -1)] * 3)]  # fmt: skip
    fitted = F.fit_all(runs, 1e13)
    assert {p["method"] for p in fitted["frontier"]} == {"best run"} and {p["sizes"] for p in fitted["frontier"]} == {1}
    warnings = F.fit_warnings(fitted, {})
    assert sum(w.startswith("frontier at budget ") and "1 distinct size(s)" in w for w in warnings) == len(BUDGETS)


def test_the_bootstrap_interval_is_about_the_estimate_so_clean_data_are_not_flagged():
    # 5 budgets x 5 sizes at 0.3% noise: the frontier law's refits vary about its fit on
    # approach 3's noise-free surface, not about its estimate; percentiles of the raw
    # refits left the estimate outside its own interval and flagged this fit unreliable
    # (4 warnings here; 3 of seeds 0-5 were flagged, none is now)
    rng = np.random.default_rng(2)
    law = {"E": 1.7, "A": 40.0, "a": 0.34, "B": 60.0, "b": 0.28}
    runs = []
    for budget in (1e10, 3e10, 1e11, 3e11, 1e12):
        for m in (0.25, 0.5, 1, 2, 4):
            n = (budget / 360) ** 0.5 * m
            d = budget / (6 * n)
            loss = float(F.chinchilla_loss(law, n, d)) * (1 + 0.003 * rng.standard_normal())
            runs.append(F.Run(f"c{budget:g}-{m}", budget, budget, n, d, loss))
    fitted = F.fit_all(runs, 1e13)
    boot = F.bootstrap(runs, 1e13, fitted, samples=40, seed=0)
    assert F.fit_warnings(fitted, boot) == []
    for name in ("loss", "params", "alpha", "ch_loss"):
        lo, hi = boot["interval95"][name]
        assert lo < F._estimate(fitted, name) < hi, name
    # the plot's and the check's band of the frontier law is that interval at the predicted budget
    band = F.law_band({**fitted, "bootstrap": boot}, 1e13)
    assert [float(band[0]), float(band[1])] == pytest.approx(boot["interval95"]["loss"], rel=1e-12)
