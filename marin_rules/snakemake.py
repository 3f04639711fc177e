"""The glue between Snakemake and the artifact core.

Model: the Snakefile calls `begin(workflow, config)` once per parse; it selects and
validates the experiment and returns a `Session`. Rules (one per step kind) declare
the success record `{prefix}/{name}/{version}/.artifact.json` as their only output,
with the wildcard `artifact` = `name/version` constrained to that step's artifacts.
Input functions (`Session.inputs`) run on the submitting host for every job reachable
from the targets, in real runs, `-n`, `--dag` and `--rulegraph`: that is where recipe
drift is reported (stderr, once per artifact) and where edges are made `ancient()`,
so that newer upstream files never rebuild a finished artifact. Only a new
name@version or an explicit `--forcerun`/`-R`/`-f`/`-F` builds again; forcing cascades
to consumers as in plain Snakemake. The `run:` wrapper (`Session.run_job`) calls the
step and writes the success record last, or a failure record and re-raises.

Remote prefixes (`gs://...`): Snakemake sees a local mirror of the records under
`.snakemake/marin-mirror/`, refreshed from one listing of the prefix per invocation;
the real records and all data live on the prefix, written by the steps.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from marin_rules.artifacts import storage
from marin_rules.artifacts.canonical import canonical_value
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.drift import drift_message, recipe_diff
from marin_rules.artifacts.errors import DriftError, MarinError, StepError
from marin_rules.artifacts.identity import RECORD_FILE, artifact_location
from marin_rules.artifacts.records import Provenance, utc_now, write_failure, write_success
from marin_rules.cluster.pod import pod_process_from_env
from marin_rules.experiment import Artifact, Experiment, load_experiment
from marin_rules.mirror import MIRROR_DIR, mirror_root, refresh_mirror  # noqa: F401 (MIRROR_DIR re-exported)
from marin_rules.steps import BUILTIN_STEPS

DEFAULT_EXPERIMENT = "experiments/default.yaml"
DEFAULT_PREFIX = "artifacts"
CUSTOM_RULE = "custom"
COMMAND_ENV = "MARIN_USER_COMMAND"  # internal: the user's command line, main -> job process


def rule_of(step: str) -> str:
    """The Snakemake rule that runs a step kind (user steps share `custom`)."""
    return step if step in BUILTIN_STEPS else CUSTOM_RULE


def select_experiment(config: dict, configfiles: list[str], workdir: str, workflow_dir: str) -> str:
    """The experiment file: `--config experiment=`, else an experiment `--configfile`, else the default."""
    experiment_files = [f for f in configfiles if _is_experiment_file(f)]
    chosen = config.get("experiment")
    if len(experiment_files) > 1:
        raise MarinError(f"more than one experiment --configfile given ({', '.join(experiment_files)}); pick one")
    if chosen and experiment_files and not _same_file(str(chosen), experiment_files[0], workdir):
        raise MarinError(
            f"--config experiment={chosen} and --configfile {experiment_files[0]} name different experiments; give one"
        )
    if chosen:
        return str(chosen)
    if experiment_files:
        return experiment_files[0]
    return os.path.join(workflow_dir, DEFAULT_EXPERIMENT)


GLUE_CONFIG_KEYS = {"experiment", "prefix", "target"}


def _is_experiment_file(path: str) -> bool:
    """A --configfile is an experiment unless it only sets the glue's own keys: one
    with a misspelled `artifacts:` must fail validation, not run the default."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError:
        return False
    except yaml.YAMLError:
        return True  # load_experiment reports the YAML error
    return not (isinstance(data, dict) and set(data) <= GLUE_CONFIG_KEYS)


def _same_file(a: str, b: str, workdir: str) -> bool:
    return os.path.realpath(os.path.join(workdir, a)) == os.path.realpath(os.path.join(workdir, b))


