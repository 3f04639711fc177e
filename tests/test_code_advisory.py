"""The step-code advisory and the priced plan during planning, in real Snakemake runs.

Each success record keeps `provenance.code = {hash, version}` of its step's code
(`marin_rules.artifacts.code`); editing a user step's module after a build gives one
advisory line per artifact in `-n`, real runs and `marin status`, and rebuilds nothing.
The priced plan (`marin_rules.inspect.plan`) goes to stderr once for the training jobs
that will run, forced ones included. User steps live in a module written into each
test's folder, as a user's own package would.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from marin_rules.artifacts import code
from marin_rules.artifacts import storage

STEPS = textwrap.dedent(
    '''
    """User steps for the advisory tests."""
    from marin_rules.artifacts import storage

    def make(ctx):
        storage.write_text_atomic(storage.join(ctx.output, "data.txt"), str(ctx.config.get("text", "")))
        return {"chars": 1}
    '''
)
CHAIN = {
    "raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}},
    "mid/b@v1": {"step": "usersteps:make", "deps": {"src": "raw/a@v1"}, "config": {"text": "b"}},
}
TRAIN = {
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "n_experts": 4,
              "top_k": 2, "d_expert": 32, "max_seq_len": 32, "vocab_size": 512},
    "optimizer": {"name": "adamw", "learning_rate": 0.01},
    "num_train_steps": 10, "batch_size": 4, "seq_len": 32,
}  # fmt: skip
WITH_TRAIN = {
    "raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}},
    "checkpoints/m@v1": {"step": "train", "deps": {"data": "raw/a@v1"}, "config": TRAIN},
    "checkpoints/n@v1": {"step": "train", "deps": {"data": "raw/a@v1"}, "config": {**TRAIN, "num_train_steps": 20}},
}


class Workspace:
    def __init__(self, root, run):
        self.root, self.run = root, run
        self.prefix = str(root / "art")
        (root / "usersteps.py").write_text(STEPS)
        self.env = {"PYTHONPATH": str(root)}

    def write(self, artifacts: dict) -> None:
        (self.root / "exp.yaml").write_text(yaml.safe_dump({"artifacts": artifacts}, sort_keys=False))

    def snakemake(self, *args: str, check: bool = True):
        config = ["--configfile", "exp.yaml", "--config", f"prefix={self.prefix}"]
        return self.run(*config, *args, cwd=self.root, env=self.env, check=check)

    def record(self, key: str) -> dict:
        name, version = key.split("@")
        return storage.read_json(f"{self.prefix}/{name}/{version}/.artifact.json")


@pytest.fixture
def ws(tmp_path, snakemake_cmd):
    return Workspace(tmp_path, snakemake_cmd)


def test_builtin_steps_hash_the_packages_they_run():
    names = {step: {n for n, _ in code.code_files(step)} for step in ("tokenize", "train", "evaluate")}
    assert "marin_rules/data/tokenize.py" in names["tokenize"]
    assert not any(n.startswith(("marin_rules/model/", "marin_rules/train/")) for n in names["tokenize"])
    assert {"marin_rules/model/moe.py", "marin_rules/train/loop.py"} <= names["train"]
    assert {"marin_rules/eval/step.py", "marin_rules/model/moe.py"} <= names["evaluate"]
    assert not any(n.startswith("marin_rules/data/") for n in names["train"])
    hashes = {step: code.code_hash(step) for step in ("download", "tokenize", "train", "evaluate")}
    assert hashes["download"] == hashes["tokenize"]  # one package, one hash
    assert len({hashes["tokenize"], hashes["train"], hashes["evaluate"]}) == 3
    assert code.code_version("train").startswith("marin-rules ")


def test_editing_a_user_step_gives_one_advisory_per_artifact_and_rebuilds_nothing(ws, capsys, monkeypatch):
    ws.write(CHAIN)
    ws.snakemake()
    before = {k: ws.record(k) for k in CHAIN}
    recorded = before["mid/b@v1"]["provenance"]["code"]
    assert len(recorded["hash"]) == 16 and recorded["version"]
    assert before["raw/a@v1"]["provenance"]["code"] == recorded  # same module, same hash
    proc = ws.snakemake("-n")
    assert "code changed" not in proc.stderr and "Nothing to be done" in proc.stdout + proc.stderr

    with open(ws.root / "usersteps.py", "a") as f:
        f.write("\n# a code change\n")
    for args in (["-n"], []):
        proc = ws.snakemake(*args)
        for key in CHAIN:
            lines = [l for l in proc.stderr.splitlines() if l.startswith(f"{key}: step code changed since")]
            assert len(lines) == 1, (args, proc.stderr)
            assert f"code {recorded['hash']} then" in lines[0] and "serving the cached output" in lines[0]
        assert "step code changed" not in proc.stdout
        assert "Nothing to be done" in proc.stdout + proc.stderr
    assert {k: ws.record(k) for k in CHAIN} == before  # nothing rebuilt

    from marin_rules.cli import main

    code.code_hash.cache_clear()  # this process may have hashed another module of that name
    monkeypatch.syspath_prepend(str(ws.root))
    assert main(["status", str(ws.root / "exp.yaml"), "--prefix", ws.prefix, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    rows = {r["key"]: r for r in (rows if isinstance(rows, list) else rows["artifacts"])}
    for key in CHAIN:
        assert rows[key]["state"] == "code changed", rows[key]
        assert f"code {recorded['hash']} then" in rows[key]["reason"]


def test_dry_run_prices_the_training_jobs_that_will_run_forced_included(ws, monkeypatch):
    from marin_rules.artifacts.identity import artifact_location
    from marin_rules.artifacts.records import Provenance, utc_now, write_success
    from marin_rules.experiment import load_experiment

    ws.write(WITH_TRAIN)
    proc = ws.snakemake("-n")
    assert proc.stderr.count("plan: 2 training job(s)") == 1, proc.stderr
    assert "  checkpoints/m@v1: params " in proc.stderr and "  checkpoints/n@v1: params " in proc.stderr
    assert "tokens 1.28k" in proc.stderr and "tokens 2.56k" in proc.stderr  # 10 and 20 steps x 4 x 32
    assert "plan:" not in proc.stdout

    monkeypatch.syspath_prepend(str(ws.root))
    experiment = load_experiment(str(ws.root / "exp.yaml"))  # n built elsewhere: a valid record, no step run
    for key in ("raw/a@v1", "checkpoints/n@v1"):
        artifact = experiment[key]
        entry = {"name": artifact.id.name, "version": artifact.id.version, "step": artifact.step,
                 "fingerprint": artifact.fingerprint, "config": artifact.config, "deps": {},
                 "runtime": artifact.runtime, "path": artifact.id.path}  # fmt: skip
        now = utc_now()
        write_success(artifact_location(ws.prefix, artifact.id), entry, {}, Provenance(".", [], None, None).as_dict(now, now))
    proc = ws.snakemake("-n")
    assert proc.stderr.count("plan: 1 training job(s)") == 1, proc.stderr
    assert "checkpoints/m@v1: params" in proc.stderr and "checkpoints/n@v1: params" not in proc.stderr
    proc = ws.snakemake("-n", "--forcerun", "train")
    assert proc.stderr.count("plan: 2 training job(s)") == 1, proc.stderr
    for args in (["--dag"], ["--config", "target=raw/a@v1", "-n"]):
        assert "plan:" not in ws.snakemake(*args).stderr  # nothing to train, or no plan asked


def test_code_change_needs_a_recorded_hash_that_differs(tmp_path, monkeypatch):
    (tmp_path / "mystep_mod.py").write_text("def run(ctx):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code.code_hash.cache_clear()
    now = code.step_code("mystep_mod:run")
    assert now["hash"] and now["version"] == "unversioned"  # not installed, not in git
    assert code.code_change("mystep_mod:run", {}) is None  # a record from before code hashes
    assert code.code_change("mystep_mod:run", {"code": {"hash": now["hash"]}}) is None
    change = code.code_change("mystep_mod:run", {"code": {"hash": "0" * 16, "version": "v0"}})
    assert change == ("0" * 16, now["hash"], "v0")
    assert code.code_change("nosuchmodule_xyz:run", {"code": {"hash": "0" * 16}}) is None  # unknown now
    assert code.code_version("yaml:safe_load").startswith("PyYAML ")  # an installed package: its version
    code.code_hash.cache_clear()


def test_code_of_no_known_version_is_said_so_not_built_with_unversioned():
    from marin_rules.artifacts.code import built_with, change_message

    assert built_with("marin-rules 0.1.0, git 1a2b3c4d5e6f") == "built with marin-rules 0.1.0, git 1a2b3c4d5e6f"
    line = change_message("feat/a@v1", ("aaaa", "bbbb", "unversioned"), "x")
    assert "built by code of no known version (not installed, not in git)" in line and "built with unversioned" not in line
