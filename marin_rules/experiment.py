"""Experiment files: YAML -> a validated graph of artifacts.

Model: an experiment is one YAML file with `artifacts:` (entries keyed `name@version`)
and optionally `sweeps:` (templates expanded into many entries, sweeps.py). Loading
validates everything before anything runs: the YAML itself (duplicate keys and
syntax errors at file:line:column, yaml_file.py), keys, steps (a user step's module
must be findable and define the function: read, not imported), deps (malformed or
missing ones with the nearest key suggested, cycles, roles a built-in step does not
take, upstreams of the wrong kind), each built-in step's config (the validation
layer), the canonical form of every recipe, and pinned fingerprints. Every error is
one line that names the file, or the artifact and the field. The result is an
`Experiment`: artifacts in dependency order, each with its fingerprint.

An entry may declare existing data instead of a step: `adopt: {source: <folder or
gs:// path>, kind: corpus|tokenizer|tokenized|train, copy: false}` (marin_rules/adopt.py);
it becomes the built-in step `adopt` and counts as the kind's step for consumers.
Dev versions (`name@dev`, `name@x-dev`) are mutable and stored per user: each gets
`ArtifactId.owner` = the path-safe `dev_user` (default: the login name); a fixed
version that depends on a dev version is refused (Marin's rule).

    sweeps:
      checkpoints/moe-lr{lr}-e{experts}@v1:
        step: train
        deps: {data: tokenized/shakespeare@v1}
        config: {optimizer: {learning_rate: "{lr}"}, model: {n_experts: "{experts}"}}
        grid: {lr: [0.001, 0.003], experts: [4, 8]}      # or: cases: [{lr: .., experts: ..}]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Iterator, Mapping

from marin_rules.artifacts.canonical import canonical_value, fingerprint, fingerprint_payload
from marin_rules.artifacts.drift import NO_DEFAULT
from marin_rules.artifacts.errors import ConfigError, ExperimentError, got
from marin_rules.artifacts.identity import SNAKEMAKE_REPEATS, ArtifactId, parse_key, periodic_suffix
from marin_rules.artifacts.shards import MAX_SHARDS
from marin_rules.data.checks import mixture_total
from marin_rules.dev_versions import default_dev_user, dev_user_in_path, owned_by, refuse_fixed_on_dev
from marin_rules.steps import (
    BUILTIN_STEPS, SHARDED_STEPS, check_dep_kinds, check_step_config, check_upstream_configs, check_user_step,
    import_function, is_valid_step,
)
from marin_rules.sweeps import expand_sweep
from marin_rules.validation import Int, Number, Rule, Text, bool_word_hint, check_fields, default_at, suggest_key
from marin_rules.yaml_file import load_yaml_file

__all__ = [
    "DEFAULT_EXPERIMENT", "Artifact", "Experiment", "build_experiment", "load_experiment", "suggest_key",
    "default_dev_user", "dev_user_in_path", "owned_by",
]  # fmt: skip

DEFAULT_EXPERIMENT = "experiments/default.yaml"  # relative to the workflow (repository) folder
ENTRY_FIELDS = {"step", "adopt", "deps", "config", "runtime", "expect_fingerprint", "description"}
TOP_FIELDS = {"artifacts", "sweeps", "description"}
EXTENSION_PREFIX = "x-"  # a top-level `x-...:` key is ignored: a place for YAML anchors (`x-model: &model {...}`)
ROLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ADOPT = "adopt"  # the built-in step of an entry's `adopt:` (marin_rules.adopt.STEP)
TPU_TYPE = r"[a-z][a-z0-9]*-[0-9]+"  # an accelerator type, as gcloud and the tpu executor take it
ZONE = r"[a-z]+-[a-z]+[0-9]+-[a-z]"  # a Google Cloud zone


class Distributed(Rule):
    """`runtime.distributed`: checked by the train step's own parser (no JAX import)."""

    what = "'auto' or {coordinator: 'host:port', num_processes: N, process_id: i}"

    def check(self, value: Any, field: str) -> Any:
        from marin_rules.train.distributed import parse_distributed

        try:
            parse_distributed(value)
        except ConfigError as e:  # its fields read `runtime.distributed...`
            raise ConfigError(field + e.field[len("runtime.distributed"):], e.message) from None
        return value

    def schema(self) -> dict[str, Any]:
        props = {"coordinator": {"type": "string"}, "num_processes": {"type": "integer", "minimum": 1},
                 "process_id": {"type": "integer", "minimum": 0}}  # fmt: skip
        mapping = {"type": "object", "properties": props, "additionalProperties": False}
        return {"anyOf": [{"enum": ["auto", False]}, mapping]}


