"""The `local-pod` backend: one job as N processes on this machine, joined like a TPU slice.

Model: a TPU pod slice runs the same command once per host and the hosts join one
`jax.distributed` run. Here the "hosts" are N local processes of the same shell
command, each told its place by three variables (the plugin's whole contract with a
job): `SNAKEMAKE_TPU_COORDINATOR` (`host:port` of process 0, here `127.0.0.1:<free
port>`; `auto` on a TPU VM, where `jax.distributed.initialize()` reads the slice
metadata), `SNAKEMAKE_TPU_NUM_PROCESSES` and `SNAKEMAKE_TPU_PROCESS_ID`. Each
process is given D fake CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=D`, `JAX_PLATFORMS=cpu`), so
multi-host code (gloo collectives, per-process data slices, orbax) runs unchanged.

Every job the executor starts (on this host, a local pod or TPU workers) is also told
where it came from (`submission_env`), as a batch system tells its jobs
(`SLURM_JOB_ID`, `SLURM_SUBMIT_HOST`): `SNAKEMAKE_TPU_JOBID`, its job id in the
submitting Snakemake run (the job command's own `{jobid}` is its id in its own
`snakemake --mode remote`, always 0; not set for a group job, whose members have
ids of their own), and `SNAKEMAKE_TPU_SUBMITTER`, the submitting process as
`<host> <pid> <pid namespace>` (`submitter`), so that a job that outlives it on a
TPU worker can say whose job it is.

A `ProcessGroup` is the running job: it succeeds iff every process exits 0; when
one process fails the others get SIGTERM, then SIGKILL after `grace` seconds (a JAX
peer would otherwise wait for the dead one until its own timeout). Each process
writes its own log file. The gcloud backend reuses `ProcessGroup` for its one
driver process. A process's exit status is its `snakemake --mode remote`'s, 1 for any
failed job; the job command's own status is read from the log, where Snakemake prints
the command's `CalledProcessError` (`command_status`).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

ENV_COORDINATOR = "SNAKEMAKE_TPU_COORDINATOR"
ENV_NUM_PROCESSES = "SNAKEMAKE_TPU_NUM_PROCESSES"
ENV_PROCESS_ID = "SNAKEMAKE_TPU_PROCESS_ID"
ENV_JOBID = "SNAKEMAKE_TPU_JOBID"
ENV_SUBMITTER = "SNAKEMAKE_TPU_SUBMITTER"
GRACE_SECONDS = 5.0  # from the first failure (or a cancel) to SIGKILL of the rest
# What Snakemake prints when a job's shell command fails: its rule exception, then
# Python's own CalledProcessError text (the command may span lines).
COMMAND_FAILED = re.compile(
    r"^CalledProcessError in file .*:\nCommand '(?:[^\n]*\n){0,200}?[^\n]*' "
    r"(?:returned non-zero exit status (\d+)|died with <Signals\.(SIG[A-Z0-9]+): \d+>)\.$",
    re.M,
)


@dataclass(frozen=True)
class LocalPodSpec:
    num_processes: int = 2  # the "hosts" of the fake slice
    devices_per_process: int = 4  # fake CPU devices each process sees

    def __post_init__(self):
        if self.num_processes < 1:
            raise ValueError(f"local pod: num_processes must be >= 1, got {self.num_processes}")
        if self.devices_per_process < 1:
            raise ValueError(f"local pod: devices_per_process must be >= 1, got {self.devices_per_process}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the coordinator's;
    the tests' GCS emulator uses it too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_env(coordinator: str, num_processes: int, process_id: int) -> dict[str, str]:
    """The variables that tell one process its place in the pod."""
    return {ENV_COORDINATOR: coordinator, ENV_NUM_PROCESSES: str(num_processes), ENV_PROCESS_ID: str(process_id)}


def submitter() -> str:
    """This process as `SNAKEMAKE_TPU_SUBMITTER` names it: `<host> <pid> <pid namespace>`
    (the namespace tells apart containers that share a host name; "" where there is none)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()} {os.getpid()} {namespace}".rstrip()


def submission_env(jobid: int | None) -> dict[str, str]:
    """The variables that tell a job where it came from (`jobid` None: a group job)."""
    return {ENV_SUBMITTER: submitter(), **({} if jobid is None else {ENV_JOBID: str(jobid)})}


def job_env(base: Mapping[str, str], jobid: int | None) -> dict[str, str]:
    """`base` with the job's `submission_env` (an inherited job id is dropped for a group)."""
    env = {k: v for k, v in base.items() if k != ENV_JOBID}
    env.update(submission_env(jobid))
    return env


