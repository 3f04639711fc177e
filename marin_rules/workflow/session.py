"""One Snakemake invocation's view of the experiment: paths, records, input functions.

Model: rules (one per step kind) declare the success record
`{records_root}/{artifact}/.artifact.json` as their only output, with the wildcard
`artifact` = `name/version` constrained to that step's artifacts (`constraint`), and a
`log:` under `.snakemake/marin-logs/`. `records_root` is the prefix, or for a remote
prefix its local mirror. Input functions (`inputs`) run on the submitting host for
every job reachable from the targets, in real runs, `-n`, `--dag` and `--rulegraph`:
records are read there through the one validating reader (a corrupt record stops the
invocation with its one-line message, never served), drift is reported, forced jobs
are noted, and edges are `ancient()` unless their upstream is forced, so newer upstream
files never rebuild a finished artifact. The job command itself gets every value it
needs as a quoted parameter (`job_params`).

Planning changes nothing on the prefix: input functions run before Snakemake locks the
working directory, and a run that then meets another run's lock ends without running
anything. What planning decided for forced artifacts (their old record saved,
`forcing.mark_forced`; a sharded one's old build moved aside, below) is done by `start`,
once Snakemake holds the lock and before any job runs: from the Snakefile's `onstart:`,
or, where that handler does not run (our Snakefile used as a Snakemake `module`, or a
user's own `onstart:` replacing ours), at the first evaluation of a job's resources
(`attempt_resource`), which comes after the lock too. `start` also refuses a local
prefix when a planned job runs on Cloud TPU workers (`refuse_unreachable_prefix`).
Used as a module (`use rule * from marin as marin_*`), our rules carry the prefixed
names: the Snakefile hands them to `name_rules`, and `--forcerun`, `--until` and
`--omit-from` are read with those names.

A sharded step (`tokenize`, `dedup`: `marin_rules.artifacts.shards`) has a second rule,
`{step}_shard`, whose jobs build `{records_root}/{artifact}/shards/{shard}/shard.json`
(`shard_pattern`), one per shard of the artifact's `runtime.shards`; the artifact's
own job gathers them. Its record asks for the shard records only while it is unbuilt
or forced (a finished artifact is served even where the shard records are not
mirrored). A forced sharded artifact has its old build moved to `.history/` by
`start` (`forcing.retire_now`, under its lease), since its shard jobs run before its
own job does; its shard jobs get the run stamp below, so Snakemake plans them (and
`-n` lists them) although their old records are still there while planning;
`--forcerun tokenize_shard` forces it as `--forcerun tokenize` does.
A finished shard of an unfinished artifact that was made from other upstream builds
than today's (its tokenizer rebuilt since) gets the run stamp below, so its job runs
again and sets it aside (`_stale_shard`).

Dev versions (`name@dev`, `*-dev`) count as forced on every run: they are never drift-
checked, and in the main process each gets the input `.snakemake/marin-run/stamp`,
rewritten once per invocation, so Snakemake's mtime trigger rebuilds them (and shows them in `-n`).
A retry (`--retries`) of a forced job is forced again (`attempt_resource`).
`--until` and `--omit-from` leave jobs out that Snakemake still plans (`left_out`): a
forced artifact left out is not rebuilt by this run, so nothing of it is moved or
marked, but for a cascade this run owes it (an upstream it rebuilds), which is marked
for the next run to finish, as below.
A forced run that was stopped before rebuilding a consumer of what it forced left the
consumer's marker (`forcing.MARKER`): once an upstream of it has been rebuilt since its
build, or is unbuilt (a forced sharded artifact's old build moved aside by `start` and
not rebuilt yet: this run builds it first), the next run counts that consumer as forced
and gives it the stamp too, so the cascade is finished, consumers after their upstreams
(`_left_pending`); each artifact this finishes gets one line saying so (`_owed_line`).
A forced rebuild killed outright along with its Snakemake leaves `.history/.rebuilding`
(`forcing.begin_rebuild`): that artifact gets the stamp, so its job restores the old
build before anything is served (`_rebuild_unended`). A forced sharded artifact whose
Snakemake was killed while `start` set its old build aside (the pointer says "moving")
has that force finished by the next run: `start` puts the old build back whole and sets
it aside again, and every shard job and the gather run (`_retire_unended`).
An unbuilt, unforced train artifact whose checkpoints hold another recipe gets planning's
line that its job will refuse to resume (`advisory.refusal_warning`).
Adopted data (`adopt:`) has its source's layout checked while planning, unless it is
already recorded (a copied source may be gone since); a recorded one adopted in place
gets a warning when its source's files changed since.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from marin_rules.adopt import STEP as ADOPT_STEP, check_layout, served_source, source_changed, source_problems
from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import ConfigError, MarinError, decode_json
from marin_rules.artifacts.identity import RECORD_FILE, artifact_location
from marin_rules.artifacts.lease import LeaseHolder, new_holder
from marin_rules.artifacts.provenance import iso, utc_now
from marin_rules.artifacts.records import Record, read_record_file
from marin_rules.artifacts.shards import SHARD_NAME, SHARD_RECORD, SHARDS_DIR, Shard, all_shards, shard_count
from marin_rules.experiment import Artifact, Experiment
from marin_rules.steps import SHARDED_STEPS
from marin_rules.workflow import advisory, forcing, signals
from marin_rules.workflow.options import CUSTOM_RULE, rerun_flags, rule_of, target_keys

LOG_ROOT = ".snakemake/marin-logs"
RUN_STAMP = ".snakemake/marin-run/stamp"  # rewritten once per invocation: newer than every record
SETTINGS = ("settings",)  # in `warned`: Snakemake's settings were checked (`advisory.missing_settings`)
TPU_RULES = ("train", CUSTOM_RULE)  # the rules whose `resources:` declare `tpu` (rules/train.smk, custom.smk)


class Stop(SystemExit):
    """Ends the invocation after a one-line message (bad input met while planning)."""


def stop(error: MarinError) -> Stop:
    print(f"marin-rules: {error}", file=sys.stderr)
    return Stop(1)


@dataclass(repr=False)
class Session:
    """Everything one Snakemake invocation knows about the experiment."""

    experiment: Experiment
    prefix: str  # where artifacts live: a local path or URL
    records_root: str  # where Snakemake sees records: the prefix, or the local mirror of a remote one
    workflow: Any
    main_process: bool
    workflow_dir: str
    command: str  # the user's command line, secrets redacted (shell-joined)
    targets_config: str | None
    lease: str  # lease settings for the job command (options.lease_options)
    registry: str  # where job processes register for signal forwarding
    profile: str = ""  # the --workflow-profile the command line named (`options.workflow_profile`), for suggested commands
    warned: set = field(default_factory=set)  # keys (and (key, shard) pairs) already reported
    training: list[str] = field(default_factory=list)  # train jobs that will run: the priced plan's
    _forced: dict[str, bool] = field(default_factory=dict)
    _pending: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (how, upstream): `_left_pending`
    _direct: dict[str, bool] = field(default_factory=dict)  # forced by the command line itself
    _by_command: dict[str, bool] = field(default_factory=dict)  # forced by the command line, itself or via an upstream
    _via: dict[str, str] = field(default_factory=dict)  # key -> the owed upstream it is forced through, nothing else
    _records: dict[str, Record | None] = field(default_factory=dict)
    _marked: list[str] = field(default_factory=list)  # marked forced by this run (`forcing.mark_forced`)
    _new_cascades: list[str] = field(default_factory=list)  # of those: cascades this run began (no marker before)
    _began: str = field(default_factory=lambda: iso(utc_now()))  # when this invocation began (records' clock)
    _left_out: set[str] | None = None  # planned but not run: `--until`, `--omit-from` (`left_out`)
    _to_retire: list[str] = field(default_factory=list)  # forced sharded artifacts, for `start`
    _to_mark: list[tuple[str, bool]] = field(default_factory=list)  # (key, cascade) forced ones, for `start`
    _pod_jobs: list[str] = field(default_factory=list)  # planned jobs that ask for a TPU (`tpu` resource)
    _rule_names: dict[str, str] = field(default_factory=dict)  # our rule -> its name in Snakemake (`name_rules`)
    _started: bool = False
    _run: LeaseHolder | None = None  # this run's main process, once started (`start`)
    _stamped: bool = False
    succeeded: bool = False  # set by `onsuccess:`

    def __repr__(self) -> str:  # short: Snakemake may print the objects it is given
        return f"Session(experiment={self.experiment.path!r}, prefix={self.prefix!r})"

    @property
    def dry(self) -> bool:
        """True unless this invocation runs jobs: `-n`, `--touch`, and every mode that
        only plans (`--dag`, `--rulegraph`, `--summary`, `--list-changes`, `--report`...),
        for which Snakemake sets no executor (its own `dryrun` is then False). Nothing
        is moved, marked or recovered in a dry invocation."""
        workflow = self.workflow
        if getattr(workflow, "executor_plugin", None) is None:
            return True
        return bool(getattr(workflow, "dryrun", False) or getattr(workflow, "touch", False))

    # ---- paths -------------------------------------------------------------------
    def location(self, key: str) -> str:
        return artifact_location(self.prefix, self.experiment[key].id)

    def record_path(self, key: str) -> str:
        """The record as Snakemake sees it (a local path)."""
        return f"{self.records_root}/{self.experiment[key].id.path}/{RECORD_FILE}"

    def record_pattern(self) -> str:
        return f"{self.records_root}/{{artifact}}/{RECORD_FILE}"

    def log_pattern(self) -> str:
        """The job's `log:`. On a pod, process k > 0 (its own `snakemake --mode remote`)
        declares `job.log.p<k>`: Snakemake deletes a job's log before running it, and on
        a local pod's shared disk process 0's log would go while process 0 writes it."""
        if not self.main_process:
            from marin_rules.cluster.pod import pod_process_from_env

            pod = pod_process_from_env(os.environ)
            if pod is not None and pod.process_id:
                return f"{LOG_ROOT}/{{artifact}}/job.log.p{pod.process_id}"
        return f"{LOG_ROOT}/{{artifact}}/job.log"

    def shard_pattern(self) -> str:
        return f"{self.records_root}/{{artifact}}/{SHARDS_DIR}/{{shard}}/{SHARD_RECORD}"

    def shard_log_pattern(self) -> str:
        return f"{LOG_ROOT}/{{artifact}}/shard-{{shard}}.log"

    def shard_records(self, key: str) -> list[str]:
        artifact = self.experiment[key]
        root = f"{self.records_root}/{artifact.id.path}"
        return [f"{root}/{s.folder}/{SHARD_RECORD}" for s in all_shards(shard_count(artifact.runtime))]

    def shard_threads(self, wildcards) -> int:
        """A shard job's threads: its tokenizer/signing processes (`num_workers` of the
        runtime, else of the config: integers >= 1, both checked at load)."""
        artifact = self.experiment.by_path[wildcards.artifact]
        return artifact.runtime.get("num_workers") or artifact.config.get("num_workers") or 1

    def constraint(self, rule: str) -> str:
        """Regex for the `artifact` wildcard: exactly the artifacts this rule builds."""
        paths = [a.id.path for a in self.experiment.artifacts.values() if rule_of(a.step) == rule]
        return trie_regex(paths) if paths else "(?!)"

    def recorded(self, key: str) -> Record | None:
        """The artifact's success record, validated; a corrupt one ends the invocation,
        its line naming the command that rebuilds it as this run would (`rerun_flags`)."""
        if key not in self._records:
            try:
                self._records[key] = read_record_file(self.record_path(key), self.experiment[key].id)
            except MarinError as e:  # a corrupt record's rebuild command runs as printed
                raise stop(e.with_flags(self.hint_flags())) from None
        return self._records[key]

    def hint_flags(self) -> str:
        """What a command this run suggests (`snakemake -f RECORD`) needs besides its
        target to plan this experiment on this prefix (`options.rerun_flags`)."""
        return rerun_flags(os.path.abspath(self.experiment.path), self.prefix, self.workflow_dir,
                           self.workflow.main_snakefile, os.getcwd(), self.profile)  # fmt: skip

    # ---- targets and job parameters --------------------------------------------------
    def targets(self) -> list[str]:
        """Records the `all` rule asks for: everything, or `--config target=KEY[,KEY...]`."""
        return [self.record_path(k) for k in target_keys(self.experiment, self.targets_config)]

    def job_params(self) -> dict[str, str]:
        """Parameters of the job command, each quoted by the rule's `:q`."""
        return {
            "python": sys.executable, "experiment": os.path.abspath(self.experiment.path), "prefix": self.prefix,
            "records": self.records_root, "command": self.command, "lease": self.lease,
            "registry": self.registry, "workflow_dir": self.workflow_dir,
            "snakefile": os.path.abspath(self.workflow.main_snakefile), "profile": self.profile,
        }  # fmt: skip

    def tpu(self, wildcards) -> str:
        """The `tpu` resource of the rules that declare it (`TPU_RULES`)."""
        return tpu_of(self.experiment.by_path[wildcards.artifact])

    def tpu_zone(self, wildcards) -> str:
        """The `tpu_zone` resource: the artifact's runtime.zone, or "" (the executor's)."""
        return self.experiment.by_path[wildcards.artifact].runtime.get("zone") or ""

    def attempt_resource(self, wildcards, attempt: int) -> int:
        """The `marin_attempt` resource of every artifact rule: the job's attempt.
        Snakemake evaluates it again, in this process, before each retry (`--retries`).
        A forced rebuild that failed put the old build back and used up its mark; its
        retry is still that forced rebuild, so the mark is saved again here (else the
        retry would find the old build and serve it as done). Its first evaluation in a
        real run (after Snakemake's lock, before the job runs) also makes sure `start`
        has run: where the Snakefile's `onstart:` does not (used as a module)."""
        if self.main_process and not self.dry:
            self.start()
        if attempt > 1 and self.main_process and not self.dry:
            artifact = self.experiment.by_path.get(wildcards.artifact)
            if artifact is not None and artifact.key in self._marked:
                location = self.location(artifact.key)
                if not storage.exists(forcing.marker_of(location)):
                    forcing.mark_forced(location, by_upstream=not self._direct.get(artifact.key), run=self._run)
        return attempt

    # ---- the start of a real run --------------------------------------------------
    def start(self) -> None:
        """Once per real run, in the main process, after Snakemake locked the working
        directory and before any job runs (see the module docstring): refuse pod jobs
        that could not see a local prefix, then move and mark what planning decided for
        forced artifacts. A run that Snakemake's lock refuses never gets here."""
        if self._started or not self.main_process or self.dry:
            return
        self._started = True
        self._run = new_holder()  # this run, named beside each marker: a reader can tell it is still going
        self._refuse_unreachable_prefix()
        for key in self._to_retire:  # may be refused (a live lease): before anything is marked
            self._retire_sharded(self.experiment[key])
        self._to_mark += [(key, True) for key in self._owed_outside_allowed_rules()]
        for key, cascade in self._to_mark:
            self._mark(key, cascade)
        self._to_retire, self._to_mark = [], []

    def _refuse_unreachable_prefix(self) -> None:
        """Cloud TPU workers (executor `tpu`, backend `gcloud`) cannot see a local prefix,
        nor an experiment file the workflow copied to them leaves out: refused in one
        line, but only when a planned job goes to them (`_pod_jobs`)."""
        from marin_rules.cluster.pod import refuse_unreachable_experiment, refuse_unreachable_prefix

        if not self._pod_jobs:
            return
        plugin = getattr(self.workflow, "executor_plugin", None)
        executor, settings = getattr(plugin, "name", None), self.workflow.executor_settings
        try:
            refuse_unreachable_prefix(executor, settings, self.prefix)
            refuse_unreachable_experiment(executor, settings, self.experiment.path, os.getcwd())
        except MarinError as e:
            raise stop(MarinError(f"{self._pod_jobs[0]}: its job goes to TPU workers: {e}")) from None

    def _mark(self, key: str, cascade: bool) -> None:
        """Save a forced artifact's record as its marker (`forcing.mark_forced`); a cascade
        this run begins (no marker before) may be taken back at exit (`drop_unbegun_cascades`)."""
        location = self.location(key)
        if cascade and key not in self._pending and not storage.exists(forcing.marker_of(location)):
            self._new_cascades.append(key)
        forcing.mark_forced(location, by_upstream=cascade, run=self._run)
        self._marked.append(key)

    # ---- forcing -----------------------------------------------------------------
    def name_rules(self, rules: Any) -> None:
        """From the end of the Snakefile, with its `rules` namespace (our rules under the
        names rules/*.smk give them): the names Snakemake registered them with, which a
        `module` import renames (`use rule * from marin as marin_*` -> `marin_custom`).
        The command line (`--forcerun`, `--until`, `--omit-from`) names those."""
        for rule in {r for a in self.experiment.artifacts.values() for r in self._own_rules(a.step)}:
            if rules.has(rule):
                self._rule_names[rule] = getattr(rules, rule).rule.name

    def _record_names(self, key: str) -> set[str]:
        """The normalized paths the artifact's record has on a command line (mirror and prefix)."""
        return {forcing.normalized(self.record_path(key)), forcing.normalized(self.location(key) + "/" + RECORD_FILE)}

    @staticmethod
    def _own_rules(step: str) -> tuple[str, ...]:
        """The rules (as rules/*.smk names them) of a step's jobs: its own, and
        `{rule}_shard` for a sharded step."""
        rule = rule_of(step)
        return (rule, f"{rule}_shard") if step in SHARDED_STEPS else (rule,)

    def _rules(self, key: str) -> tuple[str, ...]:
        """The rules of the artifact's jobs, as Snakemake names them (`name_rules`)."""
        return tuple(self._rule_names.get(r, r) for r in self._own_rules(self.experiment[key].step))

    def is_forced(self, key: str) -> bool:
        """Will Snakemake force this job, directly or through a forced upstream?"""
        if key not in self._forced:
            self._forced[key] = False  # cycles are impossible; guard recursion anyway
            artifact = self.experiment[key]
            records = self._record_names(key)
            direct = artifact.id.is_dev or any(
                forcing.forced_directly(self.workflow.dag_settings, r, records) for r in self._rules(key)
            )
            self._direct[key] = direct
            upstreams = [u for u in artifact.upstream_keys() if self.is_forced(u)]
            self._by_command[key] = direct or any(self._by_command.get(u, False) for u in upstreams)
            if upstreams and not self._by_command[key]:  # only a stopped cascade's owed upstream forces it
                self._via[key] = upstreams[0]
            self._forced[key] = direct or bool(upstreams) or self._left_pending(key)
        return self._forced[key]

    def left_out(self, key: str) -> bool:
        """Does this invocation plan the artifact's job (its input functions run) but
        never run it? `--until` runs only the jobs it names (by rule or record) and their
        upstreams; `--omit-from` none of those it names nor their consumers. A forced one
        of these is not rebuilt by this run: nothing may be marked or moved for it."""
        if self._left_out is None:
            settings = self.workflow.dag_settings
            until = {str(x) for x in (getattr(settings, "until", None) or ())}
            omit = {str(x) for x in (getattr(settings, "omit_from", None) or ())}
            upstreams = {k: a.upstream_keys() for k, a in self.experiment.artifacts.items()}
            self._left_out = forcing.left_out(upstreams, self._named, until, omit)
        return key in self._left_out

    def _named(self, key: str, names: set[str]) -> str | None:
        """Which of the artifact's jobs `names` (rules or record files of `--until`,
        `--omit-from`) names: "artifact" (its own job), "shards" (only its shard jobs), or None."""
        rules = self._rules(key)
        if rules[0] in names or self._record_names(key) & {forcing.normalized(n) for n in names}:
            return "artifact"
        return "shards" if any(r in names for r in rules[1:]) else None

    def _owed(self, key: str) -> bool:
        """Is this forced artifact, left out of this run (`left_out`), owed a rebuild by
        it: an upstream this run rebuilds is forced (a cascade its next run finishes, as
        Snakemake's mtime trigger would; `_left_pending`)?"""
        return any(self.is_forced(u) and not self.left_out(u) for u in self.experiment[key].upstream_keys())

    def _left_pending(self, key: str) -> bool:
        """Did a forced run stop before rebuilding this artifact, which it owes a rebuild?
        Its marker (`forcing.MARKER`) is still there and an upstream's record is not the
        one it was built on (rebuilt since, by that run or a later one), or an upstream
        is unbuilt: a forced sharded artifact's old build moves aside before any job
        (`start`) and never comes back, so a run stopped before its gather leaves it
        unbuilt, and this run builds it first. This run finishes that rebuild, after the
        upstream's, as Snakemake's mtime trigger finishes a plain workflow's stopped run."""
        artifact = self.experiment[key]
        record = self.recorded(key)
        if record is None or artifact.id.is_dev or not storage.exists(forcing.marker_of(self.location(key))):
            return False
        rebuilt = advisory.rebuilt_upstreams(artifact, record, self.recorded)
        if rebuilt:
            self._pending[key] = ("rebuilt", rebuilt[0][0])
            return True
        unbuilt = [u for u in artifact.upstream_keys() if self.recorded(u) is None]
        if unbuilt:  # built by this run (or, if left out, by the run that builds it): this one after it
            self._pending[key] = ("unbuilt", unbuilt[0])
            return True
        # an upstream still to be rebuilt (its own marker) forces this one through it (`is_forced`);
        # else its upstreams' builds are the ones it was built on: nothing is owed yet
        return False

    def _owed_line(self, key: str) -> str | None:
        """The one line of an artifact this run rebuilds to finish a forced cascade that
        stopped before rebuilding it (`_left_pending`, or forced only through such an
        upstream: `_via`), else None."""
        action = "a real run rebuilds it" if self.dry else "rebuilding it"
        if key in self._pending:
            how, upstream = self._pending[key]
            keep = f" (to keep this build instead, delete {forcing.marker_of(self.location(key))})"
        elif key in self._via:  # its own marker keeps nothing: the upstream's rebuild forces it
            how, upstream, keep = "unbuilt", self._via[key], ""
        else:
            return None
        forced = forcing.forced_phrase(forcing.forcing_run_alive(self.location(key)))
        if how == "rebuilt":  # by that forced run, or by a later run that stopped too
            return (f"{key}: {forced}; its upstream {upstream} has been rebuilt "
                    f"since it was built: {action}{'' if self.dry else ' now'}{keep}")  # fmt: skip
        return f"{key}: {forced} and its upstream {upstream}: {action} after {upstream}{keep}"

    # ---- input functions -----------------------------------------------------------
    def inputs(self, wildcards) -> dict[str, Any]:
        """Input function of every rule: upstream records, drift report, ancient edges."""
        from snakemake.io import ancient

        artifact = self.experiment.by_path[wildcards.artifact]
        if "shard" in wildcards.keys() and self.main_process:
            self._refuse_unknown_shard(artifact, wildcards.shard)
        if self.main_process and SETTINGS not in self.warned:
            self.warned.add(SETTINGS)
            missing = advisory.missing_settings(self.workflow)
            refusal = advisory.triggers_refusal(missing)
            if refusal:
                raise stop(MarinError(refusal))
            if missing:
                print(advisory.settings_warning(missing), file=sys.stderr)
        forced = self.is_forced(artifact.key)
        record = None if forced else self.recorded(artifact.key)  # a forced one is replaced: even if corrupt
        if self.main_process and artifact.key not in self.warned:
            self.warned.add(artifact.key)
            self._plan(artifact, record, forced)
        inputs: dict[str, Any] = {}
        if (artifact.id.is_dev or artifact.key in self._pending) and self.main_process:
            inputs["marin_run_stamp"] = self._run_stamp()  # newer than the record: Snakemake reruns it
        elif "shard" in wildcards.keys() and self.main_process and not forced and self._stale_shard(artifact, wildcards.shard):
            inputs["marin_run_stamp"] = self._run_stamp()  # its job sets the stale shard aside and builds it
        elif "shard" in wildcards.keys() and self.main_process and forced and not self.left_out(artifact.key):
            inputs["marin_run_stamp"] = self._run_stamp()  # planned (and listed by -n): `start` retires the old shards
        elif "shard" in wildcards.keys() and self.main_process and self._retire_unended(artifact):
            inputs["marin_run_stamp"] = self._run_stamp()  # `start` puts the old build back whole, then retires it
        elif "shard" not in wildcards.keys() and self.main_process and not forced and self._rebuild_unended(artifact):
            inputs["marin_run_stamp"] = self._run_stamp()  # its job restores the old build (or waits for the rebuild)
        for role, dep in artifact.deps.items():
            upstreams = [dep] if isinstance(dep, str) else list(dep)
            for i, upstream in enumerate(upstreams):
                if record is not None and not forced and self.recorded(upstream) is None:
                    continue  # a finished artifact is served; an unbuilt new upstream cannot force it
                path = self.record_path(upstream)
                name = role if isinstance(dep, str) else f"{role}_{i}"
                inputs[name] = path if self.is_forced(upstream) else ancient(path)
        if artifact.step in SHARDED_STEPS and "shard" not in wildcards.keys() and (
            forced or record is None or self._retire_unended(artifact)
        ):
            for i, path in enumerate(self.shard_records(artifact.key)):
                inputs[f"shard_{i}"] = path
        return inputs

    def _refuse_unknown_shard(self, artifact: Artifact, shard: str) -> None:
        """A target naming a shard the artifact does not have (`runtime.shards` says how
        many): refused while planning, in one line (its job would only refuse it later)."""
        count = shard_count(artifact.runtime)
        found = SHARD_NAME.fullmatch(shard)  # parsed, not looked up: this runs once per shard job planned
        if found is None or int(found.group(2)) != count or int(found.group(1)) >= count:
            first, last = Shard(0, count).name, Shard(count - 1, count).name
            listed = first if count == 1 else f"{first} .. {last}"
            raise stop(MarinError(f"{artifact.key}: it has no shard {shard}: runtime.shards gives it {count} "
                                  f"({listed}); name one of those, or the artifact's record"))  # fmt: skip

    def _stale_shard(self, artifact: Artifact, shard: str) -> bool:
        """Was this finished shard of an unfinished artifact made from another recipe (changed
        without a version bump), or from other upstream builds than today's (its tokenizer
        rebuilt since, say)? Then its job runs again, and sets it aside under the shard's
        lease (`job/shard.py`); an unreadable shard record is left to the job."""
        from marin_rules.artifacts.builds import upstream_builds
        from marin_rules.artifacts.shards import shard_change

        path = f"{self.records_root}/{artifact.id.path}/{SHARDS_DIR}/{shard}/{SHARD_RECORD}"
        try:
            with open(path, encoding="utf-8") as f:
                record = decode_json(f.read())
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict):
            return False
        now = upstream_builds(artifact.upstream_keys(), self.recorded)  # None: one built in this run (the shard reruns)
        change = shard_change(record, artifact.fingerprint, now)
        if change is not None and (artifact.key, shard) not in self.warned:
            self.warned.add((artifact.key, shard))
            print(f"{artifact.key}: shard {shard} {change}; building it again", file=sys.stderr)
        return change is not None

    def _rebuild_unended(self, artifact: Artifact) -> bool:
        """Is a forced rebuild of this artifact neither finished nor restored (its job was
        killed outright with its Snakemake, or another run rebuilds it now)? Its record may
        be Snakemake's backup of the old one over partial data: its job runs, and restores
        the old build under the lease (`forcing.recover_interrupted`) or waits for the
        rebuild to end, then serves what is there."""
        from marin_rules.inspect.reading import unended_rebuild

        seen = f"{self.records_root}/{artifact.id.path}"  # the prefix, or its mirror (which copies the pointer)
        pointer = forcing.rebuilding_pointer(seen)
        if not os.path.exists(pointer):
            return False
        if unended_rebuild(seen) is not None:
            return True
        if (artifact.key, "pointer") not in self.warned:
            self.warned.add((artifact.key, "pointer"))
            print(f"{artifact.key}: {pointer} is unreadable (not a pointer to a kept build): ignored, the build in "
                  "place serves; delete the file", file=sys.stderr)  # fmt: skip
        return False

    def _retire_unended(self, artifact: Artifact) -> bool:
        """Was this unforced sharded artifact's forced rebuild killed (with its Snakemake)
        while `start` set its old build aside (`forcing.retire_now`: part of it moved, the
        pointer says so)? Then this run finishes that force, as the job of any other step
        does: `start` puts the old build back whole and sets it aside again, under the
        lease, and every shard job and the gather run (`_plan` queues it; not with -n,
        not when this run leaves its job out)."""
        from marin_rules.inspect.reading import unended_move

        if artifact.step not in SHARDED_STEPS or artifact.id.is_dev or self.left_out(artifact.key):
            return False
        return unended_move(f"{self.records_root}/{artifact.id.path}")  # the prefix, or its mirror

    def _run_stamp(self) -> str:
        """The run stamp, touched at the first dev or pending artifact of this invocation."""
        if not self._stamped:
            os.makedirs(os.path.dirname(RUN_STAMP), exist_ok=True)
            with open(RUN_STAMP, "w", encoding="utf-8") as f:  # new content: Snakemake skips
                f.write(f"{time.time_ns()} {os.getpid()}\n")  # newer inputs with an unchanged checksum
            self._stamped = True
        return RUN_STAMP

    def _plan(self, artifact: Artifact, record: Record | None, forced: bool) -> None:
        if artifact.step == ADOPT_STEP and record is None:
            try:
                check_layout(artifact.key, artifact.config)
            except MarinError as e:
                raise stop(e) from None
        elif artifact.step == ADOPT_STEP and not forced:
            problems = source_problems(artifact, record)
            if problems:
                print(f"{artifact.key}: {source_changed(served_source(artifact, record), problems)}", file=sys.stderr)
        if artifact.step == "train" and (forced or record is None) and not self.left_out(artifact.key):
            self._refuse_short_data(artifact)
            self.training.append(artifact.key)
            if len(self.training) == 1 and getattr(self.workflow, "dryrun", False):  # -n (not --dag: no plan asked)
                atexit.register(self.print_plan)  # `onstart:` does not run in dry runs
        if forced and self.left_out(artifact.key):
            self._mark_left_out(artifact)
            return
        retire = not forced and self._retire_unended(artifact)
        unended = not forced and not retire and record is not None and self._rebuild_unended(artifact)
        if (forced or record is None or unended or retire) and tpu_of(artifact) and not self.left_out(artifact.key):
            self._pod_jobs.append(artifact.key)
        if retire:
            how = "a real run puts it back whole, then rebuilds it" if self.dry else "putting it back whole, rebuilding it"
            print(f"{artifact.key}: a forced rebuild was killed while it set the previous build aside: {how}",
                  file=sys.stderr)  # fmt: skip
            if not self.dry:
                self._to_retire.append(artifact.key)
            return
        if forced:
            line = self._owed_line(artifact.key)
            if line is not None:
                print(line, file=sys.stderr)
            if self.dry:  # -n lists the jobs (shard jobs by the run stamp); nothing is moved or marked
                return
            if artifact.step in SHARDED_STEPS:
                self._to_retire.append(artifact.key)
            else:
                self._to_mark.append((artifact.key, not self._direct.get(artifact.key)))
            return
        if unended:
            print(f"{artifact.key}: a forced rebuild of it did not end (killed, or another run is rebuilding it): "
                  "its job restores the previous build, or waits for that run", file=sys.stderr)  # fmt: skip
        if record is not None:
            try:
                advisory.report(artifact, record, self.recorded, self.record_path(artifact.key))
            except MarinError as e:
                raise stop(e) from None
        elif not self.left_out(artifact.key):  # a stopped run's checkpoints of another recipe
            refusal = advisory.refusal_warning(artifact, self.experiment, self.prefix, self.recorded)
            if refusal is not None:
                print(refusal, file=sys.stderr)


    def _owed_outside_allowed_rules(self) -> list[str]:
        """With `--allowed-rules`, Snakemake plans no job of another rule (an output there
        is taken as it is), so no input function sees the consumers of what this run
        rebuilds: those of them with a build, whose rules are not allowed, are owed their
        rebuild as a cascade `--until` leaves out is (`_mark_left_out`), and the next run
        finishes them (`_left_pending`)."""
        allowed = {str(r) for r in (getattr(self.workflow.dag_settings, "allowed_rules", None) or ())}
        rebuilt = {key for key, _ in self._to_mark if not self.left_out(key)} | set(self._to_retire)
        if not allowed or not rebuilt:
            return []
        return [
            key for key, artifact in self.experiment.artifacts.items()
            if key not in rebuilt and not artifact.id.is_dev and rebuilt & set(artifact.upstream_keys())
            and not set(self._rules(key)) & allowed and self.recorded(key) is not None
        ]  # fmt: skip

    def _refuse_short_data(self, artifact: Artifact) -> None:
        """A train artifact this run builds, whose token data this run serves as built,
        with a split shorter than its sequences (`train.config.check_built_data`):
        refused while planning, before anything is written; validations that would read
        the split's sequences more than once get a note (`repeated_validation`)."""
        from marin_rules.train.config import check_built_data, repeated_validation

        data = artifact.deps.get("data")
        members = [data] if isinstance(data, str) else [k for k, w in (data or {}).items() if w]  # weight 0: left out
        built = {}
        for key in members:
            record = None if self.is_forced(key) else self.recorded(key)
            if record is not None and record.step == "tokenize" and isinstance(record.result, Mapping):
                built[key] = record.result
        try:
            check_built_data(artifact.config, built)
        except ConfigError as e:
            raise stop(MarinError(f"{artifact.key}: {e}")) from None
        note = repeated_validation(artifact.config, built) if len(members) == 1 else None  # (a mixture: per member)
        if note is not None:
            print(f"{artifact.key}: {note}", file=sys.stderr)

    def _mark_left_out(self, artifact: Artifact) -> None:
        """A forced artifact whose job this run leaves out (`left_out`): nothing is moved
        (its build serves until a run rebuilds it); only a cascade this run owes it
        (`_owed`) is marked by `start`, so that the next run finishes it (`_left_pending`)."""
        if self.dry or artifact.id.is_dev or not self._owed(artifact.key):
            return
        self._to_mark.append((artifact.key, True))

    def _retire_sharded(self, artifact: Artifact) -> None:
        """A forced sharded artifact, from `start`: move its old build aside before its shard jobs run."""
        try:
            from marin_rules.job.main import lease_settings

            stale_s = lease_settings(self.lease)["stale_s"]
            moved = forcing.retire_now(self.location(artifact.key), keep=not artifact.id.is_dev, stale_s=stale_s)
        except MarinError as e:
            raise stop(e) from None
        if self.records_root != self.prefix:  # the mirror's shard records go with the build
            shutil.rmtree(os.path.join(self.records_root, artifact.id.path, SHARDS_DIR), ignore_errors=True)
        if moved:
            print(f"{artifact.key}: forced: {forcing.moved_note(moved)}", file=sys.stderr)

    def taken_by_another_run(self) -> list[str]:
        """One line for each artifact this run planned whose record is missing at its end
        under another run's live lease: that run is building it (a forced build moves the
        old one aside when its job starts), so this run's jobs and targets met a missing
        file, which Snakemake reports only as latency. A lease held by one of this run's
        own job processes (still registered: stopped by a signal, not yet ended) is not
        another run's; one held by a job this process submitted through the tpu executor
        (`held_for`: a pod job's process on a TPU worker, which no registry here lists,
        ends after this run when its slice is deleted) gets its own line, saying so."""
        from marin_rules.artifacts.lease import held_for, held_here_by, held_live, read_lease
        from marin_rules.cluster.pod import this_submitter

        # this run's own jobs that a signal stopped may still be ending, lease not yet
        # released, when Snakemake exits: they are registered here until they have ended
        ours, submitter = signals.registered(self.registry), this_submitter()
        lines = []
        for key in sorted(self._records):  # read while planning
            if os.path.exists(self.record_path(key)):
                continue
            holder = read_lease(self.location(key))
            if not held_live(holder) or held_here_by(holder, ours):
                continue
            if held_for(holder, submitter):
                lines.append(
                    f"{key}: this run's pod job still holds its lease from a TPU worker ({holder.describe()}) "
                    "while it stops; the next run waits for it to end, or takes the lease over once it is stale"
                )
            else:
                lines.append(
                    f"{key}: its record is not there: another run is building it (lease held by "
                    f"{holder.describe()}); run snakemake again once that run has finished, and this one serves it"
                )
        return lines

    def recover_killed_rebuilds(self) -> list[str]:
        """At exit: one line for each forced rebuild of this run whose job was killed
        outright (SIGKILL, the OOM killer), after completing the restore it could not
        do (`forcing.recover_interrupted`, under the lease), so the old build serves now,
        not Snakemake's backup of its record on top of the attempt's partial data. A
        rebuild whose lease is still live (a pod job elsewhere) is left to its next job."""
        from marin_rules.artifacts import lease as leases
        from marin_rules.inspect.reading import unended_move

        lines = []
        for key in self._marked:
            location = self.location(key)
            if forcing.interrupted_rebuild(location) is None:
                continue
            moving = unended_move(location)  # killed while it set the old build aside
            try:
                held = leases.acquire(location, is_done=lambda: False, wait=False)
            except (leases.LeaseHeld, MarinError, OSError):
                continue
            try:
                failed = forcing.recover_interrupted(location)
            except Exception as e:  # noqa: BLE001 - at exit: say it, the artifact's next job tries again
                lines.append(f"{key}: its forced rebuild was killed before it ended, and putting the previous build "
                             f"back failed ({type(e).__name__}: {e}); the next run's job of it tries again")  # fmt: skip
                continue
            finally:
                held.release()
            if failed:
                lines.append(f"{key}: its forced rebuild was killed before it ended; the previous build is back "
                             f"in place (what the attempt left: {failed})")  # fmt: skip
            elif moving:
                lines.append(f"{key}: its forced rebuild was killed while it set the previous build aside; that "
                             "build is back in place, and the next run rebuilds it (still forced)")  # fmt: skip
        return lines

    def drop_unbegun_cascades(self) -> None:
        """At exit after a failed run: a consumer this run marked forced only because an
        upstream was, whose job never ran and none of whose upstreams was rebuilt during
        the run, owes nothing (the upstream's rebuild failed or never started): its marker
        goes, so a later `-f` of that upstream alone does not rebuild it (`_left_pending`)."""
        for key in self._new_cascades:
            location = self.location(key)
            if not storage.exists(forcing.marker_of(location)):
                continue  # its job ran
            rebuilt = False
            for upstream in self.experiment[key].upstream_keys():
                try:
                    record = read_record_file(self.record_path(upstream), self.experiment[upstream].id)
                except MarinError:
                    record = None
                rebuilt = rebuilt or record is None or (record.built or "") >= self._began
            if not rebuilt:
                forcing.unmark_forced(location)

    def print_plan(self) -> None:
        """The priced plan of the training jobs that will run, once (main process)."""
        keys, self.training = self.training, []
        advisory.print_plan(self.experiment, self.prefix, keys, [k for k in keys if self.is_forced(k)])


