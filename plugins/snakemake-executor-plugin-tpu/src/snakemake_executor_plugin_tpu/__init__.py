"""Snakemake executor plugin `tpu`: jobs that ask for a TPU run on a pod, all others here.

Model: `--executor tpu` (or `executor: tpu` in a profile) works for any workflow. A
job goes to a TPU pod slice when its resources ask for one, `resources:
tpu="v5p-8"` (an accelerator type) or `tpu="default"` (the `--tpu-type` setting),
with an optional `tpu_zone`; every other job runs on the submitting host. The plugin
reads only the job and these settings. The pod is a Cloud TPU slice (`--tpu-backend
gcloud`) or N processes on this machine joined like one (`--tpu-backend local-pod`).
On a pod every host runs the job, told its place by `SNAKEMAKE_TPU_COORDINATOR`,
`SNAKEMAKE_TPU_NUM_PROCESSES` and `SNAKEMAKE_TPU_PROCESS_ID`. Every job is told its
job id in this run (`SNAKEMAKE_TPU_JOBID`) and the process that submitted it
(`SNAKEMAKE_TPU_SUBMITTER`), wherever it runs.

This module is declarative: settings (each field becomes `--tpu-<field>` and the
profile key `tpu-<field>`), common settings, and the executor from `executor.py`.
Command lines are built in `gcloud.py`, placement in `placement.py`, file transfer
in `transfer.py`. Snakemake finds the plugin by its top-level module name.
"""

# No `from __future__ import annotations`: Snakemake reads the field types at runtime.
from dataclasses import dataclass, field

from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from snakemake_executor_plugin_tpu.executor import Executor

__all__ = ["Executor", "ExecutorSettings", "common_settings"]


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    backend: str = field(
        default="gcloud",
        metadata={
            "help": "Where pod jobs run: gcloud (Cloud TPU VMs through the gcloud CLI) or local-pod "
            "(N processes on this machine joined by jax.distributed, CPU devices).",
            "choices": ["gcloud", "local-pod"],
        },
    )
    type: str = field(
        default="v5p-8",
        metadata={"help": 'TPU type (accelerator type) for jobs whose resource is tpu="default".'},
    )
    zone: str = field(
        default="",
        metadata={"help": "Cloud TPU zone, e.g. us-east5-a (empty: gcloud's configured compute/zone)."},
    )
    project: str = field(
        default="",
        metadata={"help": "Google Cloud project (empty: gcloud's configured project)."},
    )
    queued: bool = field(
        default=False,
        metadata={"help": "Request TPUs through queued resources (waits for capacity) instead of creating TPU VMs."},
    )
    spot: bool = field(
        default=False,
        metadata={"help": "Use spot (preemptible) capacity: cheaper, may be reclaimed."},
    )
    runtime_version: str = field(
        default="",
        metadata={"help": "TPU software version (empty: chosen by TPU generation, e.g. v2-alpha-tpuv5 for v5p)."},
    )
    node: str = field(
        default="",
        metadata={
            "help": "Run every pod job on this TPU VM / queued resource name, reused if it exists "
            "(empty: one node per job, named snakemake-<rule>-<wildcards>-<hash>). Run one pod job at a time with it."
        },
    )
    keep_node: bool = field(
        default=False,
        metadata={"help": "Keep the TPU VM (or queued resource) after the job instead of deleting it."},
    )
    expect_workflow: bool = field(
        default=False,
        metadata={
            "help": "Do not copy the workflow's sources to the workers; expect them (and what the jobs import) "
            "in --tpu-workdir. The jobs' input files are copied either way."
        },
    )
    workdir: str = field(
        default="snakemake-workflow",
        metadata={"help": "Workflow directory on the workers, relative to the login user's home."},
    )
    setup: str = field(
        default="",
        metadata={
            "help": "Shell command run on every worker in the workdir before each job, "
            "e.g. installing what the jobs import: python3 -m pip install -q -e . 'jax[tpu]'."
        },
    )
    local_processes: int = field(
        default=2,
        metadata={"help": "local-pod: number of processes (the hosts of the fake slice)."},
    )
    local_devices: int = field(
        default=4,
        metadata={"help": "local-pod: CPU devices per process (XLA_FLAGS host platform device count)."},
    )


common_settings = CommonSettings(
    non_local_exec=True,
    # TPU workers do not share this disk: jobs get relative paths and no --wait-for-files.
    implies_no_shared_fs=True,
    # The executor moves what pod jobs need itself (sources, declared inputs to every
    # worker, declared outputs and logs back from worker 0; transfer.py), so Snakemake
    # needs no default storage provider and deploys no sources.
    can_transfer_local_files=True,
    job_deploy_sources=False,
    auto_deploy_default_storage_provider=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    init_seconds_before_status_checks=0,
)
