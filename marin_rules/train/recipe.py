"""The recipe a run's checkpoints belong to: recorded at a fresh start, checked on resume.

Model: `{output}/checkpoints/recipe.json` holds `{"config": ..., "deps": ...}`, the
train step's `config` as the experiment gave it (canonical JSON data) and its deps'
locations RELATIVE to the run's folder (`data/relative.py`: one folder spelled two
ways is one location, and moving the whole prefix, e.g. to another folder or a
bucket, leaves the recipe valid: a stopped run resumes there). Only the writer process writes it, atomically, when a
run starts with no checkpoint, before the first checkpoint is saved; deleting
`checkpoints/` removes it with them. A run about to resume from a checkpoint
compares it with its own recipe and refuses with a `StepError` when they differ:
resuming would continue the old recipe's weights and optimizer state, and the
success record would then claim the new config made them.

What may change without refusing: the keys in `FREE_KEYS` (`log_every`,
`checkpoint_every`, `eval_every`), which decide when metrics, checkpoints and
validation losses are written, never what is trained. Everything else counts,
including a default now written out explicitly (the fingerprint counts it too),
`eval_batches` (the run's validation records would average different batches
before and after the resume) and `mesh` (the `capacity` MoE backend buckets tokens
per shard, so the mesh decides which tokens are dropped). `runtime` is not part of
the recipe. Checkpoints with no `recipe.json` written by older code resume unchecked,
as before; today's code also notes each checkpoint's digests beside it, so with those
notes a missing `recipe.json` was deleted, and a resume is refused (`read_recipe`).

`stored_recipe_refusal` says beforehand what a resume would be refused with, when a
finished checkpoint (`checkpoints/<step>/`) is there to resume; planning and `marin
status` predict a stopped run's refusal with it (`job.attempt.refusal_ahead`).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.canonical import canonical_value
from marin_rules.artifacts.drift import MAX_DIFF_LINES, SameNumber, recipe_diff
from marin_rules.artifacts.errors import StepError
from marin_rules.data.relative import relative_location
from marin_rules.steps import BUILTIN_STEPS

RECIPE_FILE = "recipe.json"
FREE_KEYS = BUILTIN_STEPS["train"].progress  # ("log_every", "checkpoint_every", "eval_every")


def _checkpoints(output: str) -> str:
    return storage.join(output, "checkpoints")


def recipe_location(output: str) -> str:
    return storage.join(_checkpoints(output), RECIPE_FILE)


def normalize_location(location: str) -> str:
    """One spelling per place: remote URLs without a trailing '/', local paths absolute."""
    if storage.is_remote(location):
        return location.rstrip("/")
    return os.path.abspath(storage.local_path(location))


def _relative_deps(deps: Mapping[str, Any], output: str) -> dict[str, Any]:
    """Each dep location (or mixture of locations) as seen from `output`; a location
    already relative (a stored recipe) is kept."""

    def rel(location: str) -> str:
        if storage.is_remote(location) or os.path.isabs(storage.local_path(location)) or location.startswith("file:"):
            return relative_location(output, normalize_location(location))
        return location

    located: dict[str, Any] = {}
    for role, value in deps.items():
        if isinstance(value, Mapping):  # a mixture: location -> weight
            located[role] = {rel(loc): weight for loc, weight in value.items()}
        else:
            located[role] = rel(value)
    return located


def make_recipe(config: Mapping[str, Any], deps: Mapping[str, Any], output: str) -> dict[str, Any]:
    """The recipe of the train step writing to `output`: its config and its deps'
    locations relative to `output` (relative deps are taken from the working directory)."""
    located = _relative_deps({r: _absolute(v) for r, v in deps.items()}, output)
    return {"config": canonical_value(config, "config"), "deps": canonical_value(located, "deps")}


def _absolute(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {normalize_location(loc): weight for loc, weight in value.items()}
    return normalize_location(value)


def _binding(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a recipe a resume must keep: all of it but `FREE_KEYS`."""
    config = {k: v for k, v in recipe.get("config", {}).items() if k not in FREE_KEYS}
    return {"config": config, "deps": recipe.get("deps", {})}