# runtime keys only some built-in steps read (any other built-in would ignore them: refused)
RUNTIME_READERS = {
    "num_workers": ("tokenize", "dedup"),
    "batch_size": ("tokenize",),
    "peak_flops": ("train",),
    "distributed": ("train",),
}


@dataclass(frozen=True)
class Runtime:
    """An entry's `runtime:`: execution choices, recorded but never fingerprinted. Every
    key is checked at load: `tpu` and `zone` travel into job resources and from there
    into the executor's commands, so they must have the form gcloud takes."""

    shards: Annotated[int, Int(min=1, max=MAX_SHARDS), "tokenize and dedup: how many shard jobs build it (any executor), then one gathers"] = 1
    tpu: Annotated[str | None, Text("an accelerator type such as v5p-8, v5litepod-16 or v6e-8, or 'default' (the executor's --tpu-type)", f"default|{TPU_TYPE}"), "run on a TPU pod of this type (the tpu executor); train jobs default to 'default'"] = None
    zone: Annotated[str | None, Text("a zone such as us-east5-a or europe-west4-b", ZONE), "the TPU pod's zone (default: the executor's --tpu-zone)"] = None
    num_workers: Annotated[int | None, Int(min=1), "tokenize and dedup: worker processes (speed only)"] = None
    batch_size: Annotated[int | None, Int(min=1), "tokenize: documents per encode_batch call handed to a worker (speed only)"] = None
    accelerator: Annotated[str | None, Text("an accelerator such as h100-8 or v5p-8", r"[a-z][a-z0-9]*(-[0-9]+)?"), "what `marin plan` prices (instead of tpu), e.g. for GPUs"] = None
    peak_flops: Annotated[float | None, Number(gt=0), "train: peak FLOP/s of the devices, for the reported MFU"] = None
    distributed: Annotated[Any, Distributed(), "train: join several processes ('auto' on a TPU VM); set per run on a pod"] = None


def step_default(step: str, path: tuple[str, ...]) -> Any:
    """The default now of the config setting at `path` of the built-in step `step`
    (`validation.default_at`), else `drift.NO_DEFAULT` (user steps have none): how the
    drift diff tells a default written out from a changed recipe."""
    builtin = BUILTIN_STEPS.get(step)
    if builtin is None or not builtin.settings:
        return NO_DEFAULT
    found, value = default_at(import_function(builtin.settings), path)
    return value if found else NO_DEFAULT


@dataclass(frozen=True)
class Artifact:
    """One validated entry. `deps` maps role -> key, or role -> {key: weight}."""

    id: ArtifactId
    step: str
    config: Mapping[str, Any]
    deps: Mapping[str, str | Mapping[str, float]]
    runtime: Mapping[str, Any]
    fingerprint: str
    expect_fingerprint: str | None = None

    @property
    def key(self) -> str:
        return self.id.key

    def upstream_keys(self) -> list[str]:
        """Every upstream key, in role order (mixture members in their order)."""
        keys: list[str] = []
        for dep in self.deps.values():
            keys.extend([dep] if isinstance(dep, str) else list(dep))
        return keys

    def payload(self) -> dict[str, Any]:
        return fingerprint_payload(self.step, self.config, self.deps)

    @property
    def typed_numbers(self) -> bool:
        """Does this artifact's step read its settings by type (a built-in step: `0` and
        `0.0` are one number there; a user step's function sees how it was spelled)?"""
        builtin = BUILTIN_STEPS.get(self.step)
        return builtin is not None and bool(builtin.settings)

    def config_default(self, path: tuple[str, ...]) -> Any:
        """The default now of the config setting at `path` of this artifact's step (`step_default`)."""
        return step_default(self.step, path)


    def progress_setting(self, path: tuple[str, ...]) -> bool:
        """Does the config setting at `path` only decide when this artifact's built-in step
        writes its progress (`BuiltinStep.progress`: train's `log_every`, ...)?"""
        builtin = BUILTIN_STEPS.get(self.step)
        return builtin is not None and len(path) == 1 and path[0] in builtin.progress


@dataclass(frozen=True)
class Experiment:
    path: str
    artifacts: Mapping[str, Artifact]  # key -> artifact, in dependency order
    by_path: Mapping[str, Artifact] = field(default_factory=dict)  # "name/version" -> artifact

    def __getitem__(self, key: str) -> Artifact:
        return self.artifacts[key]


