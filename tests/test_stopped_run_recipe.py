"""A stopped training run whose recipe then changed: predicted before its job refuses.

Each test has a real stopped run (`ws`): token data adopted in place (made once by
`train_helpers.tokens`), a long tiny training run started by a real `snakemake` in its
own process group, killed with SIGKILL once checkpoint 5 is saved. It leaves what a
`kill -9` leaves: checkpoints and `checkpoints/recipe.json`, a lease whose holder is
gone, no failure record, and Snakemake's lock files. (Not copied between tests: a copy
elsewhere would change the deps' locations relative to the run's folder, which the
recipe compares.)

Shown: `marin status` says Snakemake's lock must go first (`inspect/status.py`); with the
recipe changed without a version bump, `snakemake -n`, the real run's planning and
`marin status` say in one line that the job will refuse to resume, with the job's own
message (`job.attempt.refusal_ahead`), and the job then refuses with exactly that
message; a change of a free key predicts nothing; forcing the artifact sets the
checkpoints aside in `.history/` and trains the new recipe from scratch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SNAKEMAKE
from marin_rules.artifacts import storage
from marin_rules.artifacts.files import ATTEMPT_FILE
from marin_rules.artifacts.lease import process_exists, read_lease
from marin_rules.artifacts.provenance import iso, utc_now
from marin_rules.cli import main
from marin_rules.job.attempt import refusal_ahead
from marin_rules.train.recipe import make_recipe, mismatch_message, record_recipe
from train_helpers.runs import wait_for
from train_helpers.tokens import make_tokens

KEY, PATH = "checkpoints/long@v1", "checkpoints/long/v1"
CONFIG = {
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "n_experts": 4, "top_k": 2,
              "d_expert": 32, "max_seq_len": 32},
    "optimizer": {"name": "adamw", "learning_rate": 0.01},
    "num_train_steps": 5000,  # never reached: the run is killed after checkpoint 5
    "batch_size": 4, "seq_len": 32, "checkpoint_every": 5, "eval_every": 1000, "log_every": 5, "eval_batches": 1,
}  # fmt: skip


def experiment(tokens: str, **changes) -> str:
    config = json.loads(json.dumps(CONFIG))
    for field, value in changes.items():
        *parents, last = field.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[last] = value
    artifacts = {
        "tokens/x@v1": {"adopt": {"source": tokens, "kind": "tokenized"}},
        KEY: {"step": "train", "deps": {"data": "tokens/x@v1"}, "config": config},
    }
    return yaml.safe_dump({"artifacts": artifacts}, sort_keys=False)


class Workspace:
    def __init__(self, root: Path, tokens: str):
        self.root, self.tokens = root, tokens
        self.prefix = root / "art"
        self.output = self.prefix / PATH

    def write(self, **changes) -> None:
        (self.root / "exp.yaml").write_text(experiment(self.tokens, **changes))

    def command(self, *args: str) -> list[str]:
        return [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "--config",
                f"prefix={self.prefix}", "-c2", *args]  # fmt: skip

    def snakemake(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), cwd=self.root, capture_output=True, text=True, timeout=300)

    def status(self, capsys) -> dict:
        capsys.readouterr()
        assert main(["status", "-d", str(self.root), "--configfile", str(self.root / "exp.yaml"), "--prefix", "art", "--json"]) == 0
        return {row["key"]: row for row in json.loads(capsys.readouterr().out)}[KEY]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    return make_tokens(str(tmp_path_factory.mktemp("colleague")))


@pytest.fixture
def ws(tokens, tmp_path) -> Workspace:
    """A workspace where `snakemake` was killed (kill -9 of its process group) during training."""
    ws = Workspace(tmp_path / "run", tokens)
    ws.root.mkdir()
    ws.write()
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen(ws.command(), cwd=ws.root, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            wait_for(lambda: (ws.output / "checkpoints" / "5").is_dir(), proc, 240, "checkpoint 5")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of the whole group: snakemake and its job
            proc.wait(timeout=30)
    job = read_lease(str(ws.output)).pid  # the job, orphaned by the kill, is reaped by init: wait for it
    deadline = time.monotonic() + 30
    while process_exists(job):
        assert time.monotonic() < deadline, f"the killed job (pid {job}) still exists after 30 s"
        time.sleep(0.02)  # short polling interval, bounded by the deadline
    return ws


def test_after_kill_9_status_says_snakemakes_lock_must_be_removed_first(ws, capsys):
    holder = read_lease(str(ws.output)).describe()
    row = ws.status(capsys)
    assert row["state"] == "failed"
    assert row["reason"] == (
        f"its builder ({holder}) is gone: killed? (no failure record); the next run takes the lease over and "
        f"resumes; Snakemake's lock is still there and no snakemake runs in {ws.root}: run snakemake --unlock first"
    )
    locked = ws.snakemake()  # what the clause warns of
    assert locked.returncode != 0 and "LockException" in locked.stdout + locked.stderr
    ws.snakemake("--unlock")
    assert "lock" not in ws.status(capsys)["reason"]


def test_a_changed_recipe_is_predicted_by_dry_runs_planning_and_status_as_the_job_then_refuses(ws, capsys):
    ws.snakemake("--unlock")
    ws.write(**{"optimizer.learning_rate": 0.005})
    message = mismatch_message(str(ws.output), ["optimizer.learning_rate: 0.01 -> 0.005"])
    line = f"{KEY}: its job will refuse to resume: {message}"
    dry = ws.snakemake("-n")
    assert dry.returncode == 0 and dry.stderr.splitlines().count(line) == 1
    lease = ws.output / ".lease.json"
    killed = lease.read_bytes()
    live = {**json.loads(killed), "pid": os.getpid(), "since": iso(utc_now()), "renewed": iso(utc_now())}
    lease.write_text(json.dumps(live))  # another run holds it now: its job would wait and serve that build
    dry = ws.snakemake("-n")
    assert dry.returncode == 0 and "its job will refuse to resume" not in dry.stderr, dry.stderr[-2000:]
    lease.write_bytes(killed)
    reason = ws.status(capsys)["reason"]
    assert reason.startswith("its builder (")
    assert reason.endswith("; the next run takes the lease over; the next run will refuse to resume: "
                           + mismatch_message(f"art/{PATH}", ["optimizer.learning_rate: 0.01 -> 0.005"]))  # fmt: skip
    real = ws.snakemake()
    assert real.returncode != 0 and real.stderr.splitlines().count(line) == 1
    failures = [json.loads(p.read_text())["error"] for p in sorted((ws.output / ".failures").glob("*.json"))]
    # the killed attempt's (recorded by the run that took its lease over), then the refusal
    assert sorted(error["type"] for error in failures) == ["AttemptLost", "StepError"]
    refusal = next(error for error in failures if error["type"] == "StepError")
    assert refusal["message"] == message  # the very message
    row = ws.status(capsys)
    assert row["state"] == "failed"
    assert row["reason"].count("were written by another recipe") == 1  # the failure line says it: not repeated
    assert sorted(p.name for p in (ws.output / "checkpoints").iterdir() if p.name.isdigit()) == ["5"]  # untouched


def test_a_change_of_a_key_that_may_change_on_resume_predicts_nothing(ws, capsys):
    ws.snakemake("--unlock")
    ws.write(log_every=1, checkpoint_every=7)
    assert "refuse" not in ws.snakemake("-n").stderr
    assert ws.status(capsys)["reason"].endswith("the next run takes the lease over and resumes")


def test_forcing_the_stopped_artifact_sets_its_checkpoints_aside_and_trains_the_new_recipe(ws, capsys):
    ws.snakemake("--unlock")
    ws.write(**{"optimizer.learning_rate": 0.005, "num_train_steps": 10})
    assert ", force this artifact (snakemake -f on its record, as marin path prints it) to set them aside and train " \
           "afresh, or delete " in mismatch_message(str(ws.output), ["x: 1 -> 2"])  # what the refusal says to do
    capsys.readouterr()
    assert main(["path", KEY, "-d", str(ws.root), "--configfile", str(ws.root / "exp.yaml"), "--prefix", str(ws.prefix)]) == 0
    record = capsys.readouterr().out.strip()  # as the refusal says: marin path prints the record to force
    assert record == str(ws.output / ".artifact.json")
    dry = ws.snakemake("-n", "-f", record)
    assert "refuse" not in dry.stderr and "rule train:" in dry.stdout
    real = ws.snakemake("-f", record)
    assert real.returncode == 0, real.stderr[-4000:]
    assert json.loads((ws.output / ".artifact.json").read_text())["config"]["optimizer"]["learning_rate"] == 0.005
    (kept,) = (ws.output / ".history").iterdir()
    assert (kept / "checkpoints" / "5").is_dir()
    assert json.loads((kept / "checkpoints" / "recipe.json").read_text())["config"]["optimizer"]["learning_rate"] == 0.01
    assert ws.status(capsys)["state"] == "built"


# ---- refusal_ahead alone: what is read, on a local folder and on gs:// ------------------------------------


def _stopped_at(output: str, lr: float) -> dict:
    """Checkpoints of a run with learning rate `lr` at `output` (recipe.json and a finished
    step 5, with orbax's commit note); returns the recipe with learning rate 0.005."""
    record_recipe(output, make_recipe(dict(CONFIG, optimizer={"name": "adamw", "learning_rate": lr}), {}, output))
    storage.write_text_atomic(storage.join(output, "checkpoints", "5", "commit_success.txt"), "x")
    return make_recipe(dict(CONFIG, optimizer={"name": "adamw", "learning_rate": 0.005}), {}, output)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_refusal_ahead_needs_a_checkpoint_another_recipe_and_leftovers_kept(where, tmp_path, request):
    output = str(tmp_path / "out") if where == "local" else request.getfixturevalue("gcs_prefix") + "/out"
    now = _stopped_at(output, 0.01)
    expected = mismatch_message(output, ["optimizer.learning_rate: 0.01 -> 0.005"])
    assert refusal_ahead(output, now, {}) == expected
    assert refusal_ahead(output, make_recipe(dict(CONFIG, log_every=1), {}, output), {}) is None  # a free key
    assert refusal_ahead(output, now, None) is None  # an upstream to build first: the leftovers go aside
    same = {"u@v1": {"fingerprint": "a" * 16, "built": "2026-12-01T10:00:00.000Z"}}
    storage.write_json_atomic(storage.join(output, ATTEMPT_FILE), {"fingerprint": "f" * 16, "upstreams": same})
    assert refusal_ahead(output, now, same) == expected  # the attempt's fingerprint is not train's judge
    rebuilt = {"u@v1": {**same["u@v1"], "built": "2026-12-02T10:00:00.000Z"}}
    assert refusal_ahead(output, now, rebuilt) is None  # `job.attempt` moves them to .history/ first
    if where == "gcs":  # on an object store a step folder without orbax's commit note is unfinished
        storage.write_json_atomic(storage.join(output, ATTEMPT_FILE), {"fingerprint": "f" * 16, "upstreams": same})
        storage.filesystem(output)[0].rm(storage.filesystem(storage.join(output, "checkpoints/5/commit_success.txt"))[1])
        storage.write_text_atomic(storage.join(output, "checkpoints", "5", "model", "x"), "x")
        assert refusal_ahead(output, now, same) is None


def test_refusal_ahead_without_a_finished_checkpoint_predicts_a_fresh_start(tmp_path):
    output = str(tmp_path / "out")
    now = _stopped_at(output, 0.01)
    shutil.rmtree(tmp_path / "out" / "checkpoints" / "5")
    (tmp_path / "out" / "checkpoints" / "10.orbax-checkpoint-tmp").mkdir()  # an unfinished save
    assert refusal_ahead(output, now, {}) is None
    (tmp_path / "out" / "checkpoints" / "recipe.json").write_text("{not json")
    (tmp_path / "out" / "checkpoints" / "5").mkdir()
    assert refusal_ahead(output, now, {}).endswith(f"delete {output}/checkpoints to start the run over")


def test_a_deleted_recipe_beside_checkpoints_with_digests_notes_is_refused_not_resumed_unchecked(tmp_path):
    # today's code writes recipe.json before the first checkpoint and a digests note beside
    # each: without the recipe, a resume ran under whatever recipe the experiment now gives
    from marin_rules.artifacts.errors import StepError
    from marin_rules.train.recipe import check_recipe

    output = str(tmp_path / "out")
    now = _stopped_at(output, 0.01)
    os.remove(tmp_path / "out" / "checkpoints" / "recipe.json")
    assert refusal_ahead(output, now, {}) is None  # older code's checkpoints: resumed unchecked, as before
    check_recipe(output, now)
    (tmp_path / "out" / "checkpoints" / "5.digests.json").write_text("{}")
    message = refusal_ahead(output, now, {})
    assert message.startswith(f"{output}/checkpoints/recipe.json: missing, though the checkpoints beside it were "
                              "written by code that records their recipe there")  # fmt: skip
    with pytest.raises(StepError, match="which recipe trained them is unknown"):
        check_recipe(output, now)
