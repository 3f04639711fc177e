"""The `evaluate` step: lm-eval on a trained model and on a unigram baseline beside it.

Model: `evaluate(ctx)` loads `deps.model` (a `train` artifact) with `load_trained`,
builds the local tasks from `deps.data`'s held-out plays (tasks.py) into
`{output}/tasks/`, and runs `lm_eval.simple_evaluate` once per task (each task has its
own `num_fewshot` and `limit`) for the model and, unless `baseline: none`, for the
unigram baseline (baseline.py), counted from `deps.data`'s training split with the
model's tokenizer. Only local tasks: lm-eval's task index holds just our folder
(`include_defaults=False`) and the Hugging Face libraries are switched offline for
the call; a standard task (hellaswag, ...) brings in lm-eval's bundled index and
needs the hub.

Output (`ctx.output`, local or gs://):
  results.json           lm-eval's results for the model (results, configs, n-shot, ...)
  baseline_results.json  the same for the unigram baseline
  results.md             one table: task, metric, model and baseline with standard
                         errors, which is better (a tie within two stderr; report.py)
  results.png            bar chart of each task's headline metric, model vs baseline
  tasks/                 the task YAMLs + JSONL
No file holds an absolute path of the building machine: the task YAMLs name their
JSONL relative to their folder, and paths under the output in results.json are
written relative to the artifact (`tasks/<task>.jsonl`), so the artifact can move.
The record's `result` maps task -> {metric: model value, metric_stderr,
baseline_<metric>, baseline_<metric>_stderr}; a task scored with
`loglikelihood_rolling` (bits per byte) also gets `lossless`: whether the model's
tokenizer gave back every text scored (decode(encode(text)) == text; `lm.py`), and
where it did not, `lossless_example`, the rows "not meaningful" in results.md and
one stderr line: bits per byte divides by bytes its tokens do not describe.
results.json keeps the check per task under `lossless`. `file_digests` gives the
content digest of each file of OUTPUT_FILES, which `marin verify` and the report's
gather check (a same-size edit of results.md is found too).

Scoring runs a dropless MoE dispatch whatever the model trained with
(model_scorer.py), so a request's score never depends on the rest of its batch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Iterator

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import FILE_DIGESTS, named_digests
from marin_rules.eval.config import EvaluateConfig, TaskSpec, parse_evaluate
from marin_rules.eval.report import fill_ratio_stderrs, headline_metrics, lossy_note, plot_results, results_table

RESULT_SECTIONS = ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples")
OUTPUT_FILES = ("results.json", "baseline_results.json", "results.md", "results.png")
BOOTSTRAP_ITERS = 100  # lm-eval bootstraps only a few metrics (perplexity, f1, ...); acc has a closed form


def evaluate(ctx: StepContext) -> dict[str, Any]:
    config = parse_evaluate(ctx.config, ctx.deps)
    from marin_rules.eval.baseline import UnigramLM, training_texts, unigram_counts
    from marin_rules.eval.lm import MarinLM
    from marin_rules.eval.tasks import build_local_tasks, read_heldout
    from marin_rules.train.load import load_trained

    started = time.time()
    trained = load_trained(ctx.deps["model"])  # first: a damaged model is refused before anything is written
    with _local_workdir(ctx.output) as work:
        task_folder = None
        counts: dict[str, int] = {}
        if config.local_tasks:
            built = build_local_tasks(
                read_heldout(ctx.deps["data"]),
                os.path.join(work, "tasks"),
                names=config.local_tasks,
                seed=config.seed,
                cloze=config.cloze,
                bpb=config.bpb,
            )
            task_folder, counts = built.folder, built.counts
            check_shots(config.tasks, counts)
        model_lm = MarinLM.from_trained(trained, batch_size=config.batch_size)
        _log(f"evaluate: model on {', '.join(t.name for t in config.tasks)}")
        model_results = run_tasks(model_lm, config, task_folder)
        storage.write_json_atomic(os.path.join(work, "results.json"), relative_paths(model_results, work))
        checks = model_results["lossless"]
        lossy = {task: check["lossless_example"] for task, check in checks.items() if not check["lossless"]}
        if lossy:
            _log(f"{ctx.key}: {lossy_note(list(lossy), next(iter(lossy.values())))}")
        baseline_results = None
        if config.baseline == "unigram":
            _log("evaluate: unigram baseline (counting the training split)")
            unigram = UnigramLM.from_counts(
                unigram_counts(training_texts(ctx.deps["data"]), model_lm.tokenizer, model_lm.special),
                model_lm.tokenizer,
                model_lm.special,
                batch_size=config.batch_size,
            )
            baseline_results = run_tasks(unigram, config, task_folder)
            storage.write_json_atomic(os.path.join(work, "baseline_results.json"), relative_paths(baseline_results, work))
        summary = headline_metrics(model_results, baseline_results)
        with open(os.path.join(work, "results.md"), "w", encoding="utf-8") as f:
            f.write(results_table(summary, ctx.key, lossy))
        plot_results(summary, os.path.join(work, "results.png"), lossy)
    for task, check in checks.items():
        summary.setdefault(task, {}).update({k: v for k, v in check.items() if k != "lossless_checked"})
    return {
        **summary,
        "documents": counts,
        "max_length": model_lm.max_length,
        "seconds": round(time.time() - started, 1),
        FILE_DIGESTS: named_digests(ctx.output, OUTPUT_FILES),  # by content too: `marin verify`, the report
    }


def check_shots(tasks: tuple[TaskSpec, ...], counts: dict[str, int]) -> None:
    """Each local task's few-shot examples are other documents of the task (lm-eval
    draws them from its test split, leaving the question out): at most documents - 1."""
    for spec in tasks:
        n = counts.get(spec.name)
        if n is not None and spec.num_fewshot > n - 1:
            raise _too_many_shots(spec, f"{spec.name} has {n} document(s) from deps.data's held-out plays and draws "
                                  f"its examples from the others: use at most {n - 1}, or hold out more plays")  # fmt: skip


def _too_many_shots(spec: TaskSpec, why: str) -> StepError:
    return StepError(f"{spec.shots_field}: {spec.num_fewshot} few-shot examples before each question, but {why}")


def run_tasks(lm: Any, config: EvaluateConfig, task_folder: str | None) -> dict[str, Any]:
    """lm-eval once per task (own few-shot count and limit), merged into one results
    dict shaped like lm-eval's own, plus `tasks` and `lossless` (task -> the round trip
    of the texts a rolling task scored). Local tasks are read from `task_folder` (with
    their data paths resolved now); ratio metrics get standard errors (report.py)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from marin_rules.eval.tasks import task_configs

    manager = TaskManager(include_path=task_folder, include_defaults=not config.only_local)
    merged: dict[str, Any] = {section: {} for section in RESULT_SECTIONS}
    merged["lossless"] = {}
    for spec in config.tasks:
        task = task_configs(task_folder, [spec.name])[0] if spec.is_local and task_folder else spec.name
        lm.round_trip = None  # set by loglikelihood_rolling: did the tokenizer give the texts back?
        with _hf_offline(config.only_local), _named_shots(spec):
            out = simple_evaluate(
                model=lm,
                tasks=[task],
                num_fewshot=spec.num_fewshot,
                limit=spec.limit,
                task_manager=manager,
                log_samples=True,  # per-document values: the ratio metrics' stderr
                bootstrap_iters=BOOTSTRAP_ITERS,
                random_seed=config.seed,
                numpy_random_seed=config.seed,
                torch_random_seed=config.seed,
                fewshot_random_seed=config.seed,
            )
        out = out or {}
        fill_ratio_stderrs(out.get("results", {}), out.get("samples", {}))
        for section in RESULT_SECTIONS:
            merged[section].update(out.get(section, {}))
        if lm.round_trip is not None:
            merged["lossless"][spec.name] = lm.round_trip.result()
    merged["tasks"] = [_spec_dict(s) for s in config.tasks]
    return _jsonable(merged)


