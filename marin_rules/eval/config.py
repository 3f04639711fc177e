"""The `evaluate` step's options and their checker; no JAX, no lm-eval, no tokenizers.

Model: an evaluation scores one trained model (`deps.model`, a `train` artifact) on a
list of lm-eval tasks, and a unigram baseline beside it. Two tasks are local, built at
evaluate time from the held-out plays of `deps.data` (a `download` artifact):
`marin_shakespeare_bpb` (bits per byte over passages) and `marin_shakespeare_cloze`
(the true next line among distractor lines of the same play). Any other name is a
standard lm-eval task (hellaswag, arc_easy, ...), run through lm-eval's bundled
registry; those need the Hugging Face hub for their data.

```yaml
evaluations/nano-moe@v1:
  step: evaluate
  deps: {model: checkpoints/nano-moe@v1, data: raw/shakespeare@v1}
  config:
    tasks: [marin_shakespeare_bpb, {name: marin_shakespeare_cloze, limit: 200}]
    limit: null          # examples per task (all); a task entry may override it
    num_fewshot: 0       # a task entry may override it
    batch_size: 64       # scored continuations per jitted call (their shared contexts run once)
    seed: 0              # cloze distractors, passages order, lm-eval's seeds
    baseline: unigram    # or none
```

`parse_evaluate` is the one reader of this config, used both by the checker (at
experiment load) and by the step, so the two never disagree. The settings as written
are `EvaluateSettings` (validation-layer rules, also its JSON Schema); a task entry's
unset `limit`/`num_fewshot` take the config's own.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.validation import MAX_SEED, Int, OneOf, Optional, Rule, check_fields, json_schema, parse

BPB_TASK = "marin_shakespeare_bpb"
CLOZE_TASK = "marin_shakespeare_cloze"
LOCAL_TASKS = (BPB_TASK, CLOZE_TASK)
ROLLING_TASKS = (BPB_TASK,)  # scored as whole passages: few-shot makes no sense
BASELINES = ("unigram", "none")

REQUIRED_DEPS = {
    "model": "a `train` artifact (checkpoints/...@v) whose model is evaluated",
    "data": "a `download` artifact (raw/...@v) whose heldout/ plays build the local tasks",
}

DEFAULT_TASKS = LOCAL_TASKS
DEFAULT_BATCH_SIZE = 64  # 64 against 32: 1.1x the requests/s on the cloze benchmark (eval_throughput.py)
TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

Limit = Annotated[int | None, Optional(Int(min=1))]
Shots = Annotated[int, Int(min=0)]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    num_fewshot: int  # examples shown before each question
    limit: int | None  # examples scored; None = all
    shots_field: str = field(default="config.num_fewshot", compare=False)  # where num_fewshot was set

    @property
    def is_local(self) -> bool:
        return self.name in LOCAL_TASKS


class TaskName(Rule):
    """A local task or one lm-eval bundles (read from its task files, no import)."""

    def check(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not TASK_NAME.fullmatch(value):
            raise ConfigError(field, f"expected a task name such as {BPB_TASK!r}, got {value!r}")
        if value not in LOCAL_TASKS and not is_standard_task(value):
            from marin_rules.validation.rules import suggest_key

            raise ConfigError(
                field,
                f"unknown task {value!r}{suggest_key(value, [*LOCAL_TASKS, *sorted(_standard_task_names())])}: "
                f"not one of the local tasks ({', '.join(LOCAL_TASKS)}) and not a task, group or tag among "
                "lm-eval's bundled task files",
            )
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": TASK_NAME.pattern, "examples": list(LOCAL_TASKS) + ["hellaswag", "arc_easy"]}


@dataclass(frozen=True)
class TaskEntry:
    """One `tasks:` item written as a mapping; unset fields take the config's own."""

    name: Annotated[str, TaskName(), "a local task or a task, group or tag of lm-eval's bundled registry"]
    num_fewshot: Annotated[int | None, Optional(Int(min=0)), "examples shown before each question"] = None
    limit: Annotated[Limit, "examples scored (null: all)"] = None


