"""How a job learns it is one process of a pod.

Model: a pod backend (the TPU executor's `gcloud` or `local-pod`) starts the same
Snakemake job command once per host and tells each process its place through three
variables, which JAX itself also needs: `MARIN_POD_COORDINATOR` (`host:port` of
process 0, or `auto` on a TPU VM, where JAX reads the slice metadata),
`MARIN_POD_NUM_PROCESSES` and `MARIN_POD_PROCESS_ID`. The job wrapper turns them into
the step's `runtime.distributed`; only process 0 writes the success record, every
process that fails its own failure record. Without
them a job is a single process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

ENV_COORDINATOR = "MARIN_POD_COORDINATOR"
ENV_NUM_PROCESSES = "MARIN_POD_NUM_PROCESSES"
ENV_PROCESS_ID = "MARIN_POD_PROCESS_ID"


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

    def env(self) -> dict[str, str]:
        return {
            ENV_COORDINATOR: self.coordinator,
            ENV_NUM_PROCESSES: str(self.num_processes),
            ENV_PROCESS_ID: str(self.process_id),
        }


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
            f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers (set by the pod backend)"
        ) from None
    if not 0 <= pid < num:
        raise ValueError(f"{ENV_PROCESS_ID}={pid} is outside [0, {num})")
    return PodProcess(coordinator, num, pid)
