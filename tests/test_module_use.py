"""marin-rules from a user's own Snakefile: as a Snakemake `module`, or by `include:`.

Real `snakemake` runs of a user's Snakefile in a throwaway folder. Under
`use rule * from marin as marin_*` our rules carry the prefixed names, and the command
line names them so (`-R marin_custom`): forcing by that name rebuilds. Snakemake
finds the workflow profile (`profiles/default`: `rerun-triggers: mtime` and the
incomplete-file settings) beside the main Snakefile or in the working directory only,
so a user's Snakefile runs without it: one warning line says which keys are missing
and how to add them, and `--workflow-profile <marin-rules>/profiles/default` does.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from conftest import REPO, SNAKEMAKE

PROFILE = REPO / "profiles" / "default"
WARNING = "marin-rules: warning: this run lacks settings of marin-rules' workflow profile"


def _user_workflow(root: Path, snakefile: str) -> dict:
    """A user's folder: their Snakefile, a step, an experiment; returns the environment."""
    (root / "Snakefile").write_text(snakefile)
    (root / "mysteps.py").write_text("def fast(ctx):\n    return {'ok': True}\n")
    (root / "exp.yaml").write_text(yaml.safe_dump({"artifacts": {"feat/a@v1": {"step": "mysteps:fast"}}}))
    return {**os.environ, "PYTHONPATH": str(root)}