@contextlib.contextmanager
def _named_shots(spec: TaskSpec) -> Iterator[None]:
    """An lm-eval task whose few-shot split is smaller than num_fewshot (+ 1 when it is
    the test split) fails in `random.sample`: said as the field that asked for them."""
    try:
        yield
    except ValueError as e:
        if "Sample larger than population" not in str(e):
            raise
        raise _too_many_shots(spec, f"{spec.name}'s few-shot split holds fewer documents: lower num_fewshot for "
                              "this task") from None  # fmt: skip


def relative_paths(value: Any, root: str) -> Any:
    """`value` (JSON-like) with every string naming a path under the local folder
    `root` rewritten relative to it (the artifact's own files, e.g. a task's data)."""
    if isinstance(value, dict):
        return {k: relative_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [relative_paths(v, root) for v in value]
    if isinstance(value, str) and value.startswith(root.rstrip(os.sep) + os.sep):
        return os.path.relpath(value, root)
    return value


@contextlib.contextmanager
def _local_workdir(output: str) -> Iterator[str]:
    """A local folder to write into: the output itself, or a temporary folder
    copied to a remote output at the end."""
    if not storage.is_remote(output):
        path = storage.local_path(output)
        os.makedirs(path, exist_ok=True)
        yield os.path.abspath(path)
        return
    tmp = tempfile.mkdtemp(prefix="marin-eval-")
    try:
        yield tmp
        for folder, _, files in os.walk(tmp):
            for name in files:
                local = os.path.join(folder, name)
                with open(local, "rb") as f:
                    storage.write_bytes_atomic(storage.join(output, os.path.relpath(local, tmp)), f.read())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _hf_offline(offline: bool) -> Iterator[None]:
    """HF_DATASETS_OFFLINE / HF_HUB_OFFLINE for the duration of one lm-eval call,
    also in the libraries' already-imported constants; restored afterwards."""
    if not offline:
        yield
        return
    names = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    saved_env = {n: os.environ.get(n) for n in names}
    patched = []
    for module_name, attr in (("datasets.config", "HF_HUB_OFFLINE"), ("huggingface_hub.constants", "HF_HUB_OFFLINE")):
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attr):
            patched.append((module, attr, getattr(module, attr)))
            setattr(module, attr, True)
    os.environ.update({n: "1" for n in names})
    try:
        yield
    finally:
        for module, attr, value in patched:
            setattr(module, attr, value)
        for n, value in saved_env.items():
            if value is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = value


def _spec_dict(spec: TaskSpec) -> dict[str, Any]:
    return {"name": spec.name, "num_fewshot": spec.num_fewshot, "limit": spec.limit}


def _jsonable(value: Any) -> Any:
    """lm-eval's results hold a few non-JSON values (functions in configs, numpy
    numbers, NaN stderr); make them plain JSON."""
    import math

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):  # numpy scalars
        return _jsonable(value.item())
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
