"""Shared fixtures: throwaway prefixes, a local GCS emulator, Snakemake runs.

`gcs_prefix` is a fresh `gs://marin-test/<test>-<n>` URL backed by an in-memory
emulator on 127.0.0.1, with this process's environment pointed at it; `gcs_env`
is that environment for subprocesses. `snakemake_cmd` runs the project's Snakefile
as a user would (a real `snakemake` process) in a given working directory.

The whole run shares one JAX persistent compilation cache (`JAX_COMPILATION_CACHE_DIR`,
set here before anything imports JAX and inherited by the xdist workers and every
process a test starts: Snakemake's jobs, pod processes), so the tiny models the
tests train and score compile once per program, not once per process; the
controller deletes it at the end. A cached executable is the program XLA compiled,
so results stay bitwise what they were.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gcs_emulator import BUCKET, apply_env, emulator_env, start_emulator

REPO = Path(__file__).resolve().parent.parent
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the controller (or a plain run); workers inherit it
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="marin-tests-jax-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    _OWN_JAX_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]
else:
    _OWN_JAX_CACHE = None


def pytest_sessionfinish(session):
    if _OWN_JAX_CACHE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_OWN_JAX_CACHE, ignore_errors=True)
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
_counter = itertools.count()


@pytest.fixture(scope="session")
def gcs_env():
    proc, port = start_emulator()
    env = emulator_env(port)
    apply_env(env)
    yield env
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def gcs_prefix(gcs_env, request):
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"gs://{BUCKET}/{name}-{next(_counter)}"


def run_snakemake(
    *args: str, cwd: Path, env: dict | None = None, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `snakemake -s <repo>/Snakefile ARGS` in `cwd`; fail the test with its output on error."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


@pytest.fixture
def snakemake_cmd():
    return run_snakemake


@pytest.fixture(scope="module")
def user_step_package(tmp_path_factory):
    """`mypkg.steps` (with `make(ctx)`) on sys.path, as a user's package would be: the
    loader refuses a user step whose module it cannot find."""
    import importlib

    root = tmp_path_factory.mktemp("userpkg")
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "steps.py").write_text("def make(ctx):\n    return {}\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    yield root
    sys.path.remove(str(root))
    for name in ("mypkg.steps", "mypkg"):
        sys.modules.pop(name, None)
