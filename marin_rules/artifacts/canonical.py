"""Canonical JSON and the fingerprint.

Model: the fingerprint of an artifact is xxh3-64 (hex) of the canonical JSON of
`{"step": ..., "config": ..., "deps": {role: "name@version" | {"name@version": weight}}}`.
Canonical means sorted keys, fixed separators, UTF-8, no NaN or infinity, and only
values with one stable spelling: None, bools, ints, finite floats, strings, lists
and mappings with string keys. Anything else (sets, objects, callables) is refused
with the path of the offending value, so a fingerprint never depends on a memory
address, a hash seed or dict order. Prefix, output path, host and runtime never
enter it.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import xxhash

from marin_rules.artifacts.errors import ConfigError


def canonical_value(value: Any, path: str = "", purpose: str = "the fingerprint") -> Any:
    """Return `value` as plain JSON data, or raise ConfigError naming the path and what
    needed the value (`purpose`: the fingerprint of a recipe, a step's recorded result)."""
    recipe = purpose == "the fingerprint"
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(path, f"{value!r} has no stable JSON form for {purpose}; use a finite number or a string")
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                fix = "quote it in the YAML" if recipe else "use string keys"
                raise ConfigError(path, f"mapping key {key!r} is not a string; {fix}")
            out[key] = canonical_value(item, f"{path}.{key}" if path else key, purpose)
        return out
    if isinstance(value, (list, tuple)):
        return [canonical_value(item, f"{path}[{i}]", purpose) for i, item in enumerate(value)]
    hint = " (convert arrays with .tolist(), numpy scalars with float() or int())" if not recipe else ""
    raise ConfigError(
        path,
        f"value of type {type(value).__name__} has no stable form for {purpose}; "
        f"use numbers, strings, booleans, null, lists and mappings{hint}",
    )


def canonical_json(value: Any) -> str:
    return json.dumps(
        canonical_value(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def fingerprint_payload(step: str, config: Mapping[str, Any], deps: Mapping[str, Any]) -> dict[str, Any]:
    """What identity is made of: the step kind, the recipe, and the deps' name@version."""
    return {"step": step, "config": canonical_value(config, "config"), "deps": canonical_value(deps, "deps")}


def fingerprint(step: str, config: Mapping[str, Any], deps: Mapping[str, Any]) -> str:
    """xxh3-64 hex digest of the canonical fingerprint payload."""
    payload = fingerprint_payload(step, config, deps)
    return xxhash.xxh3_64_hexdigest(canonical_json(payload).encode("utf-8"))
