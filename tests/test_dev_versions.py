"""Dev versions (`name@dev`, `*-dev`): rebuilt every run, per-user folders, no drift,
and a fixed version may not depend on one. Real Snakemake runs of small user steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from marin_rules.artifacts.errors import ConfigError
from marin_rules.artifacts.identity import MAX_OWNER_BYTES, ArtifactId, parse_key, path_safe_user
from marin_rules.experiment import build_experiment, default_dev_user, dev_user_in_path

STEP = '''
from marin_rules.artifacts import storage

def make(ctx):
    text = ctx.config.get("text", "") + "|" + ",".join(sorted(ctx.deps.values()))
    storage.write_text_atomic(storage.join(ctx.output, "out.txt"), text)
    return {"text": ctx.config.get("text")}


def flaky(ctx):  # fails after writing a file while the file `fail` lies in the working folder
    import os

    storage.write_text_atomic(storage.join(ctx.output, "partial.txt"), "half")
    if os.path.exists("fail"):
        raise RuntimeError("failing on purpose")
    return {}


def die(ctx):  # killed outright (as by the OOM killer) while the file `die` lies in the working folder
    import os
    import signal

    storage.write_text_atomic(storage.join(ctx.output, "partial.txt"), "half")
    if os.path.exists("die"):
        os.kill(os.getpid(), signal.SIGKILL)
    return {}
'''


def experiment(text_a: str = "a", b_version: str = "dev") -> dict:
    return {
        "raw/a@dev": {"step": "devsteps:make", "config": {"text": text_a}},
        f"top/b@{b_version}": {"step": "devsteps:make", "deps": {"src": "raw/a@dev"}, "config": {"text": "b"}},
        "side/c@v1": {"step": "devsteps:make", "config": {"text": "c"}},
    }


@pytest.fixture
def ws(tmp_path, snakemake_cmd):
    (tmp_path / "devsteps.py").write_text(STEP)

    def run(arts: dict, *args: str, user: str | None = "alice", check: bool = True):
        (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"artifacts": arts}, sort_keys=False))
        config = [f"prefix={tmp_path / 'art'}"] + ([f"dev_user={user}"] if user is not None else [])
        return snakemake_cmd("--configfile", "exp.yaml", "--cores", "1", *args, "--config", *config,
                             cwd=tmp_path, check=check)  # fmt: skip

    run.root = tmp_path
    return run


def record(ws, path: str) -> dict:
    return json.loads((ws.root / "art" / path / ".artifact.json").read_text())


def test_dev_versions_rebuild_every_run_per_user_without_drift_warnings(ws):
    ws(experiment())
    first = {p: record(ws, p)["provenance"]["started"] for p in ("raw/a/dev-alice", "top/b/dev-alice", "side/c/v1")}
    assert not (ws.root / "art/raw/a/dev").exists()
    out = (ws.root / "art/top/b/dev-alice/out.txt").read_text()
    assert out == f"b|{ws.root / 'art/raw/a/dev-alice'}"  # the consumer reads its owner's upstream

    plan = ws(experiment(), "-n")  # the plan shows both dev artifacts, not the fixed one
    planned = [line.split("artifact=")[1] for line in plan.stdout.splitlines() if "wildcards: artifact=" in line]
    assert sorted(planned) == ["raw/a/dev-alice", "top/b/dev-alice"]

    proc = ws(experiment(text_a="changed"))  # a new recipe on a dev version: rebuilt, never drift
    assert "drift" not in proc.stderr
    again = {p: record(ws, p)["provenance"]["started"] for p in first}
    assert again["raw/a/dev-alice"] > first["raw/a/dev-alice"] and again["top/b/dev-alice"] > first["top/b/dev-alice"]
    assert again["side/c/v1"] == first["side/c/v1"]
    assert record(ws, "raw/a/dev-alice")["config"] == {"text": "changed"}
    assert record(ws, "raw/a/dev-alice")["path"] == "raw/a/dev"
    assert not list((ws.root / "art/raw/a/dev-alice/.history").glob("2*"))  # dev keeps no old builds

    ws(experiment(text_a="bob's"), user="Bob Smith")  # a colleague: own folders, alice's untouched
    assert record(ws, "raw/a/dev-bob-smith")["config"] == {"text": "bob's"}
    assert record(ws, "raw/a/dev-alice")["provenance"]["started"] == again["raw/a/dev-alice"]


def test_a_dev_version_keeps_no_leftovers_of_failed_attempts_only_their_failure_records(ws):
    arts = {"raw/f@dev": {"step": "devsteps:flaky"}}
    folder, log = ws.root / "art/raw/f/dev-alice", ws.root / ".snakemake/marin-logs/raw/f/dev-alice/job.log"
    (ws.root / "fail").write_text("")
    assert ws(arts, check=False).returncode != 0
    assert ws(arts, check=False).returncode != 0  # rebuilt from scratch: the first attempt's file goes
    assert "raw/f@dev: forced: what an unfinished attempt left was discarded (a dev version keeps no history)" in log.read_text()
    (ws.root / "fail").unlink()
    ws(arts)
    (ws.root / "fail").write_text("")
    assert ws(arts, check=False).returncode != 0  # the last build is back; what this attempt left goes
    assert "(what the attempt left: discarded (a dev version keeps no history))" in log.read_text()
    assert record(ws, "raw/f/dev-alice")["status"] == "success"
    assert [p for p in (folder / ".history").rglob("*")] == []
    assert len(list((folder / ".failures").glob("*.json"))) == 3  # the failures stay on record


def test_a_dev_versions_leftovers_of_another_recipe_are_discarded_not_set_aside(tmp_path):
    from marin_rules.artifacts.identity import artifact_location
    from marin_rules.job.main import begin_attempt

    e = build_experiment({"artifacts": {"raw/a@dev": {"step": "json:dumps"}}}, dev_user="al")
    artifact = e["raw/a@dev"]
    folder = Path(artifact_location(str(tmp_path), artifact.id))
    folder.mkdir(parents=True)
    (folder / ".attempt.json").write_text(json.dumps({"fingerprint": "0" * 16, "upstreams": {}}))
    (folder / "old.txt").write_text("of another recipe")
    begin_attempt(artifact, e, str(folder), str(tmp_path))
    assert sorted(p.name for p in folder.iterdir()) == [".attempt.json", ".history"]
    assert [p for p in (folder / ".history").rglob("*")] == []


def test_default_owner_is_the_path_safe_login_name(ws):
    ws({"raw/a@exp-dev": {"step": "devsteps:make"}}, user=None)
    assert (ws.root / f"art/raw/a/exp-dev-{default_dev_user()}/.artifact.json").exists()


def test_fixed_version_on_a_dev_version_is_refused_at_load_in_one_line(ws):
    proc = ws(experiment(b_version="v1"), "-n", check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("marin-rules:")]
    assert len(lines) == 1
    assert lines[0].startswith("marin-rules: top/b@v1: deps.src: raw/a@dev is a dev version")
    assert not (ws.root / "art").exists()


def test_fixed_on_dev_refused_in_mixtures_and_for_dash_dev_versions():
    arts = {"a@x-dev": {"step": "json:dumps"}, "b@v1": {"step": "json:dumps"}, "c@v2": {"step": "json:dumps", "deps": {"mix": {"a@x-dev": 1, "b@v1": 1}}}}
    with pytest.raises(ConfigError, match=r"^c@v2: deps.mix: a@x-dev is a dev version"):
        build_experiment({"artifacts": arts})


@pytest.mark.parametrize("user, safe", [("alice", "alice"), ("Bob Smith", "bob-smith"), ("DOMAIN\\jo", "domain-jo"),
                                         ("../..", "u626ac4c0"), (None, "unknown"), ("é.ö", "u35413a73")])  # fmt: skip
def test_path_safe_user_gives_one_safe_segment(user, safe):
    assert path_safe_user(user) == safe


def test_users_whose_names_keep_no_safe_character_get_folders_of_their_own():
    # they all shared dev-unknown, so one user's dev builds replaced another's
    owners = {path_safe_user(name) for name in ("ÄÖ", "éö", ".", "..", "李")}
    assert len(owners) == 5 and all(re.fullmatch(r"u[0-9a-f]{8}", o) for o in owners)
    # names that keep some: Jörg and Jürg both kept j-rg
    jorg, jurg = path_safe_user("Jörg"), path_safe_user("Jürg")
    assert jorg != jurg and re.fullmatch(r"j-rg-[0-9a-f]{8}", jorg) and re.fullmatch(r"j-rg-[0-9a-f]{8}", jurg)
    assert len(path_safe_user("ö" + "x" * 300)) == MAX_OWNER_BYTES


def test_owner_enters_the_path_of_dev_versions_only_and_is_found_again():
    assert ArtifactId("raw/a", "dev", "al").path == "raw/a/dev-al"
    assert ArtifactId("raw/a", "v1", "al").path == "raw/a/v1"
    assert ArtifactId("raw/a", "dev", "al") == parse_key("raw/a@dev")  # identity is name@version
    e = build_experiment({"artifacts": {"a@dev": {"step": "json:dumps"}, "a@dev-dev": {"step": "json:dumps"}}}, dev_user="x")
    assert dev_user_in_path(e, "a/dev-dev-x") == "x" and dev_user_in_path(e, "a/dev-mary-ann") == "mary-ann"
    assert e.by_path["a/dev-x"].key == "a@dev"


def test_dev_version_on_a_bucket_prefix_rebuilds_in_its_owners_folder(tmp_path, snakemake_cmd, gcs_prefix, gcs_env):
    from marin_rules.artifacts import storage

    (tmp_path / "devsteps.py").write_text(STEP)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"artifacts": {"raw/a@dev": {"step": "devsteps:make"}}}))
    args = ("--configfile", "exp.yaml", "--config", f"prefix={gcs_prefix}", "dev_user=carol")
    started = []
    for _ in range(2):
        snakemake_cmd(*args, cwd=tmp_path, env=gcs_env)
        started.append(storage.read_json(f"{gcs_prefix}/raw/a/dev-carol/.artifact.json")["provenance"]["started"])
    assert started[1] > started[0]


def test_a_fixed_version_named_like_a_users_dev_folder_is_refused():
    arts = {"a@dev": {"step": "json:dumps"}, "a@dev-al": {"step": "json:dumps"}}
    with pytest.raises(ConfigError, match=r"^a@dev-al: version: a@dev of user 'al' is stored at a/dev-al"):
        build_experiment({"artifacts": arts}, dev_user="al")
    assert build_experiment({"artifacts": arts}, dev_user="bo").by_path["a/dev-bo"].key == "a@dev"


def marin(ws, capsys, *args: str) -> tuple[int, str, str]:
    """`marin ARGS` on the workspace's run (its folder, experiment and prefix)."""
    from marin_rules.cli import main

    code = main([*args, "-d", str(ws.root), "--configfile", str(ws.root / "exp.yaml"), "--prefix", "art"])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_marin_command_reads_a_dev_version_from_the_users_folder_and_all_lists_other_users(ws, capsys):
    ws(experiment(text_a="bob's"), user="bob")
    ws(experiment())  # alice's dev builds, of the recipe in exp.yaml now
    alice = ("--dev-user", "alice")
    code, out, err = marin(ws, capsys, "status", "--json", *alice)
    assert code == 0, err
    assert {r["key"]: r["state"] for r in json.loads(out)}["raw/a@dev"] == "built"
    code, out, _ = marin(ws, capsys, "show", "raw/a@dev", *alice)
    assert code == 0 and json.loads(out)["record"]["config"] == {"text": "a"}
    assert marin(ws, capsys, "verify", "raw/a@dev", *alice)[0] == 0
    code, out, _ = marin(ws, capsys, "history", "raw/a@dev", *alice)
    assert code == 0 and out.startswith("raw/a@dev: 1 attempt\n") and "built (current)" in out
    code, out, _ = marin(ws, capsys, "diff", "raw/a@dev", "top/b@dev", *alice)
    assert code == 0 and out.startswith("recipe: raw/a@dev -> top/b@dev: ")
    code, out, _ = marin(ws, capsys, "diff", "raw/a@dev", "top/b@dev", "--dev-user", "bob")
    assert code == 0 and "text: bob's -> b" in out  # bob's own builds
    code, out, _ = marin(ws, capsys, "status", "--json", "--dev-user", "bob")  # bob's built from another recipe
    bob = {r["key"]: r for r in json.loads(out)}["raw/a@dev"]
    assert bob["state"] == "drifted" and bob["reason"].endswith("; a dev version: the next run rebuilds it")
    code, out, _ = marin(ws, capsys, "history", "raw/a@dev", "--dev-user", "carol")
    assert code == 0 and out == "raw/a@dev: no attempts recorded (never built)\n"
    code, _, err = marin(ws, capsys, "diff", "raw/a@dev", "top/b@dev", "--dev-user", "carol")
    assert code == 0 and err.startswith("marin: raw/a@dev: not built yet in user carol's folder (missing: never built)")

    code, out, _ = marin(ws, capsys, "status", "--all", "--json", *alice)
    rows = {r["key"]: r for r in json.loads(out)}
    assert {key: r["state"] for key, r in rows.items()} == {
        "raw/a@dev": "built", "top/b@dev": "built", "side/c@v1": "built",
        "raw/a@dev (user bob)": "built", "top/b@dev (user bob)": "built",
    }  # fmt: skip
    assert rows["raw/a@dev (user bob)"]["reason"] == "user bob's dev build (marin --dev-user bob reads it)"


