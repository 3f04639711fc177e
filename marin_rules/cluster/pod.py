"""How a job learns it is one process of a pod.

Model: the `tpu` executor plugin (plugins/snakemake-executor-plugin-tpu, either
backend) starts the same Snakemake job command once per host and tells each process
its place through three variables, which JAX itself also needs:
`SNAKEMAKE_TPU_COORDINATOR` (`host:port` of process 0, or `auto` on a TPU VM, where
JAX reads the slice metadata), `SNAKEMAKE_TPU_NUM_PROCESSES` and
`SNAKEMAKE_TPU_PROCESS_ID`. The names are the plugin's public contract, repeated
here so that marin_rules never imports an executor (a test checks they agree). The
job wrapper turns them into the step's `runtime.distributed`; only process 0 writes
the success record, every process that fails its own failure record. Without them a
job is a single process.

The plugin also tells every job it runs (on the submitting host too) where it came
from: `SNAKEMAKE_TPU_JOBID`, the job's id in the submitting run, which the record's
`provenance.jobid` takes (`submitted_jobid`: the job command's own `{jobid}` is its id in
its own `snakemake --mode remote`, 0), and `SNAKEMAKE_TPU_SUBMITTER`, the submitting
process as `<host> <pid> <pid namespace>`, which a job's lease records (`submitted_by`),
so that the run can tell its own pod job, holding a lease on a TPU worker, from another
run's (`this_submitter`, `Session.taken_by_another_run`).

`refuse_unreachable_prefix` is the workflow's own check (the plugin knows no
prefixes): Cloud TPU workers share no disk with the submitting host and the plugin
moves only declared files (the records), so the prefix must be a bucket there.
"""

from __future__ import annotations

import os
import subprocess
import socket
from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.lease import pid_namespace

ENV_COORDINATOR = "SNAKEMAKE_TPU_COORDINATOR"
ENV_NUM_PROCESSES = "SNAKEMAKE_TPU_NUM_PROCESSES"
ENV_PROCESS_ID = "SNAKEMAKE_TPU_PROCESS_ID"
ENV_JOBID = "SNAKEMAKE_TPU_JOBID"
ENV_SUBMITTER = "SNAKEMAKE_TPU_SUBMITTER"


@dataclass(frozen=True)
class PodProcess:
    coordinator: str  # "host:port", or "auto" on a TPU VM
    num_processes: int
    process_id: int

    def runtime_distributed(self) -> Any:
        """The value of `runtime.distributed` the train step reads."""
        if self.coordinator == "auto":
            return "auto"
        return {"coordinator": self.coordinator, "num_processes": self.num_processes, "process_id": self.process_id}


def pod_process_from_env(environ: Mapping[str, str]) -> PodProcess | None:
    """This process's place in a pod, or None for an ordinary single-process job."""
    coordinator = environ.get(ENV_COORDINATOR)
    if not coordinator:
        return None
    try:
        num = int(environ.get(ENV_NUM_PROCESSES, "1"))
        pid = int(environ.get(ENV_PROCESS_ID, "0"))
    except ValueError:
        raise ValueError(
            f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers (set by the tpu executor)"
        ) from None
    if not 0 <= pid < num:
        raise ValueError(f"{ENV_PROCESS_ID}={pid} is outside [0, {num})")
    return PodProcess(coordinator, num, pid)


def submitted_jobid(environ: Mapping[str, str]) -> str | None:
    """The job's id in the run that submitted it through the tpu executor, or None."""
    return environ.get(ENV_JOBID) or None


def submitted_by(environ: Mapping[str, str]) -> str:
    """The process that submitted this job through the tpu executor ("" for none)."""
    return environ.get(ENV_SUBMITTER, "")


def this_submitter() -> str:
    """This process as the tpu executor names the submitter of the jobs it starts
    (`<host> <pid> <pid namespace>`, the plugin's `local_pod.submitter`)."""
    return f"{socket.gethostname()} {os.getpid()} {pid_namespace()}".rstrip()


def refuse_unreachable_experiment(executor: str | None, executor_settings: Any, experiment: str, workdir: str) -> None:
    """Raise when jobs go to Cloud TPU workers (as `refuse_unreachable_prefix`) and the
    experiment file would not reach them: the workflow copied there is the working
    directory's git files (tracked, or untracked and not ignored), so a file outside it,
    or one git ignores, is missing on the worker (the job failed there, after the node
    was made). With `--tpu-expect-workflow` the user put the workflow there: not checked."""
    if executor != "tpu" or getattr(executor_settings, "backend", None) != "gcloud":
        return
    if getattr(executor_settings, "expect_workflow", False):
        return
    path = os.path.abspath(experiment)
    rel = os.path.relpath(path, os.path.abspath(workdir))
    if rel == ".." or rel.startswith(".." + os.sep):
        raise MarinError(
            f"the experiment file {experiment} lies outside the working directory {workdir}, which is all the TPU "
            "workers get; copy it into it (experiments/, say) and name that copy"
        )
    ignored = subprocess.run(["git", "-C", workdir, "check-ignore", "-q", "--", rel], capture_output=True, timeout=60)
    if ignored.returncode == 0:
        raise MarinError(
            f"the experiment file {experiment} is ignored by git, and the workflow copied to the TPU workers is the "
            "working directory's git files: move it where git does not ignore it, or change .gitignore"
        )


def refuse_unreachable_prefix(executor: str | None, executor_settings: Any, prefix: str) -> None:
    """Raise when jobs go to Cloud TPU workers (executor `tpu`, backend `gcloud`), which
    cannot see a local prefix. Called by `Session.start` (main process, real
    runs only: the executor is known only after the Snakefile is parsed)."""
    if executor != "tpu" or getattr(executor_settings, "backend", None) != "gcloud" or storage.is_remote(prefix):
        return
    raise MarinError(
        f"TPU workers cannot see the local prefix {prefix!r}; give a bucket: --config prefix=gs://BUCKET/PATH "
        "(or run on this machine with --tpu-backend local-pod)"
    )
