"""Field-level diffs between a recorded recipe and the current one.

Model: both sides are canonical JSON data (the record's `config`, `step`, `deps`).
A diff is a list of lines `path: old -> new`, `path (added)`, `path (removed)`,
walking mappings key by key in sorted order; lists and scalars are compared whole.
A config field added or removed at the value its step's settings give as its default
now reads `path (added: value, the default now)`: the fingerprint is of the recipe as
written, so writing a default out is drift, but the message says when every
difference is of that kind (the same settings, unless the defaults changed since).
A number spelled another way (`0 -> 0.0`: JSON, hence the fingerprint, tells an int
from a float; in a list too) reads `path: 0 -> 0.0 (the same number)`; for a built-in
step (whose settings read both spellings as one number) a record whose every
difference is of that kind holds the recipe now: no drift (`records.recipe_drift`).
The drift message shows at most 20 such lines, then `...and N more`; an artifact
that pins its fingerprint (`expect_fingerprint:`) gets a one-line error instead
(`drift_notice`: planning and a job serving another run's build alike). A record whose
fingerprint is the recipe's yet whose own step, config or deps differ was edited by
hand: there is no new recipe to build, so both end with `EDITED_FIX`, as the record's
note (`records.edited_note`) does, not with "bump the version". Whatever is
shown of a record or config value goes through `printable`: control and bidi-override
characters are escaped as `repr()` writes them, so a shared prefix's record cannot
rewrite a terminal or forge lines.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from marin_rules.artifacts.errors import DriftError

MAX_DIFF_LINES = 20
AT_DEFAULT = "the default now"
SAME_NUMBER = "the same number"
SAME_SETTINGS = (
    "every difference is a setting written out or left out at its default now: the same settings, "
    "unless the step's defaults changed since this was built; serving it needs no version bump"
)
PROGRESS_ONLY = "when progress is written, not what is built"
SAME_RESULT = (
    "every difference is a setting of when the step writes its progress (metrics, checkpoints, validation "
    "losses: not what it builds), or a setting written out or left out at its default now; serving it needs "
    "no version bump (rebuild it, -f, for those files at the new settings)"
)
EDITED_FIX = "restore it, or force a rebuild"  # a record edited by hand (`records.edited_note`)


def printable(text: str) -> str:
    """`text` safe to show on a terminal: every character Python's `repr()` would escape
    (control characters such as ESC and newlines, bidi overrides such as U+202E, line
    separators) written as `repr()` writes it (`\\x1b`, `\\n`, `\\u202e`), so a value read
    from a record can neither rewrite the terminal nor forge a line; anything else (é, 中)
    is left as it is. Used wherever record or config values are shown."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


NO_DEFAULT = object()  # what a `default` lookup gives for a field without one

DefaultLookup = Callable[[tuple[str, ...]], Any]  # config field path -> its default, or NO_DEFAULT
ProgressLookup = Callable[[tuple[str, ...]], bool]  # config field path -> does it only decide when progress is written


