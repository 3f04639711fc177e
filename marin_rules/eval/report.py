"""What an evaluation reports: headline metrics with their standard errors, the
results table that calls a difference within two standard errors a tie, the chart.

Model: lm-eval gives each metric a standard error where it has a closed form (`acc`:
the sample standard deviation over sqrt(n)) and leaves corpus-level ratios without
one (`bits_per_byte`, `word_perplexity`, `byte_perplexity`: "N/A"). `ratio_stderrs`
fills those from the per-document (log-likelihood, weight) pairs lm-eval logs: the
ratio R = sum(-ll) / sum(weight) has, by the delta method,
SE(R) = sqrt(n / (n - 1) * sum((-ll_i - R * weight_i)^2)) / sum(weight);
bits per byte is R / ln 2 and a perplexity exp(R) has SE exp(R) * SE(R).

A model and its baseline are scored on the same documents; the table treats their
errors as independent (conservative: it ignores the pairing), so a difference d is
a tie when |d| <= 2 * sqrt(se_model^2 + se_baseline^2), and the side that is better
otherwise. A metric without a standard error is a tie only when equal.

The ratio metrics divide by the scored texts' bytes or words, which only means
something when the tokens describe the texts: a task whose texts the tokenizer did
not give back (`lossy`: task -> where one differs) has those rows marked "not
meaningful" and a note under the table (`lossy_note`; the step prints it too).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from marin_rules.eval.config import BPB_TASK, CLOZE_TASK

HEADLINE = {BPB_TASK: "bits_per_byte", CLOZE_TASK: "acc"}
TIE_STDERRS = 2.0  # a difference within this many standard errors is a tie
RATIO_METRICS = {"bits_per_byte", "word_perplexity", "byte_perplexity"}
LOSSY_LABEL = "not meaningful: lossy tokenizer"  # beside a ratio metric of a lossy task (table, chart, marin status)
LOWER_IS_BETTER = ("perplexity", "bits_per_byte")


def ratio_stderr(pairs: Sequence[Sequence[float]], metric: str) -> float | None:
    """The standard error of a corpus-level ratio metric from its per-document
    (log-likelihood, weight) pairs; None with fewer than two documents."""
    n = len(pairs)
    if n < 2:
        return None
    loss = [-float(ll) for ll, _ in pairs]
    weight = [float(w) for _, w in pairs]
    total = sum(weight)
    ratio = sum(loss) / total
    se = math.sqrt(n / (n - 1) * sum((x - ratio * w) ** 2 for x, w in zip(loss, weight))) / total
    if metric == "bits_per_byte":
        return se / math.log(2)
    return math.exp(ratio) * se  # a perplexity


def fill_ratio_stderrs(results: dict[str, Any], samples: dict[str, list[dict]]) -> None:
    """Put `<metric>_stderr,<filter>` into lm-eval's `results` for every ratio metric
    that has none, from the logged `samples` of its task (in place)."""
    for task, values in results.items():
        for key in list(values):
            metric, _, filt = key.partition(",")
            stderr_key = f"{metric}_stderr,{filt}"
            if metric not in RATIO_METRICS or isinstance(values.get(stderr_key), (int, float)):
                continue
            pairs = [s[metric] for s in samples.get(task, []) if s.get("filter", filt) == filt and metric in s]
            values[stderr_key] = ratio_stderr(pairs, metric)


def headline_metrics(model: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, dict[str, float]]:
    """task -> {metric: model value, metric_stderr: its standard error (when known),
    baseline_<metric>, baseline_<metric>_stderr: the same for the baseline};
    lm-eval's `metric,filter` keys lose a `none` filter."""
    summary: dict[str, dict[str, float]] = {}
    for task, values in model.get("results", {}).items():
        row = _metrics(values)
        if baseline is not None:
            row.update({f"baseline_{k}": v for k, v in _metrics(baseline["results"].get(task, {})).items()})
        summary[task] = row
    return summary


