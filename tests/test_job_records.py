"""Records you can trust, in real runs: a corrupt record is never served (`-n` and real
runs stop with its one-line message, no consumer builds), a consumer checks its
upstreams' files before it starts, a moved prefix stays valid, and a pinned artifact
whose record drifted is an error."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SNAKEMAKE
from test_workflow import built, built_chain, chain, nothing_to_do, ws  # noqa: F401 (fixtures)


def _two(ws):
    art = {k: v for k, v in chain().items() if k in ("raw/a@v1", "mid/b@v1")}
    ws.write(art)
    return art


@pytest.mark.parametrize(
    "corrupt,problem",
    [
        (lambda rec: "{not json", "not valid JSON"),
        (lambda rec: json.dumps({k: v for k, v in rec.items() if k != "fingerprint"}), "missing field fingerprint"),
        (lambda rec: json.dumps({**rec, "name": "raw/zz", "path": "raw/zz/v1"}), "sits where raw/a@v1 belongs"),
    ],
    ids=["bad-json", "missing-field", "wrong-name"],
)
def test_corrupt_upstream_record_is_never_served(ws, corrupt, problem):
    art = _two(ws)
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=raw/a@v1")
    path = Path(ws.record_path("raw/a@v1"))
    path.write_text(corrupt(json.loads(path.read_text())))
    ws.write(art)
    for args in (["-n"], []):
        proc = ws.snakemake(*args, check=False)
        lines = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
        assert proc.returncode != 0 and len(lines) == 1, (args, proc.stderr)
        assert str(path) in lines[0] and problem in lines[0] and "Traceback" not in proc.stderr
    assert not (Path(ws.prefix) / "mid/b/v1").exists()  # no consumer built on it


def test_a_corrupt_records_rebuild_command_runs_as_printed_from_another_directory(ws):
    _two(ws)
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=raw/a@v1")
    path = Path(ws.record_path("raw/a@v1"))
    path.write_text("{not json")
    proc = ws.snakemake("-n", check=False)
    (line,) = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
    printed = line.split("; delete it and rebuild the artifact with: ")[1]
    # the run used another experiment, prefix and Snakefile than the defaults: the command says so
    assert printed == shlex.join(["snakemake", "-f", str(path), "-s", str(REPO / "Snakefile"), "-d", str(ws.root),
                                  "--configfile", str(ws.root / "exp.yaml"), "--config", f"prefix={ws.prefix}"])  # fmt: skip
    path.unlink()
    elsewhere = ws.root / "elsewhere"
    elsewhere.mkdir()
    planned = subprocess.run([SNAKEMAKE, *shlex.split(printed)[1:], "-n"], cwd=elsewhere, env={**os.environ, **ws.env},
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert str(path) in planned.stdout  # the rebuild is planned


def test_consumer_checks_its_upstreams_files_before_it_starts(ws):
    _two(ws)
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=raw/a@v1")
    (Path(ws.prefix) / "raw/a/v1/data.txt").write_text("")  # truncated (was "a")
    proc = ws.snakemake(check=False)
    assert proc.returncode != 0
    line = "mid/b@v1: upstream raw/a@v1: truncated data.txt: 0 of 1 bytes; rebuild it with: snakemake -f "
    assert line in proc.stdout + proc.stderr
    # the command as printed, with what this run's experiment and prefix need, works
    printed = next(ln for ln in (proc.stdout + proc.stderr).splitlines() if line in ln).split("rebuild it with: ")[1]
    # the run's Snakefile is not ./Snakefile (the tests run `-s <repo>/Snakefile`): -s and -d
    # make the command run from anywhere
    assert printed == shlex.join(["snakemake", "-f", f"{ws.prefix}/raw/a/v1/.artifact.json", "-s",
                                  str(REPO / "Snakefile"), "-d", str(ws.root), "--configfile",
                                  str(ws.root / "exp.yaml"), "--config", f"prefix={ws.prefix}"])  # fmt: skip
    elsewhere = ws.root / "elsewhere"
    elsewhere.mkdir()
    subprocess.run([SNAKEMAKE, *shlex.split(printed)[1:]], cwd=elsewhere, env={**os.environ, **ws.env},
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    assert (Path(ws.prefix) / "raw/a/v1/data.txt").read_text() == "a"
    assert not (Path(ws.prefix) / "mid/b/v1/.artifact.json").exists()
    (failure,) = (Path(ws.prefix) / "mid/b/v1/.failures").glob("*.json")
    assert "truncated data.txt" in json.loads(failure.read_text())["error"]["message"]


def test_a_moved_prefix_stays_valid_and_builds_on_from_there(built):
    ws = built
    moved = ws.root / "moved"
    shutil.move(ws.prefix, moved)
    assert nothing_to_do(ws.snakemake("-n", prefix=str(moved)))
    art = chain()
    art["top/e@v1"] = {"step": "usersteps:make", "deps": {"src": "top/c@v1"}, "config": {"text": "e"}}
    ws.write(art)
    ws.snakemake(prefix=str(moved))
    assert (moved / "top/e/v1/data.txt").read_text() == "e|c|b|a"
    record = json.loads((moved / "top/e/v1/.artifact.json").read_text())
    assert record["deps"]["src"]["path"] == "top/c/v1" and str(ws.root) not in json.dumps(record["deps"])


def test_pinned_artifact_whose_record_drifted_is_an_error(built, monkeypatch):
    from marin_rules.experiment import build_experiment

    ws = built
    monkeypatch.syspath_prepend(str(ws.root))  # the user step module, as the loader finds it
    art = chain(text_b="changed")
    art["mid/b@v1"]["expect_fingerprint"] = build_experiment({"artifacts": art})["mid/b@v1"].fingerprint
    ws.write(art)  # the pin matches the recipe, but not what was built
    proc = ws.snakemake("-n", check=False)
    lines = [l for l in proc.stderr.splitlines() if "recipe drift on a pinned artifact" in l]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("marin-rules: mid/b@v1: "), proc.stderr
    assert ws.record("mid/b@v1")["fingerprint"] in lines[0]


def test_a_job_that_fails_before_its_step_says_why_in_one_line(tmp_path, gcs_env):
    # no bucket: the lease cannot be written (before there was only the log's header, and exit 1)
    import os
    import subprocess
    import sys

    (tmp_path / "steps.py").write_text("def make(ctx):\n    return {}\n")
    (tmp_path / "exp.yaml").write_text('artifacts:\n  raw/a@v1: {step: "steps:make"}\n')
    job = [sys.executable, "-m", "marin_rules.job", "--artifact", "raw/a/v1", "--experiment", "exp.yaml",
           "--prefix", "gs://no-such-bucket/x", "--log", str(tmp_path / "job.log")]  # fmt: skip
    proc = subprocess.run(job, cwd=tmp_path, env={**os.environ, **gcs_env, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()  # the console: one line
    assert line.startswith("marin-rules: raw/a/v1: gs://no-such-bucket/x: cannot reach the storage (NotFound: "), line
    assert "Traceback" in (tmp_path / "job.log").read_text()  # the whole story in the log


READ_WHILE_REBUILT = '''

def read_while_rebuilt(ctx):
    """Reads its upstream, then waits while another run (another machine on the same
    prefix) force-rebuilds that upstream, then writes what it read."""
    import subprocess
    import sys

    text = storage.read_text(storage.join(ctx.deps["src"], "data.txt"))
    subprocess.run([sys.executable, "-m", "snakemake", *ctx.config["rebuild"]], check=True, capture_output=True,
                   timeout=300)
    storage.write_text_atomic(storage.join(ctx.output, "data.txt"), text)
    return {}
'''


def test_a_step_whose_upstream_another_run_rebuilt_meanwhile_records_no_success(ws):
    with open(ws.root / "usersteps.py", "a") as f:
        f.write(READ_WHILE_REBUILT)
    other = ws.root / "other"  # the other run's own working directory, as on another machine
    other.mkdir()
    rebuild = ["-f", ws.record_path("raw/a@v1"), "-s", str(REPO / "Snakefile"), "-d", str(other), "-j1",
               "--configfile", str(ws.root / "exp.yaml"), "--config", f"prefix={ws.prefix}"]  # fmt: skip
    ws.write({
        "raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}},
        "mid/b@v1": {"step": "usersteps:read_while_rebuilt", "deps": {"src": "raw/a@v1"}, "config": {"rebuild": rebuild}},
    })  # fmt: skip
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=raw/a@v1")
    first = ws.record("raw/a@v1")["provenance"]["ended"]
    proc = ws.snakemake(check=False)
    assert proc.returncode != 0
    second = ws.record("raw/a@v1")["provenance"]["ended"]
    assert second != first  # the other run rebuilt the upstream while the step ran
    assert not Path(ws.record_path("mid/b@v1")).exists()
    (failure,) = (Path(ws.prefix) / "mid/b/v1/.failures").glob("*.json")
    message = json.loads(failure.read_text())["error"]["message"]
    assert message == (f"mid/b@v1: upstream raw/a@v1: built {first} then, {second} now: another run rebuilt it while "
                       "this step was reading it, so what the step read may be neither build; no success is "
                       "recorded: run snakemake again once that rebuild has finished")  # fmt: skip
    assert message in proc.stderr
    assert (Path(ws.prefix) / "mid/b/v1/data.txt").read_text() == "a"  # what the step made stays, unrecorded
    # the next run builds the consumer from the upstream as it is now
    (ws.root / "usersteps.py").write_text((ws.root / "usersteps.py").read_text().replace(
        "subprocess.run(", "(lambda *a, **k: None)("))  # fmt: skip
    ws.snakemake()
    assert ws.record("mid/b@v1")["deps"]["src"]["built"] == second


def test_a_step_that_wrote_no_data_files_on_gs_is_recorded_with_a_note_naming_the_storage_helpers(
    ws, gcs_prefix, gcs_env
):
    with open(ws.root / "usersteps.py", "a") as f:
        f.write("\n\ndef nothing(ctx):\n    return {'score': 1}\n")
    ws.write({"raw/a@v1": {"step": "usersteps:make", "config": {"text": "a"}},
              "ck/n@v1": {"step": "usersteps:nothing"}})  # fmt: skip
    proc = ws.snakemake(prefix=gcs_prefix, env=gcs_env)
    record = ws.record("ck/n@v1", prefix=gcs_prefix)
    assert record["files"] == {} and record["result"] == {"score": 1}
    notes = [line for line in proc.stderr.splitlines() if "note: the step wrote no data files" in line]
    assert notes == [f"ck/n@v1: note: the step wrote no data files under {gcs_prefix}/ck/n/v1 (its record holds only "
                     "its result); a step writes through marin_rules.artifacts.storage, since open() or os on a "
                     "gs:// path makes a local folder named gs:"]  # fmt: skip
    # on a local prefix a step that returns only a result is ordinary: no note
    assert "note: the step wrote no data files" not in ws.snakemake().stderr
    assert ws.record("ck/n@v1")["files"] == {}


def test_a_corrupt_record_a_forced_rebuild_replaced_is_history_nothing_to_repair(ws, capsys, monkeypatch):
    from marin_rules.cli import main

    _two(ws)
    monkeypatch.syspath_prepend(str(ws.root))  # the user step module, as `marin` finds it
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=raw/a@v1")
    path = Path(ws.record_path("raw/a@v1"))
    path.write_text("{not json")
    ws.snakemake("-f", str(path), "--config", f"prefix={ws.prefix}", "target=raw/a@v1")  # the fix it names
    assert main(["history", "raw/a@v1", "--configfile", str(ws.root / "exp.yaml"), "--prefix", ws.prefix]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "raw/a@v1: 2 attempts (1 replaced build whose record is unreadable, listed last)"
    (kept,) = (Path(ws.prefix) / "raw/a/v1/.history").glob("*/.artifact.json")
    assert lines[-1].startswith(f"  replaced, its record unreadable: {kept} (not valid JSON (")
    assert lines[-1].endswith("; nothing reads it, nothing to repair") and "repair or delete" not in lines[-1]
