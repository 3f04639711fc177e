"""The `tpu` executor: jobs that ask for a TPU go to a pod, every other job runs here.

Model: every job the scheduler hands over (Snakemake runs local rules itself) is
started as a `ProcessGroup` of local processes and polled; where it goes is read
from the job's resources alone (see `placement.py`):

  - no `tpu` resource: one process on this host (a job group, too);
  - `local-pod`: N processes of the job command on this host, each told its place by
    `SNAKEMAKE_TPU_*` and given fake CPU devices (shared disk: nothing is copied);
  - `gcloud`: one driver script that creates or reuses a TPU node, copies the
    workflow's sources and the job's input files to every worker, runs the job
    command on all of them over `gcloud ... ssh --worker=all`, copies the job's output
    and log files back from worker 0, and deletes the node (see `transfer.py`).

The job command is Snakemake's own (`python -m snakemake --target-jobs ... --mode
remote`, from `format_job_exec`). The variables of `--envvars` / `envvars:` reach a
job unchanged: host jobs and local pods inherit this process's environment; the gcloud
driver exports them on the workers, quoted at run time from its own environment, so
their values are never written to disk. Every job is also told its job id here and
this process (`SNAKEMAKE_TPU_JOBID`, `SNAKEMAKE_TPU_SUBMITTER`: `submission_env`). A
job succeeds iff every process exits 0; a failure names how the job's command ended
where the process's log says (`ProcessGroup.failure`), not only its `snakemake --mode
remote`'s status (1 for any failed job).
Logs go to `.snakemake/tpu/<rule>/<wildcard values>/<UTC time>/`.

Host jobs share this machine's cores and memory as Snakemake's local mode would: a
job takes its `threads` (at most `--local-cores`) and its `mem_mb` (of `--resources
mem_mb=N` when given: in cluster mode Snakemake itself leaves memory to each job, a
pod's memory is the pod's; a job asking for more runs alone), and one waits, counted
as submitted, until enough is free (`--jobs` alone bounds pod jobs). A job the executor cannot run
(an input outside the workdir, a tpu inside a group, an unknown TPU type, a wildcard
value Snakemake's `--target-jobs` cannot carry) fails alone, with the reason, so
`--keep-going` goes on with the others. Waiting host jobs never start after a failure
without `--keep-going`, nor after SIGTERM: they fail unstarted, saying why, as in local
mode. On SIGTERM the running jobs' process groups get SIGTERM too (a gcloud driver then
deletes its node): each job runs in its own session, out of reach of the process-group
signal that `timeout` and CI cancels send, which stops local mode's jobs; Snakemake's
graceful stop would wait for them. The SIGTERM handler is chained in front of the
scheduler's when the first job is handed over (the scheduler installs its own after
creating the executor); it sets a flag and signals, nothing that takes a lock.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import AsyncGenerator, List

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from snakemake_executor_plugin_tpu import gcloud, placement, transfer
from snakemake_executor_plugin_tpu.local_pod import LocalPodSpec, ProcessGroup, job_env, start_local_pod, submission_env

LOG_ROOT = Path(".snakemake/tpu")
POLL_SECONDS = 1  # status checks only poll local processes: cheap


class Executor(RemoteExecutor):
    def __init__(self, workflow, logger):
        # RemoteExecutor.__init__ starts the polling thread (check_active_jobs) before it
        # calls __post_init__: what that thread reads must exist first
        self.host_cores = placement.host_cores(workflow)
        self.host_mem_mb = placement.host_mem_mb(workflow)
        self._host_waiting: collections.deque[SubmittedJobInfo] = collections.deque()
        self._host_threads_running = 0
        self._host_mem_running = 0
        self._host_lock = threading.Lock()  # run_job (scheduler thread) and check_active_jobs (polling thread)
        self._stop_reason: str | None = None  # set by the SIGTERM handler: start no waiting host job
        self._running: set[ProcessGroup] = set()  # started and not yet seen ended: SIGTERM reaches them
        self._signal_chained = False
        super().__init__(workflow, logger)

    def __post_init__(self):
        self.settings = self.workflow.executor_settings
        try:
            self.local_pod = LocalPodSpec(self.settings.local_processes, self.settings.local_devices)
        except ValueError as e:  # --tpu-local-processes 0, --tpu-local-devices -1
            raise WorkflowError(f"tpu executor: {e} (--tpu-local-processes, --tpu-local-devices)") from None
        if self.settings.backend == "gcloud":  # a bad zone, project, type...: before any job, not at the first pod job
            try:
                placement.tpu_node(self.settings, self.settings.node or "snakemake-settings", self.settings.type)
            except ValueError as e:
                raise WorkflowError(str(e)) from None
        self.next_seconds_between_status_checks = POLL_SECONDS
        self._on_worker = False
        self._workflow_archive: tuple[Path, str] | None = None

    # ---- the job command ------------------------------------------------------------
    def get_python_executable(self) -> str:
        return placement.WORKER_PYTHON if self._on_worker else sys.executable

    def job_command(self, job: JobExecutorInterface, on_worker: bool) -> str:
        """Snakemake's command for this job, for this host or for a TPU worker."""
        self._on_worker = on_worker
        try:
            return self.format_job_exec(job)
        finally:
            self._on_worker = False

    def additional_general_args(self) -> str:
        """`--directory .`: every job starts in its working directory (a host job or a
        local pod in this process's, which Snakemake has entered; a TPU worker's command
        cds into its copy). Snakemake itself passes the run's `--directory` as given:
        relative, it would be entered a second time (`-d sub` ran jobs in sub/sub);
        absolute, it names a path a TPU worker does not have (Snakemake would create it
        there and run the job in an empty folder). The last `--directory` wins."""
        return "--directory ."

    def get_envvar_declarations(self) -> str:
        """Nothing: the variables reach jobs unchanged another way (see the module
        docstring). Snakemake's own declaration quotes with `repr`, which the shell
        expands (`$(...)`, `$HOME`) and which breaks on a value holding both quotes."""
        return ""

    # ---- submitting -----------------------------------------------------------------
    def run_job(self, job: JobExecutorInterface):
        if not self._signal_chained:
            self._chain_sigterm()
        try:
            self._submit(job)
        except (WorkflowError, ValueError) as e:  # this job cannot run here; the others go on
            if job.is_group():  # Snakemake prints a group's error without the message
                self.logger.error(str(e))
            self.report_job_error(SubmittedJobInfo(job), msg=f"{e}\n")

    def _submit(self, job: JobExecutorInterface) -> None:
        wildcards = {} if job.is_group() else dict(getattr(job, "wildcards_dict", None) or {})
        placement.check_target_wildcards(job.name, wildcards)
        tpu_type = self._tpu_type(job)
        name = f"group {job.groupid}" if job.is_group() else job.name
        description = placement.job_description(name, wildcards)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        job_dir = LOG_ROOT.joinpath(*placement.job_parts(name.replace(" ", "-"), wildcards), stamp)
        label = placement.job_label(description, tpu_type, self.settings.backend, self.settings)
        jobid = None if job.is_group() else job.jobid  # a group's members have ids of their own
        if tpu_type is None:
            threads = min(max(int(job.threads or 1), 1), self.host_cores)
            mem_mb = min(placement.job_mem_mb(job.resources), self.host_mem_mb) if self.host_mem_mb else 0
            command = self.job_command(job, on_worker=False)  # here, in the scheduler's thread
            aux = {
                "group": None, "dir": job_dir, "threads": threads, "mem_mb": mem_mb, "label": label,
                "command": command, "env": job_env(os.environ, jobid),
            }  # fmt: skip
            info = SubmittedJobInfo(job, aux=aux)
            self.report_job_submission(info)
            with self._host_lock:
                self._host_waiting.append(info)
            self._start_waiting_host_jobs()
            return
        if self.settings.backend == "local-pod":
            # what the gcloud backend would refuse (a TPU type or zone gcloud does not take, a type without a
            # default runtime version) is refused here too: a local rehearsal must not pass a job the cloud fails
            zone = placement.resource(job.resources, placement.ZONE_RESOURCE)
            _ = placement.tpu_node(self.settings, "snakemake-local-pod", tpu_type, zone).version
            env = job_env(os.environ, jobid)
            group = start_local_pod(self.job_command(job, on_worker=False), self.local_pod, job_dir, env)
        else:
            group = self._start_gcloud(job, jobid, wildcards, tpu_type, job_dir, description)
        self._running.add(group)
        self.logger.info(f"tpu executor: {label}; logs in {job_dir}/")
        self.report_job_submission(
            SubmittedJobInfo(job, external_jobid=",".join(map(str, group.pids)), aux={"group": group, "dir": job_dir})
        )

    def _chain_sigterm(self) -> None:
        """On SIGTERM, start no more waiting host jobs, then call the handler there was
        (the scheduler's graceful exit). A flag only: the handler may interrupt a thread
        holding the lock."""
        self._signal_chained = True
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except ValueError:
            return

        def on_sigterm(signum, frame):
            self._stop_reason = "snakemake received SIGTERM"
            for group in list(self._running):
                group.signal_running(signal.SIGTERM)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread: Snakemake's own handling stays
            pass

    def _start_waiting_host_jobs(self) -> None:
        """Start waiting host jobs, first come first, while their threads fit the free
        cores; after SIGTERM, fail them unstarted instead."""
        if self._stop_reason is not None:
            self._drop_waiting_host_jobs(f"not started: {self._stop_reason}")
            return
        with self._host_lock:
            self._start_host_jobs_locked()

    def _start_host_jobs_locked(self) -> None:
        while self._host_waiting:
            info = self._host_waiting[0]
            threads, mem_mb = info.aux["threads"], info.aux["mem_mb"]
            cores_full = self._host_threads_running + threads > self.host_cores
            mem_full = bool(self.host_mem_mb) and self._host_mem_running + mem_mb > self.host_mem_mb
            if self._host_threads_running and (cores_full or mem_full):
                return
            self._host_waiting.popleft()
            job_dir = info.aux["dir"]
            info.aux["group"] = ProcessGroup.start([info.aux["command"]], [info.aux["env"]], [job_dir / "job.log"])
            self._running.add(info.aux["group"])
            info.external_jobid = ",".join(map(str, info.aux["group"].pids))
            self._host_threads_running += threads
            self._host_mem_running += mem_mb
            memory = f", {mem_mb} of {self.host_mem_mb} MB" if self.host_mem_mb else ""
            self.logger.info(
                f"tpu executor: {info.aux['label']} ({threads} of {self.host_cores} cores{memory}); logs in {job_dir}/"
            )

    def _tpu_type(self, job: JobExecutorInterface) -> str | None:
        def asked(j) -> str | None:
            return placement.pod_tpu_type(placement.resource(j.resources, placement.RESOURCE), self.settings.type)

        if not job.is_group():
            return asked(job)
        asking = [j.name for j in job.jobs if asked(j) is not None]
        if asking:
            raise WorkflowError(
                f"tpu executor: rule(s) {', '.join(sorted(set(asking)))} ask for a tpu inside group {job.groupid}; "
                "a pod runs one job: remove `group:` (or --groups) for them"
            )
        return None

    def _start_gcloud(
        self, job, jobid: int | None, wildcards: dict, tpu_type: str, job_dir: Path, description: str
    ) -> ProcessGroup:
        workdir = os.getcwd()
        # what the workers' Snakemake reads must travel: refused before any pod is made (with
        # --tpu-expect-workflow the user put the workflow there, wherever its files lie)
        read_there = transfer.workflow_files(self.workflow)
        if not self.settings.expect_workflow:
            transfer.refuse_untravelled(read_there, workdir, None)
        zone = placement.resource(job.resources, placement.ZONE_RESOURCE)
        name = placement.node_name(job.name, wildcards, workdir, self.settings.node, [str(f) for f in job.output])
        node = placement.tpu_node(self.settings, name, tpu_type, zone)
        uploads = []
        if not self.settings.expect_workflow:
            if self._workflow_archive is None:
                archive = transfer.workflow_archive(workdir, LOG_ROOT / "workflow.tar.gz", read_there)
                self._workflow_archive = (archive, transfer.archive_name(archive, "workflow"))
            uploads.append((str(self._workflow_archive[0]), self._workflow_archive[1]))
        inputs = transfer.local_paths(job.input, "input", workdir)
        if inputs:
            archive = transfer.files_archive(workdir, inputs, job_dir / "inputs.tar.gz")
            uploads.append((str(archive), transfer.archive_name(archive, "inputs")))
        benchmark = [job.benchmark] if getattr(job, "benchmark", None) else []
        outputs = transfer.local_paths([*job.output, *benchmark], "output", workdir)
        logs = transfer.local_paths(job.log, "log", workdir)
        for log in logs:  # the worker's come back; an earlier run's copy here would pass for this attempt's
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(workdir, log))
        returned = f"snakemake-outputs-{node.name}-{job_dir.name}.tar.gz"
        worker = gcloud.worker_command(
            self.job_command(job, on_worker=True), self.settings.workdir, self.settings.setup,
            archives=[remote for _, remote in uploads], outputs=outputs, logs=logs, outputs_archive=returned,
            exports=submission_env(jobid),
        )  # fmt: skip
        download = (returned, str((job_dir / "outputs.tar.gz").resolve()), workdir) if outputs or logs else None
        script = gcloud.driver_script(
            node, worker, uploads=uploads, download=download, delete=not self.settings.keep_node,
            title=f"{description}, job {job.jobid}", env_names=sorted(self.envvars()), logs_back=bool(logs),
        )  # fmt: skip
        return gcloud.start_driver(script, job_dir)

    # ---- polling --------------------------------------------------------------------
    async def check_active_jobs(
        self, active_jobs: List[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        still_active = []
        for info in active_jobs:
            group: ProcessGroup | None = info.aux["group"]
            code = None if group is None else group.poll()  # None: running, or a host job waiting for cores
            if code is None:
                still_active.append(info)
                continue
            self._running.discard(group)
            if "threads" in info.aux:
                with self._host_lock:
                    self._host_threads_running -= info.aux["threads"]
                    self._host_mem_running -= info.aux["mem_mb"]
            if code != 0:
                index = group.first_failure[0] if group.first_failure else 0
                self.report_job_error(
                    info, msg=f"tpu executor: {group.failure()}; log {group.logs[index]}:\n{group.log_tail()}\n"
                )
                if not getattr(self.workflow.execution_settings, "keep_going", False):
                    # a job that failed because SIGTERM stopped it: the signal is the reason
                    why = self._stop_reason or f"job {info.job.jobid} failed (no --keep-going)"
                    self._drop_waiting_host_jobs(f"not started: {why}")
            else:
                self.report_job_success(info)
        self._start_waiting_host_jobs()
        for info in still_active:
            yield info

    def _drop_waiting_host_jobs(self, why: str) -> None:
        """As Snakemake's local mode starts nothing after a failure: the host jobs still
        waiting for cores fail unstarted."""
        with self._host_lock:
            waiting, self._host_waiting = list(self._host_waiting), collections.deque()
        for info in waiting:
            self.report_job_error(info, msg=f"tpu executor: {why}\n")

    def cancel_jobs(self, active_jobs: List[SubmittedJobInfo]):
        with self._host_lock:
            self._host_waiting.clear()
        for info in active_jobs:
            if info.aux["group"] is not None:
                info.aux["group"].terminate()
