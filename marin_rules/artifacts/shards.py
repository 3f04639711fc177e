"""Shards: one artifact built by several jobs, then gathered.

Model: a sharded step (`tokenize`, `dedup`) cuts its input into `count` contiguous
ranges of documents, given by the artifact's `runtime.shards` (an execution choice:
the gathered result does not depend on it, so it is not in the fingerprint). Shard
`k` of `count` is one job writing under `{location}/shards/{kkkkk}-of-{nnnnn}/` and,
last, its shard record `shard.json` there (identity, fingerprint, the shard's result,
its files, the upstream builds it was made from, provenance); its existence means the
shard is whole. A shard folder has its own lease, so two runs on one prefix build each
shard once, and a finished shard is never built again unless it was made otherwise
than today's build would be (`shard_change`: an upstream rebuilt since; its job then
sets it aside under `.history/` and builds it anew). Only a shard's own job, holding
that shard's lease, moves one shard: another job of the current recipe may be writing
any other, so nothing moves the whole `shards/` folder but a forced build (which first
refuses while any shard's lease is live). A shard of another recipe (changed without a
version bump while the artifact was unfinished) is refused where a reader passes the
artifact's fingerprint (`OtherRecipeShard`), naming that forced build. The gather job
(the artifact's own job) reads every shard record of the current count, refusing a
missing one or one of another recipe, and writes the artifact's success record: once,
last, and only when every shard is done. Shard folders of another count (the user
changed `runtime.shards` between attempts) are set aside by the gather before it lists
the artifact's files, each under its own lease, to `.history/<UTC time>-stale/shards/`
as other leftovers are (kept, never gathered), with one line in the job's log
(`set_aside_other_counts`); one another run is building is refused. (A dev version,
which keeps no history, never has them here: each of its runs sets its whole old build
aside, and deletes it, before its shard jobs run.)
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.builds import builds_in_deps, upstream_change
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import HISTORY_DIR, history_stamp
from marin_rules.artifacts.records import rebuild_hint

SHARDS_DIR = "shards"
SHARD_RECORD = "shard.json"
SHARD_NAME = re.compile(r"(\d{5})-of-(\d{5})")
MAX_SHARDS = 99999


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @property
    def name(self) -> str:
        return f"{self.index:05d}-of-{self.count:05d}"

    @property
    def folder(self) -> str:
        """Relative to the artifact's folder."""
        return f"{SHARDS_DIR}/{self.name}"

    def location(self, artifact_location: str) -> str:
        return storage.join(artifact_location, self.folder)

    def document_range(self, documents: int) -> range:
        """This shard's contiguous share of `documents` (sizes differ by at most one)."""
        return range(self.index * documents // self.count, (self.index + 1) * documents // self.count)


def parse_shard(text: str) -> Shard:
    """`00001-of-00004` -> Shard(1, 4)."""
    found = SHARD_NAME.fullmatch(text)
    if not found or not int(found.group(1)) < int(found.group(2)):
        raise StepError(f"--shard {text}: expected kkkkk-of-nnnnn with k < n, e.g. 00001-of-00004")
    return Shard(int(found.group(1)), int(found.group(2)))


def all_shards(count: int) -> list[Shard]:
    return [Shard(k, count) for k in range(count)]


def shard_count(runtime: Mapping[str, Any]) -> int:
    """How many shard jobs an artifact's build takes (`runtime.shards`, default 1)."""
    return int(runtime.get("shards") or 1)


def shard_record_location(artifact_location: str, shard: Shard) -> str:
    return storage.join(shard.location(artifact_location), SHARD_RECORD)


def write_shard_record(artifact_location: str, shard: Shard, entry: Mapping[str, Any], result: Any,
                       provenance: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The shard's record, written last and atomically: it lists the shard's files."""
    from marin_rules.artifacts.files import list_data_files

    record = {
        "artifact": f"{entry['name']}@{entry['version']}",
        "fingerprint": entry["fingerprint"],
        "shard": {"index": shard.index, "count": shard.count},
        "status": "success",
        "upstreams": builds_in_deps(entry.get("deps") or {}),  # what it was made from (builds.py)
        "result": result,
        "files": list_data_files(shard.location(artifact_location)),
        "provenance": dict(provenance),
    }
    storage.write_json_atomic(shard_record_location(artifact_location, shard), record)
    return record


def read_shard_record(artifact_location: str, shard: Shard, fingerprint: str | None = None) -> dict[str, Any] | None:
    """A shard's record if it is there, None if absent. An unreadable one raises StepError
    naming it (and how to fix it); so does one of another recipe than `fingerprint`
    (`OtherRecipeShard`) when it is given: without it, any recipe's is returned (its job
    judges it with `shard_change`)."""
    path = shard_record_location(artifact_location, shard)
    if not storage.exists(path):
        return None
    fix = f"delete {shard.location(artifact_location)} and run again"
    try:
        record = storage.read_json(path)
        ok = isinstance(record, dict) and record.get("shard") == {"index": shard.index, "count": shard.count}
    except (ValueError, UnicodeDecodeError) as e:
        raise StepError(f"shard {shard.name}: {path} is not valid JSON ({e}); {fix}") from None
    if not ok or not isinstance(record.get("result"), dict):
        raise StepError(f"shard {shard.name}: {path} is not a shard record of this shard; {fix}")
    if fingerprint is not None and record.get("fingerprint") != fingerprint:
        raise OtherRecipeShard(shard.name, path, artifact_location, _other_recipe(record, fingerprint))
    return record


def shard_change(record: Mapping[str, Any], fingerprint: str, upstreams: Mapping[str, Any] | None) -> str | None:
    """How the finished shard `record` was made otherwise than a build of `fingerprint` on
    the upstream builds `upstreams` (builds.py; None: unknown, not compared), as a phrase
    that follows "shard kkkkk-of-nnnnn" ("was made from another recipe (...)"), or None:
    made the same way. Either way its job sets it aside and builds it anew."""
    if record.get("fingerprint") != fingerprint:
        return _other_recipe(record, fingerprint)
    how = None if upstreams is None else upstream_change(record.get("upstreams"), upstreams)
    return None if how is None else f"was made from other upstream builds ({how})"


def _other_recipe(record: Mapping[str, Any], fingerprint: str) -> str:
    return printable(f"was made from another recipe (fingerprint {record.get('fingerprint')} then, {fingerprint} now)")


class OtherRecipeShard(StepError):
    """A finished shard of another recipe than its artifact's, met by the gather: the
    recipe changed without a version bump while the artifact was unfinished. Its fix, a
    forced build, moves what the old recipe left to `.history/` (every shard, under their
    leases: `workflow.forcing.retire_now`) and builds every shard anew; `with_flags`
    completes that command as `records.UnreadableFile` does."""

    def __init__(self, shard: str, path: str, location: str, change: str, flags: str = ""):
        self.shard, self.path, self.location, self.change, self.flags = shard, path, location, change, flags
        super().__init__(
            f"shard {shard}: {path} {change}: the recipe changed without a version bump while this artifact was "
            f"unfinished; {rebuild_hint(location, flags)} (what the old recipe left moves to {HISTORY_DIR}/, kept), "
            "or bump the version"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, as every step error
        return (OtherRecipeShard, (self.shard, self.path, self.location, self.change, self.flags))

    def with_flags(self, flags: str | None) -> OtherRecipeShard:
        """The same line, its `snakemake -f RECORD` followed by `flags`
        (`workflow.options.rerun_flags`), so that it runs as printed."""
        return OtherRecipeShard(self.shard, self.path, self.location, self.change, flags)


def shard_jobs_seconds(artifact_location: str, count: int) -> float | None:
    """The shard jobs' durations summed (each shard record's `provenance.duration_s`):
    the step's work, which the gather's own record adds as `provenance.shards_duration_s`
    (`marin status` shows both as TOOK). None when a shard's record is missing or
    unreadable or gives none: the gather then refuses or rebuilds it anyway."""
    total = 0.0
    for shard in all_shards(count):
        try:
            record = read_shard_record(artifact_location, shard)
        except StepError:
            return None
        took = ((record or {}).get("provenance") or {}).get("duration_s")
        if not isinstance(took, (int, float)) or isinstance(took, bool):
            return None
        total += took
    return round(total, 3)


def gathered_results(
    artifact_location: str, count: int, fingerprint: str, upstreams: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every shard's result, in order, for the gather; a missing shard, one of another
    recipe (`OtherRecipeShard`) or one made from other `upstreams` builds (builds.py)
    than the gather's is refused."""
    from marin_rules.artifacts.files import file_problems

    results = []
    for shard in all_shards(count):
        record = read_shard_record(artifact_location, shard, fingerprint)
        if record is None:
            raise StepError(
                f"runtime.shards: shard {shard.name} has no record at {shard.location(artifact_location)}: "
                "its job has not finished; run snakemake again (finished shards are kept)"
            )
        how = None if upstreams is None else upstream_change(record.get("upstreams"), upstreams)
        if how is not None:
            raise StepError(
                f"shard {shard.name}: made from other upstream builds than this gather's ({how}); "
                f"delete {shard.location(artifact_location)} and run snakemake again (its shard job builds it anew)"
            )
        problems = file_problems(shard.location(artifact_location), record.get("files") or {})
        if problems:
            raise StepError(f"shard {shard.name}: {problems[0]}; delete {shard.location(artifact_location)} and run again")
        results.append(record["result"])
    folder, moved = set_aside_other_counts(artifact_location, count)
    if moved:
        print(f"{artifact_location}: runtime.shards is {count} now: what the shards of another count left "
              f"({', '.join(moved)}) moved to {folder} (kept, not gathered)", file=sys.stderr, flush=True)  # fmt: skip
    return results