def target_keys(experiment: Experiment, targets_config: Any) -> list[str]:
    """The artifact keys `--config target=KEY|STEP[,...]` names (all when unset)."""
    if not targets_config:
        return list(experiment.artifacts)
    keys = []
    for item in str(targets_config).split(","):
        item = item.strip()
        if item in experiment.artifacts:
            keys.append(item)
        elif any(rule_of(a.step) == item for a in experiment.artifacts.values()):
            keys.extend(k for k, a in experiment.artifacts.items() if rule_of(a.step) == item)
        else:
            raise MarinError(
                f"--config target={item}: not an artifact of {experiment.path} "
                "(use name@version, or a step kind such as train)"
            )
    return keys


@dataclass
class Session:
    """Everything one Snakemake invocation knows about the experiment."""

    experiment: Experiment
    prefix: str  # where artifacts live: a local path or URL
    records_root: str  # where Snakemake sees records: the prefix, or the local mirror of a remote one
    workflow: Any
    main_process: bool
    workflow_dir: str
    command: list[str]
    targets_config: str | None = None
    warned: set[str] = field(default_factory=set)
    _forced: dict[str, bool] = field(default_factory=dict)
    _records: dict[str, dict | None] = field(default_factory=dict)

    # ---- paths -------------------------------------------------------------------
    def location(self, key: str) -> str:
        return artifact_location(self.prefix, self.experiment[key].id)

    def record_path(self, key: str) -> str:
        """The record as Snakemake sees it (a local path)."""
        return f"{self.records_root}/{self.experiment[key].id.path}/{RECORD_FILE}"

    def record_pattern(self) -> str:
        return f"{self.records_root}/{{artifact}}/{RECORD_FILE}"

    def constraint(self, rule: str) -> str:
        """Regex for the `artifact` wildcard: exactly the artifacts this rule builds."""
        paths = [a.id.path for a in self.experiment.artifacts.values() if rule_of(a.step) == rule]
        return trie_regex(paths) if paths else "(?!)"

    def recorded(self, key: str) -> dict | None:
        if key not in self._records:
            try:
                self._records[key] = storage.read_json(self.record_path(key))
            except (FileNotFoundError, ValueError):
                self._records[key] = None
        return self._records[key]

    # ---- targets -----------------------------------------------------------------
    def targets(self) -> list[str]:
        """Records the `all` rule asks for: everything, or `--config target=KEY[,KEY...]`."""
        return [self.record_path(k) for k in target_keys(self.experiment, self.targets_config)]

    # ---- forcing -----------------------------------------------------------------
    def is_forced(self, key: str) -> bool:
        """Will Snakemake force this job, directly or through a forced upstream?"""
        if key not in self._forced:
            self._forced[key] = False  # cycles are impossible; guard recursion anyway
            settings = self.workflow.dag_settings
            artifact = self.experiment[key]
            direct = False
            if settings is not None:
                rules = {str(f) for f in settings.forcerun or ()}
                forcerun = {_normalized(f) for f in rules}
                records = {_normalized(self.record_path(key)), _normalized(self.location(key) + "/" + RECORD_FILE)}
                targets = {_normalized(str(t)) for t in settings.targets or ()}
                direct = (
                    bool(settings.forceall)
                    or rule_of(artifact.step) in rules
                    or bool(records & forcerun)
                    or (bool(settings.forcetargets) and bool(records & targets))
                )
            self._forced[key] = direct or any(self.is_forced(u) for u in artifact.upstream_keys())
        return self._forced[key]

    # ---- input functions -----------------------------------------------------------
    def inputs(self, wildcards) -> dict[str, Any]:
        """Input function of every rule: upstream records, drift report, ancient edges."""
        from snakemake.io import ancient

        artifact = self.experiment.by_path[wildcards.artifact]
        record = self.recorded(artifact.key)
        forced = self.is_forced(artifact.key)
        if self.main_process:
            self.report(artifact, record, forced)
            if forced:
                self.keep_history(artifact.key)
        inputs: dict[str, Any] = {}
        for role, dep in artifact.deps.items():
            upstreams = [dep] if isinstance(dep, str) else list(dep)
            for i, upstream in enumerate(upstreams):
                if record is not None and not forced and self.recorded(upstream) is None:
                    continue  # a finished artifact is served; an unbuilt new upstream cannot force it
                path = self.record_path(upstream)
                name = role if isinstance(dep, str) else f"{role}_{i}"
                inputs[name] = path if self.is_forced(upstream) else ancient(path)
        return inputs

    def report(self, artifact: Artifact, record: dict | None, forced: bool) -> None:
        """Print drift and upstream advisories once per artifact; raise on pinned drift."""
        if artifact.key in self.warned or record is None:
            return
        self.warned.add(artifact.key)
        recorded_fp = record.get("fingerprint")
        if recorded_fp != artifact.fingerprint and not forced:
            recorded_payload = {
                "step": record.get("step"),
                "config": record.get("config", {}),
                "deps": _dep_keys(record.get("deps", {})),
            }
            lines = recipe_diff(recorded_payload, artifact.payload())
            if artifact.expect_fingerprint is not None:
                raise DriftError(
                    f"{artifact.key}: recipe drift on a pinned artifact: recorded fingerprint {recorded_fp}, "
                    f"pinned {artifact.expect_fingerprint}; restore the recipe that was built, or bump the version"
                )
            print(drift_message(artifact.key, recorded_fp, artifact.fingerprint, lines), file=sys.stderr)
        if forced:
            return
        for upstream in artifact.upstream_keys():
            seen = _recorded_dep(record.get("deps", {}), upstream)
            now = self.recorded(upstream) or {}
            if seen.get("fingerprint") and now.get("fingerprint") and seen["fingerprint"] != now["fingerprint"]:
                how = f"fingerprint {seen['fingerprint']} then, {now['fingerprint']} now"
            elif seen.get("built") and _built_at(now) and seen["built"] != _built_at(now):
                how = f"same recipe, built {seen['built']} then, {_built_at(now)} now"  # a forced rebuild
            else:
                continue
            print(
                f"{artifact.key}: upstream {upstream} was rebuilt since this artifact was built "
                f"({how}); serving the cached output (--forcerun {self.record_path(artifact.key)} rebuilds it).",
                file=sys.stderr,
            )

    def keep_history(self, key: str) -> None:
        """Before a forced rebuild deletes the record, copy it to `.history/` (no-op in dry runs)."""
        record = self.recorded(key)
        if record is None or getattr(self.workflow, "dryrun", False):
            return
        stamp = str(record.get("provenance", {}).get("ended", "unknown")).replace(":", "").replace("-", "")
        target = storage.join(self.location(key), ".history", f"{stamp}-{record.get('fingerprint')}.json")
        if not storage.exists(target):
            storage.write_json_atomic(target, record)

    # ---- the job -------------------------------------------------------------------
    def run_job(self, wildcards, rule: str, jobid: int | None) -> None:
        """Run one artifact's step; write its success record last, or a failure record."""
        artifact = self.experiment.by_path[wildcards.artifact]
        location = self.location(artifact.key)
        deps_record, deps_ctx = {}, {}
        for role, dep in artifact.deps.items():
            if isinstance(dep, str):
                deps_record[role] = self._dep_entry(dep)
                deps_ctx[role] = self.location(dep)
            else:
                deps_record[role] = [{**self._dep_entry(k), "weight": w} for k, w in dep.items()]
                deps_ctx[role] = {self.location(k): w for k, w in dep.items()}
        entry = {
            "name": artifact.id.name,
            "version": artifact.id.version,
            "step": artifact.step,
            "fingerprint": artifact.fingerprint,
            "config": artifact.config,
            "deps": deps_record,
            "runtime": artifact.runtime,
            "path": location,
        }
        pod = pod_process_from_env(os.environ)
        runtime = dict(artifact.runtime)
        if pod is not None:
            runtime["distributed"] = pod.runtime_distributed()
        ctx = StepContext(
            name=artifact.id.name,
            version=artifact.id.version,
            config=artifact.config,
            deps=deps_ctx,
            runtime=runtime,
            output=location,
        )
        provenance = Provenance(self.workflow_dir, self.command, rule, jobid)
        process = None if pod is None else pod.process_id
        # the step is imported inside run_step: an import error is a failed step, with a record
        record = run_step(ctx, entry, provenance, lambda c: self._step_function(artifact)(c), process=process)
        if record is not None and self.records_root != self.prefix:  # remote prefix: Snakemake checks the local mirror
            storage.write_json_atomic(self.record_path(artifact.key), record)

    def _step_function(self, artifact: Artifact) -> Callable[[StepContext], Any]:
        from marin_rules.steps import step_function

        return step_function(artifact.step)

    def _dep_entry(self, key: str) -> dict[str, Any]:
        upstream, record = self.experiment[key], self.recorded(key)
        return {
            "name": upstream.id.name,
            "version": upstream.id.version,
            "path": self.location(key),
            "fingerprint": (record or {}).get("fingerprint"),
            "built": _built_at(record),  # tells a later forced rebuild of it apart
        }