def load_experiment(path: str, dev_user: str | None = None, check_steps: bool = True) -> Experiment:
    """Read and validate an experiment file (raises MarinError subclasses). Duplicate
    keys and YAML errors are refused with file:line:column. `dev_user` owns the dev
    versions (default: this login name), made path-safe. `check_steps=False` does not
    look for user steps' modules (for readers that run no step: `marin`)."""
    return build_experiment(load_yaml_file(path), path, dev_user, check_steps)


def build_experiment(
    data: Any, path: str = "<experiment>", dev_user: str | None = None, check_steps: bool = True
) -> Experiment:
    if not isinstance(data, Mapping):
        raise ExperimentError(f"{path}: expected a mapping with an 'artifacts:' section")
    unknown = sorted((k for k in set(data) - TOP_FIELDS if not str(k).startswith(EXTENSION_PREFIX)), key=str)
    if unknown:
        raise ExperimentError(
            f"{path}: unknown top-level key {unknown[0]!r}{suggest_key(unknown[0], TOP_FIELDS)}"
            f"{bool_word_hint(unknown[0])}; "
            f"expected one of {', '.join(sorted(TOP_FIELDS))} (or x-NAME, for YAML anchors)"
        )
    if not isinstance(data.get("description", ""), str):
        description = data["description"]
        raise ExperimentError(f"{path}: description: expected text, got {description!r}{bool_word_hint(description)}")
    raw: dict[str, Any] = {}
    for section in ("artifacts", "sweeps"):
        value = data.get(section) or {}
        if not isinstance(value, Mapping):
            raise ExperimentError(f"{path}: '{section}:' must be a mapping of 'name@version' to entries")
    for key, entry in (data.get("artifacts") or {}).items():
        raw[_checked_key(key, raw, f"{path}: artifacts: ")] = entry
    for template, sweep in (data.get("sweeps") or {}).items():
        for key, entry in expand_sweep(template, sweep, ENTRY_FIELDS):
            raw[_checked_key(key, raw, f"sweep {template}: ")] = entry
    if not raw:
        raise ExperimentError(f"{path}: no artifacts defined; add entries under 'artifacts:'")

    _refuse_nested_folders(raw, path)
    entries = {key: _validated_entry(key, entry, raw) for key, entry in raw.items()}
    found: set[str] = set()  # user steps whose module was found (sweeps repeat one step)
    for key, (step, *_) in entries.items():
        if check_steps and step not in BUILTIN_STEPS and step not in found:
            try:
                check_user_step(step)
            except ConfigError as e:
                raise ConfigError(f"{key}: {e.field}", e.message) from None
            found.add(step)
    for key, (_, _, deps, _, _) in entries.items():
        for role, dep in deps.items():
            for upstream in [dep] if isinstance(dep, str) else dep:
                if upstream not in entries:
                    raise ExperimentError(
                        f"{key}: deps.{role}: {upstream} is not defined in this experiment"
                        f"{suggest_key(upstream, entries)}; add an entry for it or fix the name@version"
                    )
    order = _dependency_order(entries)
    refuse_fixed_on_dev({key: entry[2] for key, entry in entries.items()})
    step_of = {key: _kind_step(entry[0], entry[1]) for key, entry in entries.items()}
    recipes = {key: entry[:3] for key, entry in entries.items()}  # key -> (step, config, deps)
    artifacts: dict[str, Artifact] = {}
    for key in order:
        step, config, deps, runtime, pin = entries[key]
        try:
            check_step_config(step, dict(config), dict(deps))
            check_dep_kinds(step, deps, step_of)
            check_upstream_configs(step, dict(config), deps, recipes)
            fp = fingerprint(step, config, deps)
        except ConfigError as e:
            raise ConfigError(f"{key}: {e.field}", e.message) from None
        if pin is not None and pin != fp:
            raise ConfigError(
                f"{key}: expect_fingerprint",
                f"pinned {pin} but the recipe fingerprints to {fp}; restore the recipe, "
                "or bump the version and update expect_fingerprint",
            )
        artifacts[key] = Artifact(parse_key(key), step, config, deps, runtime, fp, pin)
    experiment = owned_by(Experiment(path, artifacts), dev_user or default_dev_user())
    _refuse_periodic_paths(experiment)
    return experiment