def _snakemake(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([SNAKEMAKE, "--configfile", "exp.yaml", "--cores", "1", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


MODULE = f'module marin:\n    snakefile: "{REPO / "Snakefile"}"\n    config: config\n\nuse rule * from marin as marin_*\n'


def test_forcing_a_rule_by_its_module_prefixed_name_rebuilds_the_artifact(tmp_path):
    env = _user_workflow(tmp_path, MODULE)
    profile = ["--workflow-profile", str(PROFILE)]
    _snakemake(tmp_path, env, *profile)
    folder = tmp_path / "artifacts/feat/a/v1"
    old = json.loads((folder / ".artifact.json").read_text())
    forced = _snakemake(tmp_path, env, *profile, "-R", "marin_custom")
    out = forced.stdout + forced.stderr
    assert "built already" not in out, out[-4000:]
    (moved,) = [p for p in (folder / ".history").iterdir() if p.is_dir()]
    assert json.loads((moved / ".artifact.json").read_text())["provenance"] == old["provenance"]  # kept
    assert json.loads((folder / ".artifact.json").read_text())["provenance"]["started"] > old["provenance"]["started"]
    assert not (folder / ".history/.forced-record").exists()


def test_a_run_without_the_workflow_profile_says_once_which_settings_it_lacks(tmp_path):
    env = _user_workflow(tmp_path, MODULE)
    bare = _snakemake(tmp_path, env, "-n")
    lines = [line for line in bare.stderr.splitlines() if line.startswith(WARNING)]
    assert lines == [
        f"{WARNING} (rerun-triggers: mtime; keep-incomplete: true; ignore-incomplete: true): the jobs of finished "
        "artifacts, and rules that use their records, run again when params or code change (\"Params have "
        "changed\"); a failed job may delete a record another run on the prefix just wrote; add --workflow-profile "
        f"{PROFILE}, or copy those keys into your own profile"
    ]
    with_profile = _snakemake(tmp_path, env, "-n", "--workflow-profile", str(PROFILE))
    assert WARNING not in with_profile.stderr
    included = tmp_path / "included"
    included.mkdir()
    env = _user_workflow(included, f'include: "{REPO / "Snakefile"}"\n')
    profile = ["--workflow-profile", str(PROFILE)]
    triggers = _snakemake(included, env, "all", "-n", *profile, "--rerun-triggers", "mtime", "params")
    (line,) = [line for line in triggers.stderr.splitlines() if line.startswith("marin-rules: warning: rerun")]
    assert line == (
        "marin-rules: warning: rerun-triggers is mtime params here, but marin-rules needs mtime (as its workflow "
        f"profile {PROFILE} sets it; the command line or another profile overrides it): the jobs of finished "
        "artifacts, and rules that use their records, run again when params or code change (\"Params have "
        "changed\"); drop that setting, or set it to mtime"
    )


def test_an_experiment_read_by_the_users_configfile_directive_is_refused_naming_the_directive(tmp_path):
    # Snakemake's `configfile:` fills `config` with the experiment's sections, which our
    # Snakefile would otherwise take for `--config artifacts=...` on the command line
    env = _user_workflow(tmp_path, 'configfile: "exp.yaml"\n\n' + MODULE)
    proc = subprocess.run([SNAKEMAKE, "-n", "--cores", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        "marin-rules: configfile: exp.yaml: an experiment's 'artifacts:' came from a Snakefile's configfile: "
        "directive, which marin-rules does not read experiments from; give the file with --configfile exp.yaml\n"
    ) in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "artifacts").exists()
    _snakemake(tmp_path, env, "-n")  # the fix it names (with the directive still there) plans


def test_the_users_own_config_keys_and_config_file_pass_through_our_module(tmp_path):
    # the README's module block hands the whole `config` on: a key of the user's own
    # rules, and a --configfile of theirs without an experiment's fields, are theirs
    rule = ('rule mine:\n    input: "artifacts/feat/a/v1/.artifact.json"\n    output: "mine.txt"\n'
            '    shell: "echo {config[my_threshold]} {config[my_name]} > {output}"\n')  # fmt: skip
    env = _user_workflow(tmp_path, MODULE + "\n" + rule)
    (tmp_path / "mine.yaml").write_text("my_name: alice\n")
    profile = ["--workflow-profile", str(PROFILE)]
    proc = subprocess.run(
        [SNAKEMAKE, "--configfile", "exp.yaml", "mine.yaml", "--config", "my_threshold=3", "--cores", "1", *profile,
         "mine"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "mine.txt").read_text() == "3 alice\n"
    assert "warning: --config my_threshold" not in proc.stderr  # nothing like a key of ours
    typo = _snakemake(tmp_path, env, *profile, "-n", "--config", "prefx=elsewhere")
    assert ("marin-rules: warning: --config prefx=...: not a marin-rules key (did you mean prefix?); left to your "
            "workflow") in typo.stderr
    assert json.loads((tmp_path / "artifacts/feat/a/v1/.artifact.json").read_text())["result"] == {"ok": True}
    # run as the main Snakefile, the same unknown key is still refused (a typo of ours, say)
    (tmp_path / "plain").mkdir()
    env = _user_workflow(tmp_path / "plain", "")
    typo = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", "exp.yaml", "--config",
                           "my_threshold=3", "-n"], cwd=tmp_path / "plain", env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert typo.returncode != 0 and "--config my_threshold=...: unknown key" in typo.stdout + typo.stderr


def test_no_experiment_named_in_a_users_workflow_is_one_line_saying_how_to_name_one(tmp_path):
    """The default experiment is experiments/default.yaml beside the main Snakefile (the
    user's): without it and without --configfile, one line says both ways out."""
    env = _user_workflow(tmp_path, MODULE)
    proc = subprocess.run([SNAKEMAKE, "-n", "--cores", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        f"marin-rules: no experiment named, and none at {tmp_path / 'experiments' / 'default.yaml'} beside your "
        "Snakefile: give one with --configfile FILE (or --config experiment=FILE), or write experiments/default.yaml there\n"
    ) in proc.stderr, proc.stderr[-3000:]
    (tmp_path / "experiments").mkdir()
    (tmp_path / "exp.yaml").rename(tmp_path / "experiments" / "default.yaml")
    proc = subprocess.run([SNAKEMAKE, "-n", "--cores", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "feat/a/v1" in proc.stdout, proc.stderr[-3000:]