def recipe_changes(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Lines `field: old -> new` (config fields bare, deps as `deps.<role>`) that forbid a
    resume; a number spelled another way (`0` for `0.0`) is the same setting and does not."""
    return [line for line in recipe_diff(_binding(stored), _binding(current), values=True)
            if not isinstance(line, SameNumber)]


def record_recipe(output: str, recipe: Mapping[str, Any]) -> None:
    """Write the recipe of a run starting afresh at `output` (writer process only)."""
    storage.write_json_atomic(recipe_location(output), dict(recipe))


def read_recipe(output: str) -> dict[str, Any] | None:
    """The stored recipe of the checkpoints at `output`; None when older code wrote them
    (no `recipe.json`, and none of the digests notes today's code writes beside each
    checkpoint: with those, a missing recipe was deleted, and is refused)."""
    location = recipe_location(output)
    checkpoints = _checkpoints(output)
    if not storage.exists(location):
        if storage.exists(checkpoints) and storage.list_files(checkpoints, f"*{DIGESTS_SUFFIX}"):
            raise StepError(
                f"{location}: missing, though the checkpoints beside it were written by code that records their "
                f"recipe there (they have digests notes): which recipe trained them is unknown; delete {checkpoints} "
                "to start the run over, or force this artifact (snakemake -f on its record) to set them aside"
            )
        return None
    try:
        stored = storage.read_json(location)
    except (ValueError, UnicodeDecodeError) as e:
        raise StepError(
            f"{location}: unreadable ({e}); delete {checkpoints} to start the run over"
        ) from None
    if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict):
        raise StepError(f"{location}: not a recipe; delete {checkpoints} to start the run over")
    return stored


def mismatch_message(output: str, changes: list[str]) -> str:
    """One line naming the changed fields and the three ways out: a new version, forcing
    the artifact (`snakemake -f` on its record, which `marin path KEY` prints: the
    checkpoints go to `.history/` and the new recipe trains afresh; the job does not know
    the run's flags, so no command line is spelled out), or deleting the checkpoints."""
    shown = changes[:MAX_DIFF_LINES]
    if len(changes) > MAX_DIFF_LINES:
        shown.append(f"...and {len(changes) - MAX_DIFF_LINES} more")
    field = "config" if any(not line.startswith("deps") for line in changes) else "deps"
    checkpoints = _checkpoints(output)
    return (
        f"{field}: the checkpoints in {output} were written by another recipe ({'; '.join(shown)}); "
        f"bump the version to train the new recipe, force this artifact (snakemake -f on its record, as "
        f"marin path prints it) to set them aside and train afresh, or delete {checkpoints} to start over"
    )


def check_recipe(output: str, recipe: Mapping[str, Any]) -> None:
    """Raise StepError if the checkpoints at `output` belong to a recipe other than `recipe`."""
    stored = read_recipe(output)
    if stored is None:
        return
    # older code stored absolute locations: compare them as seen from `output` too
    stored = {**stored, "deps": _relative_deps(stored.get("deps", {}), output)}
    changes = recipe_changes(stored, recipe)
    if changes:
        raise StepError(mismatch_message(output, changes))


def claim_checkpoints(output: str, recipe: Mapping[str, Any], *, resuming: bool, writer: bool) -> None:
    """Before training: check the recipe of the checkpoints resumed from, or record
    ours when starting afresh (the writer only; the others just train)."""
    if resuming:
        check_recipe(output, recipe)
    elif writer:
        record_recipe(output, recipe)


def stored_recipe_refusal(output: str, recipe: Mapping[str, Any]) -> str | None:
    """The message a job resuming the checkpoints at `output` with `recipe` would refuse
    with (`check_recipe`: another recipe, or an unreadable `recipe.json`), when there is
    a finished checkpoint to resume; else None. Reads `recipe.json` first (one request
    on gs://) and lists the checkpoints only when it differs."""
    try:
        stored = read_recipe(output)
    except StepError as e:  # unreadable: the job refuses with this line when it resumes
        message: str | None = str(e)
    else:
        if stored is None:
            return None
        stored = {**stored, "deps": _relative_deps(stored.get("deps", {}), output)}  # as `check_recipe`
        changes = recipe_changes(stored, recipe)
        message = mismatch_message(output, changes) if changes else None
    return message if message is not None and _has_checkpoint(output) else None


COMMIT_NOTE = "commit_success.txt"  # orbax ends every finished checkpoint (and item) with this file (`checkpoint.py`)
DIGESTS_SUFFIX = ".digests.json"  # `checkpoints/<step>.digests.json`: each checkpoint's digests (`checkpoint.py`)


def _has_checkpoint(output: str) -> bool:
    return resumable_step(output) is not None


def resumable_step(output: str) -> int | None:
    """The step of the newest checkpoint a stopped run would resume from: a
    `checkpoints/<step>/` folder (orbax renames a finished one into place; on gs:// one
    with its commit note); None when there is none."""
    checkpoints = _checkpoints(output)
    named = [(loc.rstrip("/").rsplit("/", 1)[-1], loc) for loc in storage.list_files(checkpoints)]
    remote = storage.is_remote(output)
    for step, loc in sorted(((int(n), loc) for n, loc in named if n.isdigit()), reverse=True):
        finished = storage.exists(storage.join(loc, COMMIT_NOTE)) if remote else os.path.isdir(storage.local_path(loc))
        if finished:
            return step
    return None
