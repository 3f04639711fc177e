"""The `gcloud` backend: one job's command on every worker of a Cloud TPU slice.

Model: a job becomes one local *driver* (a bash script written next to its log)
that uses the `gcloud` CLI only:

  1. reuse the TPU VM (or queued resource) if one of that name exists, else create it
     (`gcloud compute tpus tpu-vm create`, or `queued-resources create` which waits in
     Google's queue);
  2. poll its state until READY / ACTIVE (failing on FAILED, SUSPENDED, PREEMPTED...);
  3. optionally copy the workflow (a tarball of the git-tracked sources) to every
     worker with `tpu-vm scp --worker=all`;
  4. run the worker command on all workers at once with `tpu-vm ssh --worker=all
     --command ...`; each worker learns its place from the TPU metadata server
     (`agent-worker-number`, `worker-network-endpoints`) and gets
     `MARIN_POD_COORDINATOR=auto`, so `jax.distributed.initialize()` finds the slice;
  5. delete the node when the driver exits, success or not (unless kept).

Everything here builds strings; `start_driver` runs the script as a `ProcessGroup`
of one. References: https://cloud.google.com/tpu/docs/managing-tpus-tpu-vm,
https://cloud.google.com/tpu/docs/queued-resources,
https://cloud.google.com/tpu/docs/runtimes.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from marin_rules.cluster.local_pod import ProcessGroup
from marin_rules.cluster.pod import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

# Default TPU software version per generation (the part of the type before the last "-").
RUNTIME_VERSIONS = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
READY_STATES = ("READY", "ACTIVE")  # TPU VM, queued resource
FAILED_STATES = ("FAILED", "SUSPENDED", "SUSPENDING", "PREEMPTED", "TERMINATED", "STOPPED", "DELETING")
POLL_SECONDS = 30  # between state checks while a node is being created or queued
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"


@dataclass(frozen=True)
class TpuNode:
    """A TPU VM (or the queued resource holding it) as gcloud names it."""

    name: str
    accelerator_type: str  # e.g. v5p-8
    zone: str = ""  # empty: gcloud's configured compute/zone
    project: str = ""  # empty: gcloud's configured project
    runtime_version: str = ""  # empty: RUNTIME_VERSIONS by generation
    queued: bool = False  # create through a queued resource
    spot: bool = False  # spot capacity (cheaper, may be preempted)

    @property
    def version(self) -> str:
        return self.runtime_version or default_runtime_version(self.accelerator_type)


def default_runtime_version(accelerator_type: str) -> str:
    generation = accelerator_type.rsplit("-", 1)[0]
    if generation not in RUNTIME_VERSIONS:
        raise ValueError(
            f"no default TPU runtime version for {accelerator_type!r} (known generations: "
            f"{', '.join(RUNTIME_VERSIONS)}); pass --tpu-runtime-version "
            "(see https://cloud.google.com/tpu/docs/runtimes)"
        )
    return RUNTIME_VERSIONS[generation]


def _where(node: TpuNode) -> list[str]:
    return [*(["--zone", node.zone] if node.zone else []), *(["--project", node.project] if node.project else [])]


def _gcloud(*args: str) -> str:
    return shlex.join(["gcloud", "compute", "tpus", *args])


def create_command(node: TpuNode) -> str:
    spot = ["--spot"] if node.spot else []
    if node.queued:
        return _gcloud(
            "queued-resources", "create", node.name, "--node-id", node.name,
            "--accelerator-type", node.accelerator_type, "--runtime-version", node.version, *_where(node), *spot,
        )  # fmt: skip
    return _gcloud(
        "tpu-vm", "create", node.name, "--accelerator-type", node.accelerator_type,
        "--version", node.version, *_where(node), *spot,
    )  # fmt: skip


def state_command(node: TpuNode) -> str:
    """Prints the node's state (empty output and an error exit if it does not exist)."""
    if node.queued:
        return _gcloud("queued-resources", "describe", node.name, *_where(node), "--format=value(state.state)")
    return _gcloud("tpu-vm", "describe", node.name, *_where(node), "--format=value(state)")


def delete_command(node: TpuNode) -> str:
    if node.queued:  # --force also deletes the TPU VM the queued resource holds
        return _gcloud("queued-resources", "delete", node.name, *_where(node), "--force", "--quiet")
    return _gcloud("tpu-vm", "delete", node.name, *_where(node), "--quiet")


def scp_command(node: TpuNode, local: str, remote: str) -> str:
    return _gcloud("tpu-vm", "scp", local, f"{node.name}:{remote}", *_where(node), "--worker=all")


def ssh_command(node: TpuNode, command: str) -> str:
    return _gcloud(
        "tpu-vm", "ssh", node.name, *_where(node), "--worker=all",
        "--ssh-flag=-o ServerAliveInterval=60", "--command", command,
    )  # fmt: skip