def _refuse_periodic_paths(experiment: Experiment) -> None:
    """Snakemake refuses a job whose wildcard value ends in one piece repeated 20 or
    more times (`PeriodicWildcardError`: it takes that for an endless recursion). An
    artifact's wildcard value is its folder `name/version` (`name/version-user` for a
    dev version), so such a key is refused here, where every tool reads it."""
    for key, artifact in experiment.artifacts.items():
        piece = periodic_suffix(artifact.id.path)
        if piece is not None:
            in_version = SNAKEMAKE_REPEATS * len(piece) <= len(artifact.id.path) - len(artifact.id.name) - 1
            raise ConfigError(
                f"{key}: {'version' if in_version else 'name'}",
                f"{artifact.id.path!r} ends in {piece!r} repeated {SNAKEMAKE_REPEATS} or more times, a wildcard "
                "value Snakemake refuses (it takes it for an endless recursion); change the name or version",
            )


def _refuse_nested_folders(keys: Mapping[str, Any], path: str) -> None:
    """Refuse an artifact whose folder would lie inside another's (`raw/a@v1` is stored
    at raw/a/v1, so `raw/a/v1@v2` at raw/a/v1/v2 would be moved away with it when it
    is forced, and read as its data)."""
    folders = {parse_key(key).path: key for key in keys}
    for folder, key in folders.items():
        parts = folder.split("/")
        for depth in range(1, len(parts)):
            outer = folders.get("/".join(parts[:depth]))
            if outer is not None:
                raise ExperimentError(
                    f"{path}: {key} would be stored inside {outer}'s folder ({folder}/ in {'/'.join(parts[:depth])}/); "
                    "rename one of them"
                )


def _kind_step(step: str, config: Mapping[str, Any]) -> str:
    """The step kind consumers see: adopted data counts as its kind's step."""
    if step == ADOPT:
        from marin_rules.adopt import KINDS

        kind = KINDS.get(config.get("kind"))
        return kind.step if kind else step
    return step


def _checked_key(key: Any, seen: Mapping[str, Any], where: str) -> str:
    try:
        parsed = parse_key(key)
    except ConfigError as e:
        raise ExperimentError(f"{where}{e.message}{bool_word_hint(key)}") from None
    if parsed.key in seen:
        raise ExperimentError(f"{where}{parsed.key} is defined twice; give each entry its own name@version")
    return parsed.key


