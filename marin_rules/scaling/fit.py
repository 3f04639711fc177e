"""Scaling-law fits on a sweep of runs (numpy/scipy, no JAX).

Model: each run is a point (C, N, D, L): FLOPs, compute parameters (C = 6 N D),
tokens and final validation loss, tagged with the nominal budget it was planned for.
- The compute-optimal frontier (Chinchilla approach 2): at each budget, a parabola
  in log N through that budget's runs; its vertex when it is convex and lies inside
  the sampled sizes, else the best run.
- The frontier law `L(C) = E + A * C^-alpha`, least squares on the frontier points.
- Chinchilla approach 3 on all runs: `L(N, D) = E + A/N^a + B/D^b`, Huber loss
  (delta 1e-3) on log L, from a grid of starting points (Hoffmann et al. 2022).
  Its compute-optimal size at C is `N = G (C/6)^(b/(a+b))`, `G = (aA/(bB))^(1/(a+b))`.
- Uncertainty: a residual bootstrap: losses redrawn as the approach-3 fit times
  resampled ratios of its residuals, the frontier and both laws refitted each time;
  intervals are basic bootstrap ones about each estimate: the refits' deviations from
  the fit of the noise-free surface they were drawn from, carried to the estimate
  (percentiles of the raw refits sit about that other fit, and flagged good data).
- Leave-one-budget-out: the prediction again without each budget's runs.
- Honesty flags (`fit_warnings`): a budget with fewer than 3 distinct sizes (its
  frontier point is just its best run), most budgets without a convex minimum inside
  their sizes (the frontier not located), a parameter whose estimate sits on a bound of its
  optimiser (within BOUND_TOL of the bound's range, in the optimiser's coordinates),
  whose bootstrap interval is cut by a bound (at least 2.5% of the refits end on
  it), or whose estimate lies outside its own 95% interval (by more than
  OUTSIDE_TOL: exact data give a zero-width interval the refits miss by 1e-6); the
  same for the predictions. Any of them means the data do not pin the fit.
Fits run in normalised units (C, N, D over their geometric means) and report the
parameters in raw units.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares


POWER_LAW_PARAMS = ("E", "A", "alpha")  # L(C) = E + A * C^-alpha
CHINCHILLA_PARAMS = ("ch_E", "ch_A", "ch_B", "ch_a", "ch_b")  # L(N, D) = E + A/N^a + B/D^b
ALPHA_RANGE = (1e-3, 3.0)  # the frontier law's exponent
A_NORM_RANGE = (1e-9, 1e3)  # its A, with C over its geometric mean
CH_LOG_RANGE = (-10.0, 5.0)  # approach 3's log A and log B (normalised N, D) and log E's floor
CH_EXPONENT_RANGE = (0.01, 3.0)  # approach 3's a and b
BOUND_TOL = 1e-3  # a parameter within this fraction of its bounds' range from one is on it
OUTSIDE_TOL = 1e-3  # an estimate is outside its interval by more than this fraction (the refits' own tolerance)
BOUND_NAMES = {  # (lower, upper) bound of each parameter, as a warning names them
    "E": ("0", "the smallest frontier loss"),
    "A": (f"{A_NORM_RANGE[0]:g} in normalised C", f"{A_NORM_RANGE[1]:g} in normalised C"),
    "alpha": (f"{ALPHA_RANGE[0]:g}", f"{ALPHA_RANGE[1]:g}"),
    "ch_E": (f"e^{CH_LOG_RANGE[0]:g}", "the smallest run loss"),
    "ch_A": (f"e^{CH_LOG_RANGE[0]:g} in normalised N", f"e^{CH_LOG_RANGE[1]:g} in normalised N"),
    "ch_B": (f"e^{CH_LOG_RANGE[0]:g} in normalised D", f"e^{CH_LOG_RANGE[1]:g} in normalised D"),
    "ch_a": (f"{CH_EXPONENT_RANGE[0]:g}", f"{CH_EXPONENT_RANGE[1]:g}"),
    "ch_b": (f"{CH_EXPONENT_RANGE[0]:g}", f"{CH_EXPONENT_RANGE[1]:g}"),
}
BY_RATIO = ("A", "ch_A", "ch_B", "params", "ch_params")  # positive scales: deviations as ratios
FIELDS = {  # bootstrap name -> where fit.json holds the estimate
    "E": ("power_law", "E"), "A": ("power_law", "A"), "alpha": ("power_law", "alpha"),
    "ch_E": ("chinchilla", "E"), "ch_A": ("chinchilla", "A"), "ch_B": ("chinchilla", "B"),
    "ch_a": ("chinchilla", "a"), "ch_b": ("chinchilla", "b"),
    "loss": ("prediction", "loss"), "params": ("prediction", "params"),
    "ch_loss": ("prediction", "chinchilla", "loss"), "ch_params": ("prediction", "chinchilla", "params"),
}


@dataclass(frozen=True)
class Run:
    key: str
    budget: float  # the nominal budget it was planned for
    flops: float
    params: float
    tokens: float
    loss: float


def frontier(runs: list[Run]) -> list[dict]:
    """One compute-optimal point per budget: {budget, flops, params, loss, method}."""
    points = []
    for budget in sorted({r.budget for r in runs}):
        group = sorted((r for r in runs if r.budget == budget), key=lambda r: r.params)
        x = np.log([r.params for r in group])
        y = np.array([r.loss for r in group])
        best = int(np.argmin(y))
        point = {"budget": budget, "flops": float(np.exp(np.mean(np.log([r.flops for r in group])))),
                 "params": group[best].params, "loss": float(y[best]), "method": "best run", "sizes": len(set(x))}
        if len(group) >= 3 and len(set(x)) >= 3:
            c2, c1, c0 = np.polyfit(x, y, 2)
            vertex = -c1 / (2 * c2) if c2 > 0 else None
            if vertex is not None and x.min() <= vertex <= x.max():
                loss = float(c0 + c1 * vertex + c2 * vertex**2)
                point.update(params=float(np.exp(vertex)), loss=min(loss, float(y[best])), method="parabola")
        points.append(point)
    return points


def fit_power_law(flops: np.ndarray, loss: np.ndarray, start: dict | None = None) -> dict:
    """`L = E + A * C^-alpha` by least squares; E in [0, min L), alpha in (0, 3).
    Starts from a grid, or from `start` (an earlier fit) alone."""
    return _fit_power_law(flops, loss, start)[0]


def _fit_power_law(flops: np.ndarray, loss: np.ndarray, start: dict | None = None) -> tuple[dict, dict]:
    """`fit_power_law` and which parameters ended on a bound: {name: "lower" | "upper"}."""
    flops, loss = np.asarray(flops, float), np.asarray(loss, float)
    ref = float(np.exp(np.mean(np.log(flops))))
    x = flops / ref
    lo = [0.0, A_NORM_RANGE[0], ALPHA_RANGE[0]]
    hi = [float(loss.min()) * (1 - 1e-9), A_NORM_RANGE[1], ALPHA_RANGE[1]]

    def residual(p):
        return p[0] + p[1] * x ** -p[2] - loss

    guess = None if start is None else [start["E"], start["A"] / ref ** start["alpha"], start["alpha"]]
    starts = [np.array(guess)] if guess is not None else [
        np.array([e * loss.min(), max(loss.max() - e * loss.min(), 1e-3), a])
        for e, a in itertools.product((0.0, 0.5, 0.9), (0.05, 0.2, 0.5, 1.0))
    ]
    best = min((least_squares(residual, np.clip(s, lo, hi), bounds=(lo, hi)) for s in starts), key=lambda r: r.cost)
    e, a_norm, alpha = best.x
    at = at_bounds(best.x, lo, hi, POWER_LAW_PARAMS, logs=(False, True, False))
    return {"E": float(e), "A": float(a_norm * ref**alpha), "alpha": float(alpha)}, at


def at_bounds(x, lo, hi, names, logs) -> dict[str, str]:
    """{name: "lower" | "upper"} of the parameters within BOUND_TOL of their range from a
    bound (compared in log where `logs` says so: a range over decades)."""
    out = {}
    for v, low, high, name, log in zip(x, lo, hi, names, logs):
        v, low, high = (math.log(t) for t in (v, low, high)) if log else (v, low, high)
        tol = BOUND_TOL * (high - low)
        if v - low <= tol:
            out[name] = "lower"
        elif high - v <= tol:
            out[name] = "upper"
    return out


def power_law_loss(p: dict, flops: np.ndarray | float) -> np.ndarray:
    return p["E"] + p["A"] * np.asarray(flops, float) ** -p["alpha"]


def fit_chinchilla(params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, start: dict | None = None) -> dict:
    """Approach 3: `L = E + A/N^a + B/D^b`, Huber (delta 1e-3) on log L. Starts from
    a grid, or from `start` (an earlier fit) alone."""
    return _fit_chinchilla(params, tokens, loss, start)[0]


def _fit_chinchilla(params, tokens, loss, start: dict | None = None) -> tuple[dict, dict]:
    """`fit_chinchilla` and which parameters ended on a bound: {name: "lower" | "upper"}."""
    params, tokens, loss = (np.asarray(v, float) for v in (params, tokens, loss))
    n0, d0 = float(np.exp(np.mean(np.log(params)))), float(np.exp(np.mean(np.log(tokens))))
    n, d, log_l = params / n0, tokens / d0, np.log(loss)
    (low, high), (e_lo, e_hi) = CH_LOG_RANGE, CH_EXPONENT_RANGE
    lo, hi = [low, low, low, e_lo, e_lo], [math.log(loss.min()), high, high, e_hi, e_hi]

    def residual(p):
        e, la, lb, a, b = p
        pred = np.logaddexp(np.logaddexp(e, la - a * np.log(n)), lb - b * np.log(d))
        return pred - log_l

    span = float(loss.max() - 0.5 * loss.min())
    guess = None if start is None else [
        math.log(start["E"]), math.log(start["A"]) - start["a"] * math.log(n0),
        math.log(start["B"]) - start["b"] * math.log(d0), start["a"], start["b"]]
    starts = [np.array(guess)] if guess is not None else [
        np.array([math.log(ef * loss.min()), math.log(af * span), math.log(bf * span), a, b])
        for ef, af, bf, a, b in itertools.product((0.5, 0.9), (0.1, 0.5), (0.1, 0.5), (0.2, 0.6), (0.2, 0.6))
    ]
    fits = (least_squares(residual, np.clip(s, lo, hi), bounds=(lo, hi), loss="huber", f_scale=1e-3) for s in starts)
    best = min(fits, key=lambda r: r.cost)
    e, la, lb, a, b = best.x
    at = at_bounds(best.x, lo, hi, CHINCHILLA_PARAMS, logs=(False,) * 5)  # E, A, B already in log
    return {"E": math.exp(e), "A": math.exp(la) * n0**a, "B": math.exp(lb) * d0**b, "a": float(a), "b": float(b)}, at


def chinchilla_loss(p: dict, params: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
    return p["E"] + p["A"] / np.asarray(params, float) ** p["a"] + p["B"] / np.asarray(tokens, float) ** p["b"]


def chinchilla_optimum(p: dict, flops: float) -> dict:
    """Approach 3's compute-optimal N, D and loss at `flops` (C = 6 N D)."""
    a, b = p["a"], p["b"]
    log_g = (math.log(a * p["A"]) - math.log(b * p["B"])) / (a + b)
    params = math.exp(log_g + b / (a + b) * math.log(flops / 6))
    tokens = flops / (6 * params)
    return {"params": params, "tokens": tokens, "loss": float(chinchilla_loss(p, params, tokens))}


