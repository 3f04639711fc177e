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
  5. copy worker 0's archive of the job's files back and unpack it here (the workers
     share no disk with this host): outputs, benchmark and logs after a success, the
     logs alone after a failure (so `--show-failed-logs` shows them);
  6. delete the node when the driver exits, success, failure or cancel (unless kept).
     The delete runs in its own process group: a cancelled job's driver is killed
     after a grace of seconds, and a TPU delete takes minutes; it goes on and says
     how it ended in driver.log.

The variables of Snakemake's `--envvars` are exported on the workers from the
driver's own environment, quoted by bash (`printf %q`) when the driver runs: their
values never appear in driver.sh (written 0700 all the same). Every value put into
the script is validated (`TpuNode`) or quoted, so no setting, wildcard value or
experiment field becomes shell code.

Everything here builds strings; `start_driver` runs the script as a `ProcessGroup`
of one. References: https://cloud.google.com/tpu/docs/managing-tpus-tpu-vm,
https://cloud.google.com/tpu/docs/queued-resources,
https://cloud.google.com/tpu/docs/runtimes.
"""

from __future__ import annotations

import os
import re
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
# What gcloud accepts (and all this script lets through): names, types, zones, projects, images.
NAME_PATTERN = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
TYPE_PATTERN = r"[a-z][a-z0-9]*-[0-9]+"
ZONE_PATTERN = r"[a-z]+-[a-z]+[0-9]+-[a-z]"
PROJECT_PATTERN = r"[a-z]([-a-z0-9.:]*[a-z0-9])?"
VERSION_PATTERN = r"[A-Za-z0-9][-A-Za-z0-9._]*"
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

    def __post_init__(self):
        for field, value, pattern, example in (
            ("node name (--tpu-node)", self.name, NAME_PATTERN, "snakemake-train-1a2b3c4d"),
            ("TPU type (resource tpu / --tpu-type)", self.accelerator_type, TYPE_PATTERN, "v5p-8"),
            ("zone (resource tpu_zone / --tpu-zone)", self.zone, ZONE_PATTERN, "us-east5-a"),
            ("project (--tpu-project)", self.project, PROJECT_PATTERN, "my-project"),
            ("runtime version (--tpu-runtime-version)", self.runtime_version, VERSION_PATTERN, "v2-alpha-tpuv5"),
        ):
            if value and not re.fullmatch(pattern, value):
                # a path: Snakemake makes an empty profile setting the profile's folder
                hint = ("; an empty setting in a profile's config.yaml becomes the profile's folder: leave the "
                        "key out instead") if "/" in value else ""  # fmt: skip
                raise ValueError(f"tpu executor: {field} {value!r} is not valid (like {example!r}){hint}")

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


def ssh_command(node: TpuNode, command: str, prefix_variable: str = "") -> str:
    """Run `command` on every worker; with `prefix_variable`, the driver's shell
    variable of that name is put before it (the exports built at run time)."""
    head = _gcloud("tpu-vm", "ssh", node.name, *_where(node), "--worker=all", "--ssh-flag=-o ServerAliveInterval=60")
    prefix = f'"${{{prefix_variable}}}"' if prefix_variable else ""
    return f"{head} --command {prefix}{shlex.quote(command)}"


def _exports(names: Sequence[str]) -> list[str]:
    """Driver lines that set EXPORTS to `export NAME=<value, quoted by bash> && ...`
    for each variable named, from the driver's environment."""
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"tpu executor: {name!r} is not an environment variable name (--envvars)")
    return [
        "EXPORTS=",
        f"for name in {' '.join(names)}; do",
        '  printf -v value %q "${!name-}"',
        '  EXPORTS+="export $name=$value && "',
        "done",
    ]


def pod_env_exports() -> str:
    """Shell lines that tell a TPU worker its place in the slice (from the metadata
    server). A lookup that fails, or a worker number that is not a number, stops the
    worker at once with a line naming the lookup (status 1): a job run without its place
    would have no process 0 and fail later for a reason that points elsewhere."""
    get = f"curl -sSf -H 'Metadata-Flavor: Google' {METADATA_URL}"

    def failed(attribute: str) -> str:
        line = (f"tpu executor: cannot read {attribute} from the TPU metadata server ({METADATA_URL}/{attribute}); "
                "a pod job runs on a TPU VM, which answers it")  # fmt: skip
        return f"{{ echo {shlex.quote(line)} >&2; exit 1; }}"

    return " && ".join(
        [
            f"export {ENV_COORDINATOR}=auto",
            f"{{ {ENV_PROCESS_ID}=$({get}/agent-worker-number) && case \"${ENV_PROCESS_ID}\" in ''|*[!0-9]*) false ;; esac "
            f"|| {failed('agent-worker-number')}; }}",
            f"{{ endpoints=$({get}/worker-network-endpoints) && [ -n \"$endpoints\" ] || {failed('worker-network-endpoints')}; }}",
            f"export {ENV_PROCESS_ID} {ENV_NUM_PROCESSES}=$(printf '%s' \"$endpoints\" | tr , '\\n' | grep -c .)",
        ]
    )


