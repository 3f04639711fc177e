"""marin-rules from a user's own Snakefile: as a Snakemake `module`, or by `include:`.

Real `snakemake` runs of a user's Snakefile in a throwaway folder. Under
`use rule * from marin as marin_*` our rules carry the prefixed names, and the command
line names them so (`-R marin_custom`): forcing by that name rebuilds. Snakemake
finds the workflow profile (`profiles/default`: `rerun-triggers: mtime` and the
incomplete-file settings) beside the main Snakefile or in the working directory only,
so a user's Snakefile runs without it: the triggers are refused (Snakemake would leave
artifacts unbuilt), the other keys are one warning line, and
`--workflow-profile <marin-rules>/profiles/default` adds them all.
"""

from __future__ import annotations

import json
import os
import shlex
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


def test_a_run_without_the_workflow_profile_is_refused_for_its_triggers_and_warned_for_the_rest(tmp_path):
    """Snakemake's default rerun-triggers left a requested artifact after a built one
    unbuilt while the run said "100% done" (its `ancient()` inputs' producers rerun for
    params): refused, naming the fix; the incomplete-file settings are a warning."""
    env = _user_workflow(tmp_path, MODULE)
    bare = subprocess.run([SNAKEMAKE, "--configfile", "exp.yaml", "--cores", "1", "-n"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bare.returncode != 0 and "Traceback" not in bare.stderr
    refusal = ("marin-rules: rerun-triggers is mtime params input software-env code here, but marin-rules needs "
               "mtime alone: with other triggers Snakemake runs finished artifacts' jobs again (for their params, "
               "code or inputs) and "
               "leaves out the jobs after them, so an artifact downstream of a built one is never built")  # fmt: skip
    assert f"{refusal}; add --workflow-profile {PROFILE} (or --rerun-triggers mtime)\n" in bare.stderr
    assert not (tmp_path / "artifacts").exists()
    mtime = _snakemake(tmp_path, env, "-n", "--rerun-triggers", "mtime")
    lines = [line for line in mtime.stderr.splitlines() if line.startswith(WARNING)]
    assert lines == [
        f"{WARNING} (keep-incomplete: true; ignore-incomplete: true): a failed job may delete a record another run "
        f"on the prefix just wrote; add --workflow-profile {PROFILE}, or copy those keys into your own profile"
    ]
    with_profile = _snakemake(tmp_path, env, "-n", "--workflow-profile", str(PROFILE))
    assert WARNING not in with_profile.stderr
    included = tmp_path / "included"
    included.mkdir()
    env = _user_workflow(included, f'include: "{REPO / "Snakefile"}"\n')
    profile = ["--workflow-profile", str(PROFILE)]
    triggers = subprocess.run([SNAKEMAKE, "--configfile", "exp.yaml", "--cores", "1", "all", "-n", *profile,
                               "--rerun-triggers", "mtime", "params"], cwd=included, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
    assert triggers.returncode != 0
    assert (f"{refusal.replace('mtime params input software-env code', 'mtime params')}; drop that setting (the "
            f"workflow profile {PROFILE} sets mtime), or set it to mtime\n") in triggers.stderr  # fmt: skip


def test_a_missing_artifact_after_a_built_one_is_built_in_a_users_workflow(tmp_path):
    """The case the trigger refusal guards, run with the workflow profile: the second
    target, downstream of the first (built), is built."""
    env = _user_workflow(tmp_path, MODULE)
    (tmp_path / "mysteps.py").write_text("def fast(ctx):\n    return {'ok': True}\n\n"
                                         "def after(ctx):\n    return {'after': True}\n")  # fmt: skip
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"artifacts": {
        "feat/a@v1": {"step": "mysteps:fast"}, "feat/b@v1": {"step": "mysteps:after", "deps": {"a": "feat/a@v1"}}}}))
    profile = ["--workflow-profile", str(PROFILE)]
    _snakemake(tmp_path, env, *profile, "--config", "target=feat/a@v1")
    _snakemake(tmp_path, env, *profile, "--config", "target=feat/b@v1")
    assert json.loads((tmp_path / "artifacts/feat/b/v1/.artifact.json").read_text())["result"] == {"after": True}


