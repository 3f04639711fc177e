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
remote`, from `format_job_exec`), with the variables of `--envvars` exported. A job
succeeds iff every process exits 0. Logs go to
`.snakemake/tpu/<rule>/<wildcard values>/<UTC time>/`.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import AsyncGenerator, List

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from snakemake_executor_plugin_tpu import gcloud, placement, transfer
from snakemake_executor_plugin_tpu.local_pod import LocalPodSpec, ProcessGroup, start_local_pod

LOG_ROOT = Path(".snakemake/tpu")
POLL_SECONDS = 1  # status checks only poll local processes: cheap


class Executor(RemoteExecutor):
    def __post_init__(self):
        self.settings = self.workflow.executor_settings
        self.local_pod = LocalPodSpec(self.settings.local_processes, self.settings.local_devices)
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

    # ---- submitting -----------------------------------------------------------------
    def run_job(self, job: JobExecutorInterface):
        tpu_type = self._tpu_type(job)
        wildcards = {} if job.is_group() else dict(getattr(job, "wildcards_dict", None) or {})
        name = f"group {job.groupid}" if job.is_group() else job.name
        description = placement.job_description(name, wildcards)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        job_dir = LOG_ROOT.joinpath(*placement.job_parts(name.replace(" ", "-"), wildcards), stamp)
        if tpu_type is None:
            group = ProcessGroup.start([self.job_command(job, on_worker=False)], [os.environ], [job_dir / "job.log"])
        elif self.settings.backend == "local-pod":
            group = start_local_pod(self.job_command(job, on_worker=False), self.local_pod, job_dir, os.environ)
        else:
            group = self._start_gcloud(job, wildcards, tpu_type, job_dir, description)
        label = placement.job_label(description, tpu_type, self.settings.backend, self.settings)
        self.logger.info(f"tpu executor: {label}; logs in {job_dir}/")
        self.report_job_submission(
            SubmittedJobInfo(job, external_jobid=",".join(map(str, group.pids)), aux={"group": group, "dir": job_dir})
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

    def _start_gcloud(self, job, wildcards: dict, tpu_type: str, job_dir: Path, description: str) -> ProcessGroup:
        workdir = os.getcwd()
        transfer.local_paths([self.get_snakefile()], "Snakefile", workdir)  # the workers run it from the workdir
        zone = placement.resource(job.resources, placement.ZONE_RESOURCE)
        node = placement.tpu_node(self.settings, placement.node_name(job.name, wildcards, self.settings.node), tpu_type, zone)
        uploads = []
        if not self.settings.expect_workflow:
            if self._workflow_archive is None:
                archive = transfer.workflow_archive(workdir, LOG_ROOT / "workflow.tar.gz")
                self._workflow_archive = (archive, transfer.archive_name(archive, "workflow"))
            uploads.append((str(self._workflow_archive[0]), self._workflow_archive[1]))
        inputs = transfer.local_paths(job.input, "input", workdir)
        if inputs:
            archive = transfer.files_archive(workdir, inputs, job_dir / "inputs.tar.gz")
            uploads.append((str(archive), transfer.archive_name(archive, "inputs")))
        outputs = transfer.local_paths([*job.output, *job.log], "output", workdir)
        returned = f"snakemake-outputs-{node.name}-{job_dir.name}.tar.gz"
        worker = gcloud.worker_command(
            self.job_command(job, on_worker=True), self.settings.workdir, self.settings.setup,
            archives=[remote for _, remote in uploads], outputs=outputs, outputs_archive=returned,
        )  # fmt: skip
        download = (returned, str((job_dir / "outputs.tar.gz").resolve()), workdir) if outputs else None
        script = gcloud.driver_script(
            node, worker, uploads=uploads, download=download, delete=not self.settings.keep_node,
            title=f"{description}, job {job.jobid}",
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
                self.report_job_success(info)

    def cancel_jobs(self, active_jobs: List[SubmittedJobInfo]):
        for info in active_jobs:
            info.aux["group"].terminate()
