"""Each artifact's state and the reason for it, with its headline result.

Model: the state of `name@version` on a prefix follows from its success record, its
failure records, its lease and, for an artifact of the experiment, the current
recipe and its upstreams' records:

  missing          no record, no failure ("never built")
  building         a lease names who builds it now (or a stale one, to be taken over)
  failed           no record and the last attempt failed (its error's first line, or the
                   one line naming its unreadable failure record), or
                   the lease names a builder that is gone (`lease.holder_gone`: it ran
                   on this host and its process no longer exists, as after the OOM
                   killer's SIGKILL, which leaves no failure record), or
                   a forced rebuild was killed before it ended (`.history/.rebuilding`
                   and no live holder: the next run restores the previous build)
  (missing, building and failed add "the previous build is kept in .history/" while
  a forced rebuild has not succeeded)
  built            the record matches the recipe ("; last retry failed: ..." when a
                   newer failure exists)
  drifted          the record was built from another recipe (how many fields differ), or
                   its step, config or deps were edited since (`records.recipe_drift`;
                   its fingerprint still the recipe's: restore it, or force a rebuild);
                   an artifact that pins its fingerprint (`expect_fingerprint:`) says
                   instead that runs stop on it, with their one line
  upstream rebuilt an upstream's record differs from the one this was built on
                   (and, when a forced run stopped before rebuilding this one too,
                   that the next run rebuilds it; a built artifact whose forced
                   upstream was left unbuilt, as a sharded one stopped in its shards,
                   says that the next run rebuilds it after that upstream)
  (built, drifted and the states above add, for an artifact whose upstream a stopped
  forced run still owes a rebuild, that the next run rebuilds it after that upstream:
  planning forces every consumer of a forced artifact, `reading.owed_through`)
  source changed   data adopted in place whose source no longer holds the files (and
                   sizes) it was adopted with (added to the reason of the states above)
  damaged          a data file is missing, shorter or of another size than the record
                   lists (one listing, as a consumer's job checks before it starts:
                   `records.verify_files`; contents are `marin verify`'s), with the
                   rebuild command (added to the reason of the states above)
  code changed     the step's code hash differs from the one recorded at build time
                   (`marin_rules.artifacts.code`; added to the reason of the states above)
  corrupt          the record cannot be read (the records module's one line)

An unbuilt train artifact (missing or failed, not forced, not a dev version) whose
checkpoints hold another recipe than the one its next job would compare (a run stopped,
then its config changed without a version bump) adds that the next run will refuse to
resume, with the job's own message (`job.attempt.refusal_ahead`: the fields and the fix).
A builder that is gone (killed, as by `kill -9` of Snakemake's process group) while
Snakemake's lock files are still in the working directory that status reads (where
`marin` runs, or `-d DIR`: `.snakemake/locks/`) adds that `snakemake --unlock` must run
first, unless a snakemake process runs there (`snakemake_runs_in`, from /proc); lock
files with no snakemake running there get one line of their own (`lock_note`), as after
`kill -9` of snakemake alone, whose jobs finish on their own.
A `missing` artifact whose folder still holds data says so (its record was deleted,
as `snakemake --delete-all-output` does; beside an unreadable lease, an unfinished build). A built user step whose module cannot be
found from here (the code advisory needs it) says "code unknown" instead of nothing,
and why: not found, or the loader's refusal of a working-folder module that another
of the same name hides (`steps.find_user_module`).
A version found on the prefix that the experiment does not name (`--all`) gets its
state from its files alone; another user's dev version, built or not (a dev build
killed before it wrote a record is still a dev version), is shown as `name@dev (user
NAME)` (`reading.builds_on_prefix`), and a dev version's folder of the layout before
per-user folders (`name/dev`, `dev_versions.is_unowned`) once, as `name@dev (no user:
old layout)`, saying that no run reads it. A dev version never resumes what an
attempt left (its next run rebuilds it from scratch). Headline columns: the final
validation loss of a train result and the main score of an evaluate result (its
first task, in the experiment's order, that reports one of SCORE_METRICS, and the
first of those it reports: accuracy before bits per byte; a figure not meaningful, as
below, only when no task has another). A bits per byte or perplexity figure of a task whose result records
`lossless: false` (the model's tokenizer did not give the scored texts back:
`eval/step.py`) is marked "(not meaningful: lossy tokenizer)", as results.md marks it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from marin_rules.adopt import recorded_source, recorded_source_problems, source_changed
from marin_rules.artifacts import storage
from marin_rules.artifacts.code import built_with, code_change, code_hash
from marin_rules.artifacts.builds import build_of, rebuilt_upstreams, upstream_builds
from marin_rules.artifacts.drift import EDITED_FIX, drift_notice, edited_record, no_bump_needed, printable
from marin_rules.artifacts.errors import ConfigError, DriftError, MarinError
from marin_rules.artifacts.files import file_problems, list_data_files
from marin_rules.artifacts.identity import ArtifactId, artifact_location
from marin_rules.artifacts.lease import LeaseHolder, held_live, holder_gone, lease_problem, read_lease
from marin_rules.artifacts.records import edited_note, rebuild_hint, recipe_drift
from marin_rules.dev_versions import is_unowned
from marin_rules.eval.report import LOSSY_LABEL, RATIO_METRICS  # (no JAX, no lm-eval)
from marin_rules.experiment import Artifact, Experiment
from marin_rules.inspect import reading
from marin_rules.steps import find_user_module
from marin_rules.job.attempt import job_recipe, refusal_ahead  # (no JAX)
from marin_rules.workflow.forcing import forced_phrase, forcing_run_alive

VAL_LOSS_KEYS = ("final_val_loss", "val_loss")
NOT_IN_EXPERIMENT = "not in this experiment"  # the reason of a built version the experiment does not name
SCORE_METRICS = ("acc", "acc_norm", "exact_match", "f1", "bits_per_byte", "byte_perplexity", "word_perplexity")


@dataclass(frozen=True)
class Status:
    key: str
    step: str
    state: str
    reason: str
    fingerprint: str  # the recorded one ("-" when none)
    built: str  # "YYYY-MM-DD HH:MM:SS" UTC, or "-"
    took: str
    val_loss: float | None = None
    score: str = ""  # "task metric value", e.g. "marin_shakespeare_cloze acc 0.310"
    in_experiment: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def first_line(text: Any) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else ""


def headline(record: Mapping[str, Any] | None) -> tuple[float | None, str]:
    """(final validation loss, main score) of a record's result."""
    result = (record or {}).get("result")
    if not isinstance(result, Mapping):
        return None, ""
    val = next((result[k] for k in VAL_LOSS_KEYS if isinstance(result.get(k), (int, float))), None)
    config = (record or {}).get("config")
    listed = config.get("tasks") if isinstance(config, Mapping) else None
    listed = [listed] if isinstance(listed, str) else listed if isinstance(listed, list) else []
    listed = [t.get("name") if isinstance(t, Mapping) else t for t in listed]  # `{name: ..., num_fewshot: ...}` too
    listed = [t for t in listed if isinstance(t, str)]
    named = [t for t in listed if t in result] + sorted(t for t in result if t not in listed)
    scores = []  # (lossy, figure): each task's first metric in SCORE_METRICS' order, the experiment's first task first
    for task in (t for t in named if isinstance(result[t], Mapping)):
        metric = next((m for m in SCORE_METRICS if _is_number(result[task].get(m))), None)
        if metric is not None:
            lossy = metric in RATIO_METRICS and result[task].get("lossless") is False
            scores.append((lossy, f"{task} {metric} {result[task][metric]:.3f}{f' ({LOSSY_LABEL})' if lossy else ''}"))
    meaningful = [figure for lossy, figure in scores if not lossy]
    return val, (meaningful or [figure for _, figure in scores] or [""])[0]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_holder(location: str) -> LeaseHolder | None:
    """The holder of the artifact's lease; None when there is none or it cannot be read."""
    try:
        return read_lease(location)
    except (MarinError, OSError, ValueError):
        return None


