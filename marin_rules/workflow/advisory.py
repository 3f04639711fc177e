"""Drift and upstream advisories, printed by the main process while planning.

Model: for a finished artifact that is not being rebuilt, compare its record with the
recipe now. A different fingerprint, or recorded step, config or deps that differ from
the recipe's (a record edited by hand: `records.recipe_drift`), is recipe drift: a
warning with the field-level diff (the cached output is served), or an error when the
artifact pins its fingerprint (`expect_fingerprint:`) and the record disagrees. An upstream rebuilt since (another
fingerprint, or the same recipe built at another time) gets one advisory line. Each
artifact is reported at most once per invocation, on stderr (so `--dag | dot` stays
clean), in dry runs, `--dag`, `--rulegraph` and real runs alike. Step code changed
since the build (`marin_rules.artifacts.code`: the record's `provenance.code.hash`
against the code now) gets one advisory line too; nothing is rebuilt for it.

The priced plan (`marin_rules.inspect.plan.plan_lines`) of the training jobs that will
run (missing, failed or forced, as the input functions saw them) is printed once on
stderr by the main process: from `onstart:` in real runs, at exit in dry runs (where
`onstart:` does not run); `--dag`, `--rulegraph` and runs with nothing to train print none.
"""

from __future__ import annotations

import sys
from typing import Callable

from marin_rules.artifacts import builds
from marin_rules.artifacts.builds import build_of
from marin_rules.artifacts.code import change_message, code_change
from marin_rules.artifacts.drift import drift_message, printable
from marin_rules.artifacts.errors import DriftError, MarinError
from marin_rules.artifacts.records import Record, edited_note, recipe_drift
from marin_rules.experiment import Artifact, Experiment


def report(
    artifact: Artifact, record: Record, recorded: Callable[[str], Record | None], rebuild_hint: str
) -> None:
    """Print drift and upstream advisories for one finished, unforced artifact; raise
    DriftError on pinned drift. `recorded(key)` reads an upstream's record. Drift is
    judged by the record's fingerprint and by its own recipe fields (`recipe_drift`):
    a record edited by hand is drift too, and says so (`edited_note`)."""
    data = record.to_json()
    lines = recipe_drift(data, artifact.payload(), artifact.fingerprint)
    if lines is not None:
        note = edited_note(data)
        lines = lines + ([note] if note else [])
        if artifact.expect_fingerprint is not None:
            first = f" ({lines[0]})" if lines else ""
            raise DriftError(
                f"{artifact.key}: recipe drift on a pinned artifact: recorded fingerprint {printable(record.fingerprint)}, "
                f"pinned {artifact.expect_fingerprint}{first}; restore the recipe that was built, or bump the version"
            )
        print(drift_message(artifact.key, record.fingerprint, artifact.fingerprint, lines), file=sys.stderr)
    change = code_change(artifact.step, record.provenance)
    if change is not None:
        print(printable(change_message(artifact.key, change, rebuild_hint)), file=sys.stderr)
    for upstream, how in rebuilt_upstreams(artifact, record, recorded):
        print(
            f"{artifact.key}: upstream {upstream} was rebuilt since this artifact was built "
            f"({how}); serving the cached output (--forcerun {rebuild_hint} rebuilds it).",
            file=sys.stderr,
        )


def rebuilt_upstreams(
    artifact: Artifact, record: Record, recorded: Callable[[str], Record | None]
) -> list[tuple[str, str]]:
    """(upstream key, how it differs) for each upstream whose record now is not the one
    `record` was built on (`builds.rebuilt_upstreams`): another fingerprint, or the same
    recipe built at another time."""
    now = {}
    for upstream in artifact.upstream_keys():
        current = recorded(upstream)
        now[upstream] = None if current is None else build_of(current)
    return builds.rebuilt_upstreams(record.deps, now)


def print_plan(experiment: Experiment, prefix: str, keys: list[str]) -> None:
    """The priced plan of the training jobs `keys` on stderr (nothing when none)."""
    if not keys:
        return
    from marin_rules.inspect.plan import plan_lines

    try:
        lines = plan_lines(experiment, prefix, keys)
    except (MarinError, ValueError, KeyError) as e:  # pricing is advice: never stop a run for it
        lines = [f"plan: not priced ({type(e).__name__}: {e})"]
    print("\n".join(lines), file=sys.stderr, flush=True)