def diff_values(
    old: Any, new: Any, path: str = "", default: DefaultLookup | None = None, keys: tuple[str, ...] = (),
    values: bool = False, progress: ProgressLookup | None = None,
) -> list[str]:
    """Lines describing how `new` differs from `old`. With `default` (the step's
    settings: `experiment.Artifact.config_default`), a field added or removed at the
    value that is its default now says so: `seed (added: 0, the default now)`. With
    `values` (`marin diff`), every added or removed field shows its value, and with
    `default` the default now of a side without it: `model.router_gate (added: sigmoid;
    its default now: softmax)`; the drift warning keeps the contract's
    bare `(added)`. With `progress` (`experiment.Artifact.progress_setting`), a field
    that only decides when the step writes its progress says so:
    `log_every: 5 -> 7 (when progress is written, not what is built)`."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        lines: list[str] = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else key
            if key in old and key in new:
                lines.extend(diff_values(old[key], new[key], sub, default, (*keys, key), values, progress))
                continue
            change, value = ("added", new[key]) if key not in old else ("removed", old[key])
            known = NO_DEFAULT if default is None else default((*keys, key))
            at_default = known is not NO_DEFAULT and known == value and type(known) is type(value)
            if at_default:
                lines.append(AtDefault(f"{sub} ({change}: {_show(value)}, {AT_DEFAULT})"))
            elif progress is not None and progress((*keys, key)):
                lines.append(ProgressOnly(f"{sub} ({change}: {_show(value)}, {PROGRESS_ONLY})"))
            elif values and known is not NO_DEFAULT:  # `marin diff`: what a side without it used
                lines.append(f"{sub} ({change}: {_show(value)}; its default now: {_show(known)})")
            else:
                lines.append(f"{sub} ({change}: {_show(value)})" if values else f"{sub} ({change})")
        return lines
    if _equal(old, new, numbers_by_value=False):
        return []
    line = f"{path or '(value)'}: {_show(old)} -> {_show(new)}"
    if _equal(old, new, numbers_by_value=True):
        return [SameNumber(f"{line} ({SAME_NUMBER})")]
    return [ProgressOnly(f"{line} ({PROGRESS_ONLY})") if progress is not None and progress(keys) else line]


def _equal(old: Any, new: Any, numbers_by_value: bool) -> bool:
    """JSON values equal as spelled (`0` is not `0.0`, `true` is not `1`), or with
    `numbers_by_value` equal but for how numbers are spelled; lists item by item."""
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(_equal(a, b, numbers_by_value) for a, b in zip(old, new))
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return old.keys() == new.keys() and all(_equal(old[k], new[k], numbers_by_value) for k in old)
    numbers = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in (old, new)]
    if numbers_by_value and all(numbers):
        return old == new
    return type(old) is type(new) and old == new


class AtDefault(str):
    """A diff line of a field added or removed at its default now (`diff_values`): a
    type, not a text pattern, so no config value can pass for one."""


class ProgressOnly(str):
    """A diff line of a setting that only decides when the step writes its progress
    (train's `log_every`, `checkpoint_every`, `eval_every`: `diff_values`)."""


class SameNumber(str):
    """A diff line of a number spelled another way (`0 -> 0.0`, `1.0 -> 1`): the
    fingerprint hashes JSON's spelling, but the setting is the same (`diff_values`)."""


def only_respelled(lines: list[str]) -> bool:
    """Is every line of a recipe diff a number spelled another way (`SameNumber`)?"""
    return bool(lines) and all(isinstance(line, SameNumber) for line in lines)


def only_defaults(lines: list[str]) -> bool:
    """Is every line of a recipe diff a field written out, or left out, at its default
    (or a number spelled another way beside them)?"""
    return any(isinstance(line, AtDefault) for line in lines) and all(
        isinstance(line, (AtDefault, SameNumber)) for line in lines
    )


def no_bump_needed(lines: list[str]) -> str | None:
    """Why a recipe diff needs no version bump, or None: every line a default written
    out (`SAME_SETTINGS`), or, with at least one setting of when progress is written,
    those and numbers respelled (`SAME_RESULT`)."""
    if only_defaults(lines):
        return SAME_SETTINGS
    if any(isinstance(line, ProgressOnly) for line in lines) and all(
        isinstance(line, (AtDefault, SameNumber, ProgressOnly)) for line in lines
    ):
        return SAME_RESULT
    return None


def recipe_diff(
    recorded: Mapping[str, Any], current: Mapping[str, Any], default: DefaultLookup | None = None, values: bool = False,
    progress: ProgressLookup | None = None,
) -> list[str]:
    """Diff two fingerprint payloads: config fields bare (with `default`, the config
    defaults of the current step, `progress`, its settings of when progress is written,
    and `values`: `diff_values`), step and deps by name.
    Each line is `printable`: one line, whatever the record holds."""
    lines: list[str] = []
    if recorded.get("step") != current.get("step"):
        lines.append(f"step: {recorded.get('step')} -> {current.get('step')}")
        default = progress = None  # another step's settings say nothing about the recorded config
    lines.extend(diff_values(recorded.get("config", {}), current.get("config", {}), default=default, values=values,
                             progress=progress))  # fmt: skip
    lines.extend(diff_values(recorded.get("deps", {}), current.get("deps", {}), "deps", values=values))
    return [printable(line) for line in lines]


def drift_message(key: str, recorded_fp: str, current_fp: str, lines: list[str]) -> str:
    """The drift warning: a head saying the cached output is served and how to build the
    recipe now (bump the version; restore or force when the record was edited by hand:
    its fingerprint is the recipe's, `edited_record`), then the field `lines` (`truncated`)."""
    if edited_record(recorded_fp, current_fp):
        head = (
            f"{key}: recipe drift: its recorded fields disagree with its fingerprint {current_fp}, the recipe's now;\n"
            f"serving the cached output. The record was edited: {EDITED_FIX}."
        )
    else:
        head = (
            f"{key}: recipe drift: recorded fingerprint {printable(recorded_fp)}, now {current_fp};\n"
            "serving the cached output. Bump the version to build the new recipe."
        )
    why = no_bump_needed(lines)
    tail = [f"  ({why})"] if why else []
    return "\n".join([head, *truncated(lines, "  "), *tail])


def edited_record(recorded_fp: str, current_fp: str) -> bool:
    """Is drift with these fingerprints a record edited by hand: its fingerprint is the
    recipe's now, so only its own step, config or deps can differ (`records.recipe_drift`)?"""
    return recorded_fp == current_fp


def drift_notice(key: str, recorded_fp: str, current_fp: str, lines: list[str], pin: str | None = None) -> str:
    """What is shown when the record of `key` (fingerprint `recorded_fp`) holds another
    recipe than the one now (`current_fp`; field `lines`, `records.recipe_drift`): the
    drift warning (`drift_message`, the cached output is served), or, when the artifact
    pins its fingerprint (`pin`), DriftError in one line: drift is then an error.
    `records.drift_warning` gives it for a record and an artifact: one wording for
    planning (`workflow.advisory.report`) and for a job serving another run's build."""
    if pin is not None:
        first = f" ({lines[0]})" if lines else ""
        if edited_record(recorded_fp, current_fp):
            raise DriftError(
                f"{key}: recipe drift on a pinned artifact: its recorded fields disagree with its fingerprint "
                f"{current_fp}{first}; the record was edited: {EDITED_FIX}"
            )
        raise DriftError(
            f"{key}: recipe drift on a pinned artifact: recorded fingerprint {printable(recorded_fp)}, "
            f"pinned {pin}{first}; restore the recipe that was built, or bump the version"
        )
    return drift_message(key, recorded_fp, current_fp, lines)


def truncated(lines: list[str], indent: str = "") -> list[str]:
    """At most MAX_DIFF_LINES diff lines, then `...and N more`; each behind `indent`."""
    shown = [f"{indent}{line}" for line in lines[:MAX_DIFF_LINES]]
    if len(lines) > MAX_DIFF_LINES:
        shown.append(f"{indent}...and {len(lines) - MAX_DIFF_LINES} more")
    return shown