def _lease_problem(location: str) -> str | None:
    try:
        return lease_problem(location)
    except (MarinError, OSError):
        return None


def _lease_holder(location: str) -> tuple[str | None, str | None]:
    """(who holds the lease, described, None when no one), and who held it but is gone
    (`holder_gone`: killed on this host, leaving no failure record; None otherwise)."""
    holder = read_holder(location)
    if holder is None:
        return None, None
    if holder_gone(holder):
        return None, holder.describe()
    if not held_live(holder):
        return f"{holder.describe()} (stale: not renewed for {holder.age_s():.0f} s, the next run takes it over)", None
    return holder.describe(), None


def _shard_progress(location: str, artifact: Artifact | None) -> tuple[str | None, list[str], list[str]]:
    """An unbuilt sharded artifact: "k of n" shards with a record (None when it is not
    sharded), the holders of live shard leases, and those of shard leases whose holder is gone."""
    from marin_rules.artifacts.shards import all_shards, shard_count, shard_record_location
    from marin_rules.steps import SHARDED_STEPS

    if artifact is None or artifact.step not in SHARDED_STEPS:
        return None, [], []
    shards = all_shards(shard_count(artifact.runtime))
    done = sum(storage.exists(shard_record_location(location, s)) for s in shards)
    holders = [h for s in shards if (h := read_holder(s.location(location))) is not None]
    gone = [h.describe() for h in holders if holder_gone(h)]
    building = [h.describe() for h in holders if held_live(h)]
    return (f"{done} of {len(shards)}" if done or building or gone else None), building, gone


