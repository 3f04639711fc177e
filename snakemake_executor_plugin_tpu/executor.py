"""The `tpu` executor: pod jobs to a TPU slice (or a local pod), other jobs here.

Model: every job the scheduler hands over (local rules never come here) is started
as a `ProcessGroup` of local processes and polled:

  - a job with no TPU (see `commands.pod_tpu_type`) runs as one process on this host;
  - `local-pod`: N processes of the job command with `MARIN_POD_*`, fake CPU devices;
  - `gcloud`: one driver script that creates or reuses the TPU node, runs the job
    command on every worker over `gcloud ... ssh --worker=all`, and deletes the node.

The job command is Snakemake's own (`python -m snakemake --target-jobs ... --mode
remote`, from `format_job_exec`). A job succeeds iff every process exits 0. With a
remote prefix (`gs://`) Snakemake sees records through a local mirror: before
reporting success the executor copies the job's record from the prefix into the
mirror, since a TPU worker wrote it there and not here. Logs go to
`.snakemake/tpu/<artifact>/<UTC time>/`.
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncGenerator, List

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from marin_rules.cluster import gcloud
from marin_rules.cluster.local_pod import LocalPodSpec, ProcessGroup, start_local_pod
from snakemake_executor_plugin_tpu import commands

LOG_ROOT = Path(".snakemake/tpu")
POLL_SECONDS = 1  # status checks only poll local processes: cheap


class Executor(RemoteExecutor):
    def __post_init__(self):
        self.settings = self.workflow.executor_settings
        self.local_pod = LocalPodSpec(self.settings.local_processes, self.settings.local_devices)
        self.next_seconds_between_status_checks = POLL_SECONDS
        self._on_worker = False
        self._archive: Path | None = None
        if self.settings.backend == "gcloud":
            check_gcloud_ready(_session())

    # ---- the job command ------------------------------------------------------------
    def get_python_executable(self) -> str:
        return commands.WORKER_PYTHON if self._on_worker else sys.executable

    def job_command(self, job: JobExecutorInterface, on_worker: bool) -> str:
        """Snakemake's command for this job, for this host or for a TPU worker."""
        self._on_worker = on_worker
        try:
            return self.format_job_exec(job)
        finally:
            self._on_worker = False

    # ---- submitting -----------------------------------------------------------------
    def run_job(self, job: JobExecutorInterface):
        if job.is_group():
            raise WorkflowError("the tpu executor does not run job groups; remove `group:` / --groups for these rules")
        session = _session()
        artifact = session.experiment.by_path[job.format_wildcards("{wildcards.artifact}")]
        tpu_type = commands.pod_tpu_type(job.name, _resource(job, "tpu"), artifact.runtime, self.settings.type)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        job_dir = LOG_ROOT / artifact.id.path / stamp
        if tpu_type is None:
            group = ProcessGroup.start([self.job_command(job, on_worker=False)], [os.environ], [job_dir / "job.log"])
        elif self.settings.backend == "local-pod":
            group = start_local_pod(self.job_command(job, on_worker=False), self.local_pod, job_dir, os.environ)
        else:
            group = self._start_gcloud(job, session, artifact, tpu_type, job_dir)
        self.logger.info(
            f"tpu executor: {commands.job_label(artifact.key, tpu_type, self.settings.backend, self.settings)}; "
            f"logs in {job_dir}/"
        )
        self.report_job_submission(
            SubmittedJobInfo(job, external_jobid=",".join(map(str, group.pids)), aux={"group": group, "dir": job_dir})
        )

    def _start_gcloud(self, job, session, artifact, tpu_type: str, job_dir: Path) -> ProcessGroup:
        from marin_rules.snakemake import COMMAND_ENV

        node = commands.tpu_node(self.settings, artifact.id.path, artifact.runtime, tpu_type)
        local_archive, remote_archive = "", ""
        if not self.settings.expect_workflow:
            if self._archive is None:
                self._archive = gcloud.workflow_archive(session.workflow_dir, LOG_ROOT / "workflow.tar.gz")
            local_archive, remote_archive = str(self._archive), gcloud.archive_name(self._archive)
        before = " && ".join(
            [
                commands.export_command(COMMAND_ENV, shlex.join(session.command)),
                commands.mirror_refresh_command(session.prefix),
            ]
        )
        worker = gcloud.worker_command(
            self.job_command(job, on_worker=True), self.settings.workdir, self.settings.setup,
            archive=remote_archive, before=before,
        )  # fmt: skip
        script = gcloud.driver_script(
            node, worker, archive=local_archive, remote_archive=remote_archive,
            delete=not self.settings.keep_node, title=f"{artifact.key} (rule {job.name}, job {job.jobid})",
        )  # fmt: skip
        return gcloud.start_driver(script, job_dir)

    # ---- polling --------------------------------------------------------------------
    async def check_active_jobs(
        self, active_jobs: List[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        for info in active_jobs:
            group: ProcessGroup = info.aux["group"]
            code = group.poll()
            if code is None:
                yield info
            elif code != 0:
                index = group.first_failure[0] if group.first_failure else 0
                self.report_job_error(
                    info,
                    msg=f"tpu executor: process {index} exited with {code}; log {group.logs[index]}:\n"
                    f"{group.log_tail()}\n",
                )
            else:
                try:
                    fetch_records(info.job, _session())
                except Exception as e:  # noqa: BLE001 - the job ran but its record is unreadable
                    self.report_job_error(info, msg=f"tpu executor: job succeeded but its record was not found: {e}\n")
                else:
                    self.report_job_success(info)

    def cancel_jobs(self, active_jobs: List[SubmittedJobInfo]):
        for info in active_jobs:
            info.aux["group"].terminate()


def check_gcloud_ready(session: Any) -> None:
    """Refuse, before any job runs, what TPU workers could not follow."""
    from marin_rules.artifacts import storage

    if not storage.is_remote(session.prefix):
        raise WorkflowError(
            f"TPU workers cannot see the local prefix {session.prefix!r}; give a bucket: "
            "--config prefix=gs://BUCKET/PATH (or run on this machine with --tpu-backend local-pod)"
        )
    if os.path.realpath(os.getcwd()) != os.path.realpath(session.workflow_dir):
        raise WorkflowError(
            f"run `snakemake --profile tpu` from the workflow directory {session.workflow_dir} "
            f"(not {os.getcwd()}): jobs on TPU workers use paths relative to it"
        )


def fetch_records(job: JobExecutorInterface, session: Any) -> None:
    """Copy the job's records from a remote prefix into the local mirror Snakemake checks."""
    from marin_rules.artifacts import storage

    if session.records_root == session.prefix:
        return  # local prefix: the job wrote the record where Snakemake looks
    root = os.path.abspath(session.records_root)
    for output in job.output:
        rel = os.path.relpath(os.path.abspath(str(output)), root)
        if rel.startswith(".."):
            continue
        data = storage.read_bytes(storage.join(session.prefix, *rel.split(os.sep)))
        storage.write_bytes_atomic(str(output), data)


def _session() -> Any:
    """The marin-rules session of this Snakemake invocation (the Snakefile made it)."""
    from marin_rules import snakemake as glue

    session = glue.current_session()
    if session is None:
        raise WorkflowError("the tpu executor runs marin-rules workflows only (no marin session was started)")
    return session


def _resource(job: JobExecutorInterface, name: str) -> Any:
    try:
        return job.resources.get(name)
    except AttributeError:
        return dict(job.resources.items()).get(name)
