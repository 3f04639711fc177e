"""The glue between Snakemake and the artifact core.

Model: the Snakefile calls `begin(workflow, config)` once per parse. It checks what
the user typed (`options`: --config keys and values, the prefix, the targets), selects
and loads the experiment, and returns a `Session` (`session`) whose methods are the
rules' input functions, output patterns and job parameters. Each step runs in its own
process, `python -m marin_rules.job` (see that package), started by the rules' `shell:`
with every value quoted by `:q`. Forcing (`forcing`) rebuilds from scratch and keeps
the old build under `.history/`; drift is reported while planning (`advisory`);
SIGINT/SIGTERM to Snakemake reach the job processes (`signals`, from `onstart:`);
`--dag` shows `name@version` (`dag_labels`, the one wrapped Snakemake internal).

Remote prefixes (`gs://...`): Snakemake sees a local mirror of the records under
`.snakemake/marin-mirror/` (`marin_rules.mirror`), refreshed from one listing of the
prefix per invocation; the real records and all data live on the prefix.
"""

from __future__ import annotations

import atexit
import os
import shlex
import site
import sys
from pathlib import Path
from typing import Any

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.experiment import load_experiment
from marin_rules import mirror
from marin_rules.workflow import dag_labels, options, signals
from marin_rules.workflow.session import Session, stop

# Set by the main process for the jobs it starts, so that a job an executor runs as
# `snakemake --mode remote` on this machine (the tpu executor's host jobs and local pods)
# records the user's command line, not its own, and registers where the main process
# forwards SIGINT/SIGTERM. Workers elsewhere (a gcloud pod) do not see them.
COMMAND_ENV = "MARIN_USER_COMMAND"
REGISTRY_ENV = "MARIN_SIGNAL_REGISTRY"
PROFILE_ENV = "MARIN_WORKFLOW_PROFILE"  # the main process's --workflow-profile, for jobs planned elsewhere
DEFAULT_PREFIX = options.DEFAULT_PREFIX