def _killed_rebuild(location: str) -> str | None:
    """The reason of a forced rebuild killed before it ended (its pointer is there and no
    live holder rebuilds: `workflow/forcing.py`), else None."""
    unended = reading.unended_rebuild(location)
    if unended is None:
        return None
    holder = read_holder(location)
    if held_live(holder):
        return None  # being rebuilt now
    if reading.unended_move(location):
        return (f"a forced rebuild was stopped while it set the previous build aside: part of that build is in "
                f"{unended}, part still in place; the next run puts it back whole, then rebuilds it")  # fmt: skip
    return (f"a forced rebuild was killed before it ended: the files there are its partial output; the "
            f"previous build is kept in {unended}, and the next run puts it back")  # fmt: skip


def never_built_reason(location: str, lease_unreadable: bool = False) -> str:
    """The reason of an artifact with no record of any kind: "never built", unless its
    folder still holds data (its record was deleted, as `snakemake --delete-all-output`
    does; beside an unreadable lease, more likely a build killed or still under way)."""
    files = list_data_files(location)
    if not files:
        return "never built"
    if lease_unreadable:
        return (f"unfinished: no success record, yet its folder holds {len(files)} data file(s) beside an "
                "unreadable lease (a build killed, or one still under way?); the next run builds it")  # fmt: skip
    return (f"record deleted, data still there: no success record, yet its folder holds {len(files)} data "
            "file(s) (snakemake --delete-all-output?); the next run builds it")  # fmt: skip


def unbuilt_reason(location: str, artifact: Artifact | None, experiment: Experiment | None = None,
                   prefix: str | None = None) -> str:  # fmt: skip
    """Why an artifact has no record of any kind, for `marin history`: a sharded one
    stopped part-way says how many shards are built (its shard folders are data, not
    a deleted record's leftovers) and, given its `experiment` and `prefix`, whether the
    next run encodes them again (`_shards_to_redo`); else `never_built_reason`."""
    done, building, _ = _shard_progress(location, artifact)
    if done is None:
        return _no_shard_reason(location, artifact)
    upstreams = None
    if artifact is not None and experiment is not None and prefix is not None:
        ids = {key: experiment[key].id for key in artifact.upstream_keys()}
        upstreams = {key: reading.record_or_none(artifact_location(prefix, id_), id_) for key, id_ in ids.items()}
    return shards_reason(done, building, _shards_to_redo(location, artifact, upstreams))


def _no_shard_reason(location: str, artifact: Artifact | None, lease_unreadable: bool = False) -> str:
    """`never_built_reason`, unless the folder holds only shards of another count than
    `runtime.shards` asks for now (an attempt stopped part-way before the user changed
    it): those are data of an unfinished build, not a deleted record's leftovers."""
    from marin_rules.artifacts.shards import other_counts, shard_count
    from marin_rules.steps import SHARDED_STEPS

    if artifact is None or artifact.step not in SHARDED_STEPS:
        return never_built_reason(location, lease_unreadable)
    count = shard_count(artifact.runtime)
    others = other_counts(location, count)
    if not others:
        return never_built_reason(location, lease_unreadable)
    return (f"stopped part-way with another shard count: shards/{others[0]}{' ...' if len(others) > 1 else ''} "
            f"({len(others)} folder(s)), while runtime.shards is now {count}; the next run builds {count} "
            "shard(s) and sets those aside, in .history/")  # fmt: skip


def shards_reason(done: str, building: list[str], redo: str | None = None) -> str:
    """A sharded artifact without a record, from `_shard_progress`: every shard built
    (only the gather is owed: it never ran, or its record was deleted), or part of them;
    `redo`: why the next run encodes the built ones again (`_shards_to_redo`)."""
    built, _, total = done.partition(" of ")
    if built == total and not building:
        if redo is not None:
            return f"not gathered: all {total} shard(s) built, but {redo}"
        return f"not gathered: all {total} shard(s) built; the next run gathers them"
    running = f", {len(building)} building" if building else ""
    if redo is not None:
        return f"stopped part-way: {done} shard(s) built{running}, but {redo}"
    return f"stopped part-way: {done} shard(s) built{running}; the next run builds the rest and gathers them"