def test_a_dev_folder_found_on_a_prefix_is_the_version_its_record_names(tmp_path):
    from marin_rules.artifacts.records import write_success
    from marin_rules.dev_versions import folder_identities
    from marin_rules.inspect.reading import builds_on_prefix

    assert [(a.version, a.owner) for a in folder_identities("x", "a-dev-bo-dev-al")] == [
        ("a-dev-bo-dev-al", ""), ("a-dev", "bo-dev-al"), ("a-dev-bo-dev", "al"),
    ]  # fmt: skip
    for folder, version in [("a-dev-bo-dev-al", "a-dev-bo-dev"), ("dev-al", "dev-al"), ("v1", "v1")]:
        entry = {"name": "x", "version": version, "step": "devsteps:make", "fingerprint": "0" * 16,
                 "config": {}, "deps": {}, "runtime": {}}  # fmt: skip
        write_success(str(tmp_path / "x" / folder), entry, {}, {})
    found = {a.path: (a.key, a.owner) for a in builds_on_prefix(str(tmp_path), "x")}
    assert found == {"x/a-dev-bo-dev-al": ("x@a-dev-bo-dev", "al"), "x/dev-al": ("x@dev-al", ""), "x/v1": ("x@v1", "")}


def test_an_old_layout_dev_folder_shows_once_in_status_all(ws, capsys):
    import shutil

    ws(experiment())  # alice's dev builds, in raw/a/dev-alice
    shutil.copytree(ws.root / "art/raw/a/dev-alice", ws.root / "art/raw/a/dev")  # as the layout before per-user folders
    code, out, err = marin(ws, capsys, "status", "--all", "--json", "--dev-user", "alice")
    assert code == 0, err
    keys = [r["key"] for r in json.loads(out)]
    assert len(keys) == len(set(keys))  # raw/a@dev was listed twice: alice's, and the old folder as if it were hers
    rows = {r["key"]: r for r in json.loads(out)}
    assert {key: r["state"] for key, r in rows.items()} == {
        "raw/a@dev": "built", "top/b@dev": "built", "side/c@v1": "built", "raw/a@dev (no user: old layout)": "built",
    }  # fmt: skip
    assert rows["raw/a@dev (no user: old layout)"]["reason"] == (
        "a dev build of the old layout, from before each user's went to raw/a/dev-USER: no run reads or rebuilds it; "
        "delete it when done with it"
    )
    code, out, _ = marin(ws, capsys, "status", "--all", "--dev-user", "alice")
    lines = out.splitlines()
    assert code == 0 and sum(line.startswith("raw/a@dev ") for line in lines) == 2  # alice's, and the old folder:
    assert sum(line.startswith("raw/a@dev (no user: old layout) ") for line in lines) == 1  # shown once, as such


