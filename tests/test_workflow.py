"""Real Snakemake runs of the Snakefile on throwaway prefixes, with user steps.

The user steps live in a module written into each test's folder (as a user's own
package would), so these tests exercise exactly the `pkg.module:function` contract.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from marin_rules.artifacts import storage

STEPS = textwrap.dedent(
    '''
    """User steps for workflow tests."""
    import os
    import signal
    from marin_rules.artifacts import storage

    def make(ctx):
        text = str(ctx.config.get("text", ""))
        for role, loc in sorted(ctx.deps.items()):
            locs = [loc] if isinstance(loc, str) else sorted(loc)
            for l in locs:
                text += "|" + storage.read_text(storage.join(l, "data.txt"))
        storage.write_text_atomic(storage.join(ctx.output, "data.txt"), text)
        return {"chars": len(text), "output_seen": ctx.output}

    def fail(ctx):
        storage.write_text_atomic(storage.join(ctx.output, "checkpoint-1.txt"), "progress")
        if not ctx.config.get("ok"):
            raise RuntimeError("simulated crash at step 1")
        storage.write_text_atomic(storage.join(ctx.output, "data.txt"), "done")
        return {"ok": True}

    def stop_self(ctx):
        storage.write_text_atomic(storage.join(ctx.output, "partial.txt"), "half")
        os.kill(os.getpid(), getattr(signal, ctx.config["signal"]))  # as Ctrl-C or a scheduler would
        for _ in range(10**9):  # a long computation (tens of seconds), stopped by the signal
            pass
        return {"finished": True}
    '''
)


class Workspace:
    def __init__(self, root: Path, run):
        self.root = root
        self.prefix = str(root / "art")
        self._run = run
        (root / "usersteps.py").write_text(STEPS)
        self.env = {"PYTHONPATH": str(root)}

    def write(self, artifacts: dict, name: str = "exp.yaml") -> Path:
        path = self.root / name
        path.write_text(yaml.safe_dump({"artifacts": artifacts}, sort_keys=False))
        return path

    def snakemake(self, *args: str, exp: str = "exp.yaml", check: bool = True, prefix: str | None = None, env=None):
        config = ["--config", f"prefix={prefix or self.prefix}"]
        return self._run("--configfile", exp, *config, *args, cwd=self.root, env={**self.env, **(env or {})}, check=check)

    def record(self, key: str, prefix: str | None = None) -> dict:
        name, version = key.split("@")
        return storage.read_json(f"{prefix or self.prefix}/{name}/{version}/.artifact.json")

    def record_path(self, key: str) -> str:
        name, version = key.split("@")
        return f"{self.prefix}/{name}/{version}/.artifact.json"


@pytest.fixture
def ws(tmp_path, snakemake_cmd):
    return Workspace(tmp_path, snakemake_cmd)


@pytest.fixture(scope="module")
def built_chain(tmp_path_factory):
    """The `chain()` experiment built once; tests get a copy (mtimes preserved)."""
    from conftest import run_snakemake

    template = Workspace(tmp_path_factory.mktemp("chain"), run_snakemake)
    template.write(chain())
    template.snakemake()
    return template


@pytest.fixture
def built(ws, built_chain):
    import shutil

    shutil.copytree(built_chain.prefix, ws.prefix)
    ws.write(chain())
    return ws


def chain(text_b="b", extra_b=None):
    b = {"text": text_b, **(extra_b or {})}
    return {
        "raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}},
        "mid/b@v1": {"step": "usersteps:make", "deps": {"src": "raw/a@v1"}, "config": b, "runtime": {"tpu": "v5p-8"}},
        "top/c@v1": {"step": "usersteps:make", "deps": {"src": "mid/b@v1"}, "config": {"text": "c"}},
        "side/d@v1": {"step": "usersteps:make", "config": {"text": "d"}},
    }


def nothing_to_do(proc) -> bool:
    return "Nothing to be done" in proc.stdout + proc.stderr


def started(ws, key):
    return ws.record(key)["provenance"]["started"]


def test_build_writes_complete_records_without_secrets_and_second_run_serves_cache(ws):
    ws.write(chain())
    proc = ws.snakemake(env={"MY_API_TOKEN": "s3cr3t-value-123"})
    shown = re.search(r"output: \S*top/c/v1/\.artifact\.json \(update\)\n(?:.*\n)*?\s+jobid: (\d+)", proc.stdout + proc.stderr)
    for path in Path(ws.prefix).rglob("*.json"):
        assert "s3cr3t-value-123" not in path.read_text()
    rec = ws.record("top/c@v1")
    for field in ("name", "version", "step", "fingerprint", "config", "deps", "runtime", "result", "provenance"):
        assert field in rec
    assert (rec["name"], rec["version"], rec["step"]) == ("top/c", "v1", "usersteps:make")
    assert rec["deps"]["src"]["name"] == "mid/b" and rec["deps"]["src"]["fingerprint"] == ws.record("mid/b@v1")["fingerprint"]
    assert rec["result"] == {"chars": len("c|b|a"), "output_seen": f"{ws.prefix}/top/c/v1"}
    assert rec["path"] == "top/c/v1" and rec["deps"]["src"]["path"] == "mid/b/v1"  # prefix-relative
    assert rec["files"] == {"data.txt": len("c|b|a")}
    assert ws.record("mid/b@v1")["runtime"] == {"tpu": "v5p-8"}
    prov = rec["provenance"]
    for field in ("git", "user", "host", "command", "packages", "started", "ended", "duration_s", "rule", "jobid"):
        assert field in prov
    assert prov["rule"] == "custom" and "--configfile" in prov["command"] and "snakemake" in prov["packages"]
    assert prov["jobid"] == int(shown.group(1))  # the job id the main process showed
    assert (Path(ws.prefix) / "top/c/v1/data.txt").read_text() == "c|b|a"
    assert nothing_to_do(ws.snakemake())


def test_failing_step_keeps_data_writes_failure_record_and_history_survives_success(ws):
    ws.write({"ck/f@v1": {"step": "usersteps:fail", "config": {}}})
    proc = ws.snakemake(check=False)
    assert proc.returncode != 0
    folder = Path(ws.prefix) / "ck/f/v1"
    assert (folder / "checkpoint-1.txt").read_text() == "progress"  # data directory survives
    assert not (folder / ".artifact.json").exists()
    failures = sorted((folder / ".failures").glob("*.json"))
    assert len(failures) == 1
    failure = json.loads(failures[0].read_text())
    assert failure["status"] == "failed" and failure["name"] == "ck/f" and failure["fingerprint"]
    assert failure["error"]["type"] == "RuntimeError" and "simulated crash at step 1" in failure["error"]["message"]
    assert "Traceback" in failure["error"]["traceback"] and failure["provenance"]["host"]
    ws.write({"ck/f@v1": {"step": "usersteps:fail", "config": {"ok": True}}})
    ws.snakemake()
    assert ws.record("ck/f@v1")["result"] == {"ok": True}
    assert len(list((folder / ".failures").glob("*.json"))) == 1  # failures are history


def test_signal_to_the_job_process_stops_the_step_with_a_failure_record(ws):
    # the step runs in the job process's main thread, which owns its signals
    ws.write({"ck/s@v1": {"step": "usersteps:stop_self", "config": {"signal": "SIGTERM"}}})
    proc = ws.snakemake(check=False)
    assert proc.returncode != 0
    folder = Path(ws.prefix) / "ck/s/v1"
    (failure,) = [json.loads(f.read_text()) for f in (folder / ".failures").glob("*.json")]
    assert failure["error"]["type"] == "JobTerminated" and failure["error"]["exit_status"] == "SIGTERM"
    assert (folder / "partial.txt").read_text() == "half"  # finished data is kept
    assert not (folder / ".artifact.json").exists()


def test_a_step_function_that_does_not_exist_is_refused_at_load_naming_it(ws):
    ws.write({"ck/m@v1": {"step": "usersteps:no_such_function", "config": {}}})
    proc = ws.snakemake(check=False)
    assert proc.returncode != 0 and "ck/m@v1: step: module 'usersteps' (" in proc.stderr
    assert "defines no function 'no_such_function'" in proc.stderr
    assert not (Path(ws.prefix) / "ck/m/v1").exists()  # found before anything ran


def test_a_key_of_long_segments_is_planned_and_built(ws):
    # each segment may be 200 characters, the whole name/version 512 bytes (the longest
    # key, built here): the rules' key regex was built one recursion level per character
    # and failed with RecursionError on 3 x 200
    key = "x" * 200 + "/" + "y" * 200 + "/" + "z" * 107 + "@v1"
    ws.write({key: {"step": "usersteps:make", "config": {"text": "long"}}, "side/d@v1": {"step": "usersteps:make"}})
    ws.snakemake()
    assert ws.record(key)["status"] == "success"


def test_drift_warns_once_in_dry_run_dag_rulegraph_and_run_without_rebuilding(built):
    ws = built
    before = ws.record("mid/b@v1")
    ws.write(chain(text_b="B", extra_b={"lr": 0.1}))
    head = "mid/b@v1: recipe drift: recorded fingerprint "
    for args in (["-n"], ["--dag"], ["--rulegraph"], []):
        proc = ws.snakemake(*args)
        assert proc.stderr.count(head) == 1, (args, proc.stderr)
        assert "serving the cached output. Bump the version to build the new recipe." in proc.stderr
        assert "  text: b -> B" in proc.stderr and "  lr (added)" in proc.stderr
        assert head not in proc.stdout
        if args in (["--dag"], ["--rulegraph"]):
            assert proc.stdout.lstrip().startswith("digraph") and proc.stdout.rstrip().endswith("}")
        else:
            assert nothing_to_do(proc)
    assert ws.record("mid/b@v1") == before


def test_drift_warnings_show_control_and_bidi_characters_of_a_record_escaped(built):
    ws = built
    record = ws.record("mid/b@v1")  # a shared prefix's record, edited by someone else
    record["config"]["text"] = "b\x1b[2J\n  n: 1 -> 1\u202eé中"
    storage.write_json_atomic(ws.record_path("mid/b@v1"), record)
    ws.write(chain(text_b="B"))
    proc = ws.snakemake("-n")
    assert "  text: b\\x1b[2J\\n  n: 1 -> 1\\u202eé中 -> B" in proc.stderr.splitlines()
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
    assert not any(line.startswith("  n: 1 -> 1") for line in proc.stderr.splitlines())  # no forged line


@pytest.mark.parametrize("edit,line", [
    (lambda r: r["deps"]["src"].update(version="v0"), "deps.src: raw/a@v0 -> raw/a@v1"),
    (lambda r: r.update(step="usersteps:fail"), "step: usersteps:fail -> usersteps:make"),
    (lambda r: r["config"].update(text="z"), "text: z -> b"),
], ids=["deps", "step", "config"])  # fmt: skip
def test_a_record_edited_so_its_recipe_fields_no_longer_match_is_drift_as_an_edited_fingerprint_is(
    built, capsys, monkeypatch, edit, line
):
    from marin_rules.cli import main

    ws = built
    monkeypatch.syspath_prepend(str(ws.root))  # the user step module, as `marin` finds it
    record = ws.record("mid/b@v1")  # its fingerprint kept: still the recipe's
    edit(record)
    storage.write_json_atomic(ws.record_path("mid/b@v1"), record)
    proc = ws.snakemake("-n")
    lines = proc.stderr.splitlines()
    head = lines.index(f"mid/b@v1: recipe drift: its recorded fields disagree with its fingerprint {record['fingerprint']}, "
                       "the recipe's now;")  # fmt: skip
    assert f"  {line}" in lines[head:] and any("was the record edited?" in l for l in lines[head:])
    assert nothing_to_do(proc)  # served as built, as drift is: nothing rebuilt
    assert main(["status", "--configfile", str(ws.root / "exp.yaml"), "--prefix", ws.prefix, "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["key"] == "mid/b@v1")
    assert row["state"] == "drifted" and row["reason"].startswith(f"1 field differs from the recipe ({line})")
    assert "was the record edited?" in row["reason"]
    pinned = chain()
    pinned["mid/b@v1"]["expect_fingerprint"] = record["fingerprint"]  # the pin matches the fingerprint, not the fields
    ws.write(pinned)
    proc = ws.snakemake("-n", check=False)
    assert proc.returncode != 0 and f"marin-rules: mid/b@v1: recipe drift on a pinned artifact" in proc.stderr


def test_no_rebuild_on_newer_upstream_or_changed_step_code(built):
    ws = built
    top = ws.record("top/c@v1")
    later = os.path.getmtime(ws.record_path("top/c@v1")) + 100
    os.utime(ws.record_path("mid/b@v1"), (later, later))  # upstream newer than consumer
    os.utime(Path(ws.prefix) / "mid/b/v1/data.txt", (later, later))
    with open(ws.root / "usersteps.py", "a") as f:
        f.write("\n# a code change\n")
    assert nothing_to_do(ws.snakemake("-n"))
    assert nothing_to_do(ws.snakemake())
    assert ws.record("top/c@v1") == top


def test_upstream_rebuilt_with_new_recipe_gets_one_line_advisory(built):
    ws = built
    ws.write(chain(text_b="B"))
    ws.snakemake("-f", ws.record_path("mid/b@v1"))  # rebuild just the upstream, new recipe
    assert ws.record("mid/b@v1")["config"]["text"] == "B"
    proc = ws.snakemake("-n")
    lines = [l for l in proc.stderr.splitlines() if l.startswith("top/c@v1: upstream mid/b@v1 was rebuilt")]
    assert len(lines) == 1 and "serving the cached output" in lines[0]
    assert nothing_to_do(proc)
    assert "mid/b@v1: recipe drift" not in proc.stderr  # its record matches the recipe now


def test_upstream_forced_with_the_same_recipe_gets_the_advisory_too(built):
    ws = built
    ws.snakemake("-f", ws.record_path("mid/b@v1"))  # same recipe, rebuilt: its data may differ
    proc = ws.snakemake("-n")
    lines = [l for l in proc.stderr.splitlines() if l.startswith("top/c@v1: upstream mid/b@v1 was rebuilt")]
    assert len(lines) == 1 and "same recipe" in lines[0] and "serving the cached output" in lines[0]
    assert nothing_to_do(proc)


def test_new_upstream_version_does_not_rebuild_built_consumer(built):
    ws = built
    art = chain()
    art["mid/b@v2"] = {**art["mid/b@v1"], "config": {"text": "b2"}}
    art["top/c@v1"]["deps"] = {"src": "mid/b@v2"}
    ws.write(art)
    proc = ws.snakemake()
    assert "top/c@v1: recipe drift" in proc.stderr and "deps.src: mid/b@v1 -> mid/b@v2" in proc.stderr
    assert ws.record("mid/b@v2")["config"]["text"] == "b2"  # the new version is built
    assert (Path(ws.prefix) / "top/c/v1/data.txt").read_text() == "c|b|a"  # the consumer is served


def test_pinned_fingerprint_turns_drift_into_an_error(built):
    ws = built
    art = chain()
    pinned = ws.record("mid/b@v1")["fingerprint"]
    art["mid/b@v1"]["expect_fingerprint"] = pinned
    ws.write(art)
    assert nothing_to_do(ws.snakemake("-n"))  # the pin holds
    art["mid/b@v1"]["config"]["text"] = "changed"
    ws.write(art)
    proc = ws.snakemake("-n", check=False)
    assert proc.returncode != 0
    assert f"mid/b@v1: expect_fingerprint: pinned {pinned} but the recipe fingerprints to" in proc.stderr


def test_forcerun_record_rebuilds_it_and_its_consumers_only(built):
    ws = built
    times = {k: started(ws, k) for k in chain()}
    ws.snakemake("--forcerun", ws.record_path("mid/b@v1"))
    assert started(ws, "raw/a@v1") == times["raw/a@v1"] and started(ws, "side/d@v1") == times["side/d@v1"]
    assert started(ws, "mid/b@v1") != times["mid/b@v1"] and started(ws, "top/c@v1") != times["top/c@v1"]
    (old,) = (Path(ws.prefix) / "mid/b/v1/.history").glob("*/.artifact.json")  # the old build, moved whole
    assert json.loads(old.read_text())["provenance"]["started"] == times["mid/b@v1"]
    assert (old.parent / "data.txt").read_text() == "b|a"


def test_forcerun_rule_and_forceall_rebuild_every_job(built):
    ws = built
    times = {k: started(ws, k) for k in chain()}
    ws.snakemake("-R", "custom")
    assert all(started(ws, k) != t for k, t in times.items())
    times = {k: started(ws, k) for k in chain()}
    proc = ws.snakemake("-F", "-n")
    assert all(f"artifact={Path(k.replace('@', '/'))}" in proc.stdout for k in times)


def test_forced_rebuild_that_fails_puts_the_previous_build_back(ws):
    ws.write({"ck/f@v1": {"step": "usersteps:fail", "config": {"ok": True}}})
    ws.snakemake()
    good = ws.record("ck/f@v1")
    folder = Path(ws.prefix) / "ck/f/v1"
    data = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".artifact.json"}
    ws.write({"ck/f@v1": {"step": "usersteps:fail", "config": {"ok": True}, "deps": {}}})
    (ws.root / "usersteps.py").write_text(STEPS.replace('if not ctx.config.get("ok")', "if True"))
    proc = ws.snakemake("-F", check=False)
    assert proc.returncode != 0
    assert ws.record("ck/f@v1") == good  # the previous build serves again, files and all
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".artifact.json"} == data
    assert [p.name.endswith("-failed") for p in (folder / ".history").iterdir()] == [True]  # what the attempt left
    assert len(list((folder / ".failures").glob("*.json"))) == 1
    assert nothing_to_do(ws.snakemake())


def test_dag_labels_show_name_at_version(ws):
    # Snakemake labels jobs by their wildcards; marin_rules/workflow/dag_labels.py turns
    # `artifact: name/version` into `artifact: name@version` (tests/test_dag_labels.py)
    ws.write(chain())
    proc = ws.snakemake("--dag")
    assert proc.stdout.lstrip().startswith("digraph")
    labels = re.findall(r'label = "([^"]*)"', proc.stdout)
    for key in chain():
        assert any(f"artifact: {key}" in label for label in labels), (key, labels)
    assert "marin" not in proc.stdout.lower().split("digraph", 1)[0]  # nothing printed before the graph


def test_target_config_builds_one_artifact_and_its_upstreams(ws):
    ws.write(chain())
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=mid/b@v1")
    assert (Path(ws.prefix) / "mid/b/v1/.artifact.json").exists()
    assert (Path(ws.prefix) / "raw/a/v1/.artifact.json").exists()
    assert not (Path(ws.prefix) / "top/c/v1").exists() and not (Path(ws.prefix) / "side/d/v1").exists()


def test_configfile_and_config_experiment_select_one_experiment_never_merged(ws):
    ws.write(chain())
    ws.write({"solo/x@v1": {"step": "usersteps:make", "config": {"text": "x"}}}, name="other.yaml")
    proc = ws.snakemake("-n", exp="other.yaml")
    assert "solo/x/v1" in proc.stdout and "raw/a/v1" not in proc.stdout
    proc = ws._run("-n", "--config", "experiment=other.yaml", f"prefix={ws.prefix}", cwd=ws.root, env=ws.env)
    assert "solo/x/v1" in proc.stdout and "raw/a/v1" not in proc.stdout
    proc = ws._run("-n", "--configfile", "other.yaml", "--config", "experiment=other.yaml", cwd=ws.root, env=ws.env)
    assert "solo/x/v1" in proc.stdout
    proc = ws._run("-n", "--configfile", "exp.yaml", "--config", "experiment=other.yaml", cwd=ws.root, env=ws.env, check=False)
    assert proc.returncode != 0 and "name different experiments" in proc.stderr
    # with -d a relative experiment= is read in that folder (--configfile where snakemake started): said so
    (ws.root / "elsewhere").mkdir()
    proc = ws._run("-n", "-d", "elsewhere", "--config", "experiment=other.yaml", cwd=ws.root, env=ws.env, check=False)
    assert proc.returncode != 0 and (f"marin-rules: --config experiment=other.yaml: no such file in the working "
                                     f"directory {ws.root / 'elsewhere'} (a relative path is read there") in proc.stderr  # fmt: skip
    # two experiment files: one line, whether given to one --configfile (Snakemake would merge
    # them) or to a repeated one (Snakemake would keep the last); one file given twice is one
    for two in (["--configfile", "exp.yaml", "other.yaml"], ["--configfile", "exp.yaml", "--configfile=other.yaml"]):
        proc = ws._run("-n", *two, cwd=ws.root, env=ws.env, check=False)
        assert proc.returncode != 0, two
        assert "marin-rules: more than one experiment --configfile given (" in proc.stderr and "pick one" in proc.stderr
        assert "Traceback" not in proc.stderr and "--config artifacts" not in proc.stderr
    proc = ws._run("-n", "--configfile", "other.yaml", "--configfile", str(ws.root / "other.yaml"), cwd=ws.root, env=ws.env)
    assert "solo/x/v1" in proc.stdout


def test_configfile_with_a_misspelled_top_level_key_is_an_error_not_the_default_experiment(ws):
    (ws.root / "typo.yaml").write_text(yaml.safe_dump({"artifact": {"solo/x@v1": {"step": "usersteps:make"}}}))
    proc = ws.snakemake("-n", exp="typo.yaml", check=False)
    assert proc.returncode != 0 and "unknown top-level key 'artifact'" in proc.stderr
    assert "shakespeare" not in proc.stdout  # the default experiment was not planned
    # a configfile that only sets the glue's own keys is plain config, not an experiment
    (ws.root / "where.yaml").write_text(yaml.safe_dump({"prefix": ws.prefix}))
    ws.write({"solo/x@v1": {"step": "usersteps:make", "config": {"text": "x"}}})
    proc = ws._run("-n", "--configfile", "where.yaml", "--config", "experiment=exp.yaml", cwd=ws.root, env=ws.env)
    assert "solo/x/v1" in proc.stdout


def test_unknown_target_is_one_line(ws):
    ws.write(chain())
    proc = ws.snakemake("-n", "--config", "target=raw/nope@v1", check=False)
    lines = [l for l in proc.stderr.splitlines() if "target=raw/nope@v1" in l]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("marin-rules: ")
    assert "Traceback" not in proc.stderr and "File " not in proc.stderr


@pytest.mark.parametrize(
    "artifacts,message",
    [
        ({"raw/a@v1": {"step": "no.such.module:fn"}}, None),
        ({"raw/a@v1": {"step": "nosuchstep"}}, "raw/a@v1: step: expected a built-in step"),
        ({"raw/a@v1": {"step": "usersteps:make", "deps": {"src": "raw/zzz@v1"}}}, "raw/a@v1: deps.src: raw/zzz@v1 is not defined"),
        ({"raw/../a@v1": {"step": "usersteps:make"}}, "bad artifact name"),
        ({"tok/t@v1": {"step": "train_tokenizer", "config": {"vocab_size": 10}, "deps": {"corpus": "raw/a@v1"}},
          "raw/a@v1": {"step": "download"}}, "tok/t@v1: config.vocab_size"),
    ],
)  # fmt: skip
def test_bad_input_exits_nonzero_with_one_line_and_writes_nothing(ws, artifacts, message):
    ws.write(artifacts)
    proc = ws.snakemake("-n" if message else "", check=False) if message else ws.snakemake(check=False)
    assert proc.returncode != 0
    if message:
        lines = [l for l in proc.stderr.splitlines() if message in l]
        assert len(lines) == 1 and lines[0].startswith("marin-rules: "), proc.stderr
        assert "Traceback" not in proc.stderr
    else:
        assert "no.such.module" in proc.stderr
    assert not list(Path(ws.prefix).rglob(".artifact.json"))


def test_marin_status_shows_built_drifted_missing_and_failed(ws, monkeypatch):
    from marin_rules.cli import main

    monkeypatch.chdir(ws.root)  # as a user runs it: user steps are found from the workflow folder
    art = chain()
    art["ck/f@v1"] = {"step": "usersteps:fail"}
    ws.write(art)
    ws.snakemake("--keep-going", check=False)
    art["side/d@v1"]["config"]["text"] = "D"
    art["new/e@v1"] = {"step": "usersteps:make"}
    ws.write(art)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", str(ws.root / "exp.yaml"), "--prefix", ws.prefix]) == 0
    rows = {line.split()[0]: line for line in out.getvalue().splitlines()[1:]}
    assert " built " in rows["raw/a@v1"] and ws.record("raw/a@v1")["fingerprint"] in rows["raw/a@v1"]
    assert " drifted " in rows["side/d@v1"]
    assert " missing " in rows["new/e@v1"]
    assert " failed " in rows["ck/f@v1"]
    assert re.search(r"\d+\.\ds", rows["raw/a@v1"])


def test_remote_prefix_builds_on_gcs_and_serves_cache(ws, gcs_prefix, gcs_env):
    ws.write(chain())
    ws.snakemake(prefix=gcs_prefix, env=gcs_env)
    rec = ws.record("top/c@v1", prefix=gcs_prefix)
    assert rec["path"] == "top/c/v1"
    assert storage.read_text(f"{gcs_prefix}/top/c/v1/data.txt") == "c|b|a"
    assert not (Path(ws.prefix)).exists()
    import shutil

    shutil.rmtree(ws.root / ".snakemake")  # a fresh machine: nothing local, records only on the bucket
    assert nothing_to_do(ws.snakemake("-n", prefix=gcs_prefix, env=gcs_env))


def test_unknown_config_key_is_one_line_with_the_nearest_key_and_writes_nothing(ws):
    ws.write(chain())
    proc = ws._run("--configfile", "exp.yaml", "--config", f"prefx={ws.prefix}", cwd=ws.root, env=ws.env, check=False)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "--config prefx=...: unknown key (did you mean prefix?)" in lines[0] and ws.prefix not in lines[0]
    assert not (ws.root / "artifacts").exists() and not Path(ws.prefix).exists()


def test_prefix_that_is_a_file_is_refused_in_one_line(ws):
    ws.write(chain())
    (ws.root / "afile").write_text("not a folder")
    proc = ws.snakemake(prefix=str(ws.root / "afile" / "sub"), check=False)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
    assert proc.returncode != 0 and len(lines) == 1 and "afile is a file, not a folder" in lines[0], proc.stderr
    assert (ws.root / "afile").read_text() == "not a folder" and not list(ws.root.rglob(".artifact.json"))


def test_target_without_a_version_suggests_name_at_version(ws):
    ws.write(chain())
    proc = ws.snakemake("--config", f"prefix={ws.prefix}", "target=mid/b", check=False)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
    assert proc.returncode != 0 and len(lines) == 1 and "(did you mean mid/b@v1?)" in lines[0], proc.stderr
    assert not Path(ws.prefix).exists()


def test_command_line_kept_in_records_redacts_secret_looking_values():
    from marin_rules.workflow.options import redact_command

    argv = ["snakemake", "--config", "prefix=/a", "hf_token=abc123", "db_password=pw", "--storage-s3-secret-key",
            "SK", "--api-key=K2", "--config=my_secret=S3", "-n"]  # fmt: skip
    shown = " ".join(redact_command(argv))
    for secret in ("abc123", "=pw", " SK", "K2", "S3"):
        assert secret not in shown, shown
    assert "prefix=/a" in shown and "hf_token=<redacted>" in shown and shown.endswith("-n")
    # Snakemake's short -C: separate, attached (-CKEY=V) and -C=KEY=V
    short = ["snakemake", "-C", "target=a@v2", "hf_token=T1", "api_key=T2", "-Cmy_token=T3", "-C=db_secret=T4", "-n"]
    assert redact_command(short) == ["snakemake", "-C", "target=a@v2", "hf_token=<redacted>", "api_key=<redacted>",
                                     "-Cmy_token=<redacted>", "-C=db_secret=<redacted>", "-n"]  # fmt: skip


def test_a_user_step_module_beside_the_snakefile_is_found_by_planning_and_by_the_jobs(tmp_path):
    # planning searched the Snakefile's folder (Snakemake puts it on sys.path), the jobs
    # did not: `-s elsewhere/Snakefile` planned fine, then every job failed
    import shutil
    import subprocess

    from conftest import REPO, SNAKEMAKE

    workflow = tmp_path / "wf"
    workflow.mkdir()
    shutil.copy(REPO / "Snakefile", workflow / "Snakefile")
    shutil.copytree(REPO / "rules", workflow / "rules")
    (workflow / "besidesteps.py").write_text("def make(ctx):\n    return {'made': True}\n")
    (workflow / "exp.yaml").write_text(yaml.safe_dump({"artifacts": {"raw/b@v1": {"step": "besidesteps:make"}}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [SNAKEMAKE, "-s", str(workflow / "Snakefile"), "--configfile", str(workflow / "exp.yaml"),
               "--config", f"prefix={tmp_path / 'art'}", "--cores", "1",
               "--workflow-profile", str(REPO / "profiles" / "default")]  # a copied Snakefile: not beside it  # fmt: skip
    proc = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert storage.read_json(str(tmp_path / "art/raw/b/v1/.artifact.json"))["result"] == {"made": True}


def test_rerun_triggers_beyond_mtime_are_refused_before_any_job_runs(ws):
    """Params carry the run's command line, so under a params trigger Snakemake would
    rerun every built artifact's job and leave out the jobs after them: refused."""
    ws.write({"raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}}})
    ws.snakemake()
    before = started(ws, "raw/a@v1")
    proc = ws.snakemake("-j2", "--rerun-triggers", "params", check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("marin-rules: ")]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith(
        "marin-rules: rerun-triggers is params here, but marin-rules needs mtime alone"), proc.stderr[-3000:]
    assert started(ws, "raw/a@v1") == before  # nothing ran


def test_a_lossy_tokenizer_noted_in_a_result_is_told_on_the_console(ws):
    with open(ws.root / "usersteps.py", "a") as f:
        f.write("\n\ndef lossy(ctx):\n    return {'bpb': {'lossless': False, 'lossless_example': 'text 1: x'}}\n")
    ws.write({"raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}}, "ev/l@v1": {"step": "usersteps:lossy"}})
    console = ws.snakemake().stderr
    notes = [line for line in console.splitlines() if "losslessly" in line]
    assert notes == ["ev/l@v1: note: its tokenizer does not encode texts losslessly (text 1: x): bits per byte, and "
                     "perplexity compared across tokenizers, will not be meaningful; for those use a byte-level "
                     "tokenizer (train one with vocab_size)"]  # fmt: skip


def test_a_working_directory_or_experiment_file_with_braces_is_refused_in_one_line(tmp_path, snakemake_cmd):
    braced = tmp_path / "w{d}"
    braced.mkdir()
    experiment = braced / "exp.yaml"
    experiment.write_text(yaml.safe_dump({"artifacts": {"raw/a@v1": {"step": "download", "config": {"source": "package:shakespeare"}}}}))
    elsewhere = tmp_path / "plain"
    elsewhere.mkdir()
    cases = [  # (where snakemake runs, its arguments, the path named)
        (elsewhere, ["--configfile", str(experiment), "--config", f"prefix={elsewhere / 'art'}"], f"the experiment file {experiment}"),
        (braced, ["--configfile", "exp.yaml"], f"the experiment file {experiment}"),
    ]
    (elsewhere / "exp.yaml").write_text(experiment.read_text())
    cases.append((braced, ["--configfile", str(elsewhere / "exp.yaml")], f"the prefix {braced / 'artifacts'}"))
    for cwd, args, named in cases:
        proc = snakemake_cmd("-n", *args, cwd=cwd, check=False)
        assert proc.returncode != 0
        lines = [line for line in proc.stderr.splitlines() if "holds a brace" in line]
        assert lines == [f"marin-rules: {named} holds a brace, which Snakemake reads as a wildcard; use a path without braces "
                         "(a relative prefix or experiment lies under the working directory)"], proc.stderr  # fmt: skip
        assert "WildcardError" not in proc.stderr


def test_a_missing_config_experiment_is_named_for_what_it_is(tmp_path):
    from marin_rules.artifacts.errors import MarinError
    from marin_rules.workflow.options import select_experiment

    cases = {
        "exp.yaml": f"--config experiment=exp.yaml: no such file in the working directory {tmp_path} (a relative",
        str(tmp_path / "nope.yaml"): f"--config experiment={tmp_path / 'nope.yaml'}: no such file",
        "gs://bucket/exp.yaml": "--config experiment=gs://bucket/exp.yaml: an experiment file is read from this machine",
        "a\x1b[2Jb.yaml": "--config experiment=a\\x1b[2Jb.yaml: no such file in the working directory",
    }
    for chosen, start in cases.items():
        with pytest.raises(MarinError) as error:
            select_experiment({"experiment": chosen}, [], str(tmp_path), str(tmp_path))
        assert str(error.value).startswith(start), str(error.value)
