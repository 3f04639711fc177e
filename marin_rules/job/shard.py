"""A shard job: one shard of a sharded step (`--shard kkkkk-of-nnnnn`).

Model: as the artifact's own job (`main.build`), under a lease, but on the shard's
folder `{location}/shards/{shard}/` (`marin_rules.artifacts.shards`): a live holder
(another run building this shard) is waited for, a finished shard is served (its
record mirrored for Snakemake on a remote prefix) and never built again, unless it
was made from other upstream builds than today's (an upstream rebuilt since: it is
set aside under `.history/<time>-stale/`, a dev version's deleted, and built anew). Upstreams
are checked, then the step's shard function runs; its shard record is written last,
only while the lease is still held. A failure writes the artifact's failure record
naming the shard. Nothing here writes the artifact's success record: the gather does.
A shard job of an artifact whose build this run keeps (`kept_build`) changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from marin_rules.artifacts import storage
from marin_rules.artifacts.shards import (
    SHARD_RECORD,
    Shard,
    parse_shard,
    read_shard_record,
    shard_change,
    shard_count,
    write_shard_record,
)


def build_shard(artifact: Any, experiment: Any, location: str, args: argparse.Namespace) -> int:
    from marin_rules.artifacts.errors import StepError
    from marin_rules.artifacts.files import remove_interrupted_writes, removed_writes_phrase
    from marin_rules.job.context import upstream_builds
    from marin_rules.job.main import DISCARDED, kept_or_discarded, lease_or_failure, record_lost_attempt, tell
    from marin_rules.workflow.forcing import set_aside

    shard = parse_shard(args.shard)
    if shard.count != shard_count(artifact.runtime):
        raise StepError(
            f"{artifact.key}: runtime.shards is {shard_count(artifact.runtime)}, but this job is shard {shard.name}: "
            "the experiment changed since the run was planned; run snakemake again"
        )
    if kept_build(location):
        if not storage.exists(storage.join(shard.location(location), SHARD_RECORD)):  # built with another count
            raise StepError(
                f"{artifact.key}: shard {shard.name}: the artifact is built, with no such shard (runtime.shards "
                "changed since?), and this run keeps that build: its own job is not in this run; force it without "
                "--until/--omit-from to rebuild it with today's count"
            )
        tell(f"{artifact.key}: it is built, and this run does not rebuild it (its own job is not in this run, or "
             f"another run built it meanwhile); shard {shard.name} is left as that build has it")  # fmt: skip
        _mirror_shard(location, shard, artifact, args)
        return 0
    upstreams = upstream_builds(artifact, experiment, args.prefix)  # None: one unreadable (the step refuses it)

    def made_from(record: dict[str, Any] | None) -> str | None:
        """How a finished shard was made otherwise than today's recipe and upstream builds (None: the same)."""
        return None if record is None else shard_change(record, artifact.fingerprint, upstreams)

    def is_done() -> bool:
        record = read_shard_record(location, shard)  # any recipe's: another one is set aside below
        return record is not None and made_from(record) is None

    held = lease_or_failure(artifact, experiment, location, args, is_done, shard.location(location),
                            f"shard {shard.name}", shard)  # fmt: skip
    if held is None:
        tell(f"{artifact.key}: shard {shard.name} is built already; serving it")
        _mirror_shard(location, shard, artifact, args)
        return 0
    try:
        if held.taken_over is not None:  # its last attempt left its lease: killed outright
            record_lost_attempt(artifact, experiment, location, args, held.taken_over, shard)
        left = remove_interrupted_writes(location, shard.folder)  # a killed attempt's half-written files
        if left:
            print(f"{artifact.key}: shard {shard.name}: {removed_writes_phrase(left)}", file=sys.stderr, flush=True)
        how = made_from(read_shard_record(location, shard))
        if how is not None:
            left = kept_or_discarded(artifact, set_aside(location, "stale", shard.folder))
            where = left if left == DISCARDED else f"moved to {left}"
            print(f"{artifact.key}: shard {shard.name} {how}; "
                  f"{where}, building it again", file=sys.stderr, flush=True)  # fmt: skip
        return _run_shard(artifact, experiment, location, shard, args, held)
    finally:
        held.release()


def _run_shard(artifact: Any, experiment: Any, location: str, shard: Shard, args: argparse.Namespace, held: Any) -> int:
    from marin_rules.job.context import check_upstreams, check_upstreams_unchanged, job_context
    from marin_rules.job.main import rerun_hint
    from marin_rules.job.run import run_step
    from marin_rules.steps import shard_function

    ctx, entry, provenance, deps_record = job_context(artifact, experiment, location, args)
    entry = {**entry, "shard": {"index": shard.index, "count": shard.count}}

    def step(c: Any) -> Any:
        check_upstreams(artifact, experiment, args.prefix, deps_record, rerun_hint(args))
        result = shard_function(artifact.step)(c, shard)
        check_upstreams_unchanged(artifact, experiment, args.prefix, deps_record)
        return result

    def write(result: Any, provenance_dict: dict) -> Any:
        return write_shard_record(location, shard, entry, result, provenance_dict)

    run_step(ctx, entry, provenance, step, None, held.still_held, write=write, hint_flags=rerun_hint(args))
    print(f"{artifact.key}: shard {shard.name} done", flush=True)
    _mirror_shard(location, shard, artifact, args)
    return 0


def kept_build(location: str) -> bool:
    """Is the artifact at `location` built (its record there, no rebuild pointer)? Every
    run that rebuilds a sharded artifact moves its build aside before any shard job
    (`workflow.forcing.retire_now`), so a shard job that finds one runs because
    Snakemake forced it while leaving the artifact's own job out (`-R` of an upstream
    with `--until {step}_shard`; the cascade it owes is marked for the next run): it
    must not change the shards that build's record and index describe."""
    from marin_rules.artifacts.identity import RECORD_FILE
    from marin_rules.workflow.forcing import rebuilding_pointer

    return storage.exists(storage.join(location, RECORD_FILE)) and not storage.exists(rebuilding_pointer(location))


def _mirror_shard(location: str, shard: Shard, artifact: Any, args: argparse.Namespace) -> None:
    """On a remote prefix, the shard record where Snakemake looks for it (the mirror)."""
    if args.records and args.records != args.prefix:
        data = storage.read_bytes(storage.join(shard.location(location), SHARD_RECORD))
        storage.write_bytes_atomic(f"{args.records}/{artifact.id.path}/{shard.folder}/{SHARD_RECORD}", data)

