"""What a stopped attempt left is resumed only under the same recipe (`marin_rules/job/attempt.py`).

A user step cannot know whether the files in its output folder were written under
today's config: the job compares the fingerprint the stopped attempt recorded in
`.attempt.json` with today's and moves leftovers of another recipe to
`.history/<time>-stale/` before the step runs, with or without upstreams. Leftovers
of the same recipe stay (training resumes from checkpoints that way).

The step `partsteps:parts` writes `part{i}.txt` for i < config `parts`, and, while the
file `stop-once` lies next to the experiment, fails after writing them (a stopped
attempt: files, no record); its result lists the part files it found on starting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_workflow import Workspace

PARTS = '''
import os

def parts(ctx):
    found = sorted(n for n in os.listdir(ctx.output) if n.startswith("part")) if os.path.isdir(ctx.output) else []
    for i in range(int(ctx.config["parts"])):
        with open(os.path.join(ctx.output, f"part{i}.txt"), "w") as f:
            f.write(str(i))
    if os.path.exists("stop-once"):  # this attempt stops after writing its files
        os.remove("stop-once")
        raise RuntimeError("stopped")
    return {"found": found}
'''

ALL = [f"part{i}.txt" for i in range(8)]


def _experiment(parts: int, with_deps: bool) -> dict:
    slow = {"step": "partsteps:parts", "config": {"parts": parts}}
    if not with_deps:
        return {"feat/slow@v1": slow}
    a = {"step": "usersteps:make", "config": {"text": "a"}}
    return {"feat/a@v1": a, "feat/slow@v1": {**slow, "deps": {"inp": "feat/a@v1"}}}


def _workspace(tmp_path, snakemake_cmd, monkeypatch) -> Workspace:
    ws = Workspace(tmp_path, snakemake_cmd)
    (tmp_path / "partsteps.py").write_text(PARTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return ws


def _stop_once(ws, parts: int, with_deps: bool) -> None:
    """A run of feat/slow@v1 with `parts` that stops after writing its files."""
    ws.write(_experiment(parts, with_deps))
    (ws.root / "stop-once").write_text("")
    assert ws.snakemake(check=False).returncode != 0
    assert not (ws.root / "stop-once").exists()


def _job_log(ws) -> str:
    return (ws.root / ".snakemake/marin-logs/feat/slow/v1/job.log").read_text()


@pytest.fixture(params=[True, False], ids=["with-deps", "without-deps"])
def stopped(request, tmp_path, snakemake_cmd, monkeypatch) -> tuple[Workspace, Path, bool]:
    """A workspace where an attempt of feat/slow@v1 with 8 parts stopped (with or
    without an upstream): its folder, and whether it has the upstream."""
    ws = _workspace(tmp_path, snakemake_cmd, monkeypatch)
    _stop_once(ws, 8, request.param)
    return ws, Path(ws.prefix) / "feat/slow/v1", request.param


def test_leftovers_of_a_stopped_attempt_with_another_recipe_are_set_aside_not_recorded(stopped):
    ws, folder, with_deps = stopped
    assert sorted(p.name for p in folder.glob("part*.txt")) == ALL and not (folder / ".artifact.json").exists()
    (failure,) = folder.glob(".failures/*.json")
    old = json.loads(failure.read_text())["fingerprint"]

    ws.write(_experiment(2, with_deps))  # the recipe changed; no record, so no drift check stands in the way
    console = ws.snakemake().stderr
    record = ws.record("feat/slow@v1")
    assert record["config"] == {"parts": 2} and record["fingerprint"] != old
    assert record["files"] == {"part0.txt": 1, "part1.txt": 1}  # nothing of the other recipe's attempt
    assert record["result"] == {"found": []}  # built in an empty folder
    assert sorted(p.name for p in folder.glob("part*.txt")) == ["part0.txt", "part1.txt"]
    (stale,) = (folder / ".history").glob("*-stale")
    assert sorted(p.name for p in stale.glob("part*.txt")) == ALL  # set aside, not lost
    line = (f"feat/slow@v1: what an earlier attempt left was made from another recipe (changed since that attempt: "
            f"fingerprint {old} then, {record['fingerprint']} now); moved to {stale}, building from scratch")  # fmt: skip
    assert [x for x in _job_log(ws).splitlines() if "what an earlier attempt left" in x] == [line]
    assert [x for x in console.splitlines() if "what an earlier attempt left" in x] == [line]  # seen, not only logged


def test_leftovers_of_a_stopped_attempt_with_the_same_recipe_are_resumed_and_only_those(stopped):
    # a stopped attempt of another recipe (8 parts), then one of today's (2 parts) that
    # stops too: the first one's leftovers go, the second one's are resumed
    ws, folder, with_deps = stopped
    _stop_once(ws, 2, with_deps)
    assert "was made from another recipe" in _job_log(ws)
    (stale,) = (folder / ".history").glob("*-stale")
    assert sorted(p.name for p in stale.glob("part*.txt")) == ALL

    # what writers killed before their rename left (storage.write_bytes_atomic's temporary files)
    (folder / "part2.txt.tmp-0123abcd").write_text("half")
    (folder / "sub").mkdir()
    (folder / "sub" / "x.npy.tmp-89abcdef").write_text("half")
    (folder / "part3.txt.tmp-notours").write_text("a step's own file")
    ws.snakemake()  # the same recipe as the stopped attempt: its files are resumed
    record = ws.record("feat/slow@v1")
    assert record["result"] == {"found": ["part0.txt", "part1.txt", "part3.txt.tmp-notours"]}
    assert record["files"] == {"part0.txt": 1, "part1.txt": 1, "part3.txt.tmp-notours": 17}
    assert not (folder / "part2.txt.tmp-0123abcd").exists() and not (folder / "sub" / "x.npy.tmp-89abcdef").exists()
    assert (f"{folder}: removed 2 temporary file(s) of writes an earlier attempt did not finish "
            "(part2.txt.tmp-0123abcd, sub/x.npy.tmp-89abcdef)") in _job_log(ws)
    assert "what an earlier attempt left" not in _job_log(ws)
    assert len(list((folder / ".history").glob("*-stale"))) == 1


def test_training_judges_a_changed_recipe_itself(tmp_path):
    # its checkpoints' recipe.json refuses a changed config naming the field, and lets
    # log_every, checkpoint_every and eval_every change (the fingerprint counts them)
    from marin_rules.job import attempt

    attempt.begin(str(tmp_path), "a" * 16, {}, "train")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints/recipe.json").write_text("{}")
    assert attempt.begin(str(tmp_path), "b" * 16, {}, "train") is None
    assert (tmp_path / "checkpoints/recipe.json").exists()
    noted = json.loads((tmp_path / ".attempt.json").read_text())
    assert noted == {"fingerprint": "b" * 16, "upstreams": {}, "started": noted["started"]}
    assert noted["started"].endswith("Z")  # when it began (`marin status` tells a later attempt by it)
    moved = attempt.begin(str(tmp_path), "c" * 16, {}, "usersteps:make")
    assert moved is not None and (Path(moved[0]) / "checkpoints/recipe.json").exists()