def fit_size_law(points: list[dict]) -> dict:
    """`N_opt = G * C^s`: a line through the frontier in log-log."""
    s, log_g = np.polyfit(np.log([p["flops"] for p in points]), np.log([p["params"] for p in points]), 1)
    return {"G": float(math.exp(log_g)), "s": float(s)}


def fit_all(runs: list[Run], target: float, start: dict | None = None) -> dict:
    """Frontier, both laws, and their predictions at `target` FLOPs (`start`: an
    earlier `fit_all` to start both fits from); `at_bound`: {name: "lower" | "upper"}
    of the parameters (bootstrap names) that ended on a bound of their optimiser."""
    points = frontier(runs)
    law, law_at = _fit_power_law(np.array([p["flops"] for p in points]), np.array([p["loss"] for p in points]),
                                 start=start and start["power_law"])
    ch, ch_at = _fit_chinchilla(*(np.array([getattr(r, f) for r in runs]) for f in ("params", "tokens", "loss")),
                                start=start and start["chinchilla"])
    size = fit_size_law(points)
    return {
        "frontier": points, "power_law": law, "chinchilla": ch, "size_law": size, "at_bound": {**law_at, **ch_at},
        "prediction": {
            "flops": target,
            "loss": float(power_law_loss(law, target)),
            "params": size["G"] * target ** size["s"],
            "chinchilla": chinchilla_optimum(ch, target),
        },
    }