def test_a_suggested_rebuild_command_carries_the_workflow_profile_and_runs_as_printed(tmp_path):
    env = _user_workflow(tmp_path, MODULE)
    profile = ["--workflow-profile", str(PROFILE)]
    _snakemake(tmp_path, env, *profile)
    record = tmp_path / "artifacts/feat/a/v1/.artifact.json"
    record.write_text("{")
    planned = subprocess.run([SNAKEMAKE, "--configfile", "exp.yaml", "-n", *profile], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    (line,) = [l for l in planned.stderr.splitlines() if l.startswith("marin-rules: ")]
    command = line.partition("delete it and rebuild the artifact with: ")[2]
    assert f"--workflow-profile {PROFILE}" in command, line
    # `marin status` in the user's folder (their Snakefile, no profile of their own) suggests it too
    status = subprocess.run([str(Path(SNAKEMAKE).parent / "marin"), "status", "--configfile", "exp.yaml"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert f"-s {tmp_path / 'Snakefile'} -d {tmp_path} --workflow-profile {PROFILE}" in status.stdout + status.stderr
    record.unlink()
    program, *args = shlex.split(command)
    assert program == "snakemake"
    rebuilt = subprocess.run([SNAKEMAKE, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert json.loads(record.read_text())["result"] == {"ok": True}


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
    _snakemake(tmp_path, env, "-n", "--workflow-profile", str(PROFILE))  # the fix it names (directive still there) plans


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


def test_a_users_rule_names_an_artifacts_record_through_record_path_under_any_prefix(tmp_path):
    rule = ('import marin_rules.workflow as marin\n\nrule mine:\n    input: marin.record_path("feat/a@v1")\n'
            '    output: "mine.txt"\n    shell: "cp {input} {output}"\n')  # fmt: skip
    env = _user_workflow(tmp_path, MODULE + "\n" + rule)
    _snakemake(tmp_path, env, "--workflow-profile", str(PROFILE), "mine", "--config", "prefix=elsewhere")
    assert json.loads((tmp_path / "mine.txt").read_text())["result"] == {"ok": True}
    assert (tmp_path / "elsewhere/feat/a/v1/.artifact.json").exists() and not (tmp_path / "artifacts").exists()
    # a wildcard in the key (known per job only): one line saying to give the input as a function
    wild = rule.replace('"feat/a@v1"', '"feat/a@{v}"').replace('"mine.txt"', '"mine-{v}.txt"')
    env = _user_workflow(tmp_path, MODULE + "\n" + wild)
    proc = subprocess.run([SNAKEMAKE, "-n", "--configfile", "exp.yaml", "--workflow-profile", str(PROFILE),
                           "mine-v1.txt"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode != 0 and ("record_path('feat/a@{v}'): takes one artifact's key, and a wildcard has no value "
                                     "while the Snakefile is read; for a wildcard, give the input as a function: "
                                     'lambda w: mr.record_path(f"name@{w.version}")') in proc.stderr, proc.stderr[-2000:]


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
    proc = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "--workflow-profile", str(PROFILE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "feat/a/v1" in proc.stdout, proc.stderr[-3000:]


def test_a_users_first_rule_stays_the_default_target_beside_our_module(tmp_path):
    """Standard Snakemake: the main Snakefile's first rule is the default target. Our
    `all` is first only where our module comes first (or alone)."""
    mine = 'rule mine:\n    output: "mine.txt"\n    shell: "echo > {output}"\n\n'
    env = _user_workflow(tmp_path, mine + MODULE)
    planned = _snakemake(tmp_path, env, "--workflow-profile", str(PROFILE), "-n").stdout
    assert "rule mine:" in planned and "marin_" not in planned, planned
    (tmp_path / "Snakefile").write_text(MODULE + "\n" + mine)
    planned = _snakemake(tmp_path, env, "--workflow-profile", str(PROFILE), "-n").stdout
    assert "rule marin_all:" in planned and "rule mine:" not in planned, planned
