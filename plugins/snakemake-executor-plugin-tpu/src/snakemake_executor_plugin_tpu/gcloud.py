"""The `gcloud` backend: one job's command on every worker of a Cloud TPU slice.

Model: a job becomes one local *driver* (a bash script written next to its log)
that uses the `gcloud` CLI only:

  1. reuse the TPU VM (or queued resource) if one of that name exists, else create it
     (`gcloud compute tpus tpu-vm create`, or `queued-resources create` which waits in
     Google's queue);
  2. poll its state until READY / ACTIVE (failing on FAILED, SUSPENDED, PREEMPTED...);
  3. copy the archives the job needs (the workflow's sources, the job's input files;
     see `transfer.py`) to every worker with `tpu-vm scp --worker=all`;
  4. run the worker command on all workers at once with `tpu-vm ssh --worker=all
     --command ...`; each worker learns its place from the TPU metadata server
     (`agent-worker-number`, `worker-network-endpoints`) and gets
     `SNAKEMAKE_TPU_COORDINATOR=auto`, so `jax.distributed.initialize()` finds the slice;
  5. on success, copy worker 0's archive of the job's output files back and unpack
     it here (the workers share no disk with this host);
  6. delete the node when the driver exits, success or not (unless kept).

Everything here builds strings; `start_driver` runs the script as a `ProcessGroup`
of one. References: https://cloud.google.com/tpu/docs/managing-tpus-tpu-vm,
https://cloud.google.com/tpu/docs/queued-resources,
https://cloud.google.com/tpu/docs/runtimes.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from snakemake_executor_plugin_tpu.local_pod import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID, ProcessGroup

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
    """Copy a local file to `remote` (relative to the login home) on every worker."""
    return _gcloud("tpu-vm", "scp", local, f"{node.name}:{remote}", *_where(node), "--worker=all")


def scp_back_command(node: TpuNode, remote: str, local: str) -> str:
    """Copy `remote` (relative to the login home) from worker 0 to a local file."""
    return _gcloud("tpu-vm", "scp", f"{node.name}:{remote}", local, *_where(node), "--worker=0")


def ssh_command(node: TpuNode, command: str) -> str:
    return _gcloud(
        "tpu-vm", "ssh", node.name, *_where(node), "--worker=all",
        "--ssh-flag=-o ServerAliveInterval=60", "--command", command,
    )  # fmt: skip


def pod_env_exports() -> str:
    """Shell lines that tell a TPU worker its place in the slice (from the metadata server)."""
    get = f"curl -sf -H 'Metadata-Flavor: Google' {METADATA_URL}"
    return " && ".join(
        [
            f"export {ENV_COORDINATOR}=auto",
            f"export {ENV_PROCESS_ID}=$({get}/agent-worker-number)",
            f"export {ENV_NUM_PROCESSES}=$({get}/worker-network-endpoints | tr , '\\n' | grep -c .)",
        ]
    )


def worker_command(
    job_command: str, workdir: str, setup: str = "", archives: Sequence[str] = (), outputs: Sequence[str] = (),
    outputs_archive: str = "",
) -> str:  # fmt: skip
    """What every worker runs: unpack the copied archives into the workdir, cd, set up,
    learn its place in the slice, run the job command; then worker 0 packs the job's
    `outputs` (paths relative to the workdir) into `~/outputs_archive` for the driver."""
    parts = []
    if archives:
        parts.append(f"mkdir -p {shlex.quote(workdir)}")
        parts += [f"tar -xzf {shlex.quote(a)} -C {shlex.quote(workdir)}" for a in archives]
    parts.append(f"cd {shlex.quote(workdir)}")
    if setup:
        parts.append(f"( {setup} )")
    parts.append(pod_env_exports())
    parts.append(job_command)
    if outputs:
        pack = f'tar -czf "$HOME"/{shlex.quote(outputs_archive)} --ignore-failed-read -- {shlex.join(outputs)}'
        parts.append(f'{{ [ "${ENV_PROCESS_ID}" != 0 ] || {pack}; }}')
    return " && ".join(parts)


def driver_script(
    node: TpuNode, worker_cmd: str, *, uploads: Sequence[tuple[str, str]] = (),
    download: tuple[str, str, str] | None = None, delete: bool = True, title: str = "",
) -> str:  # fmt: skip
    """The bash script that creates (or reuses) the node, waits for it, copies each
    `(local file, remote name)` of `uploads` to every worker, runs `worker_cmd` on all
    workers, on success fetches `download = (remote name, local file, directory)` from
    worker 0 and unpacks it into that directory, and deletes the node on exit."""
    ready = "|".join(READY_STATES)
    failed = "|".join(FAILED_STATES)
    kind = "queued resource" if node.queued else "TPU VM"
    lines = [
        "#!/usr/bin/env bash",
        f"# snakemake tpu executor driver{': ' + title if title else ''}",
        f"# {kind} {node.name} ({node.accelerator_type}, runtime {node.version})",
        "set -uo pipefail",
    ]
    if delete:
        lines += [
            f"cleanup() {{ echo 'tpu executor: deleting {kind} {node.name}' >&2; {delete_command(node)} || "
            f"echo 'tpu executor: could not delete {node.name}; delete it yourself: {delete_command(node)}' >&2; }}",
            "trap cleanup EXIT",
        ]
    lines += [
        "trap 'exit 143' TERM INT",
        f"if state=$({state_command(node)} 2>/dev/null) && [ -n \"$state\" ]; then",
        f"  echo \"tpu executor: reusing {kind} {node.name} (state $state)\" >&2",
        "else",
        f"  echo 'tpu executor: creating {kind} {node.name}' >&2",
        f"  {create_command(node)} || exit 1",
        "fi",
        "while true; do",
        f"  state=$({state_command(node)})",
        "  case \"$state\" in",
        f"    {ready}) break ;;",
        f"    {failed}) echo \"tpu executor: {node.name} is $state\" >&2; exit 1 ;;",
        "  esac",
        f"  echo \"tpu executor: waiting for {node.name} (state ${{state:-unknown}})\" >&2",
        f"  sleep {POLL_SECONDS}",
        "done",
    ]
    lines += [f"{scp_command(node, local, remote)} || exit 1" for local, remote in uploads]
    lines.append(f"{ssh_command(node, worker_cmd)} || exit $?")
    if download is not None:
        remote, local, directory = download
        lines.append(f"{scp_back_command(node, remote, local)} || exit 1")
        # -m: outputs get this host's time of arrival, so they are newer than their inputs
        lines.append(f"{shlex.join(['tar', '-xmzf', local, '-C', directory])} || exit 1")
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
