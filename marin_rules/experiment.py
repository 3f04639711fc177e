"""Experiment files: YAML -> a validated graph of artifacts.

Model: an experiment is one YAML file with `artifacts:` (entries keyed `name@version`)
and optionally `sweeps:` (templates expanded into many entries). Loading validates
everything before anything runs: keys, steps (a user step's module must be findable),
deps (missing ones, cycles, and an upstream of the wrong kind for a built-in step's
role), each built-in step's config, the canonical form of every recipe, and pinned
fingerprints.
Every error is one line that names the artifact and the field. The result is an
`Experiment`: artifacts in dependency order, each with its fingerprint.

Sweep form (a template key with `{var}` placeholders, expanded over a grid or a
list of cases; a string that is exactly `{var}` takes the value with its type):

    sweeps:
      checkpoints/moe-lr{lr}-e{experts}@v1:
        step: train
        deps: {data: tokenized/shakespeare@v1}
        config: {optimizer: {learning_rate: "{lr}"}, model: {n_experts: "{experts}"}}
        grid: {lr: [0.001, 0.003], experts: [4, 8]}      # or: cases: [{lr: .., experts: ..}]
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import yaml

from marin_rules.artifacts.canonical import canonical_value, fingerprint, fingerprint_payload
from marin_rules.artifacts.errors import ConfigError, ExperimentError, got
from marin_rules.artifacts.identity import ArtifactId, parse_key
from marin_rules.steps import (
    BUILTIN_STEPS, check_dep_kinds, check_step_config, check_upstream_configs, check_user_step, is_valid_step,
)

ENTRY_FIELDS = {"step", "deps", "config", "runtime", "expect_fingerprint", "description"}
SWEEP_FIELDS = ENTRY_FIELDS | {"grid", "cases"}
TOP_FIELDS = {"artifacts", "sweeps", "description"}
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


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


@dataclass(frozen=True)
class Experiment:
    path: str
    artifacts: Mapping[str, Artifact]  # key -> artifact, in dependency order
    by_path: Mapping[str, Artifact] = field(default_factory=dict)  # "name/version" -> artifact

    def __getitem__(self, key: str) -> Artifact:
        return self.artifacts[key]

    def keys_of_step(self, step: str) -> list[str]:
        return [k for k, a in self.artifacts.items() if a.step == step]

    def upstream_closure(self, keys: list[str]) -> list[str]:
        """The given keys and all their ancestors, in dependency order."""
        wanted: set[str] = set()
        stack = list(keys)
        while stack:
            key = stack.pop()
            if key not in wanted:
                wanted.add(key)
                stack.extend(self.artifacts[key].upstream_keys())
        return [k for k in self.artifacts if k in wanted]


def load_experiment(path: str) -> Experiment:
    """Read and validate an experiment file (raises MarinError subclasses)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ExperimentError(f"{path}: experiment file not found") from None
    except yaml.YAMLError as e:
        raise ExperimentError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    return build_experiment(data, path)


