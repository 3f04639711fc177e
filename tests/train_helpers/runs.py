"""Running the train step in subprocesses, as the tests' kill, resume and
multi-host scenarios need: one spec file per process, bounded timeouts, exit codes
checked, the result read from the last stdout line.

Every run gets an explicit environment: `XLA_FLAGS` fixes the number of CPU
devices (whatever the test process was started with), and a shared JAX
compilation cache lets later processes reuse programs the first one compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HELPER = Path(__file__).with_name("run_train.py")

# A model small enough to compile and train in seconds on 2 cores, big enough to learn.
TINY_MODEL = {
    "d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
    "n_experts": 4, "top_k": 2, "d_expert": 32, "max_seq_len": 32,
}  # fmt: skip


PEAK_FLOPS = 1e11  # injected MFU ceiling (FLOP/s of the whole run): no matmul is measured


def tiny_config(**overrides) -> dict:
    config = {
        "model": dict(TINY_MODEL),
        "optimizer": {"name": "adamw", "learning_rate": 0.01, "warmup_steps": 2},
        "num_train_steps": 20,
        "batch_size": 16,
        "grad_accum_steps": 2,  # 2 micro-batches of 8 rows: one row per device on 8 devices
        "seq_len": 32,
        "checkpoint_every": 10,
        "log_every": 5,
        "eval_every": 10,
        "eval_batches": 2,
    }
    config.update(overrides)
    return config


def write_spec(path: Path, *, output: str, config: dict, data: str, runtime: dict | None = None,
               compile_cache: str | None = None, save_looks_s: float = 0, stop_after_save: int = 0) -> Path:  # fmt: skip
    spec = {
        "output": output,
        "config": config,
        "deps": {"data": data},
        "runtime": {"peak_flops": PEAK_FLOPS, **(runtime or {})},
        "compile_cache": compile_cache,
        "save_looks_s": save_looks_s,  # run_train.py: each checkpoint save looks that long to the clocks
        "stop_after_save": stop_after_save,  # run_train.py: SIGTERM right after that step's save began
    }
    path.write_text(json.dumps(spec))
    return path


def train_env(devices: int, extra: dict | None = None) -> dict:
    env = {**os.environ, **(extra or {})}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HELPER.parent.parent.parent), env.get("PYTHONPATH")) if p)
    return env


def start(spec: Path, env: dict, log: Path) -> subprocess.Popen:
    """Start a training process; stdout to `log`.out, stderr to `log`.err."""
    return subprocess.Popen(
        [sys.executable, str(HELPER), str(spec)],
        env=env,
        stdout=open(f"{log}.out", "w"),
        stderr=open(f"{log}.err", "w"),
    )


def finish(proc: subprocess.Popen, log: Path, timeout: float) -> dict:
    """Wait for a training process; its result, or an AssertionError with its stderr."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        raise AssertionError(f"training did not finish in {timeout} s\n{tail(log)}") from None
    if proc.returncode != 0:
        raise AssertionError(f"training exited with status {proc.returncode}\n{tail(log)}")
    lines = Path(f"{log}.out").read_text().strip().splitlines()
    return json.loads(lines[-1])


def run(spec: Path, env: dict, log: Path, timeout: float = 180) -> dict:
    return finish(start(spec, env, log), log, timeout)


def tail(log: Path, chars: int = 6000) -> str:
    err = Path(f"{log}.err")
    return err.read_text()[-chars:] if err.exists() else ""


def wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    """Poll `predicate` (every 20 ms, at most `timeout` s) while `proc` runs."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=30)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)  # short polling interval, bounded by the deadline