def _job_pythonpath() -> str:
    """The shell prefix that makes a job import this very `marin_rules` (the checkout
    the plan was made with; `-P` keeps the working folder off the front of its sys.path):
    its parent folder first on PYTHONPATH, unless that is an installed-packages folder,
    which the job has anyway, and which must not go before the standard library."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root in {*site.getsitepackages(), site.getusersitepackages()}:
        return ""
    quoted = shlex.quote(root).replace("{", "{{").replace("}", "}}")  # a format string for Snakemake
    return f"PYTHONPATH={quoted}${{{{PYTHONPATH:+:$PYTHONPATH}}}} "


# `-P`: the working folder is not put first on the job's sys.path (a project's `logging.py`
# must not replace the library's; `steps.use_job_path` appends it last).
JOB_SHELL = _job_pythonpath() + (
    "{params.python:q} -P -m marin_rules.job --artifact {wildcards.artifact:q} --rule {rule:q} --jobid {jobid}"
    " --experiment {params.experiment:q} --prefix {params.prefix:q} --records {params.records:q}"
    " --lease {params.lease:q} --registry {params.registry:q} --workflow-dir {params.workflow_dir:q}"
    " --snakefile {params.snakefile:q} --profile={params.profile:q}"
    " --log {log:q} --command {params.command:q}"
)
SHARD_SHELL = JOB_SHELL + " --shard {wildcards.shard:q} --threads {threads}"  # a `{step}_shard` rule's
SHARD_CONSTRAINT = r"\d{5}-of-\d{5}"

_session: Session | None = None


def current_session() -> Session | None:
    """The session the Snakefile started in this process (None before `begin`)."""
    return _session


def record_path(key: str) -> str:
    """For a rule of your own Snakefile: the success record of the artifact `key`
    (`name@version`) of this run's experiment, as our rules name it under the run's
    prefix (for a gs:// prefix, its local mirror): take it as the rule's input. The
    artifact's data lie beside it on a local prefix (`marin path KEY` says where)."""
    if _session is None:
        raise stop(MarinError("marin_rules.workflow.record_path: marin-rules has not read the experiment yet; call "
                              "it after `module marin: ...` / `use rule * from marin` (or `include:`)"))  # fmt: skip
    if key not in _session.experiment.artifacts and "{" in key:  # a wildcard: known only per job
        raise stop(MarinError(f"record_path({key!r}): takes one artifact's key, and a wildcard has no value while the "
                              "Snakefile is read; for a wildcard, give the input as a function: "
                              "lambda w: mr.record_path(f\"name@{w.version}\")"))  # fmt: skip
    if key not in _session.experiment.artifacts:
        from marin_rules.inspect.reading import suggestion

        raise stop(MarinError(f"record_path({key!r}): not an artifact of {_session.experiment.path}"
                              f"{suggestion(key, _session.experiment.artifacts)}"))  # fmt: skip
    return _session.record_path(key)


def begin(workflow: Any, config: dict) -> Session:
    """Check the input, load the experiment; called once per Snakefile parse."""
    global _session
    from snakemake.settings.types import ExecMode

    main_process = workflow.exec_mode == ExecMode.DEFAULT
    workdir = os.getcwd()
    workflow_dir = os.path.dirname(os.path.abspath(workflow.main_snakefile))
    configfiles = [str(f) for f in (getattr(workflow, "overwrite_configfiles", None) or [])]
    directive_files = [str(f) for f in (getattr(workflow, "configfiles", None) or []) if str(f) not in configfiles]
    # our Snakefile `include:`d or used as a `module` by the user's: its config keys are theirs too
    users_workflow = Path(workflow.main_snakefile).resolve() != Path(options.PROJECT_SNAKEFILE).resolve()
    try:
        typed = options.typed_configfiles(sys.argv[1:]) if main_process else []
        if len(typed) > len(configfiles):  # a repeated --configfile, of which Snakemake kept the last
            options.experiment_configfiles([*typed, *configfiles], users_workflow)
        # before check_config: two experiment files are that line, not one of their keys
        experiment_files = options.experiment_configfiles(configfiles, users_workflow)
        options.check_config(config, configfiles, directive_files, users_workflow)
        prefix = options.checked_prefix(config)
        path = options.select_experiment(config, experiment_files, workdir, workflow_dir, users_workflow)
        options.refuse_braced_paths(path, prefix, workflow_dir)
        experiment = load_experiment(path, dev_user=options.dev_user(config))
        options.target_keys(experiment, config.get("target"))
        if main_process:  # targets are not known yet while the Snakefile is parsed: read as typed
            options.refuse_remote_targets(sys.argv[1:])
    except MarinError as e:
        raise stop(e) from None
    records_root = mirror.records_root(prefix)
    if main_process and storage.is_remote(prefix):
        try:
            storage.check_bucket(prefix)
            mirror.refresh_mirror(prefix, records_root)
        except OSError as e:  # gcsfs's connection errors are OSErrors
            raise stop(MarinError(storage.storage_problem(prefix, e))) from None
        except MarinError as e:  # no such bucket
            raise stop(e) from None
    command = shlex.join(options.redact_command(sys.argv))
    registry = signals.registry_dir()
    profile = options.workflow_profile(sys.argv[1:])
    if main_process:
        os.environ[COMMAND_ENV] = command
        os.environ[REGISTRY_ENV] = registry
        os.environ[PROFILE_ENV] = profile
        signals.clear_stop(registry)  # left by an earlier main process that had this pid
    else:
        command = os.environ.get(COMMAND_ENV) or command
        registry = os.environ.get(REGISTRY_ENV) or registry
        profile = os.environ.get(PROFILE_ENV, "")
    _session = Session(
        experiment=experiment,
        prefix=prefix,
        records_root=records_root,
        workflow=workflow,
        main_process=main_process,
        workflow_dir=workflow_dir,
        command=command,
        targets_config=config.get("target"),
        lease=options.lease_options(config),
        registry=registry,
        profile=profile,
    )
    if main_process:
        by_path = experiment.by_path
        dag_labels.install(lambda path: by_path[path].key if path in by_path else None)
        atexit.unregister(_explain_at_exit)  # once, however often the Snakefile is parsed
        atexit.register(_explain_at_exit)
    return _session


REPORT_FOLDER = "marin-report"  # rules/report.smk's output


def report_inputs() -> list[str]:
    """What the `all` rule adds under `snakemake --report FILE`: the pictures and tables
    of the built artifacts, gathered now (main process, reading only) into
    marin-report/, the `marin_report` rule's report() output, so the report holds them
    with the default target too. [] in every other invocation: runs never gather."""
    session = _session
    if session is None or not session.main_process:
        return []
    if not any(a == "--report" or a.startswith("--report=") for a in sys.argv[1:]):
        return []
    from marin_rules.inspect.gather import built_keys, gather

    gather(session.experiment, session.prefix, REPORT_FOLDER, set(built_keys(session.experiment, session.recorded)),
           session.hint_flags())  # fmt: skip
    return [REPORT_FOLDER]


def on_start() -> None:
    """From the Snakefile's `onstart:` (main process, Snakemake has locked the working
    directory, no job has run): refuse pod jobs that cannot see a local prefix, set aside
    and mark forced builds (`Session.start`); forward SIGINT/SIGTERM/SIGHUP to the job
    processes; print the priced plan of the training jobs. A Snakefile that uses ours as
    a module calls it from its own `onstart:` (Snakemake runs the main Snakefile's only)."""
    if _session is not None:
        _session.start()
        signals.forward_signals(_session.registry)
        if _session.main_process:
            _session.print_plan()


def on_success() -> None:
    """From the Snakefile's `onsuccess:`: nothing to explain at exit."""
    if _session is not None:
        _session.succeeded = True


def _explain_at_exit() -> None:
    """At the main process's exit: close its signal registry (`signals.close`); after a
    failed run, also take back the forced marks of
    cascades the run never began (`Session.drop_unbegun_cascades`), restore the old
    builds of forced rebuilds whose jobs were killed outright
    (`Session.recover_killed_rebuilds`), and
    name the artifacts another run took away while this one ran
    (`Session.taken_by_another_run`): Snakemake reports the
    missing record as filesystem latency, and an exception raised while waiting for it
    never reaches `onerror:`, hence exit."""
    if _session is not None and _session.main_process:
        signals.close(_session.registry)
    if _session is not None and not _session.succeeded and not _session.dry:
        _session.drop_unbegun_cascades()
        for line in _session.recover_killed_rebuilds() + _session.taken_by_another_run():
            print(f"marin-rules: {line}", file=sys.stderr, flush=True)
