"""The `evaluate` step end to end, its config checker, and the lm-eval command line.

Artifacts as in test_eval_lm.py (real download and tokenizer steps, a tiny model in
the training checkpoint layout), shared through the session's temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import fsspec
import pytest
import xxhash

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError
from marin_rules.eval.config import BPB_TASK, CLOZE_TASK, check_evaluate, parse_evaluate
from marin_rules.eval.report import results_table
from test_eval_lm import tiny_artifacts

DEPS = {"model": "checkpoints/m@v1", "data": "raw/shakespeare@v1"}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, str]:
    return tiny_artifacts(str(tmp_path_factory.getbasetemp() / "eval-artifacts"))


@pytest.fixture(scope="module")
def lossy_artifacts(tmp_path_factory) -> dict[str, str]:
    """As `artifacts`, with a WordPiece tokenizer ([UNK], whitespace dropped) given as `pretrained`."""
    from test_data_tokenizer import TEXTS, wordpiece_tokenizer_json

    base = tmp_path_factory.getbasetemp() / "eval-artifacts-wordpiece"
    base.mkdir(exist_ok=True)
    (base / "wordpiece.json").write_text(wordpiece_tokenizer_json([(TEXTS / "comedy_of_errors_gut.txt").read_text()]))
    return tiny_artifacts(str(base), {"pretrained": str(base / "wordpiece.json")})


@pytest.mark.parametrize(
    "config, deps, field",
    [
        ({"batch_size": 0}, DEPS, "config.batch_size"),
        ({"limit": "all"}, DEPS, "config.limit"),
        ({"baseline": "bigram"}, DEPS, "config.baseline"),
        ({"tasks": []}, DEPS, "config.tasks"),
        ({"tasks": ["no_such_task_anywhere"]}, DEPS, "config.tasks[0].name"),
        ({"tasks": [BPB_TASK, {"name": CLOZE_TASK, "limit": -3}]}, DEPS, "config.tasks[1].limit"),
        ({"tasks": [{"name": BPB_TASK, "num_fewshot": 2}]}, DEPS, "config.tasks[0].num_fewshot"),
        ({"tasks": [{"name": CLOZE_TASK, "shots": 2}]}, DEPS, "config.tasks[0].shots"),
        ({"cloze": {"distractors": 0}}, DEPS, "config.cloze.distractors"),
        ({"learning_rate": 1}, DEPS, "config.learning_rate"),
        ({}, {"model": "checkpoints/m@v1"}, "deps.data"),
        ({}, {"data": "raw/s@v1"}, "deps.model"),
        ({}, {**DEPS, "corpus": "raw/s@v1"}, "deps.corpus"),
    ],
)
def test_check_evaluate_errors_name_the_field(config, deps, field):
    with pytest.raises(ConfigError) as error:
        check_evaluate(config, deps)
    assert error.value.field == field
    assert str(error.value).startswith(f"{field}: ")


def test_check_evaluate_accepts_local_and_standard_tasks_with_their_own_settings():
    parsed = parse_evaluate(
        {"tasks": [BPB_TASK, {"name": CLOZE_TASK, "num_fewshot": 2, "limit": 50}, "hellaswag", "arc_easy"], "limit": 10},
        DEPS,
    )
    assert [(t.name, t.num_fewshot, t.limit) for t in parsed.tasks] == [
        (BPB_TASK, 0, 10), (CLOZE_TASK, 2, 50), ("hellaswag", 0, 10), ("arc_easy", 0, 10),
    ]  # fmt: skip
    assert parsed.baseline == "unigram" and not parsed.only_local
    assert parse_evaluate({}, DEPS).local_tasks == (BPB_TASK, CLOZE_TASK)


def test_checker_imports_neither_jax_nor_lm_eval():
    code = (
        "import sys; from marin_rules.eval.config import check_evaluate;"
        f"check_evaluate({{'tasks': ['{BPB_TASK}', 'hellaswag']}}, {DEPS!r});"
        "heavy = [m for m in ('jax', 'flax', 'lm_eval', 'tokenizers', 'orbax') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_evaluate_writes_results_table_and_headline_metrics(artifacts, tmp_path):
    out = str(tmp_path / "eval")
    config = {"tasks": [BPB_TASK, {"name": CLOZE_TASK, "limit": 8}], "limit": 3, "batch_size": 4}
    offline_before = os.environ.get("HF_DATASETS_OFFLINE")
    from marin_rules.eval.step import evaluate

    result = evaluate(StepContext("evaluations/t", "v1", config, {"model": artifacts["model"], "data": artifacts["raw"]}, output=out))
    assert os.environ.get("HF_DATASETS_OFFLINE") == offline_before  # set only during lm-eval's call
    bpb, cloze = result[BPB_TASK], result[CLOZE_TASK]
    assert 0 < bpb["bits_per_byte"] < 16 and 0 < bpb["baseline_bits_per_byte"] < 16
    assert 0 <= cloze["acc"] <= 1 and 0 <= cloze["baseline_acc"] <= 1
    json.dumps(result, allow_nan=False)
    model_results = json.loads(open(os.path.join(out, "results.json")).read())
    assert model_results["n-samples"][CLOZE_TASK]["effective"] == 8
    assert model_results["n-samples"][BPB_TASK]["effective"] == 3
    assert model_results["results"][BPB_TASK]["bits_per_byte,none"] == pytest.approx(bpb["bits_per_byte"])
    baseline = json.loads(open(os.path.join(out, "baseline_results.json")).read())
    assert baseline["results"][CLOZE_TASK]["acc,none"] == pytest.approx(cloze["baseline_acc"])
    # every headline metric has a standard error: lm-eval's for acc, ours for the ratios
    assert cloze["acc_stderr"] == pytest.approx(model_results["results"][CLOZE_TASK]["acc_stderr,none"])
    assert 0 < bpb["bits_per_byte_stderr"] < 1 and 0 < bpb["baseline_bits_per_byte_stderr"] < 1
    table = open(os.path.join(out, "results.md")).read()
    assert f"| marin_shakespeare_bpb | bits_per_byte | {bpb['bits_per_byte']:.4f} ± {bpb['bits_per_byte_stderr']:.4f} |" in table
    assert "unigram baseline" in table
    assert os.path.getsize(os.path.join(out, "results.png")) > 1000
    # each output file by content, for `marin verify` and the report (xxh3 of its bytes)
    assert result["file_digests"] == {name: "xxh3:" + xxhash.xxh3_64_hexdigest(open(os.path.join(out, name), "rb").read())
                                      for name in ("results.json", "baseline_results.json", "results.md", "results.png")}
    assert bpb["lossless"] is True and "lossless" not in cloze and "not meaningful" not in table  # byte-level BPE


@pytest.mark.parametrize("where, field", [("task", "config.tasks[0].num_fewshot"), ("config", "config.num_fewshot")])
def test_more_few_shot_examples_than_the_task_has_other_documents_name_the_field_before_scoring(artifacts, tmp_path, where, field):
    from marin_rules.artifacts.errors import StepError
    from marin_rules.eval.step import evaluate

    task = {"name": CLOZE_TASK, "num_fewshot": 5000} if where == "task" else CLOZE_TASK
    config = {"tasks": [task], "limit": 2, **({"num_fewshot": 5000} if where == "config" else {})}
    with pytest.raises(StepError) as e:
        evaluate(StepContext("evaluations/t", "v1", config, {"model": artifacts["model"], "data": artifacts["raw"]},
                             output=str(tmp_path / "eval")))  # fmt: skip
    count = json.load(open(tmp_path / "eval" / "tasks" / "manifest.json"))["counts"][CLOZE_TASK]
    assert str(e.value) == (
        f"{field}: 5000 few-shot examples before each question, but {CLOZE_TASK} has {count} document(s) from "
        f"deps.data's held-out plays and draws its examples from the others: use at most {count - 1}, or hold out more plays"
    )
    assert not (tmp_path / "eval" / "results.json").exists()


def test_an_lm_eval_task_with_a_few_shot_split_too_small_names_the_field():
    """lm-eval draws few-shot examples with random.sample: its error on this Python, said
    as the field (a registry task's split size is known only once lm-eval loads it)."""
    import random

    from marin_rules.artifacts.errors import StepError
    from marin_rules.eval.config import TaskSpec
    from marin_rules.eval.step import _named_shots

    with pytest.raises(StepError, match=r"^config.tasks\[1\].num_fewshot: 30 few-shot examples before each question, "
                                        r"but arc_easy's few-shot split holds fewer documents"):  # fmt: skip
        with _named_shots(TaskSpec("arc_easy", 30, None, "config.tasks[1].num_fewshot")):
            random.Random(0).sample(range(5), 31)
    with pytest.raises(ValueError, match="other"):  # any other error passes through
        with _named_shots(TaskSpec("arc_easy", 30, None)):
            raise ValueError("other")


def test_bits_per_byte_of_a_lossy_tokenizer_says_it_is_not_meaningful(lossy_artifacts, tmp_path, capsys):
    from marin_rules.eval.step import evaluate

    out = tmp_path / "eval"
    config = {"tasks": [BPB_TASK, {"name": CLOZE_TASK, "limit": 2}], "limit": 3, "batch_size": 4}
    deps = {"model": lossy_artifacts["model"], "data": lossy_artifacts["raw"]}
    result = evaluate(StepContext("evaluations/wp", "v1", config, deps, output=str(out)))
    bpb = result[BPB_TASK]
    assert bpb["lossless"] is False and bpb["lossless_example"].startswith("text ")
    assert "lossless" not in result[CLOZE_TASK]  # no bytes counted: accuracy stands
    table = (out / "results.md").read_text()
    assert f"| {BPB_TASK} | bits_per_byte (not meaningful: lossy tokenizer) | {bpb['bits_per_byte']:.4f} ± " in table
    assert f"| {CLOZE_TASK} | acc | " in table
    assert f"Not meaningful: {BPB_TASK}: the model's tokenizer does not encode the scored texts losslessly (text " in table
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("evaluations/wp@v1: ")]
    assert line.startswith(f"evaluations/wp@v1: {BPB_TASK}: the model's tokenizer does not encode the scored texts losslessly")
    assert "use a byte-level tokenizer for bits per byte" in line
    assert json.loads((out / "results.json").read_text())["lossless"][BPB_TASK]["lossless"] is False


