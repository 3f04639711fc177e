"""Where a job runs, read from the job alone, and the names that follow from it.

Model: a job asks for a TPU pod through its resources: `tpu="v5p-8"` (an
accelerator type) or `tpu="default"` (the executor's `--tpu-type`); `tpu_zone`
optionally overrides `--tpu-zone`. Any other job (no `tpu`, or an empty one) runs on
the submitting host. A job is named for logs and TPU nodes by its rule and wildcard
values, so a retry of the same job reuses its node. Nothing here runs a process.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Mapping, Sequence

from snakemake_interface_common.exceptions import WorkflowError

from snakemake_executor_plugin_tpu.gcloud import TpuNode

RESOURCE = "tpu"  # resources: tpu="v5p-8" | "default"
ZONE_RESOURCE = "tpu_zone"  # resources: tpu_zone="us-east5-a" (optional)
DEFAULT = "default"  # the executor's --tpu-type
QUOTES = ("'", '"')
WORKER_PYTHON = "python3"  # the interpreter on TPU VM images (a venv activated by --tpu-setup wins)


def pod_tpu_type(resource_tpu: Any, default_type: str) -> str | None:
    """The TPU type a job's `tpu` resource asks for, or None to run it on this host."""
    if resource_tpu in (None, "", 0, False):
        return None
    value = str(resource_tpu).strip()
    if not value or value.lower() == "none":
        return None
    return default_type if value == DEFAULT else value


def resource(resources: Any, name: str) -> Any:
    """A job's resource by name (None if it has none)."""
    try:
        return resources.get(name)
    except AttributeError:
        return dict(resources.items()).get(name)


def job_parts(rule: str, wildcards: Mapping[str, Any]) -> list[str]:
    """Path components naming one job: its rule, then each wildcard value (a value with
    `/` gives several); characters other than [A-Za-z0-9._-] become `_`."""
    parts = [rule]
    for value in wildcards.values():
        parts += [p for p in str(value).split("/") if p]
    safe = [re.sub(r"[^A-Za-z0-9._-]", "_", p) for p in parts]
    return ["_" if p in (".", "..") else p for p in safe]


def job_description(rule: str, wildcards: Mapping[str, Any]) -> str:
    """`rule train (artifact=checkpoints/x/v1)`, for the log."""
    shown = ", ".join(f"{k}={v}" for k, v in wildcards.items())
    return f"rule {rule}" + (f" ({shown})" if shown else "")


def node_name(
    rule: str, wildcards: Mapping[str, Any], workdir: str, fixed: str = "", outputs: Sequence[str] = ()
) -> str:
    """A valid TPU node name for a job: `snakemake-<slug>-<hash8>` (or the fixed one).

    Names must match [a-z]([-a-z0-9]*[a-z0-9])?, so the slug loses characters; the
    hash is of the rule, the exact wildcard values, the working directory and the job's
    output files, so two jobs (`b c` and `b_c`), the same job run from two checkouts,
    or from one checkout into two places (the same wildcards, other outputs: another
    storage prefix, another --config), never share a node (a driver deletes its node
    when done), while a retry of one job reuses its own."""
    if fixed:
        return fixed
    slug = re.sub(r"[^a-z0-9]+", "-", "/".join(job_parts(rule, wildcards)).lower()).strip("-")[:30].strip("-")
    key = json.dumps([rule, [[str(k), str(v)] for k, v in wildcards.items()], os.path.abspath(workdir),
                      *([sorted(map(str, outputs))] if outputs else [])])  # fmt: skip
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    return f"snakemake-{slug}-{digest}" if slug else f"snakemake-{digest}"


def check_target_wildcards(rule: str, wildcards: Mapping[str, Any]) -> None:
    """Refuse wildcard values that Snakemake's `--target-jobs RULE:NAME=VALUE,...`
    (how every executor plugin names the job to run) cannot carry: it splits on `,`,
    strips quotes at both ends of a value and doubles a backslash, so the job would
    build another file."""
    for name, value in wildcards.items():
        text = str(value)
        if "," in text or "\\" in text or text[:1] in QUOTES or text[-1:] in QUOTES:
            raise WorkflowError(
                f"tpu executor: rule {rule}: wildcard {name}={text!r} cannot be passed to a job run by an executor "
                "plugin (Snakemake's --target-jobs splits values on ',', strips quotes at their ends and doubles "
                "backslashes); use a file name without them, or run this rule locally (localrules:)"
            )


def host_cores(workflow: Any) -> int:
    """Cores for jobs run on this host: `--local-cores` (Snakemake's setting for the
    submitting machine in cluster mode), else every core this process may run on (its
    CPU affinity: `taskset`, a Slurm allocation or a container's cpuset count, as
    Snakemake's own `--cores all` counts them), not every core of the machine."""
    settings = getattr(workflow, "resource_settings", None)  # Snakemake's Workflow; not in the plugin interface
    cores = getattr(settings, "local_cores", None)
    return max(1, int(cores)) if cores else usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (`os.sched_getaffinity`; every core where the
    platform has no affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


def host_mem_mb(workflow: Any) -> int | None:
    """Memory for jobs run on this host: `--resources mem_mb=N`, which Snakemake's
    local mode enforces but its cluster mode leaves to each job (`mem_mb` is a local
    resource there); None when not given (no limit, as in local mode)."""
    settings = getattr(workflow, "resource_settings", None)  # Snakemake's Workflow; not in the plugin interface
    value = resource(getattr(settings, "resources", None) or {}, "mem_mb")
    value = getattr(value, "value", value)  # a parsed snakemake.resources.Resource
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def job_mem_mb(resources: Any) -> int:
    """A job's `mem_mb` resource as a whole number (0 when it has none or it is not a number)."""
    value = resource(resources, "mem_mb")
    return max(0, int(value)) if isinstance(value, (int, float)) else 0


def tpu_node(settings: Any, name: str, tpu_type: str, zone: Any = None) -> TpuNode:
    """The node for one job from the executor settings; a `tpu_zone` resource wins."""
    return TpuNode(
        name=name,
        accelerator_type=tpu_type,
        zone=str(zone or settings.zone or ""),
        project=str(settings.project or ""),
        runtime_version=str(settings.runtime_version or ""),
        queued=bool(settings.queued),
        spot=bool(settings.spot),
    )


def job_label(description: str, tpu_type: str | None, backend: str, settings: Any) -> str:
    """One line saying where a job runs, for the log."""
    if tpu_type is None:
        return f"{description}: on this host"
    if backend == "local-pod":
        return (
            f"{description}: local pod of {settings.local_processes} processes x "
            f"{settings.local_devices} CPU devices (stands in for {tpu_type})"
        )
    return f"{description}: {tpu_type} via gcloud"
