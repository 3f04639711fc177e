"""Field rules: how one setting of a step config is checked, described and schema'd.

Model: a rule checks one value from an experiment file (`check(value, field)` returns
the value to store or raises `ConfigError(field, message)`), says what it expects in
words (`what`: "an integer >= 1", used by every message: `expected a number > 0, got
'fast'`, with the YAML `3e-4`-is-text hint of `got`, and for a rule that takes text the
`no`-is-false hint of `bool_word_hint`) and as JSON Schema (`schema()`).
A step-specific rule is a `Rule` subclass beside its config.
"""

from __future__ import annotations

import difflib
import math
import sys
import re
from dataclasses import dataclass
from typing import Any, Iterable

from marin_rules.artifacts.errors import ConfigError, number_text_hint


def suggest_key(text: str, keys: Iterable[str], cutoff: float = 0.6) -> str:
    """` (did you mean X?)` for the known key closest to a misspelled one, else ``.
    A name typed without `@` suggests its versions (up to three); never `text` itself."""
    text = str(text)
    keys = [str(k) for k in keys if str(k) != text]
    same_name = [k for k in keys if k.rpartition("@")[0] == text] if "@" not in text else []
    other_case = [k for k in keys if k.lower() == text.lower()]  # names are lower case: MID/B@v1 is mid/b@v1
    close = same_name[:3] or other_case[:1] or difflib.get_close_matches(text, keys, n=1, cutoff=cutoff)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def bool_word_hint(value: Any, quote: bool = True) -> str:
    """` (YAML reads no and off as false: ...)` for a boolean where text or a key was
    expected (YAML 1.1: unquoted yes/no/on/off are booleans; y and n stay text in PyYAML),
    else ``. Without `quote` (a number was expected) the hint does not say to quote it."""
    if not isinstance(value, bool):
        return ""
    words = "yes and on as true" if value else "no and off as false"
    quoted = "'yes' or 'on'" if value else "'no' or 'off'"
    return f" (YAML reads {words}: quote it, {quoted})" if quote else f" (YAML reads {words})"


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


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


MAX_SEED = 2**32 - 1  # numpy, JAX and lm-eval take seeds of 32 bits (lm-eval refuses larger ones)
INT32_MAX = 2**31 - 1  # counts that reach jitted code as int32 (training steps, batch sizes)