class JobTerminated(BaseException):
    """Raised inside a step when Snakemake (or a user) sends SIGTERM or SIGINT. Made
    with no argument when raised asynchronously in a step's thread (see
    `install_stop_handlers`): the signal is then the one that thread was sent."""

    def __init__(self, signum: int | None = None):
        if signum is None:
            signum = _STEP_THREADS.get(threading.get_ident()) or signal.SIGTERM
        super().__init__(f"terminated by signal {signal.Signals(signum).name}")
        self.signum = signum


# Steps running in a thread other than the main one: thread id -> the signal it was
# sent (None until then). Snakemake runs `run:` blocks in a worker thread of the job
# process, where Python delivers no signals.
_STEP_THREADS: dict[int, int | None] = {}


def interrupt_steps(signum: int) -> bool:
    """Raise JobTerminated in every step thread not yet interrupted; True if any was."""
    interrupted = False
    for ident, sent in list(_STEP_THREADS.items()):
        if sent is None:
            _STEP_THREADS[ident] = signum
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(JobTerminated))
            interrupted = True
    return interrupted


def install_stop_handlers() -> None:
    """In a job process (from the main thread, at parse time): the first SIGINT or
    SIGTERM stops the running step, which writes its failure record and fails the job
    the ordinary way; a second one goes to the previous handler. Snakemake's scheduler
    replaces the SIGTERM handler after parsing with a graceful exit that waits for
    running jobs, so that method is wrapped too."""
    from snakemake.scheduling.job_scheduler import JobScheduler

    previous_int = signal.getsignal(signal.SIGINT)

    def on_int(signum, frame):
        if not interrupt_steps(signum) and callable(previous_int):
            previous_int(signum, frame)

    signal.signal(signal.SIGINT, on_int)
    graceful = JobScheduler.exit_gracefully
    if getattr(graceful, "_marin", False):
        return

    def exit_gracefully(self, *args):
        if not interrupt_steps(signal.SIGTERM):
            graceful(self, *args)

    exit_gracefully._marin = True
    JobScheduler.exit_gracefully = exit_gracefully