def _metrics(values: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        metric, _, filt = key.partition(",")
        if metric == "sample_len" or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if metric.endswith("_stderr") and not math.isfinite(value):
            continue
        out[metric if filt in ("", "none") else f"{metric}_{filt}"] = float(value)
    return out


def compare(metric: str, value: float, base: float, se: float | None, base_se: float | None) -> str:
    """`model`, `baseline` or `tie` (within TIE_STDERRS combined standard errors)."""
    if se is not None and base_se is not None:
        if abs(value - base) <= TIE_STDERRS * math.hypot(se, base_se):
            return "tie"
    elif value == base:
        return "tie"
    lower = any(word in metric for word in LOWER_IS_BETTER)
    return "model" if (value < base if lower else value > base) else "baseline"


def lossy_note(tasks: Sequence[str], example: str) -> str:
    """One line: the ratio metrics of `tasks` are not meaningful, why, and what to do."""
    return (
        f"{', '.join(tasks)}: the model's tokenizer does not encode the scored texts losslessly ({example}), "
        f"so {', '.join(sorted(RATIO_METRICS))} measure its tokens, not the texts, and are "
        "not meaningful; use a byte-level tokenizer for bits per byte"
    )


def results_table(summary: dict[str, dict[str, float]], title: str, lossy: Mapping[str, str] | None = None) -> str:
    """The markdown table; rows of a ratio metric of a task in `lossy` (task -> where
    a text did not come back) say "not meaningful", with a note under the table.
    Without any baseline score (`baseline: none`) the table has no baseline columns."""
    lossy = lossy or {}
    with_baseline = any(k.startswith("baseline_") for row in summary.values() for k in row)
    lines = [
        f"# Evaluation of {title}",
        "",
        "Each value is followed by its standard error"
        + (f"; a difference within {TIE_STDERRS:g} combined standard errors is a tie." if with_baseline else "."),
        "",
        "| task | metric | model | unigram baseline | better |" if with_baseline else "| task | metric | model |",
        "|---|---|---:|---:|---|" if with_baseline else "|---|---|---:|",
    ]
    for task, row in summary.items():
        for metric, value in row.items():
            if metric.startswith("baseline_") or metric.endswith("_stderr"):
                continue
            se, base = row.get(f"{metric}_stderr"), row.get(f"baseline_{metric}")
            base_se = row.get(f"baseline_{metric}_stderr")
            better = "" if base is None else compare(metric, value, base, se, base_se)
            name = f"{metric} ({LOSSY_LABEL})" if task in lossy and metric in RATIO_METRICS else metric
            baseline = f" {_cell(base, base_se)} | {better} |" if with_baseline else ""
            lines.append(f"| {task} | {name} | {_cell(value, se)} |{baseline}")
    lines += [line for task, example in lossy.items() for line in ("", f"Not meaningful: {lossy_note([task], example)}.")]
    return "\n".join(lines) + "\n"


def _cell(value: float | None, se: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if se is None else f"{value:.4f} ± {se:.4f}"


def plot_results(summary: dict[str, dict[str, float]], path: str, lossy: Mapping[str, str] | None = None) -> None:
    """A bar per side for each task's headline metric, with two-stderr error bars; a
    ratio metric of a task in `lossy` is titled "not meaningful"."""
    lossy = lossy or {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary)
    if not tasks:
        return
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        row = summary[task]
        metric = HEADLINE.get(task) or next(k for k in row if not k.startswith("baseline_") and not k.endswith("_stderr"))
        sides = [("model", metric)] + ([("unigram", f"baseline_{metric}")] if f"baseline_{metric}" in row else [])
        values = [row[key] for _, key in sides]
        errors = [TIE_STDERRS * row.get(f"{key}_stderr", 0.0) for _, key in sides]
        ax.bar([name for name, _ in sides], values, yerr=errors, capsize=4, color=["tab:blue", "tab:gray"][: len(sides)])
        invalid = f"\n{LOSSY_LABEL}" if task in lossy and metric in RATIO_METRICS else ""
        ax.set_title(f"{task}\n{metric} (±{TIE_STDERRS:g} stderr){invalid}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