def test_evaluate_artifact_holds_no_absolute_path_and_reads_back_after_a_move(artifacts, tmp_path):
    from marin_rules.eval.step import evaluate
    from marin_rules.eval.tasks import task_configs

    out = str(tmp_path / "built-here" / "eval")
    config = {"tasks": [BPB_TASK, CLOZE_TASK], "limit": 2, "batch_size": 4}
    evaluate(StepContext("evaluations/r", "v1", config, {"model": artifacts["model"], "data": artifacts["raw"]}, output=out))
    written = [os.path.join(folder, name) for folder, _, names in os.walk(out) for name in names]
    assert {os.path.join(out, "results.json"), os.path.join(out, "tasks", f"{BPB_TASK}.yaml")} <= set(written)
    for path in written:
        if path.endswith((".json", ".yaml", ".md")):
            text = open(path, encoding="utf-8").read()
            assert str(tmp_path) not in text, f"{os.path.relpath(path, out)} names the building machine's folder"
    results = json.loads(open(os.path.join(out, "results.json")).read())
    data_files = results["configs"][BPB_TASK]["dataset_kwargs"]["data_files"]
    assert data_files == {"test": os.path.join("tasks", f"{BPB_TASK}.jsonl")}  # relative to the artifact
    moved = str(tmp_path / "moved" / "eval")
    os.renames(out, moved)
    (bpb_task,) = task_configs(os.path.join(moved, "tasks"), [BPB_TASK])
    assert bpb_task["dataset_kwargs"]["data_files"] == {"test": os.path.join(moved, "tasks", f"{BPB_TASK}.jsonl")}
    assert os.path.exists(bpb_task["dataset_kwargs"]["data_files"]["test"])


