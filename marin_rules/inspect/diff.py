"""Two builds side by side: what recipe fields differ, and how their results moved.

Model: `A` and `B` are success records (any two artifacts, usually two versions of
one name), or, for an artifact of the experiment not built yet, its recipe there
(`recipe_record`: no results). The recipe part is the drift warning's field diff (`recipe_diff` of the
two fingerprint payloads, lines `field: a -> b`, `field (added: b)`, `field (removed: a)`, the
last two with `; its default now: d` where the step has one: what the side without it uses today).
The result part flattens both `result` mappings to dotted keys (`final_val_loss`,
`marin_shakespeare_cloze.acc`; a train run's checkpoint digests as one row, `N files
<digest of them all>`) and shows A, B and, for two numbers, B - A; with
`only_changed` the rows where A equals B are left out. Every value shown is
`printable` (control and bidi-override characters escaped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import xxhash

from marin_rules.artifacts.drift import printable, recipe_diff
from marin_rules.artifacts.files import RECORDED_DIGESTS
from marin_rules.artifacts.records import recorded_payload
from marin_rules.experiment import Artifact, step_default


@dataclass(frozen=True)
class ResultRow:
    key: str
    a: Any
    b: Any

    @property
    def delta(self) -> float | None:
        if _number(self.a) and _number(self.b):
            return self.b - self.a
        return None

    @property
    def changed(self) -> bool:
        return self.a != self.b or type(self.a) is not type(self.b)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> {dotted key: leaf}; lists and scalars are leaves."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix or "(result)": value}


# result fields of many entries that matter as a whole: one row each, "N files <short digest>"
SUMMARISED = RECORDED_DIGESTS


def _summarised(result: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(result)
    for key in SUMMARISED:
        if isinstance(out.get(key), Mapping):
            whole = xxhash.xxh3_64_hexdigest(json.dumps(out[key], sort_keys=True, default=str).encode("utf-8"))
            out[key] = f"{len(out[key])} files {whole[:8]}"
    return out


def result_rows(a: Mapping[str, Any], b: Mapping[str, Any], only_changed: bool = False) -> list[ResultRow]:
    fa, fb = (flatten(_summarised(r.get("result") or {})) for r in (a, b))
    rows = [ResultRow(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb))]
    return [r for r in rows if r.changed or not only_changed]


def _show(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return printable(str(v))


def recipe_record(artifact: Artifact) -> dict[str, Any]:
    """An artifact's recipe in the experiment, shaped as the fields of a success record
    that `recorded_payload` reads (deps as name and version, a mixture's with their
    weights), with no result: the side of a diff that is not built yet."""

    def dep(key: str, weight: Any = None) -> dict[str, Any]:
        name, _, version = key.rpartition("@")
        return {"name": name, "version": version, **({} if weight is None else {"weight": weight})}

    deps = {role: dep(d) if isinstance(d, str) else [dep(k, w) for k, w in d.items()] for role, d in artifact.deps.items()}
    return {"step": artifact.step, "config": dict(artifact.config), "deps": deps, "result": {}}


def format_diff(key_a: str, a: Mapping[str, Any], key_b: str, b: Mapping[str, Any], only_changed: bool) -> str:
    step = a.get("step") if a.get("step") == b.get("step") and isinstance(a.get("step"), str) else None
    default = None if step is None else (lambda path: step_default(step, path))  # what a side without a field used
    recipe = recipe_diff(recorded_payload(a), recorded_payload(b), default=default, values=True)
    lines = [f"recipe: {key_a} -> {key_b}: " + (f"{len(recipe)} field(s) differ" if recipe else "same recipe")]
    lines += [f"  {line}" for line in recipe]
    if only_changed and not (a.get("result") and b.get("result")):  # one side not built: every row would differ
        return "\n".join([*lines, f"results: {key_a if not a.get('result') else key_b} has none"])
    rows = result_rows(a, b, only_changed)
    table = [("RESULT", key_a, key_b, "DELTA (B - A)")]
    for r in rows:
        delta = r.delta
        table.append((printable(r.key), _show(r.a), _show(r.b), "" if delta is None else f"{delta:+.6g}"))
    if len(table) == 1:
        lines.append("results: " + ("no result differs" if only_changed else "no results recorded"))
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        lines.append("  ".join([*(v.ljust(w) for v, w in zip(row[:3], widths)), row[3]]).rstrip())
    return "\n".join(lines)