class Tasks(Rule):
    """`tasks:`: a task name, or a non-empty list of names and `{name, num_fewshot, limit}`."""

    def check(self, value: Any, field: str) -> tuple[TaskEntry, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise ConfigError(field, f"expected a non-empty list of task names or {{name, ...}}, got {value!r}")
        entries: list[TaskEntry] = []
        for i, entry in enumerate(value):
            where = f"{field}[{i}]"
            if isinstance(entry, str):
                entry = {"name": entry}
            if not isinstance(entry, Mapping):
                raise ConfigError(where, f"expected a task name or {{name, num_fewshot, limit}}, got {entry!r}")
            parsed = parse(TaskEntry, entry, where)
            if any(e.name == parsed.name for e in entries):
                raise ConfigError(f"{where}.name", f"task {parsed.name!r} is listed twice")
            entries.append(parsed)
        return tuple(entries)

    def schema(self) -> dict[str, Any]:
        item = {"anyOf": [TaskName().schema(), json_schema(TaskEntry)]}
        return {"anyOf": [TaskName().schema(), {"type": "array", "minItems": 1, "items": item}]}


class Baseline(Rule):
    """`baseline:` unigram or none (null and false mean none)."""

    def check(self, value: Any, field: str) -> str:
        return "none" if value is None or value is False else OneOf(BASELINES).check(value, field)

    def schema(self) -> dict[str, Any]:
        return {"enum": [*BASELINES, None, False]}


@dataclass(frozen=True)
class ClozeOptions:
    context_lines: Annotated[int, Int(min=1), "preceding lines shown as the question"] = 4
    distractors: Annotated[int, Int(min=1), "wrong lines from the same play beside the true one"] = 3
    min_chars: Annotated[int, Int(min=0), "target and distractor lines shorter than this are skipped"] = 20


@dataclass(frozen=True)
class BpbOptions:
    passage_chars: Annotated[int, Int(min=100), "plays are cut at blank lines into passages about this long"] = 4000


@dataclass(frozen=True)
class EvaluateSettings:
    """`config:` of an `evaluate` artifact as written."""

    tasks: Annotated[tuple[TaskEntry, ...], Tasks(), "lm-eval tasks; the two local ones by default"] = ()
    limit: Annotated[Limit, "examples per task (null: all); a task entry may override it"] = None
    num_fewshot: Annotated[Shots, "a task entry may override it"] = 0
    batch_size: Annotated[int, Int(min=1), "scored continuations per jitted call"] = DEFAULT_BATCH_SIZE
    seed: Annotated[int, Int(min=0, max=MAX_SEED), "cloze distractors, passage order, lm-eval's seeds"] = 0
    baseline: Annotated[str, Baseline(), "unigram baseline scored beside the model, or none"] = "unigram"
    cloze: Annotated[ClozeOptions, "the local cloze task: which lines are asked and offered"] = ClozeOptions()
    bpb: Annotated[BpbOptions, "the local bits-per-byte task"] = BpbOptions()


@dataclass(frozen=True)
class EvaluateConfig:
    tasks: tuple[TaskSpec, ...]
    batch_size: int
    seed: int
    baseline: str  # 'unigram' or 'none'
    cloze: ClozeOptions
    bpb: BpbOptions

    @property
    def local_tasks(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks if t.is_local)

    @property
    def only_local(self) -> bool:
        return all(t.is_local for t in self.tasks)


def check_evaluate(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """The experiment-load checker: raises `ConfigError` naming the field."""
    parse_evaluate(config, deps)


def check_evaluate_upstream(config: Mapping[str, Any], upstream: Mapping[str, Any]) -> None:
    """At load: a `download` data artifact must hold documents out when local tasks are
    scored (`_check_holds_out`), and the held-out documents scored must be held out of the model's training.
    The model's training corpora are the `download` artifacts up its data chain (a
    tokenizer's corpus is not training data). Scoring one of them scores its own
    held-out split; another download of the same source must not hold out a document
    that a training corpus trains on (unless that corpus caps its training documents
    with `sample_count`, which may leave it out: not decidable here)."""
    from marin_rules.data.checks import DEFAULT_SOURCE

    data, model = upstream.get("data"), upstream.get("model")
    if data is None or data.step != "download":
        return
    _check_holds_out(config, upstream, data)
    if model is None:
        return
    corpora, seen, todo = {}, set(), list(model.upstreams("data"))
    while todo:
        entry = todo.pop()
        if entry.key in seen:
            continue
        seen.add(entry.key)
        if entry.step == "download":
            corpora[entry.key] = entry
        else:
            todo += [u for role in entry.deps if role != "tokenizer" for u in entry.upstreams(role)]

    def source(entry: Any) -> str:
        return str(entry.get("source", DEFAULT_SOURCE))

    for corpus in corpora.values():
        if corpus.key == data.key or not same_documents(source(corpus), source(data)) or corpus.get("sample_count") is not None:
            continue
        trained_on = [key for key in data.get("heldout", ()) if key not in corpus.get("heldout", ())]
        if trained_on:
            raise ConfigError(
                "deps.data",
                f"{data.key} holds out {', '.join(trained_on)}, which {model.key} trained on (its corpus "
                f"{corpus.key} holds out only {', '.join(corpus.get('heldout', ())) or 'nothing'}): the scores would "
                f"not be held-out scores; evaluate on {corpus.key} (its held-out split), or hold "
                f"{', '.join(trained_on)} out of {corpus.key} too",
            )


def same_documents(a: str, b: str) -> bool:
    """May two download sources give the same documents? A local folder however spelled
    (relative, `..`, a symbolic link, a trailing slash) is itself, and holds every file a
    glob in it selects; two different globs in one folder are taken as apart (a train/test
    split by file name). Other sources (gs://, hf://, package:) compare as written."""

    def place(text: str) -> tuple[str, str]:
        if "://" in text or ":" in text.split("/", 1)[0]:
            return text.rstrip("/"), ""
        parts = text.rstrip("/").split("/")
        cut = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
        folder = "/".join(parts[:cut]) or ("/" if text.startswith("/") else ".")
        return os.path.realpath(folder), "/".join(parts[cut:])

    (folder_a, glob_a), (folder_b, glob_b) = place(a), place(b)
    return folder_a == folder_b and (glob_a == glob_b or not glob_a or not glob_b)


def _check_holds_out(config: Mapping[str, Any], upstream: Mapping[str, Any], data: Any) -> None:
    """The local tasks are built from the held-out plays of `data` (a `download` entry):
    one that holds out nothing is refused at load, not after training. (Adopted data is
    left to the step: its held-out split is known only from its files.)"""
    if data.get("heldout"):
        return
    local = parse_evaluate(config, {role: entry.key for role, entry in upstream.items()}).local_tasks
    if local:
        raise ConfigError(
            "deps.data",
            f"{data.key} holds out no documents (its config has no heldout:), and the local tasks "
            f"({', '.join(local)}) score held-out plays; give {data.key} a config.heldout list of plays (under a new "
            "version once it is built), evaluate on a download that has them, or list only lm-eval tasks in "
            "config.tasks",
        )


def parse_evaluate(config: Mapping[str, Any] | None, deps: Mapping[str, Any] | None) -> EvaluateConfig:
    _check_deps({} if deps is None else deps)
    given = check_fields(EvaluateSettings, {} if config is None else config, "config")
    s = EvaluateSettings(**given)
    entries = s.tasks or tuple(TaskEntry(name) for name in DEFAULT_TASKS)
    tasks = []
    for i, e in enumerate(entries):
        own = e.num_fewshot is not None
        spec = TaskSpec(e.name, e.num_fewshot if own else s.num_fewshot, e.limit or s.limit,
                        f"config.tasks[{i}].num_fewshot" if own else "config.num_fewshot")  # fmt: skip
        if spec.name in ROLLING_TASKS and spec.num_fewshot:
            rolling = f"{spec.name} scores whole passages (loglikelihood_rolling); expected 0, got {spec.num_fewshot}"
            if own:
                raise ConfigError(spec.shots_field, rolling)
            raise ConfigError(  # the value came from the config's own num_fewshot
                "config.num_fewshot",
                f"{rolling} (every task without its own num_fewshot takes this one: list {spec.name} as "
                f"{{name: {spec.name}, num_fewshot: 0}} in tasks, or set num_fewshot per task)",
            )
        tasks.append(spec)
    return EvaluateConfig(tuple(tasks), s.batch_size, s.seed, s.baseline, s.cloze, s.bpb)


def _check_deps(deps: Mapping[str, Any]) -> None:
    if not isinstance(deps, Mapping):
        raise ConfigError("deps", f"expected a mapping of role -> name@version, got {type(deps).__name__}")
    for role, what in REQUIRED_DEPS.items():
        if role not in deps:
            raise ConfigError(f"deps.{role}", f"missing; evaluate needs `{role}`: {what}")
        if not isinstance(deps[role], str):
            raise ConfigError(f"deps.{role}", f"expected one name@version, got {deps[role]!r}")
    unknown = sorted(str(r) for r in deps if r not in REQUIRED_DEPS)
    if unknown:
        raise ConfigError(f"deps.{unknown[0]}", f"unknown role; evaluate takes: {', '.join(sorted(REQUIRED_DEPS))}")


def is_standard_task(name: str) -> bool:
    """Whether lm-eval's bundled task YAMLs declare `name` as a task, group or tag.
    Reads the YAML files as text (about 0.6 s once) instead of importing lm-eval and
    building its full index (several seconds)."""
    return name in _standard_task_names()


@functools.lru_cache(maxsize=1)
def _standard_task_names() -> frozenset[str]:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or spec.origin is None:
        return frozenset()
    root = os.path.join(os.path.dirname(spec.origin), "tasks")
    single = re.compile(r"^(?:task|group|tag):\s*['\"]?([A-Za-z0-9_.\-]+)", re.M)
    listed = re.compile(r"^tag:\s*\n((?:\s+-\s*\S+\s*\n)+)", re.M)
    names: set[str] = set()
    for folder, _, files in os.walk(root):
        for file in files:
            if not file.endswith(".yaml"):
                continue
            with open(os.path.join(folder, file), encoding="utf-8", errors="replace") as f:
                text = f.read()
            names.update(single.findall(text))
            for block in listed.findall(text):
                names.update(item.strip().lstrip("-").strip().strip("'\"") for item in block.splitlines())
    return frozenset(n for n in names if n)
