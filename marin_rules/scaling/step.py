"""The `scaling_fit` and `scaling_check` steps.

Model: `scaling_fit(ctx)` reads the success record of every run in
`ctx.deps["runs"]` (a mixture-shaped role; the weights are ignored): C =
flops_per_token * tokens_seen, N = flops_per_token / 6, D = tokens_seen, L =
final_val_loss; each run belongs to the nearest of `config.budgets` (within 10%).
It refuses fewer than `checks.MIN_BUDGETS` budgets before writing anything. It
writes `fit.json` (runs, frontier, both laws, the prediction at
`config.predict_budget`, bootstrap intervals and draws, leave-one-budget-out, and
`warnings`: `fit.fit_warnings`, the signs that the data do not pin the fit),
`scaling.png` and `table.md` (the warnings under the table). `scaling_check(ctx)`
reads `fit.json` and the run's record, and writes `check.json` and `check.png`:
predicted against actual validation loss and the relative error (actual /
predicted - 1), `within_target` (|error| <= target) and `within_band` (inside the
bootstrap's 95% band). A fit with warnings is not a trustworthy prediction, so the
check then says `reliable: false` and carries them as `fit_warnings`; `within_band`
is null (a band the fit's own estimate can fall outside of, or that a bound cuts, is
no 95% band), `within_target` stays the measured fact, and `passed` (within target
and reliable) is false whatever the error. `summary` says all of it in one line.
Each result gives its files by content (`file_digests`: `marin verify`, the report).
"""

from __future__ import annotations

import math

import numpy as np

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import FILE_DIGESTS, named_digests
from marin_rules.artifacts.records import read_record
from marin_rules.scaling import fit as F
from marin_rules.scaling.checks import BUDGET_TOLERANCE, MIN_BUDGETS, too_few_budgets
from marin_rules.scaling.plot import plot_scaling

FIT_FILES = ("fit.json", "table.md", "scaling.png")  # each step's files, by content in its result's file_digests
CHECK_FILES = ("check.json", "check.png")


def run_point(location: str, budgets: list[float] | None = None) -> F.Run:
    """A train run as a fit point (from its success record)."""
    record = read_record(location)
    if record is None:
        raise StepError(f"{location}: no success record; build the run first")
    key = record.key
    result = record.result if isinstance(record.result, dict) else {}
    try:
        fpt, tokens, loss = float(result["flops_per_token"]), float(result["tokens_seen"]), float(result["final_val_loss"])
    except (KeyError, TypeError, ValueError):
        raise StepError(
            f"{key}: its record has no flops_per_token, tokens_seen and final_val_loss; is it a train run?"
        ) from None
    if not math.isfinite(loss):
        raise StepError(f"{key}: final_val_loss is {loss}; rerun it with a lower learning rate and a new version")
    if loss <= 0 or not (fpt > 0 and tokens > 0 and math.isfinite(fpt * tokens)):
        raise StepError(
            f"{key}: its record gives final_val_loss {loss:g}, flops_per_token {fpt:g} and tokens_seen {tokens:g}; "
            "a fit point needs a positive loss (a cross-entropy) and positive, finite FLOPs: is it a train run?"
        )
    flops = fpt * tokens
    budget = flops
    if budgets:
        budget = min(budgets, key=lambda b: abs(math.log(flops / b)))
        if abs(flops / budget - 1) > BUDGET_TOLERANCE:
            raise StepError(f"{key}: costs {flops:.3g} FLOPs, more than 10% from every budget in config.budgets {budgets}")
    return F.Run(key, float(budget), flops, fpt / 6, tokens, loss)


def scaling_fit(ctx: StepContext) -> dict:
    budgets = [float(b) for b in ctx.config["budgets"]]
    target = float(ctx.config["predict_budget"])
    if len(set(budgets)) < MIN_BUDGETS:
        raise StepError(f"config.budgets: {too_few_budgets(len(set(budgets)))}, got {budgets}")
    runs = [run_point(location, budgets) for location in ctx.deps["runs"]]
    missing = [b for b in budgets if not any(r.budget == b for r in runs)]
    if missing:
        raise StepError(f"config.budgets: no run was planned for {missing}; drop them or add runs to deps.runs")
    fitted = F.fit_all(runs, target)
    boot = F.bootstrap(runs, target, fitted, int(ctx.config.get("bootstrap", 200)), int(ctx.config.get("seed", 0)))
    loo = F.leave_one_budget_out(runs, target, fitted)
    warnings = F.fit_warnings(fitted, boot)
    out = {
        "runs": [vars(r) for r in runs],
        **fitted,
        "bootstrap": boot,
        "leave_one_budget_out": loo,
        "loo_spread": max((abs(x["relative_change"]) for x in loo), default=None),
        "loo_spread_chinchilla": max((abs(x["chinchilla_relative_change"]) for x in loo), default=None),
        "warnings": warnings,
    }
    storage.makedirs(ctx.output)
    storage.write_json_atomic(storage.join(ctx.output, "fit.json"), out)
    storage.write_text_atomic(storage.join(ctx.output, "table.md"), table(out))
    plot_scaling(out, storage.join(ctx.output, "scaling.png"))
    ci = boot["interval95"]
    return {
        "runs": len(runs),
        "budgets": len(budgets),
        "power_law": fitted["power_law"],
        "alpha_interval95": ci.get("alpha"),
        "chinchilla": fitted["chinchilla"],
        "chinchilla_a_interval95": ci.get("ch_a"),
        "chinchilla_b_interval95": ci.get("ch_b"),
        "predict_budget": target,
        "predicted_loss": fitted["prediction"]["loss"],
        "predicted_loss_interval95": ci.get("loss"),
        "predicted_params": fitted["prediction"]["params"],
        "predicted_params_interval95": ci.get("params"),
        "chinchilla_prediction": fitted["prediction"]["chinchilla"],
        "loo_spread": out["loo_spread"],
        "loo_spread_chinchilla": out["loo_spread_chinchilla"],
        "warnings": warnings,
        FILE_DIGESTS: named_digests(ctx.output, FIT_FILES),
    }


