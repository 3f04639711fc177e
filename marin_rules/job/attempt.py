"""What an unfinished build left is resumed only when it was made from the same recipe and upstream builds.

Model: before a job builds an artifact (process 0 of a pod, under the lease, after a
forced build's old one moved away; not data adopted in place, whose folder holds only
its record) it writes `{location}/.attempt.json`: the recipe's fingerprint and each
upstream's build (`{key: {fingerprint, built}}`, as the record's deps name them; `{}`
without upstreams). A later job that finds data an earlier attempt left but no success
record (a stopped or failed run, or records deleted by `snakemake
--delete-all-output`) resumes from it (checkpoints, partial files) only when that
attempt had the same fingerprint and saw the same upstream builds. When the recipe
changed since (no record, so no drift check stood in the way) or an upstream was
rebuilt since, what is there was made from something else: it moves whole to
`.history/<UTC time>-stale/` and the build starts from an empty folder, so nothing
inconsistent is resumed or recorded and nothing is lost (a dev version's are then
deleted: it keeps no history, `main.kept_or_discarded`). An attempt file that cannot
be read counts as another recipe. Either way the temporary files of atomic writes a
killed attempt left (`files.remove_interrupted_writes`) are removed first: never data. Leftovers without an attempt file (made before it
existed) are resumed as before.

Steps that judge their own leftovers' recipe keep that judgement (`steps.py: BuiltinStep.own_recipe`):
training compares its checkpoints' `recipe.json` with the new config, refuses a
changed one naming the field (its checkpoints may be days of work: the user chooses to
bump the version or delete them), and resumes when only `log_every`,
`checkpoint_every` or `eval_every` changed, which the fingerprint counts; planning and
`marin status` predict that refusal with `refusal_ahead` (the recipe the job would
compare, `job_recipe`, against its checkpoints', unless `begin` sets them aside first). Sharded
steps never come here: each shard's record carries their own checks (a shard of
another recipe is refused, one of other upstream builds set aside:
`marin_rules.artifacts.shards`).
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.builds import upstream_change
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.provenance import iso, utc_now
from marin_rules.artifacts.files import ATTEMPT_FILE, list_data_files, remove_interrupted_writes, removed_writes_phrase
from marin_rules.steps import OWN_RECIPE_STEPS
from marin_rules.train.recipe import make_recipe, stored_recipe_refusal  # (no JAX)


def begin(location: str, fingerprint: str, upstreams: Mapping[str, Any], step: str) -> tuple[str, str] | None:
    """Record this attempt of the artifact at `location` (built by `step`: those in
    `OWN_RECIPE_STEPS` judge a changed recipe themselves); first set aside leftovers of one
    made from another recipe or other upstream builds. Returns (where they went, why: a phrase that follows "what an
    earlier attempt left") when it set them aside."""
    from marin_rules.workflow.forcing import set_aside

    left = remove_interrupted_writes(location)
    if left:
        print(f"{location}: {removed_writes_phrase(left)}", file=sys.stderr, flush=True)
    path = storage.join(location, ATTEMPT_FILE)
    previous = _read(path)
    why = None if previous is None else _differs(previous, step, fingerprint, upstreams)
    moved = (set_aside(location, "stale"), why) if why is not None and list_data_files(location) else None
    started = iso(utc_now())  # (`marin status`: an attempt begun after the last failure record, none since)
    storage.write_json_atomic(path, {"fingerprint": fingerprint, "upstreams": dict(upstreams), "started": started})
    return moved


def _differs(previous: dict[str, Any], step: str, fingerprint: str, upstreams: Mapping[str, Any]) -> str | None:
    """How the attempt recorded in `previous` differs from this one (a phrase), or None."""
    if previous is UNREADABLE:
        return "is of unknown origin (its .attempt.json is unreadable)"
    if step not in OWN_RECIPE_STEPS and previous["fingerprint"] != fingerprint:  # read from a file: shown printable
        return printable(f"was made from another recipe (changed since that attempt: fingerprint "
                         f"{previous['fingerprint']} then, {fingerprint} now)")  # fmt: skip
    how = upstream_change(previous["upstreams"], upstreams)
    return None if how is None else f"was made from other upstream builds ({how})"


def job_recipe(artifact: Any, experiment: Any, prefix: str, output: str) -> dict[str, Any]:
    """The recipe the train job of `artifact` at `output` compares with its checkpoints':
    `recipe.make_recipe` of its config and the deps the job hands its step
    (`job.context.job_context`: each upstream's `adopt.data_location` on `prefix`, data
    adopted in place at its source)."""
    from marin_rules.adopt import data_location

    deps: dict[str, Any] = {}
    for role, dep in artifact.deps.items():
        if isinstance(dep, str):
            deps[role] = data_location(prefix, experiment[dep])
        else:
            deps[role] = {data_location(prefix, experiment[key]): weight for key, weight in dep.items()}
    return make_recipe(artifact.config, deps, output)


def refusal_ahead(output: str, recipe: Mapping[str, Any], upstreams: Mapping[str, Any] | None) -> str | None:
    """The message the next job of the unbuilt, unforced train artifact at `output` will
    refuse to resume with (its checkpoints hold another recipe than `recipe`, `job_recipe`:
    `recipe.stored_recipe_refusal`), for planning and `marin status`; None when it will
    resume or start afresh: also when `begin` sets the leftovers aside first (an attempt
    on other upstream builds than `upstreams`, each upstream's build now) or an upstream
    is unbuilt (`upstreams` None: it is built first, so they would be)."""
    message = stored_recipe_refusal(output, recipe)
    if message is None or upstreams is None or _sets_aside(output, "train", upstreams):
        return None
    return message


def resumes(output: str, recipe: Mapping[str, Any], upstreams: Mapping[str, Any] | None) -> bool:
    """Will the next job of the unbuilt, unforced train artifact at `output` resume from
    its checkpoints (for pricing what is left): its recipe is theirs (no refusal ahead),
    and `begin` keeps them (the attempt saw today's upstream builds, all built)."""
    return (
        stored_recipe_refusal(output, recipe) is None
        and upstreams is not None
        and not _sets_aside(output, "train", upstreams)
    )


def _sets_aside(location: str, step: str, upstreams: Mapping[str, Any]) -> bool:
    """Would `begin` move what an earlier attempt left at `location` aside because that
    attempt saw other upstream builds (or its file is unreadable)?"""
    previous = _read(storage.join(location, ATTEMPT_FILE))
    return previous is not None and _differs(previous, step, "", upstreams) is not None


def sets_aside_why(location: str, step: str, fingerprint: str, upstreams: Mapping[str, Any]) -> str | None:
    """Why `begin` will move what an earlier attempt left at `location` aside (the phrase
    that follows "what the last attempt left"), for `marin status`; None when it keeps it
    (or nothing is there)."""
    previous = _read(storage.join(location, ATTEMPT_FILE))
    if previous is None or not list_data_files(location):
        return None
    return _differs(previous, step, fingerprint, upstreams)


UNREADABLE: dict[str, Any] = {}  # an attempt file that cannot be read: its leftovers are never trusted


def _read(path: str) -> dict[str, Any] | None:
    try:
        data = storage.read_json(path)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return UNREADABLE
    ok = isinstance(data, dict) and isinstance(data.get("fingerprint"), str) and isinstance(data.get("upstreams"), dict)
    return data if ok else UNREADABLE