def build_experiment(data: Any, path: str = "<experiment>") -> Experiment:
    if not isinstance(data, Mapping):
        raise ExperimentError(f"{path}: expected a mapping with an 'artifacts:' section")
    unknown = sorted(set(data) - TOP_FIELDS)
    if unknown:
        raise ExperimentError(f"{path}: unknown top-level key {unknown[0]!r}; expected one of {sorted(TOP_FIELDS)}")
    raw: dict[str, Any] = {}
    for section in ("artifacts", "sweeps"):
        value = data.get(section) or {}
        if not isinstance(value, Mapping):
            raise ExperimentError(f"{path}: '{section}:' must be a mapping of 'name@version' to entries")
    for key, entry in (data.get("artifacts") or {}).items():
        raw[_checked_key(key, raw)] = entry
    for template, sweep in (data.get("sweeps") or {}).items():
        for key, entry in expand_sweep(template, sweep):
            raw[_checked_key(key, raw, template)] = entry
    if not raw:
        raise ExperimentError(f"{path}: no artifacts defined; add entries under 'artifacts:'")

    entries = {key: _validated_entry(key, entry) for key, entry in raw.items()}
    found: set[str] = set()  # user steps whose module was found (sweeps repeat one step)
    for key, (step, *_) in entries.items():
        if step not in BUILTIN_STEPS and step not in found:
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
                        f"{key}: deps.{role}: {upstream} is not defined in this experiment; "
                        "add an entry for it or fix the name@version"
                    )
    order = _dependency_order(entries)
    step_of = {key: entry[0] for key, entry in entries.items()}
    config_of = {key: entry[1] for key, entry in entries.items()}
    artifacts: dict[str, Artifact] = {}
    for key in order:
        step, config, deps, runtime, pin = entries[key]
        try:
            check_step_config(step, dict(config), dict(deps))
            check_dep_kinds(step, deps, step_of)
            check_upstream_configs(step, dict(config), deps, config_of)
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
    return Experiment(path, artifacts, {a.id.path: a for a in artifacts.values()})


def _checked_key(key: Any, seen: Mapping[str, Any], template: str | None = None) -> str:
    where = f"sweep {template}: " if template else ""
    try:
        parsed = parse_key(key)
    except ConfigError as e:
        raise ExperimentError(f"{where}{e.message}") from None
    if parsed.key in seen:
        raise ExperimentError(f"{where}{parsed.key} is defined twice; give each entry its own name@version")
    return parsed.key


