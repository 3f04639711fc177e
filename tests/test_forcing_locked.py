"""A forced run changes nothing on the prefix before it holds Snakemake's lock.

Snakemake runs the input functions (our planning) before it locks the working
directory; a second run in the same folder whose jobs overlap a running one's then
stops with its LockException. What planning decides for forced artifacts (a sharded
one's old build moved to `.history/`, a marker saved for the others) is done only
once the run holds the lock (`Session.start`), so the refused run leaves the running
one's upstreams as they were. Real `snakemake` runs: run A blocks in a step that
reads its upstreams until the test lets it go (a polled file, bounded).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import yaml

from conftest import REPO, SNAKEMAKE

STEPS = textwrap.dedent(
    '''
    import os
    import time
    from marin_rules.artifacts import storage

    def make(ctx):
        storage.write_text_atomic(storage.join(ctx.output, "data.txt"), "x")
        return {}

    def wait(ctx):
        """A long step of run A: says it started, then runs until the file `go` appears."""
        gate = ctx.config["gate"]
        open(os.path.join(gate, "started"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(gate, "go")):
            if time.monotonic() > deadline:
                raise RuntimeError("never told to go")
            time.sleep(0.02)
        return {}
    '''
)


def _workspace(root: Path) -> tuple[list[str], dict]:
    """download -> dedup (2 shards) and a plain artifact, both read by `feat/wait@v1`;
    returns the snakemake arguments and environment."""
    src = root / "src"
    src.mkdir()
    for i in range(4):
        (src / f"w{i}.txt").write_text("\n".join(f"line {k} of work {i} with a few words" for k in range(40)))
    (root / "locksteps.py").write_text(STEPS)
    artifacts = {
        "raw/s@v1": {"step": "download", "config": {"source": str(src)}},
        "dedup/s@v1": {"step": "dedup", "deps": {"corpus": "raw/s@v1"}, "config": {"threshold": 0.8},
                       "runtime": {"shards": 2}},  # fmt: skip
        "src/x@v1": {"step": "locksteps:make"},
        "feat/wait@v1": {"step": "locksteps:wait", "deps": {"data": "dedup/s@v1", "other": "src/x@v1"},
                         "config": {"gate": str(root)}},  # fmt: skip
    }
    (root / "exp.yaml").write_text(yaml.safe_dump({"artifacts": artifacts}))
    args = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "--config", f"prefix={root / 'art'}"]
    return args, {**os.environ, "PYTHONPATH": str(root)}  # (--config last: a target can follow the prefix)


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (but the lease's lock) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".lease.json")}  # fmt: skip


def _wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.01)  # polling a condition with a bounded deadline, not a fixed wait


def test_a_forced_run_refused_by_snakemakes_lock_moves_and_marks_nothing(tmp_path):
    args, env = _workspace(tmp_path)
    run = lambda *extra: subprocess.run([*args, *extra], cwd=tmp_path, env=env, capture_output=True, text=True,
                                        timeout=300)  # fmt: skip
    built = run("target=dedup/s@v1,src/x@v1")
    assert built.returncode == 0, built.stderr[-4000:]
    art = tmp_path / "art"
    before = {name: _tree(art / name) for name in ("dedup/s/v1", "src/x/v1")}
    assert "shards/00001-of-00002/shard.json" in before["dedup/s/v1"]

    first = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: (tmp_path / "started").exists() or first.poll() is not None, "run A's step to start")
        assert first.poll() is None, first.communicate()[0][-4000:]
        for forced in (["-R", "dedup"], ["--forcerun", str(art / "src/x/v1/.artifact.json")]):
            refused = run("--cores", "1", *forced)
            out = refused.stdout + refused.stderr
            assert refused.returncode != 0 and "LockException" in out, out[-4000:]
            assert "forced:" not in out  # nothing was moved
            assert {name: _tree(art / name) for name in before} == before, forced  # nor marked
        (tmp_path / "go").touch()
        output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    assert first.returncode == 0, output[-4000:]
    log = (tmp_path / ".snakemake/marin-logs/feat/wait/v1/job.log").read_text()
    assert "another run rebuilt it" not in log
    assert (art / "feat/wait/v1/.artifact.json").exists()
    assert not any((art / name / ".history").exists() for name in before)
