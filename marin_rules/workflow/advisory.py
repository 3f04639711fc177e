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

An unbuilt train artifact that is not forced, whose stopped run left checkpoints of
another recipe (changed without a version bump), gets one line saying that its job will
refuse to resume, with the fields and the fix (`refusal_warning`: the job's own message,
`job.attempt.refusal_ahead`), so `-n` shows what the job would stop on.

The priced plan (`marin_rules.inspect.plan.plan_lines`) of the training jobs that will
run (missing, failed or forced, as the input functions saw them) is printed once on
stderr by the main process: from `onstart:` in real runs, at exit in dry runs (where
`onstart:` does not run); `--dag`, `--rulegraph` and runs with nothing to train print none.

What the semantics need from Snakemake's own settings (`profiles/default`: only a missing
record builds; a failed job never deletes a record another run wrote) is applied by the
workflow profile, which Snakemake finds beside the main Snakefile or in the working
directory only: a user's Snakefile that includes ours, or uses it as a `module`, runs
without it. The main process then refuses, while planning, a rerun-triggers other than
mtime (`triggers_refusal`: Snakemake would leave requested artifacts unbuilt), and says
once which other keys are missing and how to add them (`settings_warning`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from marin_rules.artifacts import builds
from marin_rules.artifacts.builds import build_of, upstream_builds
from marin_rules.artifacts.code import change_message, code_change
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.records import Record, drift_warning
from marin_rules.experiment import Artifact, Experiment


def report(
    artifact: Artifact, record: Record, recorded: Callable[[str], Record | None], rebuild_hint: str
) -> None:
    """Print drift and upstream advisories for one finished, unforced artifact; raise
    DriftError on pinned drift. `recorded(key)` reads an upstream's record. Drift is
    judged by the record's fingerprint and by its own recipe fields (`recipe_drift`):
    a record edited by hand is drift too, and says so (`edited_note`)."""
    notice = drift_warning(record, artifact)  # raises DriftError on pinned drift
    if notice is not None:
        print(notice, file=sys.stderr)
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


def refusal_warning(
    artifact: Artifact, experiment: Experiment, prefix: str, recorded: Callable[[str], Record | None]
) -> str | None:
    """The line for an unbuilt, unforced train artifact whose next job will refuse to
    resume its checkpoints (another recipe: `attempt.refusal_ahead`), else None: also
    while another run holds its live lease (this run's job would wait and serve that
    build, as `marin status` says); never raises for what it cannot read (advice: the
    job says it anyway)."""
    from marin_rules.artifacts.identity import artifact_location
    from marin_rules.artifacts.lease import held_live, read_lease
    from marin_rules.job.attempt import job_recipe, refusal_ahead

    if artifact.step != "train":
        return None
    upstreams = upstream_builds(artifact.upstream_keys(), recorded)
    output = artifact_location(prefix, artifact.id)
    try:
        if held_live(read_lease(output)):
            return None  # another run builds it now: this run's job waits, then serves that build
        message = refusal_ahead(output, job_recipe(artifact, experiment, prefix, output), upstreams)
    except (MarinError, OSError, ValueError):
        return None
    return None if message is None else printable(f"{artifact.key}: its job will refuse to resume: {message}")


def print_plan(experiment: Experiment, prefix: str, keys: list[str], forced: Iterable[str] = ()) -> None:
    """The priced plan of the training jobs `keys` (`forced`: those that start over) on
    stderr (nothing when none)."""
    if not keys:
        return
    from marin_rules.inspect.plan import plan_lines

    try:
        lines = plan_lines(experiment, prefix, keys, forced=forced)
    except (MarinError, ValueError, KeyError) as e:  # pricing is advice: never stop a run for it
        lines = [f"plan: not priced ({type(e).__name__}: {e})"]
    print("\n".join(lines), file=sys.stderr, flush=True)


PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "default"  # the workflow profile beside our Snakefile


NEEDED = {"rerun-triggers": "mtime", "keep-incomplete": "true", "ignore-incomplete": "true"}  # profiles/default


def missing_settings(workflow: Any) -> list[tuple[str, str]]:
    """The keys of `profiles/default` that marin-rules' semantics need (`NEEDED`) and
    this invocation's settings (`workflow.dag_settings`, `workflow.execution_settings`,
    set once the Snakefile is parsed) set otherwise, each with its value here:
    `("rerun-triggers", "input")`; [] when all are there."""
    from snakemake.settings.enums import RerunTrigger

    missing = []
    dag = getattr(workflow, "dag_settings", None)
    if dag is not None and set(dag.rerun_triggers or ()) != {RerunTrigger.MTIME}:
        triggers = sorted(dag.rerun_triggers or (), key=lambda t: t.value)
        missing.append(("rerun-triggers", " ".join(t.item_to_choice() for t in triggers) or "none"))
    execution = getattr(workflow, "execution_settings", None)
    for key in ("keep_incomplete", "ignore_incomplete"):
        if execution is not None and not getattr(execution, key, False):
            missing.append((key.replace("_", "-"), "false"))
    return missing


def triggers_refusal(missing: list[tuple[str, str]]) -> str | None:
    """The refusal of a rerun-triggers other than mtime alone among the `missing_settings`
    (None when it is mtime). Every edge between our rules is `ancient()` and our rules'
    params differ from run to run (the command line, the job registry), and Snakemake
    (9.27) leaves out a job whose ancient input's producer must run again for a params
    or code change: a missing artifact after a built one was never built, while the run
    ended "100% done". Names the fix: the workflow profile where it was not applied
    (`keep-incomplete` missing too, or Snakemake's default triggers), else the override."""
    from snakemake.settings.enums import RerunTrigger

    value = dict(missing).get("rerun-triggers")
    if value is None:
        return None
    where = str(PROFILE) if PROFILE.is_dir() else "marin-rules' profiles/default"
    harm = (f"rerun-triggers is {value} here, but marin-rules needs mtime alone: with other triggers Snakemake "
            "runs finished artifacts' jobs again (for their params, code or inputs) and leaves out the jobs after "
            "them, so an artifact downstream of a built one is never built")  # fmt: skip
    snakemakes_default = " ".join(sorted(t.item_to_choice() for t in RerunTrigger.all()))
    applied = len(missing) == 1 and " ".join(sorted(value.split())) != snakemakes_default
    if applied:  # the profile's other keys are there: the command line or another profile overrides it
        return f"{harm}; drop that setting (the workflow profile {where} sets mtime), or set it to mtime"
    return f"{harm}; add --workflow-profile {where} (or --rerun-triggers mtime)"


def settings_warning(missing: list[tuple[str, str]]) -> str:
    """One line naming the `missing_settings` other than rerun-triggers (refused by
    `triggers_refusal`): `keep-incomplete`/`ignore-incomplete`, which only the workflow
    profile sets here (a user's Snakefile using ours runs without it), and the fix."""
    where = str(PROFILE) if PROFILE.is_dir() else "marin-rules' profiles/default"
    return (
        f"marin-rules: warning: this run lacks settings of marin-rules' workflow profile "
        f"({'; '.join(f'{key}: {NEEDED[key]}' for key, _ in missing)}): a failed job may delete a record another "
        f"run on the prefix just wrote; add --workflow-profile {where}, or copy those keys into your own profile"
    )