def _validated_entry(key: str, entry: Any, keys: Mapping[str, Any]) -> tuple[str, dict, dict, dict, str | None]:
    """One entry's fields checked; `keys` (every key of the experiment) for suggestions."""

    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(f"{key}: {field}", message)

    if not isinstance(entry, Mapping):
        raise fail("step", "expected a mapping with at least 'step:'")
    unknown = sorted(set(entry) - ENTRY_FIELDS, key=str)
    if unknown:
        raise fail(
            unknown[0],
            f"unknown field{suggest_key(unknown[0], ENTRY_FIELDS)}{bool_word_hint(unknown[0])}; "
            f"expected one of {', '.join(sorted(ENTRY_FIELDS))}",
        )
    step = entry.get("step")
    if "adopt" in entry:
        if "step" in entry or "config" in entry or "deps" in entry:
            extra = next(f for f in ("step", "config", "deps") if f in entry)
            raise fail(extra, "an entry with 'adopt:' declares existing data: it takes no step, config or deps")
        if not isinstance(entry["adopt"], Mapping):
            raise fail("adopt", f"expected a mapping such as {{source: /data/x, kind: tokenized}}, got {got(entry['adopt'])}")
        step = ADOPT
        entry = {**entry, "config": dict(entry["adopt"])}
    elif step == ADOPT:
        raise fail("step", "write existing data as 'adopt: {source: ..., kind: ...}' instead of 'step: adopt'")
    if not is_valid_step(step):
        raise fail(
            "step",
            f"expected a built-in step ({', '.join(s for s in BUILTIN_STEPS if s != ADOPT)}), 'adopt:' "
            f"or 'pkg.module:function', got {step!r}{suggest_key(step, BUILTIN_STEPS) if isinstance(step, str) else ''}"
            f"{bool_word_hint(step)}",
        )
    if not isinstance(entry.get("description", ""), str):
        raise fail("description", f"expected text, got {entry['description']!r}{bool_word_hint(entry['description'])}")
    for name in ("config", "runtime", "deps"):  # null or left out: {}; [], "" or false: refused like [1]
        if entry.get(name) is not None and not isinstance(entry[name], Mapping):
            raise fail(name, f"expected a mapping, got {type(entry[name]).__name__}")
    config, runtime, deps_in = (entry.get(name) or {} for name in ("config", "runtime", "deps"))
    deps: dict[str, str | dict[str, float]] = {}
    for role, dep in deps_in.items():
        if not isinstance(role, str) or not ROLE.fullmatch(role):
            raise fail(f"deps.{role}", f"a role is an identifier such as 'data' or 'tokenizer'{bool_word_hint(role)}")
        if isinstance(dep, Mapping):
            mixture: dict[str, float] = {}
            for upstream, weight in dep.items():
                upstream_key = _dep_key(upstream, keys, fail, f"deps.{role}")
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
                    raise fail(f"deps.{role}.{upstream}", f"expected a weight >= 0, got {got(weight)}")
                mixture[upstream_key] = weight
            try:
                total = mixture_total(mixture.values(), f"deps.{role}")
            except ConfigError as e:
                raise fail(e.field, e.message) from None
            if not mixture or total <= 0:
                raise fail(f"deps.{role}", "mixture weights must sum to a positive number")
            deps[role] = mixture
        else:
            deps[role] = _dep_key(dep, keys, fail, f"deps.{role}")
        if key in ([deps[role]] if isinstance(deps[role], str) else deps[role]):
            raise fail(f"deps.{role}", f"{key} depends on itself")
    pin = entry.get("expect_fingerprint")
    if pin is not None and not (isinstance(pin, str) and re.fullmatch(r"[0-9a-f]{16}", pin)):
        number = isinstance(pin, (int, float)) and not isinstance(pin, bool)
        hint = " (YAML read those digits as a number: quote them, expect_fingerprint: '<16 digits>')" if number else ""
        raise fail("expect_fingerprint", f"expected a 16-digit hex fingerprint, got {pin!r}{hint}")
    try:
        _refuse_boolean_keys(config, "config")
        _refuse_boolean_keys(runtime, "runtime")
        config = canonical_value(config, "config")
        runtime = canonical_value(runtime, "runtime")
    except ConfigError as e:
        raise fail(e.field, e.message) from None
    if "shards" in runtime and step not in SHARDED_STEPS:
        raise fail("runtime.shards", f"only {' and '.join(SHARDED_STEPS)} run in shards; remove it from this {step} step")
    for name, readers in RUNTIME_READERS.items():
        if name in runtime and step in BUILTIN_STEPS and step not in readers:
            own = f" ({step}'s {name} is config.{name})" if (step, name) == ("evaluate", "batch_size") else ""
            raise fail(f"runtime.{name}", f"read only by {' and '.join(readers)}, so it would do nothing in this "
                       f"{step} step{own}; remove it")  # fmt: skip
    try:
        check_fields(Runtime, runtime, "runtime")
    except ConfigError as e:
        raise fail(e.field, e.message) from None
    return step, config, deps, runtime, pin


def _refuse_boolean_keys(value: Any, path: str) -> None:
    """Refuse a key YAML read as a boolean (`on:`, `no:`) saying so; canonical_value
    refuses it too, as any key that is not a string, without saying why it is not one."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, bool):
                raise ConfigError(path, f"mapping key {key!r} is not a string{bool_word_hint(key)}")
            _refuse_boolean_keys(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _refuse_boolean_keys(item, f"{path}[{i}]")


def _dep_key(text: Any, keys: Mapping[str, Any], fail: Callable[[str, str], ConfigError], where: str) -> str:
    """A dep reference as a key; a malformed one (no `@`, a typo) suggests the
    experiment's nearest key."""
    try:
        return parse_key(text).key
    except ConfigError as e:
        close = suggest_key(text, keys) if isinstance(text, str) else ""
        if close:
            raise fail(where, f"expected 'name@version', got {text!r}{close}") from None
        raise fail(where, e.message + bool_word_hint(text)) from None


def _dependency_order(entries: Mapping[str, tuple]) -> list[str]:
    """Topological order (stable: file order among independent entries); refuses cycles."""
    state: dict[str, int] = {}  # 1 visiting, 2 done
    order: list[str] = []

    def upstreams(key: str) -> list[str]:
        deps = entries[key][2]
        return [u for d in deps.values() for u in ([d] if isinstance(d, str) else d)]

    for root in entries:
        if state.get(root):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(upstreams(root)))]
        state[root] = 1
        path = [root]
        while stack:
            key, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[key] = 2
                order.append(key)
            elif state.get(child) == 1:
                cycle = path[path.index(child) :] + [child]
                raise ExperimentError(f"{cycle[0]}: deps form a cycle: {' -> '.join(cycle)}")
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(upstreams(child))))
    return order