def pod_env_exports() -> str:
    """Shell lines that set MARIN_POD_* on a TPU worker from the TPU metadata server."""
    get = f"curl -sf -H 'Metadata-Flavor: Google' {METADATA_URL}"
    return " && ".join(
        [
            f"export {ENV_COORDINATOR}=auto",
            f"export {ENV_PROCESS_ID}=$({get}/agent-worker-number)",
            f"export {ENV_NUM_PROCESSES}=$({get}/worker-network-endpoints | tr , '\\n' | grep -c .)",
        ]
    )


def worker_command(job_command: str, workdir: str, setup: str = "", archive: str = "", before: str = "") -> str:
    """What every worker runs: unpack the workflow (if copied), cd, set up, learn its
    place in the slice, then the job command. `before` runs after setup (e.g. fetching
    records the job reads)."""
    parts = []
    if archive:
        parts.append(f"mkdir -p {shlex.quote(workdir)} && tar -xzf {shlex.quote(archive)} -C {shlex.quote(workdir)}")
    parts.append(f"cd {shlex.quote(workdir)}")
    if setup:
        parts.append(f"( {setup} )")
    parts.append(pod_env_exports())
    if before:
        parts.append(before)
    parts.append(job_command)
    return " && ".join(parts)


def driver_script(
    node: TpuNode, worker_cmd: str, *, archive: str = "", remote_archive: str = "", delete: bool = True,
    title: str = "",
) -> str:  # fmt: skip
    """The bash script that creates (or reuses) the node, waits for it, copies the
    workflow, runs `worker_cmd` on all workers and deletes the node on exit."""
    ready = "|".join(READY_STATES)
    failed = "|".join(FAILED_STATES)
    kind = "queued resource" if node.queued else "TPU VM"
    lines = [
        "#!/usr/bin/env bash",
        f"# marin-rules TPU driver{': ' + title if title else ''}",
        f"# {kind} {node.name} ({node.accelerator_type}, runtime {node.version})",
        "set -uo pipefail",
    ]
    if delete:
        lines += [
            f"cleanup() {{ echo 'marin-rules: deleting {kind} {node.name}' >&2; {delete_command(node)} || "
            f"echo 'marin-rules: could not delete {node.name}; delete it yourself: {delete_command(node)}' >&2; }}",
            "trap cleanup EXIT",
        ]
    lines += [
        "trap 'exit 143' TERM INT",
        f"if state=$({state_command(node)} 2>/dev/null) && [ -n \"$state\" ]; then",
        f"  echo \"marin-rules: reusing {kind} {node.name} (state $state)\" >&2",
        "else",
        f"  echo 'marin-rules: creating {kind} {node.name}' >&2",
        f"  {create_command(node)} || exit 1",
        "fi",
        "while true; do",
        f"  state=$({state_command(node)})",
        "  case \"$state\" in",
        f"    {ready}) break ;;",
        f"    {failed}) echo \"marin-rules: {node.name} is $state\" >&2; exit 1 ;;",
        "  esac",
        f"  echo \"marin-rules: waiting for {node.name} (state ${{state:-unknown}})\" >&2",
        f"  sleep {POLL_SECONDS}",
        "done",
    ]
    if archive:
        lines.append(f"{scp_command(node, archive, remote_archive)} || exit 1")
    lines.append(f"{ssh_command(node, worker_cmd)}")
    return "\n".join(lines) + "\n"


def start_driver(script: str, job_dir: Path, env: Mapping[str, str] | None = None, cwd: str | None = None) -> ProcessGroup:
    """Write the driver script to `job_dir/driver.sh` and run it; its log is `driver.log`."""
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / "driver.sh"
    path.write_text(script)
    path.chmod(0o755)
    return ProcessGroup.start(
        [f"exec bash {shlex.quote(str(path.resolve()))}"], [dict(env if env is not None else os.environ)],
        [job_dir / "driver.log"], cwd=cwd,
    )  # fmt: skip


def workflow_archive(workflow_dir: str, dest: Path) -> Path:
    """A tarball of the workflow's sources (git-tracked and untracked-but-not-ignored
    files, so uncommitted edits travel; data, venvs and `.snakemake/` do not)."""
    try:
        listed = subprocess.run(
            ["git", "-C", workflow_dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(
            f"cannot list the workflow's files with git in {workflow_dir} ({e}); copying the workflow to TPU "
            "workers needs a git checkout. Or put it there yourself and pass --tpu-expect-workflow"
        ) from None
    names = sorted(n for n in listed.decode().split("\0") if n and os.path.isfile(os.path.join(workflow_dir, n)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for name in names:
            tar.add(os.path.join(workflow_dir, name), arcname=name, recursive=False)
    return dest


def archive_name(archive: Path) -> str:
    """The archive's file name on the workers: content-addressed, so jobs never mix versions."""
    digest = hashlib.sha1(archive.read_bytes()).hexdigest()[:12]
    return f"marin-workflow-{digest}.tar.gz"