def test_a_dev_build_killed_before_its_record_is_shown_as_that_users_dev_version(ws, capsys):
    arts = {"raw/j@dev": {"step": "devsteps:die"}, "side/c@v1": {"step": "devsteps:make"}}
    (ws.root / "die").write_text("")
    proc = ws(arts, user="bob", check=False)  # the job process is killed outright: no record of any kind
    assert proc.returncode != 0
    folder = ws.root / "art/raw/j/dev-bob"
    assert (folder / "partial.txt").exists() and not (folder / ".artifact.json").exists()
    assert not (folder / ".failures").exists()
    code, out, err = marin(ws, capsys, "status", "--all", "--json", "--dev-user", "alice")
    assert code == 0, err
    rows = {r["key"]: r for r in json.loads(out)}
    assert set(rows) == {"raw/j@dev", "side/c@v1", "raw/j@dev (user bob)"}  # not a fixed version raw/j@dev-bob
    bob = rows["raw/j@dev (user bob)"]
    assert bob["state"] == "failed" and not bob["in_experiment"]
    assert bob["reason"].startswith("user bob's dev build (marin --dev-user bob reads it); its builder (")
    assert bob["reason"].endswith(") is gone: killed? (no failure record); the next run takes the lease over")
    code, out, _ = marin(ws, capsys, "status", "--json", "--dev-user", "bob")  # bob's own: a dev version never resumes
    mine = {r["key"]: r for r in json.loads(out)}["raw/j@dev"]
    assert mine["state"] == "failed" and mine["reason"].endswith("the next run takes the lease over")