def _shards_to_redo(location: str, artifact: Artifact | None,
                    upstream_records: Mapping[str, dict | None] | None) -> str | None:  # fmt: skip
    """Why the next run encodes the finished shards of this unbuilt sharded artifact again,
    as planning decides (`Session._stale_shard`): an upstream without a record (it is
    built first, a new build), or a shard made from another recipe or other upstream
    builds than today's; None when they stand (or without the upstreams' records)."""
    from marin_rules.artifacts.shards import all_shards, read_shard_record, shard_change, shard_count

    if artifact is None or upstream_records is None:
        return None
    unbuilt = [key for key in artifact.upstream_keys() if upstream_records.get(key) is None]
    if unbuilt:
        return f"upstream {unbuilt[0]} is not built: the next run builds it first, then encodes every shard again"
    now = upstream_builds(artifact.upstream_keys(), upstream_records.get)
    for shard in all_shards(shard_count(artifact.runtime)):
        try:
            record = read_shard_record(location, shard)
        except MarinError:  # unreadable: left to its job, which names it
            continue
        change = None if record is None else shard_change(record, artifact.fingerprint, now)
        if change is not None:
            return f"shard {shard.name} {change}: the next run encodes it again"
    return None


def missing_prefix_note(prefix: str) -> str:
    """A line saying that the prefix holds nothing at all, "" when it exists: a mistyped
    `--prefix` would otherwise read as an experiment never built. (A gs:// prefix whose
    bucket does not exist was refused before: `storage.check_bucket`.)"""
    if not storage.is_remote(prefix):
        if os.path.isdir(storage.local_path(prefix)):
            return ""
        return (f"{prefix}: no such folder, so every artifact reads as never built; check --prefix "
                "(and -d, the folder a relative prefix is read in)")  # fmt: skip
    fs, path = storage.filesystem(prefix)
    if fs.exists(path):
        return ""
    bucket = path.split("/", 1)[0]
    return (f"{prefix}: nothing is stored under this path of bucket {bucket}, so every artifact reads as never "
            "built; check --prefix")  # fmt: skip


def _code_unknown(step: str, provenance: Any) -> bool:
    """Was the step's code hashed when this was built, but cannot be read now (a user
    step whose module is not found from here: `code.user_module_file`)?"""
    recorded = provenance.get("code") if isinstance(provenance, Mapping) else None
    return isinstance(recorded, Mapping) and isinstance(recorded.get("hash"), str) and code_hash(step) is None


def _why_code_unknown(step: str) -> str:
    """Why a user step's module cannot be read from here: the loader's refusal (a module
    of the working folder that another of the same name hides) or not found."""
    module = step.partition(":")[0]
    try:
        find_user_module(module, step)
    except ConfigError as refused:
        return refused.message
    except ImportError:  # a package of a dotted name that is nowhere here (find_spec imports it): not found
        pass
    return (f"module {module!r} not importable from here: run marin in the run's working directory, "
            "or give it with -d DIR")  # fmt: skip


def gone_builder(builder: str) -> str:
    """A lease whose holder is gone: an attempt that ended without a record of any kind."""
    return f"{builder} is gone: killed? (no failure record)"


SNAKEMAKE_LOCKS = os.path.join(".snakemake", "locks")  # Snakemake's lock files (its file persistence)


def _lock_clause() -> str:
    """"; Snakemake's lock is still there: ..." when lock files of Snakemake are in the
    working directory (this process's: `-d DIR` or where marin runs) and no snakemake
    is known to run there (`snakemake_runs_in`), else ""."""
    folder = os.path.abspath(SNAKEMAKE_LOCKS)
    if not _locked(folder):
        return ""
    workdir = os.path.dirname(os.path.dirname(folder))
    running = snakemake_runs_in(workdir)
    if running:
        return ""
    if running is None:
        return f"; Snakemake's lock is still there: run snakemake --unlock first (if no snakemake runs in {workdir} now)"
    return f"; Snakemake's lock is still there and no snakemake runs in {workdir}: run snakemake --unlock first"


def lock_note() -> str:
    """One line when Snakemake's lock files are in the working directory while no
    snakemake runs there (`snakemake_runs_in`: as after `kill -9` of snakemake, whose
    jobs may still finish on their own): the next run would stop with LockException;
    "" otherwise, and when whether one runs cannot be told."""
    folder = os.path.abspath(SNAKEMAKE_LOCKS)
    workdir = os.path.dirname(os.path.dirname(folder))
    if not _locked(folder) or snakemake_runs_in(workdir) is not False:
        return ""
    return (f"Snakemake's lock is still in {folder} and no snakemake runs in {workdir} (killed with kill -9?): "
            "run snakemake --unlock there before the next run, which would stop with LockException")  # fmt: skip


