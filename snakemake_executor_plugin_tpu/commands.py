"""Where a job runs and the command lines that run it (strings only, tested as such).

Model: the executor hands every job to one of three places, decided by
`pod_tpu_type`: this host (one process), a local pod, or a Cloud TPU slice. For a
slice, a job becomes a `TpuNode` (named per artifact, so a retry or a kept node is
reused) and a worker command: Snakemake's own job command
(`python3 -m snakemake --target-jobs ... --mode remote`), preceded by what a fresh
worker needs: the records of the job's inputs mirrored from the prefix, and the
user's command line for provenance. Nothing here runs a process.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any, Mapping

from marin_rules.cluster.gcloud import TpuNode

POD_RULES = ("train",)  # rules whose jobs always go to a pod (others only with runtime.tpu)
WORKER_PYTHON = "python3"  # the interpreter on TPU VM images (a venv activated by --tpu-setup wins)


def pod_tpu_type(rule: str, resource_tpu: Any, runtime: Mapping[str, Any], default_type: str) -> str | None:
    """The TPU type a job needs, or None to run it on the submitting host.

    A `tpu` resource (`--set-resources RULE:tpu=TYPE`) wins, then the artifact's
    `runtime.tpu`; `train` jobs without either get the profile's default type."""
    if resource_tpu not in (None, "", 0):
        return str(resource_tpu)
    if runtime.get("tpu"):
        return str(runtime["tpu"])
    if rule in POD_RULES:
        return default_type
    return None


def node_name(artifact_path: str, fixed: str = "") -> str:
    """A valid TPU node name for an artifact: `marin-<slug>-<hash8>` (or the fixed one).

    Names must match [a-z]([-a-z0-9]*[a-z0-9])?; the hash keeps distinct artifacts
    apart after the slug is cut short."""
    if fixed:
        return fixed
    slug = re.sub(r"[^a-z0-9]+", "-", artifact_path.lower()).strip("-")[:30].strip("-")
    digest = hashlib.sha1(artifact_path.encode()).hexdigest()[:8]
    return f"marin-{slug}-{digest}" if slug else f"marin-{digest}"


def tpu_node(settings: Any, artifact_path: str, runtime: Mapping[str, Any], tpu_type: str) -> TpuNode:
    """The node for one job from the executor settings; `runtime.zone` overrides the zone."""
    return TpuNode(
        name=node_name(artifact_path, settings.node),
        accelerator_type=tpu_type,
        zone=str(runtime.get("zone") or settings.zone or ""),
        project=str(settings.project or ""),
        runtime_version=str(settings.runtime_version or ""),
        queued=bool(settings.queued),
        spot=bool(settings.spot),
    )


def mirror_refresh_command(prefix: str, python: str = WORKER_PYTHON) -> str:
    """Fetch the prefix's records into the worker's local mirror, where Snakemake
    looks for the job's inputs (a fresh worker has none)."""
    code = "import sys; from marin_rules.snakemake import mirror_root, refresh_mirror; refresh_mirror(sys.argv[1], mirror_root(sys.argv[1]))"
    return shlex.join([python, "-c", code, prefix])


def export_command(name: str, value: str) -> str:
    return f"export {name}={shlex.quote(value)}"


def job_label(artifact_key: str, tpu_type: str | None, backend: str, settings: Any) -> str:
    """One line saying where a job runs, for the log."""
    if tpu_type is None:
        return f"{artifact_key}: on this host"
    if backend == "local-pod":
        return (
            f"{artifact_key}: local pod of {settings.local_processes} processes x "
            f"{settings.local_devices} CPU devices (stands in for {tpu_type})"
        )
    return f"{artifact_key}: {tpu_type} via gcloud"