def test_a_dev_folder_without_a_record_is_the_dev_version_its_history_names_else_a_dev_version(tmp_path):
    from marin_rules.artifacts.records import write_success
    from marin_rules.inspect.reading import builds_on_prefix

    entry = {"name": "x", "version": "a-dev-bo-dev", "step": "devsteps:make", "fingerprint": "0" * 16,
             "config": {}, "deps": {}, "runtime": {}}  # fmt: skip
    write_success(str(tmp_path / "x" / "a-dev-bo-dev-al"), entry, {}, {})
    kept = tmp_path / "x" / "a-dev-bo-dev-al" / ".history" / "20261201T000000.000Z"
    kept.mkdir(parents=True)
    (tmp_path / "x" / "a-dev-bo-dev-al" / ".artifact.json").rename(kept / ".artifact.json")  # a rebuild killed
    for folder in ("dev-zed", "lr-dev-zed", "v2"):  # first attempts killed: a lease, or only an attempt file
        (tmp_path / "x" / folder).mkdir()
        (tmp_path / "x" / folder / (".lease.json" if folder != "lr-dev-zed" else ".attempt.json")).write_text("{}")
    found = {a.path: (a.key, a.owner) for a in builds_on_prefix(str(tmp_path), "x")}
    assert found == {"x/a-dev-bo-dev-al": ("x@a-dev-bo-dev", "al"), "x/dev-zed": ("x@dev", "zed"),
                     "x/lr-dev-zed": ("x@lr-dev", "zed"), "x/v2": ("x@v2", "")}  # fmt: skip
