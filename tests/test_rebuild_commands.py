"""Rebuild commands that messages print (`snakemake -f RECORD ...`) run as printed, from
any folder: they name the run's Snakefile and working directory (`-s`, `-d`, absolute),
its experiment (`--configfile`, absolute) and prefix, each quoted for a shell
(`workflow.options.rerun_flags`, `records.rebuild_command`).

Real runs use a project folder of their own (its Snakefile, rules, profiles and
experiments linked from this repository), so a plain `snakemake` there is the
default layout: no -s or -d typed, a relative prefix and a relative --configfile."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SNAKEMAKE
from test_workflow import STEPS, chain

RUN_TIMEOUT = 300


@pytest.fixture
def project(tmp_path) -> Path:
    """A folder laid out as this project is, with the user steps and a two-artifact experiment."""
    root = tmp_path / "proj"
    root.mkdir()
    for name in ("Snakefile", "rules", "profiles", "experiments"):
        (root / name).symlink_to(REPO / name)
    (root / "usersteps.py").write_text(STEPS)
    (root / "exps").mkdir()
    artifacts = {k: v for k, v in chain().items() if k in ("raw/a@v1", "mid/b@v1")}
    (root / "exps/exp.yaml").write_text(yaml.safe_dump({"artifacts": artifacts}))
    return root


def _snakemake(*args: str, cwd: Path, project: Path, check: bool = True) -> subprocess.CompletedProcess:
    """`snakemake ARGS` in `cwd`, as a user types it (no -s), finding the project's user steps."""
    env = {**os.environ, "PYTHONPATH": str(project)}
    proc = subprocess.run([SNAKEMAKE, "-c1", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _printed(text: str, lead: str) -> str:
    """The command after `lead` on the first line holding it, to the end of that line."""
    line = next(ln for ln in text.splitlines() if lead in ln)
    return line.split(lead, 1)[1]


def test_a_rebuild_command_printed_for_a_run_with_relative_paths_runs_from_another_folder(project, tmp_path):
    run = ["--configfile", "exps/exp.yaml", "--config", "prefix=art"]  # both relative to the run's folder
    _snakemake(*run, "target=raw/a@v1", cwd=project, project=project)
    record = project / "art/raw/a/v1/.artifact.json"
    good = record.read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    expected = ["snakemake", "-f", "art/raw/a/v1/.artifact.json", "-s", str(project / "Snakefile"), "-d", str(project),
                "--configfile", str(project / "exps/exp.yaml"), "--config", "prefix=art"]  # fmt: skip

    record.write_text("{not json")  # planning stops on it, naming the command
    printed = _printed(_snakemake("-n", *run, cwd=project, project=project, check=False).stderr,
                       "rebuild the artifact with: ")
    assert shlex.split(printed) == expected
    record.unlink()
    planned = _snakemake(*shlex.split(printed)[1:], "-n", cwd=elsewhere, project=project)
    assert "art/raw/a/v1/.artifact.json" in planned.stdout  # the rebuild is planned, from elsewhere

    record.write_text(good)
    (project / "art/raw/a/v1/data.txt").write_text("")  # truncated: the consumer's job refuses it
    failed = _snakemake(*run, cwd=project, project=project, check=False)
    assert failed.returncode != 0
    printed = _printed(failed.stderr, "rebuild it with: ")  # the command ends the line
    assert shlex.split(printed) == expected
    _snakemake(*shlex.split(printed)[1:], cwd=elsewhere, project=project)  # rebuilds it, from elsewhere
    assert (project / "art/raw/a/v1/data.txt").read_text() == "a"


def test_rebuild_commands_quote_hostile_paths_so_that_a_shell_runs_none_of_them(tmp_path):
    from marin_rules.artifacts.records import CorruptRecord, rebuild_command
    from marin_rules.workflow.options import rerun_flags

    canary = tmp_path / "canary"
    hostile = tmp_path / f"it's $(touch {canary}) `touch {canary}` \"q\" a;b"
    workdir = hostile / "run"
    snakefile = hostile / "Snakefile"
    experiment = hostile / "exp $HOME.yaml"
    prefix = "art's $(x)"
    flags = rerun_flags(str(experiment), prefix, str(hostile), str(snakefile), str(workdir))
    record = f"{prefix}/raw/a/v1/.artifact.json"
    command = rebuild_command(record, flags)
    assert str(CorruptRecord(record, "empty file", flags)).endswith(f"delete it and rebuild the artifact with: {command}")
    # a shell given the command as printed hands each path over as one word, expanding nothing
    shown = subprocess.run(["bash", "-c", "printf '%s\\n' " + command.removeprefix("snakemake ")], capture_output=True,
                           text=True, timeout=30, check=True).stdout.splitlines()  # fmt: skip
    assert shown == ["-f", record, "-s", str(snakefile), "-d", str(workdir), "--configfile", str(experiment),
                     "--config", f"prefix={prefix}"]  # fmt: skip
    assert not canary.exists()


def test_rerun_flags_make_a_relative_experiment_absolute_and_always_name_the_snakefile_and_folder(tmp_path, monkeypatch):
    from marin_rules.workflow.options import rerun_flags

    monkeypatch.chdir(tmp_path)
    flags = rerun_flags("exps/x.yaml", "art", str(tmp_path), str(tmp_path / "Snakefile"), ".")
    assert shlex.split(flags) == ["-s", str(tmp_path / "Snakefile"), "-d", str(tmp_path),
                                  "--configfile", str(tmp_path / "exps/x.yaml"), "--config", "prefix=art"]  # fmt: skip
    default = rerun_flags(str(tmp_path / "experiments/default.yaml"), "artifacts", str(tmp_path), "Snakefile", ".")
    assert shlex.split(default) == ["-s", str(tmp_path / "Snakefile"), "-d", str(tmp_path)]  # the defaults need no more
