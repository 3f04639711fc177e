"""Sweeps: one template entry expanded over a grid or a list of cases.

Model: a sweep key is a `name@version` template with `{var}` placeholders; `grid:`
(var -> list of values, or `{range: [start, stop]}`: the integers start .. stop - 1)
expands to every combination, `cases:` to the listed ones; one sweep makes at most
`MAX_SWEEP_ARTIFACTS` (10,000) artifacts, checked before any is expanded. Each expansion substitutes the case into the key and
into every string of the entry; a string that is exactly `{var}` takes the value
with its type. Two expansions that would share one key are refused, naming the
variable the key leaves out; so is a case that makes two keys of one mapping equal
(`{a}` and `{b}` both `s`), which would keep only one of them.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

from marin_rules.artifacts.errors import ExperimentError
from marin_rules.validation import suggest_key

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SWEEP_ONLY_FIELDS = {"grid", "cases"}
MAX_SWEEP_ARTIFACTS = 10_000  # per sweep: beyond it, loading and planning take minutes


def expand_sweep(template: Any, sweep: Any, entry_fields: Iterable[str]) -> Iterator[tuple[str, dict]]:
    """Expand one sweep template into (key, entry) pairs; `entry_fields`: what an entry may hold."""
    fields = set(entry_fields) | SWEEP_ONLY_FIELDS
    if not isinstance(template, str) or not isinstance(sweep, Mapping):
        raise ExperimentError(f"sweep {template!r}: expected 'template-key: {{step:, grid: or cases:}}'")
    unknown = sorted(set(sweep) - fields, key=str)
    if unknown:
        raise ExperimentError(
            f"sweep {template}: {unknown[0]}: unknown field{suggest_key(unknown[0], fields)}; "
            f"expected one of {', '.join(sorted(fields))}"
        )
    if ("grid" in sweep) == ("cases" in sweep):
        raise ExperimentError(f"sweep {template}: give exactly one of 'grid:' (var: [values]) or 'cases:' ([{{var: value}}])")
    if "grid" in sweep:
        grid = sweep["grid"]
        if not isinstance(grid, Mapping) or not grid:
            raise ExperimentError(f"sweep {template}: grid: expected a mapping of variable -> list of values")
        names = list(grid)
        columns: list[Sequence[Any]] = []
        for name in names:
            values = grid[name]
            if isinstance(values, Mapping) and set(values) == {"range"}:
                values = _range(template, name, values["range"])
            if not isinstance(values, (list, range)) or not values:
                raise ExperimentError(f"sweep {template}: grid.{name}: expected a non-empty list (or {{range: [start, stop]}})")
            columns.append(values)
        count = math.prod(len(c) for c in columns)
        if count > MAX_SWEEP_ARTIFACTS:
            sizes = " x ".join(f"{len(c)} {n}" for n, c in zip(names, columns))
            raise ExperimentError(
                f"sweep {template}: grid: expands to {count} artifacts ({sizes}); a sweep makes at most "
                f"{MAX_SWEEP_ARTIFACTS}: narrow the grid or split it into several sweeps"
            )
        cases = [dict(zip(names, combo)) for combo in itertools.product(*columns)]
    else:
        cases = sweep["cases"]
        if not isinstance(cases, list) or not cases or not all(isinstance(c, Mapping) for c in cases):
            raise ExperimentError(f"sweep {template}: cases: expected a non-empty list of mappings")
        if len(cases) > MAX_SWEEP_ARTIFACTS:
            raise ExperimentError(
                f"sweep {template}: cases: lists {len(cases)} cases; a sweep makes at most {MAX_SWEEP_ARTIFACTS} "
                "artifacts: split it into several sweeps"
            )
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
        yield key, _substitute(body, case, template, f"sweep {template}: {key}: ")


def _range(template: str, name: str, bounds: Any) -> range:
    """`{range: [start, stop]}`: the integers start, start + 1, ..., stop - 1."""
    where = f"sweep {template}: grid.{name}.range"
    ints = isinstance(bounds, list) and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
    if not (ints and len(bounds) == 2):
        raise ExperimentError(
            f"{where}: expected two integers [start, stop] (giving start .. stop - 1), got {bounds!r}; "
            f"list any other values instead, e.g. {name}: [0.5, 1, 2]"
        )
    start, stop = bounds
    if start >= stop:
        raise ExperimentError(f"{where}: start {start} must be below stop {stop} (the values are start .. stop - 1)")
    if stop - start > MAX_SWEEP_ARTIFACTS:
        raise ExperimentError(
            f"{where}: [{start}, {stop}] gives {stop - start} values; a sweep makes at most {MAX_SWEEP_ARTIFACTS} "
            "artifacts: narrow the range or split it into several sweeps"
        )
    return range(start, stop)


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


def _substitute(value: Any, case: Mapping[str, Any], template: str, where: str = "", field: str = "") -> Any:
    """`value` with the case's values in place of its placeholders; `where` + `field`
    (the expansion and the dotted field) name a mapping whose keys the case makes equal."""
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
        out: dict[Any, Any] = {}
        written: dict[Any, Any] = {}  # substituted key -> the key as written
        for k, v in value.items():
            new = _substitute(k, case, template)
            if not isinstance(new, Hashable):  # a key that is exactly `{var}`, given a list or mapping
                raise ExperimentError(f"{where}{field or 'entry'}: key {k!r} becomes {new!r}, which cannot be a key")
            if new in written:
                raise ExperimentError(
                    f"{where}{field or 'entry'}: keys {written[new]!r} and {k!r} both become {new!r} "
                    "(a mapping keeps one of them); give the case values that keep them apart"
                )
            written[new] = k
            out[new] = _substitute(v, case, template, where, f"{field}.{new}" if field else str(new))
        return out
    if isinstance(value, list):
        return [_substitute(v, case, template, where, f"{field}[{i}]") for i, v in enumerate(value)]
    return value
