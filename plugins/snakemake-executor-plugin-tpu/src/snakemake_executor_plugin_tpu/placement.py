"""Where a job runs, read from the job alone, and the names that follow from it.

Model: a job asks for a TPU pod through its resources: `tpu="v5p-8"` (an
accelerator type) or `tpu="default"` (the executor's `--tpu-type`); `tpu_zone`
optionally overrides `--tpu-zone`. Any other job (no `tpu`, or an empty one) runs on
the submitting host. A job is named for logs and TPU nodes by its rule and wildcard
values, so a retry of the same job reuses its node. Nothing here runs a process.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping

from snakemake_executor_plugin_tpu.gcloud import TpuNode

RESOURCE = "tpu"  # resources: tpu="v5p-8" | "default"
ZONE_RESOURCE = "tpu_zone"  # resources: tpu_zone="us-east5-a" (optional)
DEFAULT = "default"  # the executor's --tpu-type
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


def node_name(rule: str, wildcards: Mapping[str, Any], fixed: str = "") -> str:
    """A valid TPU node name for a job: `snakemake-<slug>-<hash8>` (or the fixed one).

    Names must match [a-z]([-a-z0-9]*[a-z0-9])?; the hash keeps distinct jobs apart
    after the slug is cut short."""
    if fixed:
        return fixed
    key = "/".join(job_parts(rule, wildcards))
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[:30].strip("-")
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    return f"snakemake-{slug}-{digest}" if slug else f"snakemake-{digest}"


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
