"""What a job calls its step with, and the check of its upstreams.

Model: the step gets a `StepContext` (config, the upstreams' data locations by role,
runtime, the artifact's location), the record gets the entry (identity, recipe, deps
as `name/version` with the upstream fingerprints seen) and the `Provenance` (the code
the step ran, who, where, the user's command line). Before the step runs, every
upstream's record and files are verified (`check_upstreams`); after it, each upstream
must still be the build seen then (`check_upstreams_unchanged`): another run that
force-rebuilds an upstream meanwhile moves its files away and writes new ones, so the
step may have read neither build.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.identity import RECORD_FILE, artifact_location
from marin_rules.artifacts.builds import build_of, builds_in_deps, upstream_change
from marin_rules.artifacts.records import Provenance, read_record, rebuild_hint, verify_files


def job_context(artifact: Any, experiment: Any, location: str, args: argparse.Namespace) -> tuple:
    """What a step is called with: (StepContext, record entry, Provenance, deps as recorded)."""
    from marin_rules.adopt import data_location
    from marin_rules.cluster.pod import pod_process_from_env

    deps_ctx: dict[str, Any] = {}
    deps_record: dict[str, Any] = {}
    for role, dep in artifact.deps.items():
        if isinstance(dep, str):
            deps_ctx[role] = data_location(args.prefix, experiment[dep])
            deps_record[role] = _dep_name(experiment, dep)
        else:
            deps_ctx[role] = {data_location(args.prefix, experiment[k]): w for k, w in dep.items()}
            deps_record[role] = [{**_dep_name(experiment, k), "weight": w} for k, w in dep.items()]
    entry = {
        "name": artifact.id.name, "version": artifact.id.version, "step": artifact.step,
        "fingerprint": artifact.fingerprint, "config": artifact.config, "deps": deps_record,
        "runtime": artifact.runtime, "path": f"{artifact.id.name}/{artifact.id.version}",
    }  # fmt: skip
    runtime = dict(artifact.runtime)
    pod = pod_process_from_env(os.environ)
    if pod is not None:
        runtime["distributed"] = pod.runtime_distributed()
    ctx = StepContext(name=artifact.id.name, version=artifact.id.version, config=artifact.config,
                      deps=deps_ctx, runtime=runtime, output=location)  # fmt: skip
    command = shlex.split(args.command) if args.command else []
    from marin_rules.artifacts.code import step_code  # read before the step runs: the code it ran

    code = (("code", step_code(artifact.step)),)
    provenance = Provenance(args.workflow_dir, command, args.rule, _jobid(args.jobid), code)
    return ctx, entry, provenance, deps_record


def _dep_name(experiment: Any, key: str) -> dict[str, Any]:
    upstream = experiment[key].id
    return {"name": upstream.name, "version": upstream.version, "path": upstream.path}


def check_upstreams(artifact: Any, experiment: Any, prefix: str, deps_record: dict, hint_flags: str = "") -> None:
    """Every upstream is built and complete: its record valid, its files there with their
    sizes (data adopted in place: its source as adopted). Records what was seen
    (fingerprint, build time) into `deps_record`. `hint_flags`: the rest of the rebuild
    command a refusal suggests (`workflow.options.rerun_flags`)."""
    from marin_rules.adopt import served_source, source_changed, source_problems

    seen = {}
    for key in artifact.upstream_keys():
        upstream = experiment[key]
        location = artifact_location(prefix, upstream.id)
        try:
            record = read_record(location, upstream.id)
        except MarinError as e:  # a corrupt record's rebuild command runs as printed
            raise e.with_flags(hint_flags) from None
        how = rebuild_hint(location, hint_flags)
        if record is None:
            raise MarinError(f"{artifact.key}: upstream {key} has no success record at {location}; "
                             f"{_being_rebuilt(location) or how}")  # fmt: skip
        problems = verify_files(location, record)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise MarinError(f"{artifact.key}: upstream {key}: {problems[0]}{more}; {_being_rebuilt(location) or how}")
        changed = source_problems(upstream, record)
        if changed:  # rebuilding would adopt the changed data under the same version: not the fix
            source = served_source(upstream, record)
            raise MarinError(f"{artifact.key}: upstream {key}: {source_changed(source, changed, consumer=True)}")
        seen[key] = build_of(record)
    for dep in deps_record.values():
        for d in dep if isinstance(dep, list) else [dep]:
            d.update(seen[f"{d['name']}@{d['version']}"])


def _being_rebuilt(location: str) -> str | None:
    """What to do about an upstream found unbuilt or incomplete while another run holds
    its live lease: it is building it (a forced rebuild moves the old build aside, on a
    bucket object by object, record last), so wait for that run, not rebuild it; None
    when no live holder is there (or its lease cannot be read)."""
    from marin_rules.artifacts.lease import held_live, read_lease

    try:
        holder = read_lease(location)
    except (MarinError, OSError, ValueError):
        return None
    if not held_live(holder):
        return None
    return (f"another run is building it now (lease held by {holder.describe()}): run snakemake again once that "
            "run has finished, and this step reads its build")  # fmt: skip


def check_upstreams_unchanged(artifact: Any, experiment: Any, prefix: str, deps_record: dict) -> None:
    """After the step: every upstream is still the build `check_upstreams` saw before
    it (its record unchanged), else a MarinError: no success is recorded for what the
    step made, which stays in place (the next run sets it aside and builds again). A
    record that cannot be read now for want of the storage (the network) is not taken
    for a rebuild: the check is skipped, with a note, rather than fail a finished step."""
    if not artifact.upstream_keys():
        return
    try:
        now = {key: _build_now(prefix, experiment[key]) for key in artifact.upstream_keys()}
    except MarinError:
        raise  # a record corrupted meanwhile: it says which, and how to rebuild it
    except Exception as e:  # noqa: BLE001 - the storage's errors (OSError, google.api_core's)
        print(f"{artifact.key}: note: could not check that the upstreams are unchanged after the step "
              f"({type(e).__name__}: {e}); recording success", file=sys.stderr)  # fmt: skip
        return
    change = upstream_change(builds_in_deps(deps_record), now)
    if change is not None:
        raise MarinError(
            f"{artifact.key}: {change}: another run rebuilt it while this step was reading it, so what the "
            "step read may be neither build; no success is recorded: run snakemake again once that rebuild "
            "has finished"
        )


def upstream_builds(artifact: Any, experiment: Any, prefix: str) -> dict[str, dict[str, Any]] | None:
    """Each upstream's build now (`build_of`), by key; None when one has no readable
    record (`check_upstreams` refuses it, with a failure record, when the step starts)."""
    builds = {}
    for key in artifact.upstream_keys():
        try:
            build = _build_now(prefix, experiment[key])
        except MarinError:
            return None
        if build is None:
            return None
        builds[key] = build
    return builds


def _build_now(prefix: str, upstream: Any) -> dict[str, Any] | None:
    """An upstream artifact's build now (`build_of` its record); None without a record.
    Raises CorruptRecord for a record that cannot be trusted."""
    record = read_record(artifact_location(prefix, upstream.id), upstream.id)
    return None if record is None else build_of(record)


def _jobid(text: str | None) -> int | str | None:
    return int(text) if text and text.isdigit() else text