def _locked(folder: str) -> bool:
    try:
        return any(n.endswith((".input.lock", ".output.lock")) for n in os.listdir(folder))
    except OSError:
        return False


def snakemake_runs_in(workdir: str) -> bool | None:
    """Does a snakemake process (`snakemake ...`, `python .../snakemake ...`, `python -m
    snakemake ...`) run with `workdir` as its working directory on this host? None when
    that cannot be told: no /proc, or such a process whose working directory cannot be read."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    unknown = False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        head = argv[:3]
        if not any(os.path.basename(a) == "snakemake" for a in head) and "-m snakemake" not in " ".join(head):
            continue
        try:
            if os.path.realpath(os.readlink(f"/proc/{pid}/cwd")) == os.path.realpath(workdir):
                return True
        except OSError:
            unknown = True  # another user's process, or one that just ended
    return None if unknown else False


def _refusal_ahead(location: str, artifact: Artifact | None, recipe: Mapping[str, Any] | None,
                   upstream_records: Mapping[str, dict | None] | None) -> str | None:  # fmt: skip
    """The message the next job of an unbuilt train artifact will refuse to resume with
    (its checkpoints hold another recipe than `recipe`: `attempt.refusal_ahead`), else None:
    also for a dev version or one marked forced (its leftovers are moved aside first)."""
    if artifact is None or recipe is None or artifact.step != "train" or artifact.id.is_dev:
        return None
    upstreams = upstream_builds(artifact.upstream_keys(), (upstream_records or {}).get)
    try:
        message = refusal_ahead(location, recipe, upstreams)
        return None if message is None or reading.forced_rebuild_owed(location) else message
    except (MarinError, OSError, ValueError):
        return None


def _starts_over(location: str, artifact: Artifact | None, upstream_records: Mapping[str, dict | None] | None) -> str | None:
    """Why the next job of this unbuilt artifact sets aside what its last attempt left
    (`attempt.begin`: made from another recipe or other upstream builds than today's),
    else None: also when an upstream is unbuilt or the artifact is sharded (its shards
    say so themselves) or a dev version (rebuilt from scratch anyway)."""
    from marin_rules.job.attempt import sets_aside_why
    from marin_rules.steps import SHARDED_STEPS

    if artifact is None or artifact.step in SHARDED_STEPS or artifact.id.is_dev:
        return None
    upstreams = upstream_builds(artifact.upstream_keys(), (upstream_records or {}).get)
    if upstreams is None:
        return None
    try:
        return sets_aside_why(location, artifact.step, artifact.fingerprint, upstreams)
    except (MarinError, OSError, ValueError):
        return None


def _already_refused(ahead: str, failed: str) -> bool:
    """Does the last failure's line already give this refusal: the same recipe changes
    (the prefix may be spelled otherwise there), so the prediction would repeat it?"""
    start, end = ahead.find(" were written by another recipe ("), ahead.find("); bump the version")
    return start >= 0 and end > start and ahead[start:end] in failed


def _times(record: Mapping[str, Any]) -> tuple[str, str]:
    provenance = record.get("provenance") or {}
    built = str(provenance.get("ended") or "-").replace("T", " ")[:19]
    took = reading.took_s(provenance)
    return built, "-" if took is None else f"{took:.1f}s"


def _failure_line(failure: Mapping[str, Any]) -> str:
    error = failure.get("error") or {}
    when = str((failure.get("provenance") or {}).get("ended", "?")).replace("T", " ")[:19]
    return f"{when}: {error.get('type', 'Error')}: {first_line(error.get('message'))}"


def location_status(
    key: str, location: str, step: str = "?", artifact: Artifact | None = None,
    upstream_records: Mapping[str, dict | None] | None = None, expected: ArtifactId | None = None,
    hint_flags: str = "", recipe: Mapping[str, Any] | None = None,
) -> tuple[Status, dict | None]:  # fmt: skip
    """The state of one artifact location, and its record (None when missing or corrupt).
    With `artifact` (the experiment's entry) drift is judged; with `upstream_records`
    (upstream key -> its current record) rebuilt upstreams are reported. `hint_flags`:
    what a corrupt record's rebuild command needs besides its target (`CorruptRecord.with_flags`).
    `recipe`: for a train artifact, the recipe its job compares with its checkpoints'
    (`attempt.job_recipe`), to predict a refusal to resume."""
    fingerprint = "-"
    try:
        record = reading.record_dict(location, expected)
    except MarinError as e:
        reason = str(e.with_flags(hint_flags))
        return Status(key, step, "corrupt", reason, "-", "-", "-", in_experiment=artifact is not None), None
    try:
        last_failure, unreadable = reading.last_failure(location), None
    except reading.UnreadableRecord as e:  # an older failure is not the last one
        last_failure, unreadable = None, str(e)
    holder, gone = _lease_holder(location)
    killed = _killed_rebuild(location)
    if killed is not None:
        killed += _lock_clause()
        return Status(key, step, "failed", killed, "-", "-", "-", in_experiment=artifact is not None), record
    failed = ""  # a failure's first line, said last: a command it ends with is followed by nothing
    if record is None:
        done, building, gone_shards = _shard_progress(location, artifact)
        if building and not holder:
            holder = f"{building[0]} for a shard"
        ahead = None if holder else _refusal_ahead(location, artifact, recipe, upstream_records)
        over = None if holder or ahead else _starts_over(location, artifact, upstream_records)
        resumes = "" if ahead or over or (expected is not None and expected.is_dev) else " and resumes"
        if holder:
            state, reason = "building", f"lease held by {holder}"
        elif gone or gone_shards:
            builder = f"its builder ({gone})" if gone else f"a shard's builder ({gone_shards[0]})"
            state, reason = "failed", f"{gone_builder(builder)}; the next run takes the lease over{resumes}"
            lease = read_holder(location)
            ended = str(((last_failure or {}).get("provenance") or {}).get("ended", ""))
            if gone and lease is not None and ended >= str(lease.since):  # another process of its pod wrote it
                reason = f"its builder ({gone}) is gone: killed?; the next run takes the lease over{resumes}"
                failed = ("a failure record since it started, as a pod's other processes leave: "
                          f"{_failure_line(last_failure)}")  # fmt: skip
            reason += _lock_clause()
        elif unreadable:
            state, reason = "failed", f"last attempt failed: {unreadable}"
        elif last_failure is not None and reading.attempt_after(location, last_failure):
            last_failure = None  # a later attempt ended well, its record deleted since: said below
        elif last_failure is not None:
            state, reason, failed = "failed", "", f"last attempt failed at {_failure_line(last_failure)}"
        problem = _lease_problem(location) if not holder and not gone else None
        if not (holder or gone or gone_shards or unreadable or last_failure is not None):
            state = "missing"
            reason = shards_reason(done, building, _shards_to_redo(location, artifact, upstream_records)) \
                if done is not None else \
                _no_shard_reason(location, artifact, lease_unreadable=bool(problem))  # fmt: skip
            if ahead:  # its data is not built on: it refuses
                reason = reason.removesuffix("; the next run builds it")
        if problem:  # as its next job will say when it takes the lease over
            reason += f"; its lease file is unreadable ({problem}): a run takes it over once it is unchanged for the lease's stale_s"
        if reading.history_files(location):  # a forced rebuild that has not (or not yet) succeeded
            if state == "missing" and not reading.forced_rebuild_owed(location):
                if reason.startswith("never built"):  # else the reason says more (data left, shards built)
                    reason = "no record: a forced rebuild not finished, or the record was deleted" + (
                        "" if ahead else "; the next run builds it")
            elif state == "missing":
                reason = "forced rebuild not finished"
            reason += "; the previous build is kept in .history/"
        if done is not None and "shard(s) built" not in reason:
            reason += f"; {done} shard(s) built, {len(building)} building"
        if ahead and not _already_refused(ahead, failed):
            reason += f"; the next run will refuse to resume: {ahead}"
        elif over:
            reason += f"; the next run starts over: what the last attempt left {over} (it moves to .history/)"
        reason = "; ".join(part for part in (reason.removeprefix("; "), failed) if part)
        return Status(key, step, state, reason, fingerprint, "-", "-", in_experiment=artifact is not None), None
    step = str(record.get("step") or step)
    fingerprint = str(record.get("fingerprint"))
    built, took = _times(record)
    state, reason = "built", "matches the recipe" if artifact is not None else NOT_IN_EXPERIMENT
    rebuilt = _rebuilt_upstreams(record, upstream_records) if artifact is not None and upstream_records else []
    drift = None if artifact is None else recipe_drift(
        record, artifact.payload(), artifact.fingerprint, artifact.config_default, artifact.typed_numbers,
        artifact.progress_setting,
    )
    if drift is not None:
        edited = edited_record(str(record.get("fingerprint")), artifact.fingerprint)
        state, reason = "drifted", _drift_reason(drift, edited_note(record), artifact.id.is_dev, edited)
        if artifact.expect_fingerprint is not None:  # pinned: every run stops on it, with this line
            try:
                drift_notice(key, str(record.get("fingerprint")), artifact.fingerprint, drift, artifact.expect_fingerprint)
            except DriftError as e:
                state, reason = "drifted", f"runs stop on it: {str(e).removeprefix(f'{key}: ')}"
    elif rebuilt:
        state, reason = "upstream rebuilt", f"{rebuilt[0]}{' (and more)' if len(rebuilt) > 1 else ''}"
    adopted = recorded_source_problems(step, record.get("result"))  # data adopted in place: its source now
    if adopted:
        text = source_changed(recorded_source(step, record.get("result")), adopted)
        if state == "built":
            state, reason = "source changed", text
        else:
            reason += f"; {text}"
    damaged = _damaged(location, record, hint_flags if artifact is not None else None)
    if damaged:
        if state == "built":
            state, reason = "damaged", damaged
        else:
            reason += f"; {damaged}"
    unbuilt = [k for k, r in (upstream_records or {}).items() if r is None] if artifact is not None else []
    if (rebuilt or unbuilt) and reading.forced_rebuild_owed(location):  # drifted or not: session._left_pending
        run = forcing_run_alive(location)
        then = "the next run rebuilds it" if run is None else "that run rebuilds it"
        if rebuilt:
            reason += f"; {forced_phrase(run)}: {then}"
        else:  # an upstream unbuilt: its forced upstream (sharded) was moved aside
            reason += f"; {forced_phrase(run)} and its upstream {unbuilt[0]}: {then} after {unbuilt[0]}"
    change = code_change(artifact.step, record.get("provenance")) if artifact is not None else None
    if change is not None:
        then, now, version = change
        text = f"step code changed since this was built (code {then} then, {now} now; {built_with(version)})"
        if state == "built":
            state, reason = "code changed", f"{text}; served as built, --forcerun rebuilds it"
        else:
            reason += f"; {text}"
    elif artifact is not None and _code_unknown(artifact.step, record.get("provenance")):
        reason += f"; code unknown ({_why_code_unknown(artifact.step)})"
    if unreadable:  # the newest failure record: its time is unknown, it may be newer than the build
        reason += f"; {unreadable}"
    if holder:
        reason += f"; being rebuilt, lease held by {holder}"
    elif gone:
        reason += "; " + gone_builder(f"a rebuild's builder ({gone})") + _lock_clause()
    if last_failure is not None:
        failed_at = str((last_failure.get("provenance") or {}).get("ended", ""))
        if failed_at > str((record.get("provenance") or {}).get("ended", "")):
            reason += f"; last retry failed at {_failure_line(last_failure)}"  # last: see `failed` above
    val, score = headline(record)
    status = Status(key, step, state, reason, fingerprint, built, took, val, score, artifact is not None)
    return status, record


def _damaged(location: str, record: Mapping[str, Any], hint_flags: str | None) -> str | None:
    """What a consumer's job would refuse in a built artifact's data files (one listing:
    a file missing, truncated or of another size than its record lists, as
    `records.verify_files` finds; a file changed in place at its size is `marin verify`'s),
    and the rebuild command; None when every file is as recorded. `hint_flags` None: the
    artifact is not the experiment's (an older version), which this experiment cannot rebuild."""
    files = record.get("files")
    if not isinstance(files, Mapping) or not files:
        return None
    problems = file_problems(location, dict(files))
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    fix = f"consumers refuse it; {rebuild_hint(location, hint_flags)}"
    return f"{problems[0]}{more}: {fix}"


def _drift_reason(lines: list[str], edited: str | None, dev: bool = False, same_fingerprint: bool = False) -> str:
    """The reason of a drifted record (`recipe_drift`'s lines; `edited`: `edited_note`);
    a `dev` version is rebuilt by every run, so no version bump is asked for; a record
    whose fingerprint is the recipe's (`same_fingerprint`: its own fields were edited,
    `drift.edited_record`) has no new recipe to build: the reason ends with the note's
    fix (restore it, or force a rebuild), as the drift warning does."""
    n = len(lines)
    if lines:
        fields = f"{n} field{'s differ' if n != 1 else ' differs'}"
        differ = f"{fields} from the recipe ({lines[0]}{', ...' if n > 1 else ''})"
    else:
        differ = "its recorded fingerprint is not the recipe's, yet no recorded field differs"
    if dev:
        return f"{differ}{f'; {edited}' if edited else ''}; a dev version: the next run rebuilds it"
    if same_fingerprint:
        return f"{differ}; served as built; {edited or f'the record was edited: {EDITED_FIX}'}"
    why = no_bump_needed(lines)
    if why and not edited:
        return f"{differ}; served as built: {why}"
    return f"{differ}{f'; {edited}' if edited else ''}; served as built, bump the version to build the new recipe"


def _rebuilt_upstreams(record: Mapping[str, Any], upstream_records: Mapping[str, dict | None]) -> list[str]:
    """One phrase per upstream rebuilt since `record` was built (`builds.rebuilt_upstreams`)."""
    now = {key: None if upstream is None else build_of(upstream) for key, upstream in upstream_records.items()}
    rebuilt = rebuilt_upstreams(record.get("deps") or {}, now)
    return [f"{key} rebuilt since this was built ({how})" for key, how in rebuilt]


def experiment_status(
    experiment: Experiment, prefix: str, every_version: bool = False, hint_flags: str = ""
) -> list[Status]:
    """Status of every artifact of the experiment, in dependency order; with
    `every_version`, also every other version of the same names found on the prefix.
    `hint_flags`: see `location_status`."""
    rows: list[Status] = []
    records: dict[str, dict | None] = {}
    owed: dict[str, str] = {}  # a stopped forced run's rebuilds the next run finishes (`reading.owed_through`)
    for key, artifact in experiment.artifacts.items():
        location = artifact_location(prefix, artifact.id)
        upstreams = {u: records.get(u) for u in artifact.upstream_keys()}
        recipe = job_recipe(artifact, experiment, prefix, location) if artifact.step == "train" else None
        status, record = location_status(key, location, artifact.step, artifact, upstreams, artifact.id, hint_flags,
                                         recipe)  # fmt: skip
        records[key] = record
        through = reading.owed_through(artifact.upstream_keys(), location, record, artifact.id.is_dev, records, owed)
        if through is not None:
            owed[key] = through
            if through in owed and records.get(through) is not None:  # location_status saw nothing of it
                run = forcing_run_alive(location) or forcing_run_alive(artifact_location(prefix, experiment[through].id))
                then = "the next run rebuilds it" if run is None else "that run rebuilds it"
                status = replace(status, reason=f"{status.reason}; its upstream {through} is owed a rebuild ("
                                                f"{forced_phrase(run).replace(' it', ' it and its consumers', 1)}): "
                                                f"{then} after {through}")  # fmt: skip
        rows.append(status)
    if every_version:
        paths = {a.id.path for a in experiment.artifacts.values()}
        for name in sorted({a.id.name for a in experiment.artifacts.values()}):
            for found in reading.builds_on_prefix(prefix, name):
                if found.path not in paths:
                    status = location_status(shown_key(found), artifact_location(prefix, found), expected=found,
                                             hint_flags=hint_flags)[0]  # fmt: skip
                    rows.append(_whose_dev(status, found))
    return rows


def _whose_dev(status: Status, found: ArtifactId) -> Status:
    """A row of another user's dev version, or of an old-layout dev folder, says whose it
    is instead of "not in this experiment" (before its own reason when it is not built)."""
    if not found.is_dev:
        return status
    if is_unowned(found):
        whose = (f"a dev build of the old layout, from before each user's went to {found.path}-USER: no run "
                 "reads or rebuilds it; delete it when done with it")  # fmt: skip
    else:
        whose = f"user {found.owner}'s dev build (marin --dev-user {found.owner} reads it)"
    return replace(status, reason=whose if status.reason == NOT_IN_EXPERIMENT else f"{whose}; {status.reason}")


def shown_key(artifact: ArtifactId) -> str:
    """`name@version`, and for a dev version the user whose folder holds it: `x@dev (user bob)`,
    or `x@dev (no user: old layout)` for a folder `name/dev` (`dev_versions.is_unowned`)."""
    if is_unowned(artifact):
        return f"{artifact.key} (no user: old layout)"
    return f"{artifact.key} (user {artifact.owner})" if artifact.is_dev else artifact.key


COLUMNS = (
    ("ARTIFACT", lambda s: s.key),
    ("STEP", lambda s: s.step),
    ("STATE", lambda s: s.state),
    ("VAL LOSS", lambda s: "-" if s.val_loss is None else f"{s.val_loss:.4f}"),
    ("SCORE", lambda s: s.score or "-"),
    ("BUILT (UTC)", lambda s: s.built),
    ("TOOK", lambda s: s.took),
    ("FINGERPRINT", lambda s: s.fingerprint),
    ("REASON", lambda s: s.reason),
)


def format_table(rows: list[Status]) -> str:
    """The rows as aligned columns; every cell `printable` (records' values are shown)."""
    table = [[name for name, _ in COLUMNS]] + [[printable(get(r)) for _, get in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    return "\n".join(
        "  ".join([*(v.ljust(w) for v, w in zip(row[:-1], widths)), row[-1]]).rstrip() for row in table
    )
