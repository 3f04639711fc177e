"""results.md does not overclaim: every metric with its standard error, and a
difference within two standard errors is a tie (model vs unigram baseline).

Pure Python: the figures are hand-made so each rule is checked at its boundary; the
end-to-end table of a real evaluation is checked in test_eval_step.py.
"""

from __future__ import annotations

import math
import random

import pytest

from marin_rules.eval.report import compare, fill_ratio_stderrs, headline_metrics, ratio_stderr, results_table


def rows_of(table: str) -> dict[str, list[str]]:
    return {
        cells[2]: cells[3:6]
        for cells in ([c.strip() for c in line.split("|")] for line in table.splitlines() if line.startswith("| t |"))
    }


def test_a_difference_within_two_stderr_is_a_tie_and_beyond_it_a_win():
    # the example: 0.31 vs 0.29 cloze accuracy on 200 items, stderr 0.033 each
    assert compare("acc", 0.31, 0.29, 0.033, 0.033) == "tie"
    se = 0.01
    edge = 2 * math.hypot(se, se)
    assert compare("acc", 0.5 + edge * 0.99, 0.5, se, se) == "tie"
    assert compare("acc", 0.5 + edge * 1.01, 0.5, se, se) == "model"
    assert compare("acc", 0.5 - edge * 1.01, 0.5, se, se) == "baseline"
    # lower is better for bits per byte and perplexities
    assert compare("bits_per_byte", 2.3, 3.1, 0.02, 0.02) == "model"
    assert compare("word_perplexity", 90.0, 40.0, 1.0, 1.0) == "baseline"


def test_results_table_shows_each_stderr_and_calls_close_scores_a_tie():
    summary = {"t": {
        "acc": 0.31, "acc_stderr": 0.033, "baseline_acc": 0.29, "baseline_acc_stderr": 0.032,
        "bits_per_byte": 2.41, "bits_per_byte_stderr": 0.03, "baseline_bits_per_byte": 3.15, "baseline_bits_per_byte_stderr": 0.02,
    }}  # fmt: skip
    table = results_table(summary, "evals/x@v1")
    assert "within 2 combined standard errors is a tie" in table
    rows = rows_of(table)
    assert rows["acc"] == ["0.3100 ± 0.0330", "0.2900 ± 0.0320", "tie"]
    assert rows["bits_per_byte"] == ["2.4100 ± 0.0300", "3.1500 ± 0.0200", "model"]
    assert set(rows) == {"acc", "bits_per_byte"}  # stderr entries are not rows of their own


def test_results_table_without_a_baseline_has_no_baseline_columns():
    table = results_table({"t": {"acc": 0.31, "acc_stderr": 0.033}}, "evals/x@v1")
    assert "| task | metric | model |\n|---|---|---:|\n| t | acc | 0.3100 ± 0.0330 |\n" in table
    assert "baseline" not in table and "tie" not in table


def test_ratio_stderr_matches_the_spread_of_the_ratio_over_resampled_corpora():
    rng = random.Random(0)
    docs = [(-rng.uniform(0.5, 1.5) * n, n) for n in (rng.randint(200, 4000) for _ in range(80))]  # (ll, bytes)
    se = ratio_stderr(docs, "bits_per_byte")
    bpb = lambda sample: -sum(ll for ll, _ in sample) / sum(n for _, n in sample) / math.log(2)  # noqa: E731
    boots = [bpb([docs[rng.randrange(len(docs))] for _ in docs]) for _ in range(2000)]
    mean = sum(boots) / len(boots)
    spread = math.sqrt(sum((b - mean) ** 2 for b in boots) / (len(boots) - 1))
    assert se == pytest.approx(spread, rel=0.1)  # the delta method against a 2,000-sample bootstrap
    ppl = ratio_stderr(docs, "word_perplexity")
    nats = -sum(ll for ll, _ in docs) / sum(n for _, n in docs)
    assert ppl == pytest.approx(math.exp(nats) * se * math.log(2))
    assert ratio_stderr(docs[:1], "bits_per_byte") is None


def test_ratio_stderrs_fill_lm_evals_missing_ones_and_reach_the_headline():
    samples = {"t": [{"bits_per_byte": (-100.0, 80), "filter": "none"}, {"bits_per_byte": (-300.0, 120), "filter": "none"}]}
    results = {"t": {"bits_per_byte,none": 2.0, "bits_per_byte_stderr,none": "N/A", "acc,none": 0.5, "acc_stderr,none": 0.1}}
    fill_ratio_stderrs(results, samples)
    expected = ratio_stderr([(-100.0, 80), (-300.0, 120)], "bits_per_byte")
    assert results["t"]["bits_per_byte_stderr,none"] == pytest.approx(expected)
    assert results["t"]["acc_stderr,none"] == 0.1  # lm-eval's own is kept
    row = headline_metrics({"results": results}, {"results": results})["t"]
    assert row["bits_per_byte_stderr"] == pytest.approx(expected) and row["baseline_acc_stderr"] == 0.1
