"""The one validation layer for step configs (standard library only: loading an
experiment, dry runs included, imports neither JAX nor pydantic).

`rules`: how one setting is checked and described (`Int`, `Number`, `Bool`, `OneOf`,
`Text`, `Optional`, `ListOf`, or a `Rule` subclass); `fields`: config dataclasses whose
fields carry rules (`parse`, `check_fields`, `check_instance`, `json_schema`,
`default_at`).
"""

from marin_rules.validation.fields import check_fields, check_instance, default_at, json_schema, nullable, parse, specs
from marin_rules.validation.rules import (
    INT32_MAX,
    MAX_SEED,
    Bool,
    Int,
    ListOf,
    Number,
    OneOf,
    Optional,
    Rule,
    Text,
    bool_word_hint,
    is_number,
    suggest_key,
)

__all__ = [
    "INT32_MAX", "MAX_SEED",
    "Bool", "Int", "ListOf", "Number", "OneOf", "Optional", "Rule", "Text", "bool_word_hint",
    "check_fields", "check_instance", "default_at", "is_number", "json_schema", "nullable", "parse", "specs", "suggest_key",
]  # fmt: skip