def _validated_entry(key: str, entry: Any) -> tuple[str, dict, dict, dict, str | None]:
    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(f"{key}: {field}", message)

    if not isinstance(entry, Mapping):
        raise fail("step", "expected a mapping with at least 'step:'")
    unknown = sorted(set(entry) - ENTRY_FIELDS)
    if unknown:
        raise fail(unknown[0], f"unknown field; expected one of {sorted(ENTRY_FIELDS)}")
    step = entry.get("step")
    if not is_valid_step(step):
        raise fail(
            "step",
            f"expected a built-in step ({', '.join(BUILTIN_STEPS)}) "
            f"or 'pkg.module:function', got {step!r}",
        )
    config = entry.get("config") or {}
    runtime = entry.get("runtime") or {}
    deps_in = entry.get("deps") or {}
    for name, value in (("config", config), ("runtime", runtime), ("deps", deps_in)):
        if not isinstance(value, Mapping):
            raise fail(name, f"expected a mapping, got {type(value).__name__}")
    deps: dict[str, str | dict[str, float]] = {}
    for role, dep in deps_in.items():
        if not isinstance(role, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", role):
            raise fail(f"deps.{role}", "a role is an identifier such as 'data' or 'tokenizer'")
        if isinstance(dep, Mapping):
            mixture: dict[str, float] = {}
            for upstream, weight in dep.items():
                try:
                    upstream_key = parse_key(upstream).key
                except ConfigError as e:
                    raise fail(f"deps.{role}", e.message) from None
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
                    raise fail(f"deps.{role}.{upstream}", f"expected a weight >= 0, got {got(weight)}")
                mixture[upstream_key] = weight
            if not mixture or sum(mixture.values()) <= 0:
                raise fail(f"deps.{role}", "mixture weights must sum to a positive number")
            deps[role] = mixture
        else:
            try:
                deps[role] = parse_key(dep).key
            except ConfigError as e:
                raise fail(f"deps.{role}", e.message) from None
        if key in ([deps[role]] if isinstance(deps[role], str) else deps[role]):
            raise fail(f"deps.{role}", f"{key} depends on itself")
    pin = entry.get("expect_fingerprint")
    if pin is not None and not (isinstance(pin, str) and re.fullmatch(r"[0-9a-f]{16}", pin)):
        raise fail("expect_fingerprint", f"expected a 16-digit hex fingerprint, got {pin!r}")
    try:
        config = canonical_value(config, "config")
        runtime = canonical_value(runtime, "runtime")
    except ConfigError as e:
        raise fail(e.field, e.message) from None
    return step, config, deps, runtime, pin


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


def expand_sweep(template: Any, sweep: Any) -> Iterator[tuple[str, dict]]:
    """Expand one sweep template into (key, entry) pairs."""
    if not isinstance(template, str) or not isinstance(sweep, Mapping):
        raise ExperimentError(f"sweep {template!r}: expected 'template-key: {{step:, grid: or cases:}}'")
    unknown = sorted(set(sweep) - SWEEP_FIELDS)
    if unknown:
        raise ExperimentError(f"sweep {template}: {unknown[0]}: unknown field; expected one of {sorted(SWEEP_FIELDS)}")
    if ("grid" in sweep) == ("cases" in sweep):
        raise ExperimentError(f"sweep {template}: give exactly one of 'grid:' (var: [values]) or 'cases:' ([{{var: value}}])")
    if "grid" in sweep:
        grid = sweep["grid"]
        if not isinstance(grid, Mapping) or not grid:
            raise ExperimentError(f"sweep {template}: grid: expected a mapping of variable -> list of values")
        names = list(grid)
        columns = []
        for name in names:
            values = grid[name]
            if isinstance(values, Mapping) and set(values) == {"range"}:
                values = list(range(*values["range"]))
            if not isinstance(values, list) or not values:
                raise ExperimentError(f"sweep {template}: grid.{name}: expected a non-empty list (or {{range: [start, stop]}})")
            columns.append(values)
        cases = [dict(zip(names, combo)) for combo in itertools.product(*columns)]
    else:
        cases = sweep["cases"]
        if not isinstance(cases, list) or not cases or not all(isinstance(c, Mapping) for c in cases):
            raise ExperimentError(f"sweep {template}: cases: expected a non-empty list of mappings")
    used = set(PLACEHOLDER.findall(template))
    body = {k: v for k, v in sweep.items() if k not in ("grid", "cases")}
    form = "grid" if "grid" in sweep else "cases"
    first_case: dict[str, int] = {}  # expanded key -> index of the case that made it
    for i, case in enumerate(cases):
        missing = used - set(case)
        if missing:
            raise ExperimentError(f"sweep {template}: case {i}: no value for {{{sorted(missing)[0]}}}")
        key = _substitute(template, case, template)
        if key in first_case:
            raise ExperimentError(_collision(template, form, cases[first_case[key]], case, used, key))
        first_case[key] = i
        yield key, _substitute(body, case, template)


def _collision(template: str, form: str, a: Mapping[str, Any], b: Mapping[str, Any], used: set[str], key: str) -> str:
    """Why two expansions of one sweep got the same key: a variable the key leaves out
    (the usual case), or values that print alike."""
    differing = [v for v in list(a) + [v for v in b if v not in a] if v not in used and a.get(v) != b.get(v)]
    if differing:
        var = differing[0]
        kind = "grid variable" if form == "grid" else "cases variable"
        return (
            f"sweeps.{template}: {kind} {var!r} does not appear in the key, so its expansions would "
            f"share one name; add {{{var}}} to the name or version"
        )
    return (
        f"sweeps.{template}: two expansions both give {key} ({dict(a)} and {dict(b)}); "
        f"give each {'grid value' if form == 'grid' else 'case'} a distinct name"
    )


def _substitute(value: Any, case: Mapping[str, Any], template: str) -> Any:
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole and whole.group(1) in case:
            return case[whole.group(1)]

        def repl(m: re.Match) -> str:
            if m.group(1) not in case:
                raise ExperimentError(f"sweep {template}: placeholder {{{m.group(1)}}} has no value in grid/cases")
            return str(case[m.group(1)])

        return PLACEHOLDER.sub(repl, value)
    if isinstance(value, Mapping):
        return {_substitute(k, case, template): _substitute(v, case, template) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, case, template) for v in value]
    return value
