"""The one validation layer for step configs: rules on frozen dataclass fields.

Model: a config is a frozen dataclass whose user-facing fields are annotated with a
rule, `d_model: Annotated[int, Int(min=1), "residual width"] = 192` (the string is
the description editors show). `parse(cls, data)` checks a mapping from an
experiment file against the rules (unknown keys with the nearest known one, missing
required fields, each value's type and range, nested config dataclasses) and builds
the instance; `check_instance(obj)` applies the same rules to one built in code.
Every failure is `ConfigError(field, message)`, message in one style:
`expected a number > 0, got 'fast'` (with the YAML `3e-4`-is-text hint of `got`).
`json_schema(cls)` turns the same rules into JSON Schema, so the schema editors
check against (schema/experiment.schema.json) is the loader's own. Relations
between fields (n_heads divides d_model) stay with each config, after `parse`.
Standard library only: experiment loading (dry runs) imports no JAX and no pydantic.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from marin_rules.artifacts.errors import ConfigError, got


def suggest_key(text: str, keys: Iterable[str]) -> str:
    """` (did you mean X?)` for the known key closest to a misspelled one, else ``."""
    close = difflib.get_close_matches(str(text), [str(k) for k in keys], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _bounds(lo: float | None, lo_open: bool, hi: float | None, hi_open: bool) -> str:
    """` > 0`, ` in [0, 1)`, or `` (no bound), as the messages say it."""
    a, b = (None if x is None else (str(x) if isinstance(x, int) else f"{x:g}") for x in (lo, hi))
    if a is not None and b is not None:
        return f" in {'(' if lo_open else '['}{a}, {b}{')' if hi_open else ']'}"
    if a is not None:
        return f" {'>' if lo_open else '>='} {a}"
    if b is not None:
        return f" {'<' if hi_open else '<='} {b}"
    return ""


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Rule:
    """How one field is checked (`check` returns the value to store) and described."""

    def check(self, value: Any, field: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Rule):
    min: int | None = None
    max: int | None = None
    extra: str = ""  # said after the bound, e.g. " (256 byte symbols + ...)"

    def check(self, value: Any, field: str) -> int:
        ok = is_int(value) and (self.min is None or value >= self.min) and (self.max is None or value <= self.max)
        if not ok:
            raise ConfigError(field, f"expected an integer{_bounds(self.min, False, self.max, False)}{self.extra}, got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "integer"}
        if self.min is not None:
            s["minimum"] = self.min
        if self.max is not None:
            s["maximum"] = self.max
        return s


@dataclass(frozen=True)
class Number(Rule):
    """A finite number; `gt`/`lt` are open bounds, `ge`/`le` closed ones."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def check(self, value: Any, field: str) -> float:
        ok = is_number(value)
        ok = ok and (self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
        ok = ok and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le)
        if not ok:
            lo, hi = (self.gt if self.gt is not None else self.ge), (self.lt if self.lt is not None else self.le)
            bound = _bounds(lo, self.gt is not None, hi, self.lt is not None)
            raise ConfigError(field, f"expected a number{bound}, got {got(value)}")
        return float(value)

    def schema(self) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "number"}
        for key, name in (("gt", "exclusiveMinimum"), ("ge", "minimum"), ("lt", "exclusiveMaximum"), ("le", "maximum")):
            if getattr(self, key) is not None:
                s[name] = getattr(self, key)
        return s


@dataclass(frozen=True)
class Bool(Rule):
    def check(self, value: Any, field: str) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(field, f"expected true or false, got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class OneOf(Rule):
    choices: tuple[Any, ...]

    def check(self, value: Any, field: str) -> Any:
        if isinstance(value, bool) or value not in self.choices:  # `True in (1,)` would pass
            raise ConfigError(field, f"expected one of {', '.join(map(repr, self.choices))}, got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.choices)}


@dataclass(frozen=True)
class Text(Rule):
    """A non-empty string; `what` replaces "a non-empty string" in the message."""

    what: str = "a non-empty string"

    def check(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(field, f"expected {self.what}, got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "minLength": 1}


@dataclass(frozen=True)
class Optional(Rule):
    """`rule`, or null (YAML `~` / `null`) for "not set"."""

    rule: Rule

    def check(self, value: Any, field: str) -> Any:
        return None if value is None else self.rule.check(value, field)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [self.rule.schema(), {"type": "null"}]}


@dataclass(frozen=True)
class ListOf(Rule):
    """A list of `item`s; `length` fixes its size, `unique` refuses repeats. Stored as a tuple."""

    item: Rule
    what: str  # "two numbers in [0, 1)", "a list of document keys (e.g. [hamlet, macbeth])"
    length: int | None = None
    unique: bool = False

    def check(self, value: Any, field: str) -> tuple:
        if not isinstance(value, (list, tuple)) or (self.length is not None and len(value) != self.length):
            raise ConfigError(field, f"expected {self.what}, got {value!r}")
        try:
            items = tuple(self.item.check(v, field) for v in value)
        except ConfigError:
            hint = next((got(v)[len(repr(v)):] for v in value if got(v) != repr(v)), "")
            raise ConfigError(field, f"expected {self.what}, got {value!r}{hint}") from None
        repeated = sorted({v for v in items if items.count(v) > 1}, key=str) if self.unique else []
        if repeated:
            raise ConfigError(field, f"lists {list(repeated)} more than once")
        return items

    def schema(self) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "array", "items": self.item.schema()}
        if self.length is not None:
            s["minItems"] = s["maxItems"] = self.length
        if self.unique:
            s["uniqueItems"] = True
        return s


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
    unknown = sorted((str(k) for k in data if k not in known), key=str)
    if unknown:
        raise ConfigError(
            _join(field, unknown[0]),
            f"unknown setting{suggest_key(unknown[0], known)}; known: {', '.join(sorted(known))}",
        )
    out: dict[str, Any] = {}
    for spec in known.values():
        where = _join(field, spec.name)
        if spec.name not in data:
            if spec.required:
                raise ConfigError(where, f"missing; expected {_what(spec)}")
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


def check_instance(obj: Any) -> None:
    """Apply the field rules to a config built in code (for `__post_init__`)."""
    for spec in specs(type(obj)):
        if spec.rule is not None:
            spec.rule.check(getattr(obj, spec.name), spec.name)


def json_schema(cls: type, title: str = "") -> dict[str, Any]:
    """JSON Schema (draft 2020-12 keywords) of a config's mapping, from its rules."""
    props: dict[str, Any] = {}
    for spec in specs(cls):
        s = json_schema(spec.nested) if spec.nested is not None else dict(spec.rule.schema())
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


def _what(spec: _Spec) -> str:
    if spec.nested is not None:
        return "a mapping"
    if hasattr(spec.rule, "missing"):
        return spec.rule.missing
    text = {Int: "an integer", Number: "a number", Bool: "true or false", Text: "a non-empty string"}
    return text.get(type(spec.rule), "a value") + (
        _bounds(spec.rule.min, False, spec.rule.max, False) if isinstance(spec.rule, Int) else ""
    )


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name