def run_step(
    ctx: StepContext, entry: dict, provenance: Provenance, function: Callable, process: int | None = None
) -> dict | None:
    """Call a step; success record last, or failure record then re-raise.

    Every process of a pod (`process` is its index) runs the step; only process 0
    writes the success record, and every process that fails writes a failure record.
    SIGTERM (and, in a job process's worker thread, SIGINT) stops the step with
    JobTerminated, recorded with the signal's name. The success record is returned
    either way."""
    started = utc_now()
    storage.makedirs(ctx.output)

    def on_term(signum, frame):
        raise JobTerminated(signum)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if in_main else None
    if not in_main:
        _STEP_THREADS[threading.get_ident()] = None
    try:
        result = function(ctx)
        result = canonical_value({} if result is None else result, "result")
    except BaseException as error:  # noqa: BLE001 - every failure leaves a record
        ended = utc_now()
        status: int | str | None = None
        if isinstance(error, JobTerminated):
            status = signal.Signals(error.signum).name
        elif isinstance(error, KeyboardInterrupt):
            status = "SIGINT"
        elif isinstance(error, SystemExit):
            status = error.code if isinstance(error.code, int) else 1
        where = write_failure(ctx.output, entry, error, provenance.as_dict(started, ended), status, process)
        print(f"{ctx.key}: step failed ({type(error).__name__}: {error}); failure record {where}", file=sys.stderr)
        raise
    finally:
        _STEP_THREADS.pop(threading.get_ident(), None)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if process:
        return None
    return write_success(ctx.output, entry, result, provenance.as_dict(started, utc_now())).to_json()


