"""Two real `snakemake` runs on one prefix, with two recipes for the same name@version:
the second run waits for the first's lease, then serves what the first built. It says
so as planning would have, had the record been there: the drift warning (the same
text, `drift.drift_notice`), or, when it pins its own recipe (`expect_fingerprint:`),
a one-line error (the job fails; the first run's record stays, and nothing downstream
of the served build runs)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from conftest import REPO, SNAKEMAKE
from marin_rules.artifacts.canonical import fingerprint
from marin_rules.artifacts.drift import drift_message

STEP = '''
import os, time
from marin_rules.artifacts import storage

def build(ctx):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"{ctx.config['n']}\\n")
    release = os.environ["RUNS_LOG"] + ".release"  # the test says when the other run is waiting
    for _ in range(1200):
        if os.path.exists(release):
            break
        time.sleep(0.1)
    storage.write_text_atomic(storage.join(ctx.output, "n.txt"), str(ctx.config["n"]))
    return {"n": ctx.config["n"]}

def consume(ctx):
    with open(os.environ["RUNS_LOG"] + ".consumed", "a") as f:
        f.write("consumed\\n")
    return {}
'''
STEP_NAME = "driftsteps:build"


def _experiment(n: int, pin: str | None = None, consumer: bool = True) -> str:
    pinned = f'\n    expect_fingerprint: "{pin}"' if pin else ""
    consumed = "  feat/c@v1:\n    step: driftsteps:consume\n    deps: {s: feat/s@v1}\n" if consumer else ""
    return f"artifacts:\n  feat/s@v1:\n    step: {STEP_NAME}\n    config: {{n: {n}}}{pinned}\n{consumed}"


def _start(folder: Path, prefix: str, env: dict, experiment: str) -> subprocess.Popen:
    folder.mkdir()
    (folder / "exp.yaml").write_text(experiment)
    return subprocess.Popen(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml",
         "--config", f"prefix={prefix}", "lease_poll_s=0.2"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _two_recipes(tmp_path: Path, second: str) -> tuple[int, str, int, str]:
    """Run A (n=10) builds feat/s@v1; run B (`second`) starts while A holds the lease."""
    (tmp_path / "driftsteps.py").write_text(STEP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "RUNS_LOG": str(tmp_path / "runs.log")}
    prefix = str(tmp_path / "art")
    first = _start(tmp_path / "alice", prefix, env, _experiment(10, consumer=False))
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "runs.log").exists():  # A's step has started: A holds the lease
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
            time.sleep(0.1)
        other = _start(tmp_path / "bob", prefix, env, second)
        bob_log = tmp_path / "bob/.snakemake/marin-logs/feat/s/v1/job.log"
        while not (bob_log.exists() and "being built by" in bob_log.read_text()):
            assert time.monotonic() < deadline, other.communicate()[0] if other.poll() is not None else "timeout"
            time.sleep(0.1)
    finally:
        (tmp_path / "runs.log.release").write_text("")
    out2, _ = other.communicate(timeout=180)
    out1, _ = first.communicate(timeout=180)
    return first.returncode, out1, other.returncode, out2


def _fingerprint(n: int) -> str:
    return fingerprint(STEP_NAME, {"n": n}, {})


def test_serving_a_build_of_another_recipe_prints_the_drift_warning(tmp_path):
    rc1, out1, rc2, out2 = _two_recipes(tmp_path, _experiment(12))
    assert rc1 == 0 and rc2 == 0, (out1[-3000:], out2[-3000:])
    assert (tmp_path / "runs.log").read_text().split() == ["10"]  # built once, from A's recipe
    warning = drift_message("feat/s@v1", _fingerprint(10), _fingerprint(12), ["n: 10 -> 12"])
    assert warning in out2, out2[-3000:]  # planning's wording, on the terminal of the run that waited
    assert out2.count("recipe drift") == 1
    assert "feat/s@v1: built meanwhile by another run" in out2
    assert (tmp_path / "runs.log.consumed").exists()  # served, as planning serves a drifted record


def test_a_pinned_artifact_served_a_build_of_another_recipe_fails_in_one_line(tmp_path):
    pin = _fingerprint(12)
    rc1, out1, rc2, out2 = _two_recipes(tmp_path, _experiment(12, pin))
    assert rc1 == 0 and rc2 != 0, (out1[-3000:], out2[-3000:])
    lines = [l for l in out2.splitlines() if "recipe drift" in l]  # on the terminal, and again from the job's log
    assert lines and set(lines) == {
        f"marin-rules: feat/s@v1: recipe drift on a pinned artifact: recorded fingerprint {_fingerprint(10)}, "
        f"pinned {pin} (n: 10 -> 12); restore the recipe that was built, or bump the version"
    }, out2[-3000:]
    assert "serving it" not in out2
    location = tmp_path / "art/feat/s/v1"
    assert json.loads((location / ".artifact.json").read_text())["fingerprint"] == _fingerprint(10)  # A's build stays
    assert not (location / ".failures").exists()  # nothing was attempted
    assert not (tmp_path / "runs.log.consumed").exists()  # nothing ran on the build B refused


def test_a_dev_version_served_from_another_run_is_not_drift_checked(capsys):
    """A dev version is rebuilt on every run and never drift-checked: serving another
    run's build of it tells no 'bump the version'; a fixed version's does."""
    from types import SimpleNamespace

    from marin_rules.job.main import check_served_recipe

    record = SimpleNamespace(fingerprint=_fingerprint(10), to_json=lambda: {
        "fingerprint": _fingerprint(10), "step": STEP_NAME, "config": {"n": 10}, "deps": {}})  # fmt: skip

    def artifact(is_dev: bool) -> SimpleNamespace:
        payload = {"step": STEP_NAME, "config": {"n": 12}, "deps": {}}
        return SimpleNamespace(key="feat/s@dev" if is_dev else "feat/s@v1", id=SimpleNamespace(is_dev=is_dev),
                               payload=lambda: payload, fingerprint=_fingerprint(12), expect_fingerprint=None)  # fmt: skip

    check_served_recipe(artifact(True), record)
    assert "recipe drift" not in capsys.readouterr().err
    check_served_recipe(artifact(False), record)
    assert "feat/s@v1: recipe drift" in capsys.readouterr().err