def table(fit: dict) -> str:
    """The runs and the fitted laws as a Markdown table."""
    lines = ["| run | budget | FLOPs | N (FLOPs/token / 6) | D | val loss |", "|---|---|---|---|---|---|"]
    for r in sorted(fit["runs"], key=lambda r: (r["budget"], r["params"])):
        lines.append(f"| {r['key']} | {r['budget']:.3g} | {r['flops']:.3g} | {r['params']:.3g} | "
                     f"{r['tokens']:.3g} | {r['loss']:.4f} |")
    law, ch, pred = fit["power_law"], fit["chinchilla"], fit["prediction"]
    ci = fit["bootstrap"]["interval95"]
    band = ci.get("loss")
    lines += [
        "",
        f"Frontier law: L(C) = {law['E']:.3f} + {law['A']:.4g} * C^-{law['alpha']:.4f}"
        + (f" (alpha 95%: {ci['alpha'][0]:.3f}-{ci['alpha'][1]:.3f})" if "alpha" in ci else ""),
        f"Approach 3: L(N, D) = {ch['E']:.3f} + {ch['A']:.4g}/N^{ch['a']:.3f} + {ch['B']:.4g}/D^{ch['b']:.3f}",
        f"Prediction at C = {pred['flops']:.3g}: L = {pred['loss']:.4f}"
        + (f" (95%: {band[0]:.4f}-{band[1]:.4f})" if band else "")
        + f", N = {pred['params']:.3g}; approach 3: L = {pred['chinchilla']['loss']:.4f}, "
        f"N = {pred['chinchilla']['params']:.3g}",
        f"N is FLOP-equivalent: FLOPs per token / 6 (active matmul parameters plus the attention term), so "
        "C = 6 N D; marin plan shows the parameter counts",
        f"Leave one budget out: largest change {100 * fit['loo_spread']:.2f}% (frontier law), "
        f"{100 * fit['loo_spread_chinchilla']:.2f}% (approach 3)"
        if fit["leave_one_budget_out"] else "Leave one budget out: needs at least 4 budgets",
    ]
    if fit.get("warnings"):
        lines += ["", f"**Warnings: {UNRELIABLE}; {REFIT}**", ""] + [f"- {w}" for w in fit["warnings"]]
    return "\n".join(lines) + "\n"


UNRELIABLE = "the data do not pin this fit"
REFIT = "add budgets (over a wider range) or sizes per budget and refit"


def summary(out: dict, band: list[float] | None, warnings: list[str]) -> str:
    """`scaling_check`'s verdict in one line."""
    met = "met" if out["within_target"] else "missed"
    line = (f"{out['run']}: actual {out['actual_loss']:.4f} vs predicted {out['predicted_loss']:.4f} "
            f"({100 * out['relative_error']:+.1f}%; target {100 * out['target_relative_error']:g}%: {met})")
    if warnings:
        return (f"{line}; NOT a pass: {UNRELIABLE} ({len(warnings)} warning(s) in fit.json, the first: "
                f"{warnings[0]}), so neither its band nor its error says much; {REFIT}")
    inside = "inside" if out["within_band"] else "outside"
    return f"{line}; {inside} the 95% band {band[0]:.4f}-{band[1]:.4f}" if band else f"{line}; no bootstrap band"


def scaling_check(ctx: StepContext) -> dict:
    fit = storage.read_json(storage.join(ctx.deps["fit"], "fit.json"))
    run = run_point(ctx.deps["run"])
    target = fit["prediction"]["flops"]
    if abs(run.flops / target - 1) > BUDGET_TOLERANCE:
        raise StepError(f"deps.run: {run.key} costs {run.flops:.3g} FLOPs, not the fit's predicted budget {target:.3g}")
    law, ch = fit["power_law"], fit["chinchilla"]
    predicted = float(F.power_law_loss(law, run.flops))
    at = F.law_band(fit, run.flops)
    band = None if at is None else [float(at[0]), float(at[1])]
    predicted_ch = float(F.chinchilla_loss(ch, run.params, run.tokens))
    error = run.loss / predicted - 1
    limit = float(ctx.config.get("target_relative_error", 0.05))
    warnings = list(fit.get("warnings", []))
    within_band = bool(band and band[0] <= run.loss <= band[1])
    out = {
        "run": run.key, "flops": run.flops, "params": run.params, "tokens": run.tokens,
        "actual_loss": run.loss, "predicted_loss": predicted, "predicted_loss_interval95": band,
        "relative_error": error, "within_band": None if warnings else within_band,
        "chinchilla_predicted_loss": predicted_ch, "chinchilla_relative_error": run.loss / predicted_ch - 1,
        "predicted_params": fit["prediction"]["params"], "target_relative_error": limit,
        "within_target": abs(error) <= limit,
        "reliable": not warnings, "fit_warnings": warnings,
    }
    out["passed"] = bool(out["within_target"] and not warnings)
    out["summary"] = summary(out, band, warnings)
    storage.makedirs(ctx.output)
    storage.write_json_atomic(storage.join(ctx.output, "check.json"), out)
    plot_scaling(fit, storage.join(ctx.output, "check.png"), actual=out)
    return {**out, FILE_DIGESTS: named_digests(ctx.output, CHECK_FILES)}