def command_status(log_text: str) -> str | None:
    """How the job's shell command ended, from the output of its `snakemake --mode
    remote` (`COMMAND_FAILED`): "exited with N" or "was killed by SIGX"; None when the
    log names none (another failure, or another Snakemake's wording). The first report:
    a gcloud driver's log holds every worker's, and the first to fail is the cause (its
    peers fail after it). A `run:` block's `subprocess.run(check=True)` is reported in
    the same words, so it is read as the job's command too."""
    found = COMMAND_FAILED.search(log_text)
    if found is None:
        return None
    code, signame = found.groups()
    return f"exited with {code}" if code is not None else f"was killed by {signame}"


def exit_description(code: int) -> str:
    """A process's end from its Popen return code: "exited with N" or "was killed by SIGX"."""
    if code >= 0:
        return f"exited with {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def process_env(base: Mapping[str, str], spec: LocalPodSpec, port: int, process_id: int) -> dict[str, str]:
    """The environment of one local pod process: `base`, its place, its fake devices."""
    env = dict(base)
    kept = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*kept, f"--xla_force_host_platform_device_count={spec.devices_per_process}"])
    env["JAX_PLATFORMS"] = "cpu"
    env.update(pod_env(f"127.0.0.1:{port}", spec.num_processes, process_id))
    return env


class ProcessGroup:
    """Shell commands running side by side as one job (each in its own session)."""

    def __init__(self, procs: Sequence[subprocess.Popen], logs: Sequence[Path], grace: float = GRACE_SECONDS):
        self.procs = list(procs)
        self.logs = list(logs)
        self.grace = grace
        self.first_failure: tuple[int, int] | None = None  # (process index, exit code)
        self._kill_at: float | None = None

    @classmethod
    def start(
        cls, commands: Sequence[str], envs: Sequence[Mapping[str, str]], logs: Sequence[Path], cwd: str | None = None
    ) -> "ProcessGroup":
        procs = []
        for command, env, log in zip(commands, envs, logs, strict=True):
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "wb") as out:
                procs.append(
                    subprocess.Popen(
                        ["bash", "-c", command], cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True,
                    )
                )  # fmt: skip
        return cls(procs, logs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def poll(self) -> int | None:
        """None while running; else 0 if all exited 0, or the first failure's exit code."""
        codes = [p.poll() for p in self.procs]
        for i, code in enumerate(codes):
            if code not in (None, 0) and self.first_failure is None:
                self.first_failure = (i, code)
        if self.first_failure is not None and None in codes:
            if self._kill_at is None:
                self.signal_running(signal.SIGTERM)
                self._kill_at = time.monotonic() + self.grace
            elif time.monotonic() >= self._kill_at:
                self.signal_running(signal.SIGKILL)
        if None in codes:
            return None
        return 0 if self.first_failure is None else self.first_failure[1]

    def wait(self, timeout: float) -> int:
        """Block until the group ends (bounded: past `timeout` it is terminated)."""
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                self.terminate()
                raise TimeoutError(f"pod processes still running after {timeout:.0f} s; terminated them")
            for p in self.procs:
                if p.poll() is None:
                    try:
                        p.wait(timeout=0.2)
                    except subprocess.TimeoutExpired:
                        pass
                    break
        return code

    def terminate(self) -> None:
        """SIGTERM every process (and its children), SIGKILL what is left after `grace`."""
        self.signal_running(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.signal_running(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def _failing_log(self) -> str:
        """The failing process's log (or the first one's); "" when it cannot be read."""
        index = self.first_failure[0] if self.first_failure else 0
        try:
            return self.logs[index].read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30, width: int = 300) -> str:
        """The end of the failing process's log (or of the first one): its last lines,
        each cut to `width` characters (Snakemake's job command lines are long)."""
        tail = self._failing_log().splitlines()[-lines:]
        return "\n".join(line if len(line) <= width else line[:width] + " ..." for line in tail)

    def failure(self) -> str:
        """One phrase on how the failing process ended: `process 0 exited with 1`, and
        how the job's command in it ended where its log says (`command_status`):
        `process 0 exited with 1: the job's command exited with 7`."""
        index, code = self.first_failure if self.first_failure else (0, self.procs[0].returncode or 0)
        said = f"process {index} {exit_description(code)}"
        status = command_status(self._failing_log())
        return said if status is None else f"{said}: the job's command {status}"

    def signal_running(self, signum: int) -> None:
        """Send `signum` to the process group of every process still running (no wait)."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signum)  # the shell and what it started
                except ProcessLookupError:
                    pass


def start_local_pod(
    command: str, spec: LocalPodSpec, log_dir: Path, base_env: Mapping[str, str], cwd: str | None = None
) -> ProcessGroup:
    """Start `command` once per pod process; logs in `log_dir/process-<i>.log`."""
    port = free_port()
    envs = [process_env(base_env, spec, port, i) for i in range(spec.num_processes)]
    logs = [log_dir / f"process-{i}.log" for i in range(spec.num_processes)]
    return ProcessGroup.start([command] * spec.num_processes, envs, logs, cwd=cwd)