class Rule:
    """How one field is checked (`check` returns the value to store), described in
    messages (`what`: "an integer >= 1") and in the JSON Schema (`schema()`)."""

    what = "a value"
    # a rule checking a whole mapping of settings by another config class: that class, whose
    # defaults are the defaults of the settings under this field (`fields.default_at`), but
    # for those `filled_in` from elsewhere when left out (a model's vocab_size, from the data)
    settings: type | None = None
    filled_in: frozenset[str] = frozenset()

    def check(self, value: Any, field: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def hint(self, value: Any) -> str:
        """What a refused `value` may have meant: a number YAML read as text (`'3e-4'`), or
        a word YAML read as a boolean (`yes`)."""
        return number_text_hint(value) or bool_word_hint(value, quote=False)

    def refuse(self, value: Any, field: str) -> ConfigError:
        return ConfigError(field, f"expected {self.what}, got {value!r}{self.hint(value)}")


@dataclass(frozen=True)
class Int(Rule):
    """An integer in [min, max]. With `max_why`, `max` is a technical ceiling rather
    than part of the range: messages leave it out (`expected an integer >= 1`) except
    for a value above it (`expected an integer <= 2147483647 (<max_why>), got ...`)."""

    min: int | None = None
    max: int | None = None
    extra: str = ""  # said after the bound, e.g. " (256 byte symbols + ...)"
    max_why: str = ""  # why `max` is a ceiling, e.g. "steps are int32 in the jitted step"

    @property
    def what(self) -> str:
        return f"an integer{_bounds(self.min, False, None if self.max_why else self.max, False)}{self.extra}"

    def check(self, value: Any, field: str) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and self.max_why and self.max is not None and value > self.max:
            raise ConfigError(field, f"expected an integer <= {self.max} ({self.max_why}), got {value}")
        if not (ok and (self.min is None or value >= self.min) and (self.max is None or value <= self.max)):
            raise self.refuse(value, field)
        return value

    def hint(self, value: Any) -> str:
        """A whole number written with a point (`300.0`, `1.0e3`) is a float in YAML; JSON
        Schema calls it an integer, so an editor passes what the loader refuses here:
        say how to write it."""
        whole = isinstance(value, float) and value.is_integer() and abs(value) < 1e15
        if whole and (self.min is None or value >= self.min) and (self.max is None or value <= self.max):
            return f" (a float: write {int(value)}, without the point)"
        return super().hint(value)

    def schema(self) -> dict[str, Any]:
        bounds = {"minimum": self.min, "maximum": self.max}
        return {"type": "integer", **{k: v for k, v in bounds.items() if v is not None}}


@dataclass(frozen=True)
class Number(Rule):
    """A finite number; `gt`/`lt` are open bounds, `ge`/`le` closed ones."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    @property
    def what(self) -> str:
        lo, hi = (self.gt if self.gt is not None else self.ge), (self.lt if self.lt is not None else self.le)
        return f"a number{_bounds(lo, self.gt is not None, hi, self.lt is not None)}"

    def check(self, value: Any, field: str) -> float:
        ok = is_number(value)
        ok = ok and (self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
        ok = ok and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le)
        if not ok:
            raise self.refuse(value, field)
        return float(value)

    def schema(self) -> dict[str, Any]:
        bounds = {"exclusiveMinimum": self.gt, "minimum": self.ge, "exclusiveMaximum": self.lt, "maximum": self.le}
        finite = {  # YAML's .inf and -.inf: numbers to a validator, refused by `check`
            **({} if self.gt is not None or self.ge is not None else {"minimum": -sys.float_info.max}),
            **({} if self.lt is not None or self.le is not None else {"maximum": sys.float_info.max}),
        }
        return {"type": "number", **{k: v for k, v in bounds.items() if v is not None}, **finite}


@dataclass(frozen=True)
class Bool(Rule):
    what = "true or false"

    def check(self, value: Any, field: str) -> bool:
        if not isinstance(value, bool):
            raise self.refuse(value, field)
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class OneOf(Rule):
    choices: tuple[Any, ...]

    @property
    def what(self) -> str:
        return f"one of {', '.join(map(repr, self.choices))}"

    def check(self, value: Any, field: str) -> Any:
        if isinstance(value, bool) or value not in self.choices:  # `True in (1,)` would pass
            raise self.refuse(value, field)
        return value

    def hint(self, value: Any) -> str:
        takes_text = any(isinstance(c, str) for c in self.choices)
        return (bool_word_hint(value) if takes_text else "") or number_text_hint(value)

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.choices)}


@dataclass(frozen=True)
class Text(Rule):
    """A non-empty string; with `pattern`, one that matches it whole (say its form in `what`)."""

    what: str = "a non-empty string"
    pattern: str = ""  # a regular expression the whole string must match

    def check(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.refuse(value, field)
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise self.refuse(value, field)
        return value

    def hint(self, value: Any) -> str:
        return bool_word_hint(value) or number_text_hint(value)

    def schema(self) -> dict[str, Any]:
        if self.pattern:
            return {"type": "string", "pattern": f"^(?:{self.pattern})$"}
        return {"type": "string", "minLength": 1}


@dataclass(frozen=True)
class Optional(Rule):
    """`rule`, or null (YAML `~` / `null`) for "not set"."""

    rule: Rule

    @property
    def what(self) -> str:
        return self.rule.what

    def check(self, value: Any, field: str) -> Any:
        return None if value is None else self.rule.check(value, field)

    def hint(self, value: Any) -> str:
        return self.rule.hint(value)

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
            raise self.refuse(value, field)
        try:
            items = tuple(self.item.check(v, field) for v in value)
        except ConfigError:
            hint = next((h for h in map(self.item.hint, value) if h), "")
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
