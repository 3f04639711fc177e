"""Snakemake executor plugin `tpu`: training jobs on TPU pods, everything else here.

Model: `snakemake --profile tpu` selects this executor (`executor: tpu`). A job goes
to a pod when its rule is `train` or its artifact's `runtime.tpu` names a TPU type
(a `tpu` resource, e.g. `--set-resources train:tpu=v5p-32`, overrides both); every
other job runs on the submitting host. Rules that never need a TPU (data,
evaluation) are `localrule: True`, so Snakemake runs them itself. The pod is a
Cloud TPU slice (`--tpu-backend gcloud`) or N processes on this machine joined by
`jax.distributed` (`--tpu-backend local-pod`): the same multi-host code path.

This module is declarative: settings (each field becomes `--tpu-<field>` and the
profile key `tpu-<field>`), common settings, and the executor from `executor.py`.
Command lines are built in `commands.py` and `marin_rules.cluster.gcloud`.
Snakemake finds the plugin by its top-level module name. See docs/TPU.md.
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
        metadata={"help": "TPU type (accelerator type) when the artifact's runtime.tpu names none."},
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
            "(empty: one node per artifact, named marin-<artifact>-<hash>). Run one pod job at a time with it."
        },
    )
    keep_node: bool = field(
        default=False,
        metadata={"help": "Keep the TPU VM (or queued resource) after the job instead of deleting it."},
    )
    expect_workflow: bool = field(
        default=False,
        metadata={
            "help": "Do not copy the workflow to the workers; expect it (and an installed marin-rules) in --tpu-workdir."
        },
    )
    workdir: str = field(
        default="marin-rules",
        metadata={"help": "Workflow directory on the workers, relative to the login user's home."},
    )
    setup: str = field(
        default="",
        metadata={
            "help": "Shell command run on every worker in the workdir before each job, "
            "e.g. installing the package: python3 -m pip install -q -e . 'jax[tpu]'."
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
    # The executor moves what jobs need itself (workflow tarball, record mirror refresh),
    # so Snakemake needs no default storage provider and deploys no sources.
    can_transfer_local_files=True,
    job_deploy_sources=False,
    auto_deploy_default_storage_provider=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    init_seconds_before_status_checks=0,
)
