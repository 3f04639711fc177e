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
    batch_size: 32       # scored continuations per jitted call (their shared contexts run once)
    seed: 0              # cloze distractors, passages order, lm-eval's seeds
    baseline: unigram    # or none
```

`parse_evaluate` is the one reader of this config, used both by the checker (at
experiment load) and by the step, so the two never disagree.
"""

from __future__ import annotations

import functools
import os
import re
import importlib.util
from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError

BPB_TASK = "marin_shakespeare_bpb"
CLOZE_TASK = "marin_shakespeare_cloze"
LOCAL_TASKS = (BPB_TASK, CLOZE_TASK)
ROLLING_TASKS = (BPB_TASK,)  # scored as whole passages: few-shot makes no sense
BASELINES = ("unigram", "none")

KEYS = {"tasks", "limit", "num_fewshot", "batch_size", "seed", "baseline", "cloze", "bpb"}
TASK_KEYS = {"name", "num_fewshot", "limit"}
CLOZE_KEYS = {"context_lines", "distractors", "min_chars"}
BPB_KEYS = {"passage_chars"}
REQUIRED_DEPS = {
    "model": "a `train` artifact (checkpoints/...@v) whose model is evaluated",
    "data": "a `download` artifact (raw/...@v) whose heldout/ plays build the local tasks",
}
OPTIONAL_DEPS: dict[str, str] = {}

DEFAULT_TASKS = LOCAL_TASKS
DEFAULT_BATCH_SIZE = 32
TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    num_fewshot: int  # examples shown before each question
    limit: int | None  # examples scored; None = all

    @property
    def is_local(self) -> bool:
        return self.name in LOCAL_TASKS


@dataclass(frozen=True)
class ClozeOptions:
    context_lines: int = 4  # preceding lines shown as the question
    distractors: int = 3  # wrong lines from the same play beside the true one
    min_chars: int = 20  # target and distractor lines shorter than this are skipped


@dataclass(frozen=True)
class BpbOptions:
    passage_chars: int = 4000  # plays are cut at blank lines into passages about this long


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


def parse_evaluate(config: Mapping[str, Any] | None, deps: Mapping[str, Any] | None) -> EvaluateConfig:
    config = {} if config is None else config
    deps = {} if deps is None else deps
    if not isinstance(config, Mapping):
        raise ConfigError("config", f"expected a mapping, got {type(config).__name__}")
    _check_deps(deps)
    _reject_unknown(config, KEYS, "config")
    limit = _optional_count(config.get("limit"), "config.limit")
    num_fewshot = _count(config.get("num_fewshot", 0), "config.num_fewshot", low=0)
    batch_size = _count(config.get("batch_size", DEFAULT_BATCH_SIZE), "config.batch_size", low=1)
    seed = _count(config.get("seed", 0), "config.seed", low=0)
    baseline = config.get("baseline", "unigram")
    if baseline is None or baseline is False:
        baseline = "none"
    if baseline not in BASELINES:
        raise ConfigError("config.baseline", f"expected one of {', '.join(BASELINES)}, got {baseline!r}")
    tasks = _parse_tasks(config.get("tasks", list(DEFAULT_TASKS)), limit, num_fewshot)
    cloze = _parse_options(config.get("cloze", {}), ClozeOptions, CLOZE_KEYS, "config.cloze")
    if cloze.context_lines < 1:
        raise ConfigError("config.cloze.context_lines", f"expected an integer >= 1, got {cloze.context_lines}")
    if cloze.distractors < 1:
        raise ConfigError("config.cloze.distractors", f"expected an integer >= 1, got {cloze.distractors}")
    bpb = _parse_options(config.get("bpb", {}), BpbOptions, BPB_KEYS, "config.bpb")
    if bpb.passage_chars < 100:
        raise ConfigError("config.bpb.passage_chars", f"expected an integer >= 100, got {bpb.passage_chars}")
    return EvaluateConfig(tasks, batch_size, seed, baseline, cloze, bpb)


def _check_deps(deps: Mapping[str, Any]) -> None:
    if not isinstance(deps, Mapping):
        raise ConfigError("deps", f"expected a mapping of role -> name@version, got {type(deps).__name__}")
    for role, what in REQUIRED_DEPS.items():
        if role not in deps:
            raise ConfigError(f"deps.{role}", f"missing; evaluate needs `{role}`: {what}")
        if not isinstance(deps[role], str):
            raise ConfigError(f"deps.{role}", f"expected one name@version, got {deps[role]!r}")
    unknown = sorted(str(r) for r in deps if r not in REQUIRED_DEPS and r not in OPTIONAL_DEPS)
    if unknown:
        known = ", ".join(sorted({**REQUIRED_DEPS, **OPTIONAL_DEPS}))
        raise ConfigError(f"deps.{unknown[0]}", f"unknown role; evaluate takes: {known}")


def _parse_tasks(value: Any, limit: int | None, num_fewshot: int) -> tuple[TaskSpec, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError("config.tasks", f"expected a non-empty list of task names or {{name, ...}}, got {value!r}")
    specs: list[TaskSpec] = []
    for i, entry in enumerate(value):
        field = f"config.tasks[{i}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, Mapping):
            raise ConfigError(field, f"expected a task name or {{name, num_fewshot, limit}}, got {entry!r}")
        _reject_unknown(entry, TASK_KEYS, field)
        name = entry.get("name")
        if not isinstance(name, str) or not TASK_NAME.match(name):
            raise ConfigError(f"{field}.name", f"expected a task name such as {BPB_TASK!r}, got {name!r}")
        spec = TaskSpec(
            name,
            _count(entry.get("num_fewshot", num_fewshot), f"{field}.num_fewshot", low=0),
            _optional_count(entry.get("limit", limit), f"{field}.limit"),
        )
        if spec.name in ROLLING_TASKS and spec.num_fewshot:
            raise ConfigError(
                f"{field}.num_fewshot",
                f"{spec.name} scores whole passages (loglikelihood_rolling); expected 0, got {spec.num_fewshot}",
            )
        if not spec.is_local and not is_standard_task(spec.name):
            raise ConfigError(
                f"{field}.name",
                f"unknown task {name!r}: not one of the local tasks ({', '.join(LOCAL_TASKS)}) "
                "and not a task, group or tag among lm-eval's bundled task files",
            )
        if any(s.name == spec.name for s in specs):
            raise ConfigError(f"{field}.name", f"task {name!r} is listed twice")
        specs.append(spec)
    return tuple(specs)


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


def _parse_options(value: Any, cls: type, keys: set[str], field: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(field, f"expected a mapping, got {value!r}")
    _reject_unknown(value, keys, field)
    return cls(**{k: _count(v, f"{field}.{k}", low=0) for k, v in value.items()})


def _reject_unknown(mapping: Mapping[str, Any], known: set[str], field: str) -> None:
    unknown = sorted(str(k) for k in mapping if k not in known)
    if unknown:
        raise ConfigError(f"{field}.{unknown[0]}", f"unknown setting; known: {', '.join(sorted(known))}")


def _count(value: Any, field: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(field, f"expected an integer >= {low}, got {value!r}")
    return value


def _optional_count(value: Any, field: str) -> int | None:
    return None if value is None else _count(value, field, low=1)
