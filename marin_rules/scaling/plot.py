"""The scaling plot: loss against compute, as a PNG (matplotlib's Figure, no pyplot).

Model: every run as a point (coloured by budget), the compute-optimal frontier
(its points joined), the frontier law `E + A C^-alpha` from the smallest budget to
the prediction, its 95% bootstrap band, approach 3's compute-optimal curve, the
predicted point at the target budget and, for `scaling_check`, the actual loss of
the verification run. A fit with `warnings` says so in a red box, bottom left.
"""

from __future__ import annotations

import io

import numpy as np

from marin_rules.artifacts import storage
from marin_rules.scaling import fit as F


def plot_scaling(fit: dict, location: str, actual: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5), dpi=110)
    ax = fig.subplots()
    runs, points, pred = fit["runs"], fit["frontier"], fit["prediction"]
    budgets = sorted({r["budget"] for r in runs})
    colours = matplotlib.colormaps["viridis"](np.linspace(0, 0.9, len(budgets)))
    for budget, colour in zip(budgets, colours):
        group = [r for r in runs if r["budget"] == budget]
        ax.scatter([r["flops"] for r in group], [r["loss"] for r in group], s=22, color=colour, alpha=0.8,
                   label=f"runs at {budget:.2g} FLOPs")
    ax.plot([p["flops"] for p in points], [p["loss"] for p in points], "k*-", markersize=9, linewidth=0.8,
            label="compute-optimal frontier")
    grid = np.geomspace(min(r["flops"] for r in runs) / 1.5, pred["flops"] * 1.5, 200)
    law = fit["power_law"]
    ax.plot(grid, F.power_law_loss(law, grid), "C3-", linewidth=1.4,
            label=f"L(C) = {law['E']:.2f} + {law['A']:.3g} C^-{law['alpha']:.3f}")
    band = F.law_band(fit, grid)
    if band is not None:
        ax.fill_between(grid, *band, color="C3", alpha=0.15, label="95% bootstrap band")
    ch = fit["chinchilla"]
    opt = [F.chinchilla_optimum(ch, c)["loss"] for c in grid]
    ax.plot(grid, opt, "C0--", linewidth=1.1, label=f"approach 3 optimum (a={ch['a']:.2f}, b={ch['b']:.2f})")
    ax.plot([pred["flops"]], [pred["loss"]], "C3D", markersize=8, label=f"prediction {pred['loss']:.3f}")
    if actual is not None:
        ax.plot([actual["flops"]], [actual["actual_loss"]], "ko", markersize=9, mfc="none", mew=2,
                label=f"actual {actual['actual_loss']:.3f} ({100 * actual['relative_error']:+.1f}%)")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (C = 6 N D)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Scaling: IsoFLOP runs, frontier law and its prediction")
    if fit.get("warnings"):
        ax.text(0.02, 0.03, f"UNRELIABLE: {len(fit['warnings'])} warning(s), the data do not pin the fit (table.md)",
                transform=ax.transAxes, ha="left", va="bottom", color="C3", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "C3", "alpha": 0.9})
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    storage.write_bytes_atomic(location, buf.getvalue())