def bootstrap(runs: list[Run], target: float, fitted: dict, samples: int, seed: int) -> dict:
    """Residual bootstrap: parameter and prediction samples with 95% intervals, and
    `at_bound` {name: {"lower" | "upper": how many refits ended on that bound}}."""
    rng = np.random.default_rng(seed)
    ch = fitted["chinchilla"]
    center = chinchilla_loss(ch, np.array([r.params for r in runs]), np.array([r.tokens for r in runs]))
    ratios = np.array([r.loss for r in runs]) / center
    draws: dict[str, list[float]] = {k: [] for k in ("E", "A", "alpha", "ch_E", "ch_A", "ch_B", "ch_a", "ch_b",
                                                    "loss", "params", "ch_loss", "ch_params")}
    at_bound: dict[str, dict[str, int]] = {}
    for _ in range(samples):
        losses = center * rng.choice(ratios, size=len(runs), replace=True)
        again = [Run(r.key, r.budget, r.flops, r.params, r.tokens, float(l)) for r, l in zip(runs, losses)]
        redo = fit_all(again, target, start=fitted)
        law, chb, opt = redo["power_law"], redo["chinchilla"], redo["prediction"]["chinchilla"]
        for name, side in redo["at_bound"].items():
            counts = at_bound.setdefault(name, {})
            counts[side] = counts.get(side, 0) + 1
        for k, v in (("E", law["E"]), ("A", law["A"]), ("alpha", law["alpha"]), ("ch_E", chb["E"]),
                     ("ch_A", chb["A"]), ("ch_B", chb["B"]), ("ch_a", chb["a"]), ("ch_b", chb["b"]),
                     ("loss", redo["prediction"]["loss"]), ("params", redo["prediction"]["params"]),
                     ("ch_loss", opt["loss"]), ("ch_params", opt["params"])):
            draws[k].append(float(v))
    smooth = fit_all([Run(r.key, r.budget, r.flops, r.params, r.tokens, float(l)) for r, l in zip(runs, center)],
                     target, start=fitted)  # fmt: skip
    about = _about_the_estimate(draws, fitted, smooth)
    intervals = {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in about.items() if v}
    return {"samples": samples, "seed": seed, "interval95": intervals, "draws": draws, "at_bound": at_bound,
            "smooth_power_law": smooth["power_law"]}  # fmt: skip


