"""Config dataclasses whose fields carry rules: parsing, checking, JSON Schema.

Model: a config is a frozen dataclass whose user-facing fields are annotated with a
rule, `d_model: Annotated[int, Int(min=1), "residual width"] = 192` (the string is
the description editors show); a field whose type is itself such a dataclass is a
nested section. `parse(cls, data)` checks a mapping from an experiment file (unknown
keys with the nearest known one, missing required fields, each value by its rule,
nested sections) and builds the instance; `check_instance(obj)` applies the rules to
one built in code; `json_schema(cls)` gives the same rules as JSON Schema, so the
schema editors check against (schema/experiment.schema.json) is the loader's own.
Relations between fields (n_heads divides d_model) stay with each config.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.validation.rules import Rule, bool_word_hint, suggest_key


@dataclass(frozen=True)
class _Spec:
    name: str
    rule: Rule | None  # None: a nested config dataclass (`nested`), or not user-facing
    nested: type | None
    doc: str
    required: bool
    default: Any


@functools.cache
def specs(cls: type) -> tuple[_Spec, ...]:
    """The user-facing fields of a config dataclass, in declaration order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        rule, doc, nested = None, "", None
        if typing.get_origin(hint) is typing.Annotated:
            extras = hint.__metadata__
            rule = next((x for x in extras if isinstance(x, Rule)), None)
            doc = next((x for x in extras if isinstance(x, str)), "")
            hint = typing.get_args(hint)[0]
        if rule is None and dataclasses.is_dataclass(hint):
            nested = hint
        if rule is None and nested is None:
            continue  # derived or internal: not read from the experiment file
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append(_Spec(f.name, rule, nested, doc, required, default))
    return tuple(out)


def check_fields(cls: type, data: Any, field: str = "") -> dict[str, Any]:
    """The given settings of `data`, each checked by its rule (nested configs built);
    raises `ConfigError` naming the first unknown, missing or bad field."""
    if not isinstance(data, Mapping):
        raise ConfigError(field, f"expected a mapping, got {data!r}")
    known = {s.name: s for s in specs(cls)}
    unknown = sorted((k for k in data if k not in known), key=str)
    if unknown:
        raise ConfigError(
            _join(field, str(unknown[0])),
            f"unknown setting{suggest_key(unknown[0], known)}{bool_word_hint(unknown[0])}; "
            f"known: {', '.join(sorted(known))}",
        )
    out: dict[str, Any] = {}
    for spec in known.values():
        where = _join(field, spec.name)
        if spec.name not in data:
            if spec.required:
                raise ConfigError(where, f"missing; expected {'a mapping' if spec.nested else spec.rule.what}")
            continue
        value = data[spec.name]
        if spec.nested is not None:
            out[spec.name] = parse(spec.nested, {} if value is None else value, where)
        else:
            out[spec.name] = spec.rule.check(value, where)
    return out


def parse(cls: type, data: Any, field: str = "") -> Any:
    """`cls` built from a mapping: `check_fields`, then the class's own checks
    (`__post_init__`), whose errors are re-rooted under `field`."""
    values = check_fields(cls, data, field)
    try:
        return cls(**values)
    except ConfigError as e:
        raise (e.within(field) if field else e) from None


def default_at(cls: type, path: tuple[str, ...]) -> tuple[bool, Any]:
    """(True, the default) of the setting at `path` (names through nested configs) of
    `cls`, as written in an experiment file (a tuple as a list); (False, None) when the
    path names no optional setting (unknown, required, or a whole nested config)."""
    for i, name in enumerate(path):
        spec = next((s for s in specs(cls) if s.name == name), None)
        if spec is None:
            return False, None
        if spec.nested is not None:
            cls = spec.nested
            continue
        if spec.rule is not None and spec.rule.settings is not None and i < len(path) - 1:
            if path[i + 1] in spec.rule.filled_in:
                return False, None
            cls = spec.rule.settings  # (`model`: a ModelConfig mapping checked as a whole)
            continue
        if spec.required or i != len(path) - 1:
            return False, None
        return True, list(spec.default) if isinstance(spec.default, tuple) else spec.default
    return False, None


def check_instance(obj: Any) -> None:
    """Apply the field rules to a config built in code (for `__post_init__`)."""
    for spec in specs(type(obj)):
        if spec.rule is not None:
            spec.rule.check(getattr(obj, spec.name), spec.name)


def json_schema(cls: type, title: str = "") -> dict[str, Any]:
    """JSON Schema (draft-07 keywords) of a config's mapping, from its rules."""
    props: dict[str, Any] = {}
    for spec in specs(cls):
        s = nullable(json_schema(spec.nested)) if spec.nested is not None else dict(spec.rule.schema())
        if spec.doc:
            s["description"] = spec.doc
        if spec.default is not None and spec.nested is None:
            s["default"] = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        props[spec.name] = s
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    required = [s.name for s in specs(cls) if s.required]
    if required:
        out["required"] = required
    if title:
        out["title"] = title
    return out


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of a section that may also be written null (YAML `~`), which the
    loader reads as left out: every section without required settings (`check_fields`).
    `type: [object, null]` rather than `anyOf`, so an editor still points at the bad
    setting inside an object (keywords on properties apply to objects only)."""
    return schema if schema.get("required") else {**schema, "type": [schema["type"], "null"]}


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name
