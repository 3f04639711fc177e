"""The job process: `python -m marin_rules.job --artifact NAME/VERSION ...` builds one artifact.

Model: a rule's `shell:` starts this with every value as its own quoted argument (the
experiment file, prefix, the user's redacted command line, lease settings); nothing
is read from the environment but what the tpu executor tells its jobs
(`marin_rules.cluster.pod`): a pod's place (`pod_process_from_env`), the job's id in the
submitting run (the record's `provenance.jobid`; `--jobid` is the job's id in the
executor's own `snakemake --mode remote`, 0) and who submitted it (in the lease). It runs as
`python -P -m marin_rules.job`: the working folder is not first on sys.path but last
(`steps.use_job_path`), so a project file named like a library module (`logging.py`)
replaces nothing, and user steps are found as planning found them. In order:
1. send stdout/stderr to the job's log (`--log`), register for signal forwarding
   (`marin_rules.workflow.signals`), install the stop handlers (a SIGTERM that follows
   a signal Snakemake received, its executor cancelling after a Ctrl-C, stops the step
   as that signal: `run.note_stop_cause`);
2. take the artifact's lease (`marin_rules.artifacts.lease`): a live holder is waited
   for (saying who it is, in the log and on the stderr the job was started with, where
   the user watching Snakemake sees it: `tell`), or with `lease_wait=false` refused at
   once; when the holder finishes, the artifact is served (exit 0, nothing built; on
   a remote prefix the local mirror record is written for Snakemake; a build of
   another recipe gets planning's drift warning, or fails a pinned artifact:
   `check_served_recipe`), unless it was
   made from other upstream builds than today's: then it is rebuilt as a forced
   cascade would be (`finished_on_other_upstreams`); a stale lease is taken over; a
   lease file or lock that cannot be opened fails the job in one line naming it, with a
   failure record (`lease_or_failure`);
3. if the main process marked the build forced, move the old build to `.history/` (a
   dev version keeps no history: what is set aside is deleted, `kept_or_discarded`);
   on a pod, process 0 alone does 2, 3 and the start of the attempt (`begin_attempt`),
   then lets the other processes start the step (`pod_start`), which wait for it;
4. check every upstream's record and files (`context.check_upstreams`), then call the step
   (`run.run_step`), then check that no other run rebuilt an upstream meanwhile
   (`context.check_upstreams_unchanged`); the heartbeat stops the step if the lease is lost, and the
   success record is written only while the lease is still held.
A shard job of a sharded step (`--shard kkkkk-of-nnnnn`, `marin_rules.artifacts.shards`)
does the same for its shard folder: its own lease, its shard record instead of the
success record (a finished shard is served, never built again). The artifact's own
job of a sharded step is then the gather: it reads every shard's result. `--threads`
(Snakemake's allowance) caps the tokenizers' thread pool (`RAYON_NUM_THREADS`). JAX's
preemption service is off (`JAX_ENABLE_PREEMPTION_SERVICE`): its SIGTERM handler would
replace the job's once a step joins `jax.distributed`.
Exit status: 0 built or served, 1 failed, 128+N stopped by signal N.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from functools import partial
from typing import Any, Callable

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.identity import RECORD_FILE, artifact_location
from marin_rules.artifacts.provenance import iso, utc_now
from marin_rules.artifacts.records import error_message, read_record
from marin_rules.dev_versions import DISCARDED
from marin_rules.job.run import (
    JobTerminated, exit_status, install_stop_handlers, note_stop_cause, run_step, stop_for_lost_lease,
)  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m marin_rules.job", description=__doc__.split("\n")[0])
    p.add_argument("--artifact", required=True, help="name/version")
    p.add_argument("--experiment", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--records", help="where Snakemake sees records (the local mirror of a remote prefix)")
    p.add_argument("--rule")
    p.add_argument("--jobid")
    p.add_argument("--lease", default="", help="wait=1,heartbeat_s=30,stale_s=90,poll_s=5")
    p.add_argument("--registry", help="folder to register this process in for signal forwarding")
    p.add_argument("--workflow-dir", default=".")
    p.add_argument("--snakefile", default="", help="the run's Snakefile (for suggested commands)")
    p.add_argument("--profile", default="", help="the run's --workflow-profile, if it named one (for suggested commands)")
    p.add_argument("--log", help="file for this job's output")
    p.add_argument("--command", default="", help="the user's command line (secrets already redacted)")
    p.add_argument("--shard", help="kkkkk-of-nnnnn: build this shard of a sharded step")
    p.add_argument("--threads", type=int, help="threads Snakemake allows this job")
    return p.parse_args(argv)


_console: int | None = None  # the stderr this process was started with, once its output goes to the log


def tell(line: str) -> None:
    """`line` in the job's log and on the console (Snakemake's terminal, or the
    executor's view of the job): for what the user waits on, such as another run's lease.
    Control characters are escaped (`printable`), line by line: a line may quote a record
    or an error; a multi-line message (the drift warning) keeps its lines."""
    line = "\n".join(printable(part) for part in line.split("\n"))
    print(line, file=sys.stderr, flush=True)
    if _console is not None:
        try:
            os.write(_console, (line + "\n").encode("utf-8", "replace"))
        except OSError:  # the terminal is gone: the log has it
            pass


def main(argv: list[str] | None = None) -> int:
    global _console
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from marin_rules.cluster.pod import submitted_jobid

    args.jobid = submitted_jobid(os.environ) or args.jobid  # under the tpu executor: the submitting run's
    if args.threads and "RAYON_NUM_THREADS" not in os.environ:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its pool
    # This process owns SIGTERM (stop the step, record the failure). jax.distributed.initialize
    # would otherwise start JAX's preemption service, whose handler swallows SIGTERM until a
    # preemption sync point that no step polls: a pod training on after `timeout` or a cancel.
    os.environ.setdefault("JAX_ENABLE_PREEMPTION_SERVICE", "false")
    from marin_rules.steps import use_job_path

    use_job_path(args.workflow_dir)  # user steps are found as planning found them (steps.find_user_module)
    install_stop_handlers()
    pod_stderr, log = None, None
    if args.log:
        from marin_rules.cluster.pod import pod_process_from_env

        pod = pod_process_from_env(os.environ)  # every process of a pod runs this command
        suffix = "" if pod is None or pod.process_id == 0 else f".p{pod.process_id}"
        log = args.log if args.log.endswith(suffix) else args.log + suffix  # the Snakefile's rules declare it
        console = os.dup(2)
        if pod is not None:  # the executor shows a pod process's own stderr: keep it for the cause
            pod_stderr = console
        if pod is None or pod.process_id == 0:  # one voice per pod
            _console = console
        _log_to(log)
    unregister, watching = None, None
    try:
        if args.registry:
            import signal

            from marin_rules.workflow.signals import register, stop_requested, watch_stop

            unregister = register(args.registry, os.getpid())
            note_stop_cause(lambda: stop_requested(args.registry))  # a Ctrl-C's SIGTERM records SIGINT
            stopped = stop_requested(args.registry)  # the signal came before this process registered
            if stopped is not None:
                tell(f"marin-rules: {args.artifact}: not started: snakemake received {stopped}")
                return 128 + int(getattr(signal.Signals, stopped, signal.SIGTERM))
            watching = watch_stop(args.registry)  # on another host than snakemake: no signal reaches here
        code = _exit_status(args)
    except JobTerminated as e:  # stopped while registering: nothing begun, nothing to record
        code = 128 + e.signum if e.signum else 1
    finally:
        if watching is not None:
            watching.set()
        if unregister is not None:
            unregister()
    if pod_stderr is not None and code != 0:
        _echo_tail(log, pod_stderr)
    return code


def _exit_status(args: argparse.Namespace) -> int:
    """Build; 0 built or served, 1 failed, 128+N stopped by signal N."""
    try:
        return build(args)
    except JobTerminated as e:
        return 128 + e.signum if e.signum else 1
    except MarinError as e:
        if not getattr(e, "reported", False):
            shown = e.with_flags(rerun_hint(args))  # a suggested command runs as printed
            tell(f"marin-rules: {shown}")
        return 1
    except BaseException as e:  # noqa: BLE001 - a step's failure has its record and message already
        if not getattr(e, "reported", False):  # failed before or around the step (the lease, a restore)
            import traceback

            traceback.print_exc()  # into the job's log
            tell(f"marin-rules: {args.artifact}: {_problem(args.prefix, e)}")
        return 1


def _problem(prefix: str, error: BaseException) -> str:
    """One line for an error met outside the step: the storage's (a missing bucket, no
    credentials: OSErrors and google.api_core's errors) naming the prefix, else the error."""
    if isinstance(error, OSError) or type(error).__module__.startswith("google."):
        return storage.storage_problem(prefix, error)
    return f"{type(error).__name__}: {(error_message(error).strip().splitlines() or [''])[0][:300]}"