def worker_command(
    job_command: str, workdir: str, setup: str = "", archives: Sequence[str] = (), outputs: Sequence[str] = (),
    outputs_archive: str = "", logs: Sequence[str] = (), exports: Mapping[str, str] | None = None,
) -> str:  # fmt: skip
    """What every worker runs: unpack the copied archives into the workdir, cd, set up,
    learn its place in the slice, export `exports` (quoted), run the job command; then
    worker 0 packs the job's `outputs` and `logs` (paths relative to the workdir; after
    a failure the logs alone) into `~/outputs_archive` for the driver. Exits with the
    job's status; a job that ended well without one of its `outputs` fails (status 1)."""
    parts = []
    if archives:
        parts.append(f"mkdir -p {shlex.quote(workdir)}")
        parts += [f"tar -xzf {shlex.quote(a)} -C {shlex.quote(workdir)}" for a in archives]
    parts.append(f"cd {shlex.quote(workdir)}")
    if setup:
        parts.append(f"( {setup} )")
    parts.append(pod_env_exports())
    parts += [f"export {name}={shlex.quote(value)}" for name, value in (exports or {}).items()]
    if not (outputs or logs):
        return " && ".join([*parts, job_command])

    def pack(files: Sequence[str]) -> str:
        return f'tar -czf "$HOME"/{shlex.quote(outputs_archive)} --ignore-failed-read -- {shlex.join(files)}'

    on_failure = pack(logs) if logs else ":"
    # a success without a declared output (a name the job command could not carry) fails the job here:
    # tar --ignore-failed-read (for logs a rule may not write) would pack the rest and report success
    present = "".join(
        f"[ -e {shlex.quote(f)} ] || {{ echo {shlex.quote(f'tpu executor: the job ended without its output {f}')} >&2; "
        "code=1; }; " for f in outputs
    )  # fmt: skip
    check = f'if [ "$code" = 0 ]; then {present}fi; ' if outputs else ""  # (no outputs, logs only: nothing to check)
    finish = (
        f'if [ "${ENV_PROCESS_ID}" = 0 ]; then {check}'
        f'if [ "$code" = 0 ]; then {pack([*outputs, *logs])} || code=$?; else {on_failure}; fi; fi'
    )
    return " && ".join(parts) + f" && {{ ( {job_command} ); code=$?; {finish}; exit $code; }}"


def _safe_comment(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)


def driver_script(
    node: TpuNode, worker_cmd: str, *, uploads: Sequence[tuple[str, str]] = (),
    download: tuple[str, str, str] | None = None, delete: bool = True, title: str = "",
    env_names: Sequence[str] = (), logs_back: bool = True,
) -> str:  # fmt: skip
    """The bash script that creates (or reuses) the node, waits for it, copies each
    `(local file, remote name)` of `uploads` to every worker, runs `worker_cmd` on all
    workers (after exporting the variables `env_names` from the driver's environment),
    fetches `download = (remote name, local file, directory)` from worker 0 and unpacks
    it into that directory (required after a success; after a failure tried when the job
    has log files, `logs_back`, which worker 0 then packs alone), and deletes the node on
    exit in a process group of its own."""
    ready = "|".join(READY_STATES)
    failed = "|".join(FAILED_STATES)
    kind = "queued resource" if node.queued else "TPU VM"
    lines = [
        "#!/usr/bin/env bash",
        f"# snakemake tpu executor driver{': ' + _safe_comment(title) if title else ''}",
        f"# {kind} {node.name} ({node.accelerator_type}, runtime {node.version})",
        "set -uo pipefail",
    ]
    if delete:
        deleting = shlex.quote(f"tpu executor: deleting {kind} {node.name}")
        deleted = shlex.quote(f"tpu executor: deleted {kind} {node.name}")
        failed_delete = shlex.quote(f"tpu executor: could not delete {node.name}; delete it yourself: {delete_command(node)}")
        lines += [
            # set -m: the delete gets a process group of its own, so the SIGKILL that ends
            # a cancelled driver after its grace does not stop it (it logs here either way)
            f"cleanup() {{ echo {deleting} >&2; set -m; "
            f"( if {delete_command(node)}; then echo {deleted} >&2; else echo {failed_delete} >&2; fi ) & wait $!; }}",
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
    if env_names:
        lines += _exports(env_names)
    lines.append(f"{ssh_command(node, worker_cmd, 'EXPORTS' if env_names else '')}; code=$?")
    if download is not None:
        remote, local, directory = download
        # -m: outputs get this host's time of arrival, so they are newer than their inputs
        fetch = f"{scp_back_command(node, remote, local)} && {shlex.join(['tar', '-xmzf', local, '-C', directory])}"
        if logs_back:  # a failed job may have packed no logs (it failed before): one line, not scp's error
            gone = shlex.quote("tpu executor: the job's log files did not come back from worker 0 (it failed before "
                               "packing them, or the copy failed)")  # fmt: skip
            after_failure = f"{{ {fetch}; }} 2>/dev/null || echo {gone} >&2"
        else:
            after_failure = ":"  # no logs: worker 0 packed nothing after a failure
        lines.append(f'if [ "$code" = 0 ]; then {{ {fetch}; }} || exit 1; else {after_failure}; fi')
    lines.append("exit $code")
    return "\n".join(lines) + "\n"


def start_driver(script: str, job_dir: Path, env: Mapping[str, str] | None = None, cwd: str | None = None) -> ProcessGroup:
    """Write the driver script to `job_dir/driver.sh` and run it; its log is `driver.log`."""
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / "driver.sh"
    path.touch(mode=0o700)
    path.chmod(0o700)
    path.write_text(script)
    return ProcessGroup.start(
        [f"exec bash {shlex.quote(str(path.resolve()))}"], [dict(env if env is not None else os.environ)],
        [job_dir / "driver.log"], cwd=cwd,
    )  # fmt: skip