def test_evaluate_reads_and_writes_gcs(artifacts, gcs_prefix):
    fs = fsspec.filesystem("gs")
    remote = {role: f"{gcs_prefix}/{role}" for role in ("model", "raw")}
    for role, location in remote.items():
        fs.put(artifacts[role], location, recursive=True)
    from marin_rules.eval.step import evaluate

    out = f"{gcs_prefix}/eval"
    config = {"tasks": [BPB_TASK], "limit": 2, "batch_size": 4, "baseline": "none"}
    result = evaluate(StepContext("evaluations/g", "v1", config, {"model": remote["model"], "data": remote["raw"]}, output=out))
    assert "baseline_bits_per_byte" not in result[BPB_TASK]
    written = storage.read_json(f"{out}/results.json")
    assert written["results"][BPB_TASK]["bits_per_byte,none"] == pytest.approx(result[BPB_TASK]["bits_per_byte"])
    assert storage.exists(f"{out}/results.md") and storage.exists(f"{out}/tasks/{BPB_TASK}.yaml")


def test_lm_eval_command_line_runs_the_marin_model(artifacts, tmp_path, monkeypatch, capsys):
    """`python -m marin_rules.eval.cli ARGS` is `lm_eval ARGS` with `marin` registered.
    The task folder comes from `python -m marin_rules.eval.tasks`; the CLI itself runs
    in-process (lm-eval's CLI always indexes its ~14k bundled tasks: no need to also
    pay a second JAX start-up)."""
    tasks = tmp_path / "tasks"
    subprocess.run(
        [sys.executable, "-m", "marin_rules.eval.tasks", artifacts["raw"], str(tasks)], check=True, timeout=120
    )
    out = tmp_path / "out"
    from marin_rules.eval import cli

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", [
        "marin_rules.eval.cli", "--model", "marin", "--model_args", f"checkpoint={artifacts['model']},batch_size=4",
        "--tasks", BPB_TASK, "--include_path", str(tasks), "--limit", "2", "--output_path", str(out),
    ])  # fmt: skip
    cli.main()
    (written,) = list(out.rglob("results_*.json"))
    results = json.loads(written.read_text())["results"][BPB_TASK]
    assert 0 < results["bits_per_byte,none"] < 16
    # a bad model_args value is one line and exit status 2, not a traceback
    monkeypatch.setattr(sys, "argv", [
        "marin_rules.eval.cli", "--model", "marin", "--model_args", f"checkpoint={artifacts['model']},max_length=100000",
        "--tasks", BPB_TASK, "--include_path", str(tasks), "--limit", "2",
    ])  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "marin-lm-eval: max_length: 100000 is longer than the model's max_seq_len"
    )


def test_results_table_says_which_side_is_better_and_calls_equal_scores_a_tie():
    table = results_table({"t": {"bits_per_byte": 2.5, "baseline_bits_per_byte": 3.1, "acc": 0.29, "baseline_acc": 0.29,
                                 "acc_norm": 0.2, "baseline_acc_norm": 0.3}}, "evals/x@v1")  # fmt: skip
    rows = {line.split("|")[2].strip(): line.split("|")[5].strip() for line in table.splitlines() if line.startswith("| t ")}
    assert rows == {"bits_per_byte": "model", "acc": "tie", "acc_norm": "baseline"}  # no stderr: only equal ties