def tpu_of(artifact: Artifact) -> str:
    """The `tpu` resource of an artifact's job: its runtime.tpu (its form checked at load:
    `experiment.Runtime`); "default" for training jobs that name none (the executor's
    --tpu-type); "" (this host) for other steps, and for rules that declare no `tpu`."""
    if rule_of(artifact.step) not in TPU_RULES:
        return ""
    return artifact.runtime.get("tpu") or ("default" if artifact.step == "train" else "")


def trie_regex(words: list[str]) -> str:
    """A regex matching exactly `words`, as a prefix trie: short to store and to match
    (Snakemake substitutes and matches the constraint for every job of a rule, so a
    flat alternation of thousands of sweep members would cost quadratic time). Built
    bottom-up without recursion: a key may be hundreds of characters long."""
    import re

    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    regex: dict[int, str] = {}  # id(trie node) -> the regex of the words below it
    stack = [(trie, False)]
    while stack:
        node, children_done = stack.pop()
        if not children_done:
            stack.append((node, True))
            stack += [(child, False) for ch, child in node.items() if ch]
            continue
        branches = [re.escape(ch) + regex[id(child)] for ch, child in sorted(node.items()) if ch]
        body = "" if not branches else branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        regex[id(node)] = "(?:" + body + ")?" if branches and "" in node else body
    return regex[id(trie)]