def other_counts(artifact_location: str, count: int) -> list[str]:
    """The names of the shard folders of another shard count than `count` (an earlier attempt's)."""
    folder = storage.join(artifact_location, SHARDS_DIR)
    fs, root = storage.filesystem(folder)
    try:
        entries = fs.ls(root.rstrip("/"), detail=False)
    except FileNotFoundError:
        return []
    names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries]
    return sorted(n for n in names if (found := SHARD_NAME.fullmatch(n)) and int(found.group(2)) != count)


def set_aside_other_counts(artifact_location: str, count: int) -> tuple[str, list[str]]:
    """Move what the shards of another count than `count` left into one folder
    `.history/<UTC time>-stale/` (as `shards/<name>/`), each under that shard's lease
    (taken without waiting: a live holder is another run building it with the other
    count, refused in one line); returns that folder and the names of the shards that
    left anything. An emptied folder is removed (a run that took its lease meanwhile loses it)."""
    from marin_rules.artifacts import lease as leases

    folder = storage.join(artifact_location, HISTORY_DIR, history_stamp("stale"))
    moved: list[str] = []
    for name in other_counts(artifact_location, count):
        source = storage.join(artifact_location, SHARDS_DIR, name)
        try:
            held = leases.acquire(source, is_done=lambda: False, wait=False)
        except leases.LeaseHeld as e:
            raise StepError(
                f"runtime.shards: shard {name} of another count is being built by {e.who}: another run "
                f"plans this artifact with other runtime.shards; give both the same runtime.shards, or run again once "
                "that run has finished"
            ) from None
        try:
            if _move_contents(source, storage.join(folder, SHARDS_DIR, name)):
                moved.append(name)
        finally:
            held.release()
        _remove_emptied(source)
    return folder, moved


def _move_contents(source: str, target: str) -> bool:
    """Move every entry of the folder `source` but its lease files into `target`; False when there were none."""
    from marin_rules.artifacts.lease import LEASE_FILE

    fs, root = storage.filesystem(source)
    entries = [e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root.rstrip("/"), detail=False)]
    entries = [e for e in entries if not e.startswith(LEASE_FILE)]
    if entries:
        storage.makedirs(target)
    for entry in entries:
        storage.move(storage.join(source, entry), storage.join(target, entry))
    return bool(entries)


def _remove_emptied(folder: str) -> None:
    """Remove a shard folder `_move_contents` emptied, unless something but its lease's lock came meanwhile."""
    from marin_rules.artifacts.lease import LEASE_FILE

    fs, root = storage.filesystem(folder)
    try:
        left = [e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root.rstrip("/"), detail=False)]
        if all(e == LEASE_FILE + ".lock" for e in left):
            fs.rm(root.rstrip("/"), recursive=True)
    except FileNotFoundError:  # on GCS an emptied folder is gone already
        pass
