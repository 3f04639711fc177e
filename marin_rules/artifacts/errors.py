"""Errors that name what to fix.

`ConfigError` carries the dotted path of the offending field inside an artifact's
`config` (or `deps`, `runtime`); the experiment loader prefixes it with the artifact's
`name@version`, giving one line such as
`checkpoints/nano-moe@v1: config.optimizer.learning_rate: expected a number > 0, got 'fast'`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any


class MarinError(Exception):
    """Base class for errors meant to be shown to the user as one line."""

    def with_flags(self, flags: str | None) -> "MarinError":
        """The error whose suggested snakemake command also carries `flags` (what the
        run's experiment and prefix need: `workflow.options.rerun_flags`; None: the
        artifact is not the experiment's, so no command is suggested): itself, for
        errors that suggest none (`records.CorruptRecord` completes its own)."""
        return self


class ConfigError(MarinError):
    """A bad value in an experiment file; `field` is a dotted path such as
    `config.optimizer.learning_rate` (steps' checkers give it relative to `config`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def within(self, parent: str) -> "ConfigError":
        """The same error with `parent.` in front of its field."""
        field = f"{parent}.{self.field}" if self.field else parent
        return ConfigError(field, self.message)


class ExperimentError(MarinError):
    """A whole-experiment problem: a cycle, a missing dependency, a bad key."""


class DriftError(MarinError):
    """A pinned artifact (`expect_fingerprint:`) whose recipe no longer matches."""


class StepError(MarinError):
    """A step failed for a reason the user can fix (empty corpus, missing source)."""


MAX_JSON_DEPTH = 200  # experiment values nest at most 100 levels (yaml_file.MAX_DEPTH); a record adds a few


def decode_json(raw: bytes | str, max_depth: int | None = MAX_JSON_DEPTH) -> Any:
    """`json.loads` of text from a file anyone may have written (a record, a lease, a
    document), where the ways hostile JSON gets past `json.JSONDecodeError` become
    ValueErrors that say what they are (`json_problem` shows them): nesting deeper than
    MAX_JSON_DEPTH (past Python's recursion limit a RecursionError in the parser; below
    it, one in whatever walks the value later: copying a record, printing it) and an
    integer of more digits than Python converts (`sys.get_int_max_str_digits`).
    `max_depth` None: no walk (a corpus's documents, of which only `text` is read)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as e:
        if type(e) is not ValueError or "integer string conversion" not in str(e):
            raise  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"an integer of more than {sys.get_int_max_str_digits()} digits") from None
    if max_depth is not None and deeper_than(value, max_depth):
        raise ValueError(f"nested more than {max_depth} levels deep")
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Does `value` nest lists and objects more than `limit` levels (walked without recursion)?"""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def json_problem(e: ValueError) -> str:
    """"not valid JSON (<what> at line L, column C)" for a json.JSONDecodeError (whose
    message may itself end in "at": "Unterminated string starting at line ..."); other
    ValueErrors (UnicodeDecodeError) by their own text."""
    if not hasattr(e, "lineno"):
        return f"not valid JSON ({e})"
    where = f"line {e.lineno}, column {e.colno}"  # type: ignore[attr-defined]
    what = str(getattr(e, "msg", e))
    return f"not valid JSON ({what} {where})" if what.endswith(" at") else f"not valid JSON ({what} at {where})"


def got(value: Any) -> str:
    """`repr(value)` for a "got ..." message about a number, with a hint when the value
    is a string that reads as a number: YAML 1.1 reads `3e-4` (no dot, or an exponent
    without a sign) as text, and a quoted number is text too."""
    return f"{value!r}{number_text_hint(value)}"


_NUMBER_TEXT = re.compile(r"^([-+]?)(\d*)(?:\.(\d*))?(?:[eE]([-+]?)(\d+))?$")


def number_text_hint(value: Any) -> str:
    """` (a string: ...)` when `value` is a string that parses as a finite number, else ``."""
    if not isinstance(value, str):
        return ""
    text = value.strip()
    m = _NUMBER_TEXT.match(text)
    if not m or not (m.group(2) or m.group(3)):
        return ""
    try:
        if not math.isfinite(float(text)):
            return ""
    except ValueError:
        return ""
    if _yaml_number(text):
        return f" (a string; write {text} without quotes)"
    sign, whole, frac, exp_sign, exp = m.groups()
    number = float(text)
    if number.is_integer() and abs(number) < 1e15:  # 1e3 -> 1000: right for integer fields, and number fields take it
        written = str(int(number))
    else:
        written = f"{sign}{whole or '0'}.{frac or '0'}" + (f"e{exp_sign or '+'}{exp}" if exp else "")
    suggestion = f"; write {written}" if _yaml_number(written) else ""
    return f" (a string: YAML reads {text} as text{suggestion})"


def _yaml_number(text: str) -> bool:
    import yaml  # the experiment loader's own parser, already imported there

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)