def _echo_tail(log: str, fd: int, lines: int = 5) -> None:
    """The last lines of a failed pod process's log on its own stderr (the executor's view)."""
    sys.stderr.flush()
    with open(log, encoding="utf-8", errors="replace") as f:
        tail = [line for line in f.read().splitlines() if line.strip()][-lines:]
    os.write(fd, ("\n".join(tail) + "\n").encode())


def _log_to(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def rerun_hint(args: argparse.Namespace) -> str:
    """The flags a suggested rebuild command needs (`workflow.options.rerun_flags`)."""
    from marin_rules.workflow.options import rerun_flags

    return rerun_flags(args.experiment, args.prefix, args.workflow_dir, args.snakefile, os.getcwd(), args.profile)


def lease_settings(text: str) -> dict[str, Any]:
    from marin_rules.artifacts import lease

    settings: dict[str, Any] = {"wait": True, "heartbeat_s": lease.HEARTBEAT_S, "stale_s": lease.STALE_S,
                                "poll_s": lease.POLL_S}  # fmt: skip
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        settings[key] = value not in ("0", "false", "False") if key == "wait" else float(value)
    return settings


def build(args: argparse.Namespace) -> int:
    from marin_rules.cluster.pod import pod_process_from_env
    from marin_rules.experiment import dev_user_in_path, load_experiment, owned_by
    from marin_rules.steps import SHARDED_STEPS
    from marin_rules.workflow.forcing import end_rebuild, mark_forced, recover_interrupted, restore_old_build, unmark_forced

    experiment = load_experiment(args.experiment)
    if args.artifact not in experiment.by_path:  # a dev version: its path names its owner
        experiment = owned_by(experiment, dev_user_in_path(experiment, args.artifact) or "")
    artifact = experiment.by_path[args.artifact]
    location = artifact_location(args.prefix, artifact.id)
    began = iso(utc_now())
    print(f"marin job: {artifact.key} (rule {args.rule}, job {args.jobid}): {args.command}", flush=True)
    if args.shard:
        from marin_rules.job.shard import build_shard

        return build_shard(artifact, experiment, location, args)
    pod = pod_process_from_env(os.environ)
    process = None if pod is None else pod.process_id
    is_done, made_from_others = done_check(artifact, experiment, location, args.prefix)
    if not process and not is_done():  # before the lease writes anything here (one built already is served)
        refuse_enclosing(artifact.key, artifact.id.path, args.prefix)
    if process and not await_process_0(artifact, location, args, pod, is_done):
        return 0  # built: process 0 serves it
    held = None
    if not process:
        held = lease_or_failure(artifact, experiment, location, args, is_done)
        if held is None:
            return serve(artifact, location, args, since=began)
        recovered = recover_interrupted(location)  # a forced rebuild killed outright (forcing.py)
        if recovered:
            tell(f"{artifact.key}: its last forced rebuild was killed before it ended; the previous build is back "
                 f"in place (what the attempt left: {kept_or_discarded(artifact, recovered)})")  # fmt: skip
        elif held.taken_over is not None and not process:  # (recover_interrupted wrote that one's record)
            record_lost_attempt(artifact, experiment, location, args, held.taken_over)
        met = force_met_meanwhile(artifact, location, began)
        if met:
            unmark_forced(location)
            if is_done():
                held.release()
                return serve(artifact, location, args, f"forced, but another run was building it when this run "
                             f"began, and that build of the same recipe and code ended {met}, while this job "
                             "waited: not building it twice")  # fmt: skip
        if is_done():  # the old build serves, as after any failed direct force (or an unreadable pointer went)
            held.release()
            return serve(artifact, location, args, "its previous build is in place")
        if made_from_others:  # another run built it on other upstream builds: rebuild, keep it
            mark_forced(location, by_upstream=True)
            tell(f"{artifact.key}: the build there was made from other upstream builds than today's "
                 f"({made_from_others[0]}): rebuilding it; that build moves to .history/")  # fmt: skip
    try:
        if not process:
            refuse_enclosed(artifact.key, artifact.id.path, location)
        attempt = None  # a pod's: every process's records name it (`marin history` shows one attempt)
        if pod is not None:
            from marin_rules.job.pod_start import attempt_id, begun_token

            token = held.holder.token if held is not None else begun_token(location, pod.coordinator)
            attempt = None if token is None else attempt_id(token)
        moved, owed = retire_forced_build(artifact, experiment, location, args, attempt) if not process else (None, False)
        try:
            if not process and artifact.step not in SHARDED_STEPS:  # shards check their own (shards.py)
                begin_attempt(artifact, experiment, location, args.prefix)
            if pod is not None and not process:  # the other processes may start now (pod_start.py)
                from marin_rules.job.pod_start import announce_begun

                announce_begun(location, held.holder.token, pod.coordinator)
            code = run(artifact, experiment, location, args, pod, held, attempt)
        except BaseException:
            if moved:  # the rebuild failed or was stopped: the old build serves again
                failed = kept_or_discarded(artifact, restore_old_build(location, moved, owed=owed))
                print(f"{artifact.key}: the forced rebuild failed; the previous build is back in place "
                      f"(what the attempt left: {failed})", file=sys.stderr, flush=True)  # fmt: skip
            raise
        if moved:
            end_rebuild(location)
            kept_or_discarded(artifact, moved)  # the old build: a dev version keeps no history
        return code
    finally:
        if held is not None:
            held.release()


def refuse_enclosing(key: str, path: str, prefix: str) -> None:
    """Process 0, before the lease: refuse to build `key` (folder `path`) inside the folder
    of another artifact built on the prefix (an experiment's load refuses such pairs
    within one file; two experiments sharing a prefix can still name them): forcing that
    one would move this one away with its old build, and list its files as its data."""
    from marin_rules.artifacts.files import enclosing_record

    outer = enclosing_record(prefix, path)
    if outer is not None:
        raise MarinError(
            f"{key}: its folder {path}/ would lie inside {outer}/, the folder of another artifact built on this "
            "prefix (its record is there): rename the artifact (its name or version)"
        )


def refuse_enclosed(key: str, path: str, location: str) -> None:
    """Process 0, under the lease, before anything moves: the same the other way round,
    another artifact's folder with its record inside this one's (`refuse_enclosing`)."""
    from marin_rules.artifacts.files import nested_records

    inner = nested_records(location)
    if inner:
        raise MarinError(
            f"{key}: its folder {path}/ holds another artifact's folder ({inner[0].removesuffix('/' + RECORD_FILE)}/, "
            "with its record), built on this prefix: building or forcing this one there would take that one as its "
            "data; move that folder elsewhere, or rename one of the two artifacts"
        )


def retire_forced_build(
    artifact: Any, experiment: Any, location: str, args: argparse.Namespace, attempt: str | None = None
) -> tuple[str | None, bool]:
    """Process 0, under the lease: when the build was marked forced, move the old build
    to `.history/` (`forcing.move_old_build`) and note the rebuild under way, for a
    killed one's failure record (`begin_rebuild`). Returns (where a finished old build
    went, None when there was none; whether the rebuild is owed, a cascade's). What an
    unfinished attempt left is not put back if this one fails: it stays there (a dev
    version's is deleted: `kept_or_discarded`)."""
    from marin_rules.job.context import job_context
    from marin_rules.workflow.forcing import (
        begin_rebuild, forced_by_upstream, holds_build, move_old_build, moved_note, recover_interrupted,
    )  # fmt: skip

    owed = forced_by_upstream(location)  # read before the move clears it
    try:
        moved = move_old_build(location, keep_pointer=True)  # stopped part-way, it puts the old build back
        if not moved:
            return None, owed
        finished, note = holds_build(moved), moved_note(moved)
        if not finished and kept_or_discarded(artifact, moved) == DISCARDED:
            note = f"what an unfinished attempt left was {DISCARDED}"
        print(f"{artifact.key}: forced: {note}", file=sys.stderr, flush=True)
        if not finished:
            return None, owed
        _, entry, provenance, _ = job_context(artifact, experiment, location, args)
        now = utc_now()
        pod = {} if attempt is None else {"pod_attempt": attempt}  # (`attempt`: a pod's, as its records name it)
        begin_rebuild(location, moved, owed, entry, {**provenance.as_dict(now, now), **pod})  # replaces "moving"
    except BaseException as error:  # before the rebuild began: the old build back in place, the force still to do
        recover_interrupted(location)  # a "moving" pointer: the old build back in place, still marked forced
        record_stopped_move(artifact, experiment, location, args, error)
        raise
    return moved, owed


def record_stopped_move(artifact: Any, experiment: Any, location: str, args: argparse.Namespace, error: BaseException) -> None:
    """The failure record of a forced attempt stopped (or failed) while the old build was
    being set aside, before its step began (`run.run_step` writes it for one that began):
    the old build is back in place, the rebuild still to do."""
    from marin_rules.artifacts.records import write_failure
    from marin_rules.job.context import job_context

    try:
        _, entry, provenance, _ = job_context(artifact, experiment, location, args)
        now = utc_now()
        write_failure(location, entry, error, provenance.as_dict(now, now), exit_status(error))
    except Exception as e:  # noqa: BLE001 - the storage that stopped the move may refuse this too: the error stands
        print(f"{artifact.key}: no failure record for the stopped attempt ({type(e).__name__}: {e})", file=sys.stderr)


def kept_or_discarded(artifact: Any, moved: str) -> str:
    """What was set aside under `.history/` at `moved` (an old build, or what an attempt
    left): kept there (returns `moved`), or, for an artifact that keeps no history (a dev
    version: `dev_versions.keeps_history`), deleted (returns `DISCARDED`). Failure
    records stay either way."""
    from marin_rules.artifacts.files import discard, history_entry
    from marin_rules.dev_versions import keeps_history

    if keeps_history(artifact.id):
        return moved
    discard(history_entry(moved))  # the whole .history/<stamp>/, not only a shard's folder in it
    return DISCARDED


def force_met_meanwhile(artifact: Any, location: str, began: str) -> str | None:
    """A forced job whose run found no finished build to set aside (its marker is `null`:
    another run's build was under way, `forcing.mark_forced`) meets its force with that
    build when it finished while this job waited for the lease (ended after `began`)
    with this recipe and this step code: the end time of its record; else None."""
    from marin_rules.artifacts.code import step_code
    from marin_rules.workflow.forcing import marker_of

    try:
        if storage.read_bytes(marker_of(location)).strip() != b"null":
            return None
        record = storage.read_json(storage.join(location, RECORD_FILE))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    provenance = record.get("provenance") if isinstance(record, dict) else None
    if not isinstance(provenance, dict) or record.get("fingerprint") != artifact.fingerprint:
        return None
    ended = provenance.get("ended")
    if provenance.get("code") != step_code(artifact.step) or not isinstance(ended, str) or ended < began:
        return None
    return ended


def done_check(artifact: Any, experiment: Any, location: str, prefix: str) -> tuple[Callable[[], bool], list[str]]:
    """(is_done, made_from_others): is_done() tells whether the artifact at `location` is
    built and may be served: its success record is there, no forced rebuild is pending
    or under way (a record beside the rebuilding pointer may be Snakemake's backup over
    partial data), and it was made from today's upstream builds; when it was made from
    others, is_done() is False and `made_from_others` holds how they differ."""
    from marin_rules.workflow.forcing import marker_of, rebuilding_pointer

    marker, pointer = marker_of(location), rebuilding_pointer(location)
    made_from_others: list[str] = []

    def is_done() -> bool:
        made_from_others.clear()
        if not storage.exists(storage.join(location, RECORD_FILE)) or storage.exists(marker) or storage.exists(pointer):
            return False
        change = finished_on_other_upstreams(artifact, experiment, location, prefix)
        if change is not None:
            made_from_others.append(change)
        return change is None

    return is_done, made_from_others


def await_process_0(
    artifact: Any, location: str, args: argparse.Namespace, pod: Any, is_done: Callable[[], bool]
) -> bool:
    """Process k > 0 of a pod: wait until process 0 has readied the artifact folder
    (`pod_start`); False when the artifact is built meanwhile (nothing to do)."""
    from marin_rules.job import pod_start

    settings = lease_settings(args.lease)
    mine = f"{artifact.key}: process {pod.process_id} of the pod"
    print(f"{mine}: waiting for process 0 to begin the attempt", file=sys.stderr, flush=True)
    outcome = pod_start.wait_for_process_0(
        artifact.key, location, pod.coordinator, is_done, settings["poll_s"], settings["stale_s"],
        process_0_log=pod_start.process_0_log(args.log),
    )  # fmt: skip
    done = outcome == "done"
    news = "the artifact is built; nothing to do" if done else "process 0 has begun; starting the step"
    print(f"{mine}: {news}", file=sys.stderr, flush=True)
    return not done


def finished_on_other_upstreams(artifact: Any, experiment: Any, location: str, prefix: str) -> str | None:
    """How the upstream builds the success record at `location` names differ from the
    upstreams' builds now (one phrase), or None: the same, no upstreams, or unknown (an
    unreadable upstream: the step refuses it). A job finds a record only when another run
    finished it meanwhile (planning saw none, or marked it forced): built on the
    upstreams this run planned with, it is served; on others, this run's plan stands."""
    from marin_rules.artifacts.builds import builds_in_deps, upstream_change
    from marin_rules.job.context import upstream_builds

    if not artifact.upstream_keys():
        return None
    now = upstream_builds(artifact, experiment, prefix)
    record = read_record(location, artifact.id)
    if now is None or record is None:
        return None
    then = builds_in_deps(record.deps)
    if any(build.get("built") is None for build in then.values()):  # a record of before builds were kept
        return None
    return upstream_change(then, now)


def begin_attempt(artifact: Any, experiment: Any, location: str, prefix: str) -> None:
    """Record this attempt's recipe and upstream builds; set aside what an earlier
    attempt left when it was made from others (`attempt.py`). Skipped for data adopted
    in place (its folder holds only its record), and when an upstream is unreadable:
    the step refuses it."""
    from marin_rules.adopt import is_adopted_in_place
    from marin_rules.job import attempt
    from marin_rules.job.context import upstream_builds

    if is_adopted_in_place(artifact):
        return
    upstreams = upstream_builds(artifact, experiment, prefix)
    stale = None if upstreams is None else attempt.begin(location, artifact.fingerprint, upstreams, artifact.step)
    if stale:
        left = kept_or_discarded(artifact, stale[0])
        where = left if left == DISCARDED else f"moved to {left}"
        tell(f"{artifact.key}: what an earlier attempt left {stale[1]}; {where}, building from scratch")


def take_lease(args: argparse.Namespace, key: str, location: str, what: str, is_done: Callable[[], bool]) -> Any:
    """The build lease of `location` with its heartbeat running, or None when is_done()
    turned true while a live holder was waited for (serve what it built)."""
    from marin_rules.artifacts import lease as leases
    from marin_rules.cluster.pod import submitted_by

    settings = lease_settings(args.lease)

    def on_wait(holder: leases.LeaseHolder | None) -> None:
        if holder is None:  # (the log has the file and why)
            tell(f"{key}: waiting: {what}'s lease is unreadable, and a run may be building under it: taken over "
                 f"once no run has renewed it for {settings['stale_s']:.0f} s")  # fmt: skip
        else:
            tell(f"{key}: waiting: {what} is being built by {holder.describe()}")

    held = leases.acquire(
        location, is_done=is_done, wait=settings["wait"], on_wait=on_wait,
        heartbeat_s=settings["heartbeat_s"], stale_s=settings["stale_s"], poll_s=settings["poll_s"],
        submitted_by=submitted_by(os.environ),
    )  # fmt: skip
    if held is not None:
        held.start_heartbeat(stop_for_lost_lease)
    return held


def lease_or_failure(
    artifact: Any, experiment: Any, location: str, args: argparse.Namespace, is_done: Callable[[], bool],
    lease_at: str = "", what: str = "", shard: Any = None,
) -> Any:  # fmt: skip
    """`take_lease` of the artifact at `location` (or of its shard folder `lease_at`,
    `what` in messages); a lease file or lock that cannot be opened fails the job in one
    line naming the artifact and the file, with a failure record where the folder takes
    one (`unusable_lease`)."""
    from marin_rules.artifacts.lease_stores import LeaseFileUnusable

    try:
        return take_lease(args, artifact.key, lease_at or location, what or location, is_done)
    except LeaseFileUnusable as e:
        raise unusable_lease(artifact, experiment, location, args, e, shard) from None


def unusable_lease(artifact: Any, experiment: Any, location: str, args: argparse.Namespace, error: MarinError,
                   shard: Any = None) -> MarinError:  # fmt: skip
    """The job's one line for a lease file that cannot be opened (`error`), after writing
    the failure record (of `shard`, for a shard job) when the artifact folder takes one."""
    from marin_rules.artifacts.records import write_failure
    from marin_rules.job.context import job_context

    failed = type(error)(f"{artifact.key}: {error}")
    try:
        _, entry, provenance, _ = job_context(artifact, experiment, location, args)
        if shard is not None:
            entry = {**entry, "shard": {"index": shard.index, "count": shard.count}}
        now = utc_now()
        where = write_failure(location, entry, failed, provenance.as_dict(now, now))
    except Exception:  # noqa: BLE001 - the folder takes no record either (no permission): the line says it all
        return failed
    return type(error)(f"{failed} (failure record {where})")


class AttemptLost(Exception):
    """The error of the failure record `record_lost_attempt` writes for an attempt that
    ended without ending its lease."""


def record_lost_attempt(
    artifact: Any, experiment: Any, location: str, args: argparse.Namespace, holder: Any, shard: Any = None
) -> None:
    """A job took the lease over from `holder`, gone or stale: an attempt that left its
    lease behind was killed outright (SIGKILL, the OOM killer: `lease.holder_gone` tells
    on its own host), or stopped renewing (killed elsewhere, a lost machine, or paused:
    then said as such, since a paused one writes its own record when it wakes); every
    other end releases the lease. Unless it wrote a failure record
    since it began (its own: on a pod, process 0's, not one of the processes stopped
    with it), write the one it could not (under this run's recipe, which a resumed
    build shares), so `marin history` lists every attempt, and say so on the console.
    `shard`: the attempt was that shard's job (its lease is the shard folder's)."""
    from marin_rules.artifacts.records import read_failures, write_failure
    from marin_rules.job.context import job_context

    index = None if shard is None else shard.index
    for failure in read_failures(location):  # a pod's other processes write their own: not the holder's
        own = index is None or (failure.get("shard") or {}).get("index") == index
        if own and not failure.get("process") and str((failure.get("provenance") or {}).get("started", "")) >= holder.since:
            return
    from marin_rules.artifacts.lease import holder_gone

    _, entry, _, _ = job_context(artifact, experiment, location, args)
    if shard is not None:
        entry = {**entry, "shard": {"index": shard.index, "count": shard.count}}
    if holder_gone(holder):  # its process is known to be gone (this host, this pid namespace)
        why, status, said = "killed outright (SIGKILL, the OOM killer)", "killed", "was killed before it ended"
    else:  # only known to have stopped renewing: a paused process that wakes up writes its own record too
        why, status, said = ("it stopped renewing its lease: killed, paused (SIGSTOP), or its machine lost or "
                             "unreachable", "lost", "stopped renewing its lease")  # fmt: skip
    lost = AttemptLost(
        f"the attempt of {holder.describe()} ended without a record (its lease was last renewed {holder.renewed}): "
        f"{why}; a later run took the build over"
    )
    provenance = {"user": holder.user, "host": holder.host, "pid": holder.pid, "started": holder.since,
                  "ended": holder.renewed, "duration_s": None}  # fmt: skip
    from marin_rules.job.pod_start import attempt_of

    attempt = attempt_of(location, holder.token) if shard is None else None
    if attempt is not None:  # a pod's process 0: one attempt with its other processes' records
        provenance["pod_attempt"] = attempt
    where = write_failure(location, entry, lost, provenance, status)
    what = "an earlier attempt" if shard is None else f"an earlier attempt at shard {shard.name}"
    tell(f"{artifact.key}: {what} ({holder.describe()}) {said}; taking the build over "
         f"(failure record {where})")  # fmt: skip


def serve(artifact: Any, location: str, args: argparse.Namespace, why: str = "", since: str = "") -> int:
    """Built already (or `why`): nothing to build. With `since` (when this job began), a
    record that ended before it was there all along (Snakemake ran the job for another
    reason, such as `--rerun-triggers params`); a later one another run built meanwhile."""
    from marin_rules.artifacts.drift import printable

    record = read_record(location, artifact.id)
    if not why:
        ended, host = str(record.provenance.get("ended") or ""), printable(str(record.provenance.get("host")))
        already = bool(since and ended and ended < since)
        why = f"built already (ended {printable(ended)} on {host})" if already else f"built meanwhile by another run ({host})"
        if not already:  # planning judged a record that was there all along: warn once
            check_served_recipe(artifact, record)
    tell(f"{artifact.key}: {why}; serving it")
    _mirror(record, artifact, args)
    return 0


def check_served_recipe(artifact: Any, record: Any) -> None:
    """Judge the build about to be served as planning judges a record it finds
    (`workflow.advisory.report`): when its record holds another recipe than this run's
    (`records.recipe_drift`: another run built this name@version from its own recipe),
    tell the drift warning (`drift.drift_notice`); when the artifact pins its fingerprint
    (`expect_fingerprint:`), raise the pinned-drift DriftError instead (the job fails in
    one line, with no failure record: no build was attempted). A dev version is never
    drift-checked (it is rebuilt on every run): nothing to tell."""
    from marin_rules.artifacts.records import drift_warning

    if artifact.id.is_dev:
        return
    notice = drift_warning(record, artifact)
    if notice is not None:
        tell(notice)


def lossy_example(result: Any) -> str | None:
    """Where a step's result says its tokenizer did not give a text back (`lossless:
    false`, at the top as train_tokenizer and tokenize record it, or in a task's result
    as evaluate does): its `lossless_example`; None when it says nothing of the kind."""
    if not isinstance(result, dict):
        return None
    for part in (result, *(v for v in result.values() if isinstance(v, dict))):
        if part.get("lossless") is False:
            return str(part.get("lossless_example") or "no example recorded")
    return None


def _mirror(record: Any, artifact: Any, args: argparse.Namespace) -> None:
    if record is not None and args.records and args.records != args.prefix:
        storage.write_json_atomic(f"{args.records}/{artifact.id.path}/{RECORD_FILE}", record.to_json())


def run(
    artifact: Any, experiment: Any, location: str, args: argparse.Namespace, pod: Any, held: Any,
    attempt: str | None = None,
) -> int:
    """Run the step (`run_step`) as process `pod.process_id` of a pod, or alone (`pod` None)."""
    from marin_rules.adopt import is_adopted_in_place
    from marin_rules.artifacts.builds import builds_in_deps
    from marin_rules.artifacts.shards import gathered_results, shard_count, shard_jobs_seconds
    from marin_rules.steps import SHARDED_STEPS, step_function

    from marin_rules.job.context import check_upstreams, check_upstreams_unchanged, job_context
    from marin_rules.job.pod_start import process_0_died

    ctx, entry, provenance, deps_record = job_context(artifact, experiment, location, args)
    sharded = artifact.step in SHARDED_STEPS
    process = None if pod is None else pod.process_id
    if attempt is not None:  # a pod's (`build`): every process's record names it
        provenance = dataclasses.replace(provenance, extra=(*provenance.extra, ("pod_attempt", attempt)))
    if sharded and not process:  # the gather's record also says what the shard jobs took
        try:
            seconds = shard_jobs_seconds(location, shard_count(ctx.runtime))
        except Exception:  # noqa: BLE001 - a figure for status: the gather itself judges the shard records
            seconds = None
        provenance = dataclasses.replace(provenance, extra=(*provenance.extra, ("shards_duration_s", seconds)))

    def step(c: StepContext) -> Any:
        check_upstreams(artifact, experiment, args.prefix, deps_record, rerun_hint(args))  # fills in what was seen
        if sharded:  # the gather: every shard job has finished
            shards = gathered_results(location, shard_count(c.runtime), artifact.fingerprint, builds_in_deps(deps_record))
            result = step_function(artifact.step)(c, shards)
        else:
            result = step_function(artifact.step)(c)
        if not process:  # a pod's writer decides, for every process
            check_upstreams_unchanged(artifact, experiment, args.prefix, deps_record)
        return result

    why_stopped = partial(process_0_died, location, pod.coordinator) if process else None  # (pod_start.py)
    record = run_step(ctx, entry, provenance, step, process, None if held is None else held.still_held,
                      hint_flags=rerun_hint(args), why_stopped=why_stopped)
    if record is not None and not record.files and storage.is_remote(location) and not is_adopted_in_place(artifact):
        tell(f"{artifact.key}: note: the step wrote no data files under {location} (its record holds only its "
             "result); a step writes through marin_rules.artifacts.storage, since open() or os on a gs:// path "
             "makes a local folder named gs:")  # fmt: skip
    lossy = None if record is None else lossy_example(record.result)
    if lossy is not None:  # the step said so in its log; a warning the user should see without opening it
        from marin_rules.data.tokenizer import lossy_message

        tell(f"{artifact.key}: note: {lossy_message('its tokenizer', lossy)}")
    _mirror(record, artifact, args)
    return 0
