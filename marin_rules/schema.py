"""JSON Schema of experiment files, for editors: completion, hover text, checking as you type.

Model: the schema is generated, never written by hand: entry fields and key
patterns come from the loader (experiment.py, identity.py; an entry has either
`step:` or `adopt:`, whose fields come from marin_rules.adopt.AdoptConfig), and each built-in
step's `config:` and the entry's `runtime:` (experiment.Runtime) from the validation
rules of their dataclasses (`BuiltinStep.settings`), so the editor checks what
`load_experiment` checks. The
loader still has the last word (relations between fields, findable user steps,
deps that exist, cycles); sweep entries get the entry structure but a free-form
`config:` and `runtime:` values (they may be `{var}` placeholders). The committed copy is
`schema/experiment.schema.json`; `python -m marin_rules.schema --write` renews it
and a test fails when it is out of date. Point an editor at it with the first line
`# yaml-language-server: $schema=<path or URL of experiment.schema.json>`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from marin_rules.experiment import ADOPT, RUNTIME_READERS, Runtime
from marin_rules.steps import BUILTIN_STEPS, SHARDED_STEPS, USER_STEP, import_function
from marin_rules.sweeps import MAX_SWEEP_ARTIFACTS
from marin_rules.validation import json_schema, nullable, specs

SCHEMA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schema", "experiment.schema.json")
SEGMENT = "[a-z0-9][a-z0-9._-]*"
KEY_PATTERN = f"^{SEGMENT}(/{SEGMENT})*@[A-Za-z0-9][A-Za-z0-9._-]*$"
ROLE_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*$"
REQUIRED_ROLES = {"dedup": ["corpus"], "tokenize": ["corpus", "tokenizer"], "train": ["data"], "evaluate": ["data", "model"]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/definitions/{name}"}


def experiment_schema() -> dict[str, Any]:
    """The schema as a JSON-able dict (draft-07: what YAML language servers support)."""
    dep = {"anyOf": [_ref("key"), _ref("mixture")]}
    entry_props: dict[str, Any] = {
        "step": {
            "description": "a built-in step, or a user step 'pkg.module:function'",
            "anyOf": [{"enum": sorted(set(BUILTIN_STEPS) - {ADOPT})}, {"type": "string", "pattern": USER_STEP.pattern}],
        },
        "adopt": {
            "description": "instead of step: existing data (a folder or gs:// path) of a kind; its layout is checked, nothing copied unless copy: true",
            **json_schema(import_function(BUILTIN_STEPS[ADOPT].settings), title="adopted data"),
        },
        "deps": {
            "description": "role -> upstream name@version, or role -> {name@version: weight} (a mixture)",
            **nullable({"type": "object", "propertyNames": {"pattern": ROLE_PATTERN}, "additionalProperties": dep}),
        },
        "config": {"description": "the step's settings; fingerprinted", **nullable({"type": "object"})},
        "runtime": {
            "description": "where and how it runs (tpu, zone, shards, ...); recorded, not fingerprinted",
            **nullable(json_schema(Runtime)),
        },
        "expect_fingerprint": {"description": "pin: loading fails if the recipe no longer fingerprints to this",
                               "anyOf": [{"type": "string", "pattern": "^[0-9a-f]{16}$"}, {"type": "null"}]},
        "description": {"type": "string"},
    }
    per_step = []
    for name, builtin in sorted(BUILTIN_STEPS.items()):
        if name == ADOPT:  # written as `adopt:`; the loader refuses `step: adopt`
            refused = {"properties": {"config": entry_props["adopt"]}, "not": {}}  # `not: {}` refuses all
            per_step.append({"if": {"properties": {"step": {"const": name}}, "required": ["step"]}, "then": refused})
            continue
        deps = {"type": "object", "properties": {role: dep for role in sorted(builtin.deps)}, "additionalProperties": False}
        if name in REQUIRED_ROLES:
            deps["required"] = REQUIRED_ROLES[name]
        config = json_schema(import_function(builtin.settings), title=f"{name} config")
        unread = [k for k, readers in RUNTIME_READERS.items() if name not in readers]
        unread = sorted(unread + ([] if name in SHARDED_STEPS else ["shards"]))
        then = {"config": nullable(config), "deps": nullable(deps)}
        if unread:  # keys this step never reads: the loader refuses them too
            then["runtime"] = {"not": {"type": "object", "anyOf": [{"required": [k]} for k in unread]}}  # (null: none)
        per_step.append({
            "if": {"properties": {"step": {"const": name}}, "required": ["step"]},
            "then": {"properties": then},
        })  # fmt: skip
    sweep_props = {
        **entry_props,
        "runtime": {"description": entry_props["runtime"]["description"], "type": ["object", "null"],
                    "propertyNames": {"enum": [spec.name for spec in specs(Runtime)]}},  # values may be {var}
        "grid": {"description": "variable -> list of values (or {range: [start, stop]}); every combination",
                 "type": "object", "additionalProperties": {"anyOf": [{"type": "array", "minItems": 1}, _ref("range")]}},
        "cases": {"description": "a list of {variable: value}; one artifact each",
                  "type": "array", "minItems": 1, "items": {"type": "object"}},
    }  # fmt: skip
    top = {
        "description": {"type": "string"},
        "artifacts": {"type": "object", "propertyNames": _ref("key"), "additionalProperties": _ref("entry")},
        "sweeps": {"description": "template name@version with {var} placeholders -> entry with grid: or cases:",
                   "type": "object", "additionalProperties": _ref("sweep")},
    }  # fmt: skip
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "marin-rules experiment file",
        "description": "Artifacts keyed name@version: step, deps, config, runtime. Generated by marin_rules/schema.py.",
        "type": "object",
        "properties": top,
        "patternProperties": {"^x-": {"description": "ignored: a place for YAML anchors (x-model: &model {...})"}},
        "additionalProperties": False,
        "definitions": {
            "key": {"type": "string", "pattern": KEY_PATTERN, "description": "name@version, e.g. checkpoints/nano-moe@v1"},
            "mixture": {"type": "object", "minProperties": 1, "propertyNames": _ref("key"),
                        "additionalProperties": {"type": "number", "minimum": 0}},
            "range": {"type": "object", "required": ["range"], "additionalProperties": False,
                      "properties": {"range": {"description": f"[start, stop]: the integers start .. stop - 1 (at most {MAX_SWEEP_ARTIFACTS})",
                                               "type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}}},
            "entry": {"type": "object", "properties": entry_props, "additionalProperties": False, "allOf": per_step,
                      "oneOf": [{"required": ["step"], "not": {"required": ["adopt"]}},
                                {"required": ["adopt"], "not": {"anyOf": [{"required": [f]} for f in ("step", "config", "deps")]}}]},
            "sweep": {"type": "object", "properties": sweep_props, "additionalProperties": False,
                      "oneOf": [{"required": ["step"]}, {"required": ["adopt"]}]},
        },  # fmt: skip
    }


def schema_text() -> str:
    return json.dumps(experiment_schema(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    """`python -m marin_rules.schema` prints the schema; `--write` renews the committed file."""
    if argv == ["--write"]:
        os.makedirs(os.path.dirname(SCHEMA_FILE), exist_ok=True)
        with open(SCHEMA_FILE, "w", encoding="utf-8") as f:
            f.write(schema_text())
        print(f"wrote {SCHEMA_FILE}")
        return 0
    if argv:
        print("usage: python -m marin_rules.schema [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