def law_band(fit: dict, flops: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The frontier law's 95% band at `flops` (a number or an array) from a fit.json's
    bootstrap: the basic interval of the curve, each refit's curve taken as its deviation
    from the noise-free fit's (`smooth_power_law`) carried to the estimate, so that at
    the predicted budget it is `interval95.loss`. A fit.json written before that field
    gives the refits' own percentiles. None without draws."""
    boot = fit.get("bootstrap") or {}
    draws = boot.get("draws") or {}
    if not draws.get("E"):
        return None
    flops = np.asarray(flops, dtype=float)
    curves = np.array([e + a * flops**-al for e, a, al in zip(draws["E"], draws["A"], draws["alpha"])])
    smooth = boot.get("smooth_power_law")
    if smooth is not None:
        curves = power_law_loss(fit["power_law"], flops) - (curves - power_law_loss(smooth, flops))
    lo, hi = np.percentile(curves, [2.5, 97.5], axis=0)
    return lo, hi


def _estimate(fitted: dict, name: str) -> float:
    value: Any = fitted
    for part in FIELDS[name]:
        value = value[part]
    return float(value)


def _about_the_estimate(draws: dict[str, list[float]], fitted: dict, smooth: dict) -> dict[str, list[float]]:
    """The refits' spread carried to the estimate (the basic bootstrap): the refits vary
    around what the estimators give on the noise-free surface they were drawn from
    (`smooth`: approach 3's fitted losses), not around the estimate itself, and for the
    frontier law those differ by the estimators' own bias. Each draw becomes the estimate
    less its refit's deviation: as a ratio for the scales and sizes (`BY_RATIO`, which
    span orders of magnitude), else a difference (a floor E near 0 would blow a ratio up)."""
    out = {}
    for name, values in draws.items():
        raw = np.array(values, dtype=float)
        est, tilde = _estimate(fitted, name), _estimate(smooth, name)
        if name in BY_RATIO and raw.size and est > 0 and tilde > 0 and np.all(raw > 0):
            out[name] = [float(v) for v in est * tilde / raw]
        else:
            out[name] = [float(v) for v in est - (raw - tilde)]
    return out


def fit_warnings(fitted: dict, boot: dict) -> list[str]:
    """One line per sign that the data do not pin a parameter or prediction: its
    estimate on a bound of the optimiser, its 95% interval cut by a bound (at least
    2.5% of the refits on it), or (off its bounds) its estimate outside its own
    interval."""
    out = []
    points = fitted.get("frontier", [])
    for point in points:
        if point.get("sizes", 3) < 3:  # no parabola through it: the optimum is not located at all
            out.append(f"frontier at budget {point['budget']:.3g}: {point['sizes']} distinct size(s), so its "
                       f"compute-optimal point is just its best run (N = {point['params']:.3g}): give each budget "
                       "at least 3 sizes around its optimum")  # fmt: skip
    unlocated = [p for p in points if p.get("method") == "best run" and p.get("sizes", 3) >= 3]
    if len(unlocated) * 2 > len(points):  # one budget's noise may put its best run at an edge; most cannot
        out.append(f"frontier: at {len(unlocated)} of {len(points)} budgets no convex minimum lies inside the sizes "
                   "(the best run at an edge, or losses that do not curve up on both sides): the frontier is not "
                   "located; add or move sizes around each budget's best run")  # fmt: skip
    ci, samples, boot_at = boot.get("interval95", {}), boot.get("samples", 0), boot.get("at_bound", {})
    for name, path in FIELDS.items():
        est = _estimate(fitted, name)
        field = ".".join(path)
        on_bound = fitted.get("at_bound", {}).get(name)
        if on_bound:
            out.append(f"{field} = {est:.4g}: on the optimiser's {on_bound} bound "
                       f"({BOUND_NAMES[name][on_bound == 'upper']}); the bound, not the data, set it")
        interval = ci.get(name)
        raw = (boot.get("draws") or {}).get(name) or []
        for end, count in sorted(boot_at.get(name, {}).items()):
            if raw and count >= 0.025 * samples:  # the refits themselves (the interval is carried to the estimate)
                out.append(f"{field}: the bootstrap refits span {min(raw):.4g}-{max(raw):.4g} and touch the "
                           f"optimiser's {end} bound ({BOUND_NAMES[name][end == 'upper']}): {count} of {samples} "
                           "bootstrap fits ended on it")  # fmt: skip
        if interval and not on_bound:  # an estimate on a bound is flagged above, its interval noise
            lo, hi = interval
            slack = OUTSIDE_TOL * max(abs(est), abs(lo), abs(hi))
            if not lo - slack <= est <= hi + slack:
                what = "prediction" if path[0] == "prediction" else "parameter"
                out.append(f"{field} = {est:.4g} lies outside its bootstrap 95% interval {lo:.4g}-{hi:.4g}: "
                           f"bootstrap disagrees with the fit: the data do not pin this {what}")
    return out


def leave_one_budget_out(runs: list[Run], target: float, fitted: dict) -> list[dict]:
    """The predictions at `target` without each budget's runs, relative to the full fit's."""
    full, full_ch = fitted["prediction"]["loss"], fitted["prediction"]["chinchilla"]["loss"]
    out = []
    for budget in sorted({r.budget for r in runs}):
        rest = [r for r in runs if r.budget != budget]
        if len({r.budget for r in rest}) < 3:
            continue
        again = fit_all(rest, target, start=fitted)
        loss, ch_loss = again["prediction"]["loss"], again["prediction"]["chinchilla"]["loss"]
        out.append({"dropped_budget": budget, "loss": loss, "relative_change": loss / full - 1,
                    "chinchilla_loss": ch_loss, "chinchilla_relative_change": ch_loss / full_ch - 1,
                    "alpha": again["power_law"]["alpha"]})
    return out