def trie_regex(words: list[str]) -> str:
    """A regex matching exactly `words`, as a prefix trie: short to store and to match
    (Snakemake substitutes and matches the constraint for every job of a rule, so a
    flat alternation of thousands of sweep members would cost quadratic time)."""
    import re

    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        ends = "" in node
        branches = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if ends:
            return "(?:" + body + ")?"
        return body

    return build(trie)


def _normalized(path: str) -> str:
    """A comparable form of a record path given on the command line."""
    return path if storage.is_remote(path) else os.path.abspath(storage.local_path(path))


def _dep_keys(recorded_deps: dict) -> dict:
    """Recorded deps (role -> {name, version, ...} or list) as in a fingerprint payload."""
    out: dict[str, Any] = {}
    for role, dep in recorded_deps.items():
        if isinstance(dep, list):
            out[role] = {f"{d['name']}@{d['version']}": d.get("weight") for d in dep}
        elif isinstance(dep, dict):
            out[role] = f"{dep['name']}@{dep['version']}"
    return out


def _recorded_dep(recorded_deps: dict, key: str) -> dict:
    """The entry a record keeps for upstream `key` (empty if none)."""
    for dep in recorded_deps.values():
        for d in dep if isinstance(dep, list) else [dep]:
            if isinstance(d, dict) and f"{d.get('name')}@{d.get('version')}" == key:
                return d
    return {}


def _built_at(record: dict | None) -> str | None:
    return (record or {}).get("provenance", {}).get("ended")


_session: Session | None = None


def current_session() -> Session | None:
    """The session the Snakefile started in this process (None before `begin`)."""
    return _session


def begin(workflow: Any, config: dict) -> Session:
    """Select, load and validate the experiment; called once per Snakefile parse."""
    global _session
    from snakemake.settings.types import ExecMode

    main_process = workflow.exec_mode == ExecMode.DEFAULT
    workdir = os.getcwd()
    workflow_dir = os.path.dirname(os.path.abspath(workflow.main_snakefile))
    configfiles = [str(f) for f in (getattr(workflow, "overwrite_configfiles", None) or [])]
    try:
        path = select_experiment(config, configfiles, workdir, workflow_dir)
        experiment = load_experiment(path)
        target_keys(experiment, config.get("target"))
    except MarinError as e:
        print(f"marin-rules: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    prefix = str(config.get("prefix", DEFAULT_PREFIX)).rstrip("/") or DEFAULT_PREFIX
    if prefix.startswith("file://"):
        prefix = storage.local_path(prefix)
    records_root = prefix
    if storage.is_remote(prefix):
        records_root = mirror_root(prefix)
        if main_process:
            refresh_mirror(prefix, records_root)
    if main_process:
        os.environ[COMMAND_ENV] = shlex.join(sys.argv)
        command = list(sys.argv)
    else:
        command = shlex.split(os.environ.get(COMMAND_ENV, "")) or list(sys.argv)
    _session = Session(
        experiment=experiment,
        prefix=prefix,
        records_root=records_root,
        workflow=workflow,
        main_process=main_process,
        workflow_dir=workflow_dir,
        command=command,
        targets_config=config.get("target"),
    )
    _install_dag_labels()
    if not main_process:
        install_stop_handlers()
    return _session


def _install_dag_labels() -> None:
    """Show `name@version` in `--dag` job labels (Snakemake labels jobs by wildcards)."""
    from snakemake.dag import DAG

    if getattr(DAG.new_wildcards, "_marin", False):
        return
    original = DAG.new_wildcards

    def new_wildcards(self, job):
        wildcards = dict(job.wildcards.items()) if job.wildcards else {}
        session = _session
        if session is not None and "artifact" in wildcards:
            artifact = session.experiment.by_path.get(wildcards["artifact"])
            if artifact is not None:
                return {("artifact", artifact.key)}
        return original(self, job)

    new_wildcards._marin = True
    DAG.new_wildcards = new_wildcards
