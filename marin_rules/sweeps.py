"""Sweeps: one template entry expanded over a grid or a list of cases.

Model: a sweep key is a `name@version` template with `{var}` placeholders; `grid:`
(var -> list of values, or `{range: [start, stop]}`) expands to every combination,
`cases:` to the listed ones. Each expansion substitutes the case into the key and
into every string of the entry; a string that is exactly `{var}` takes the value
with its type. Two expansions that would share one key are refused, naming the
variable the key leaves out.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Iterable, Iterator, Mapping

from marin_rules.artifacts.errors import ExperimentError
from marin_rules.validation import suggest_key

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SWEEP_ONLY_FIELDS = {"grid", "cases"}


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
