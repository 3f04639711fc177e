"""Nothing a user types reaches a shell unquoted: prefix, experiment path, target and
config values holding quotes, `$(...)`, backticks, `;`, spaces or newlines either work
literally or are refused in one line; nothing is executed (a canary file that the
payload would create never appears) and nothing is written outside the prefix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

STEP = "from marin_rules.artifacts import storage\n\ndef make(ctx):\n    storage.write_text_atomic(storage.join(ctx.output, 'data.txt'), str(ctx.config.get('text', '')))\n    return {}\n"
EXPERIMENT = 'artifacts:\n  raw/a@v1: {step: "hsteps:make", config: {text: a}}\n'


def payloads(canary: Path) -> dict[str, str]:
    return {
        "single quote": f"x'$(touch {canary})'",
        "double quote": f'x"$(touch {canary})"',
        "dollar paren": f"x$(touch {canary})",
        "backtick": f"x`touch {canary}`",
        "newline": f"x\ntouch {canary}",
    }


def _setup(tmp_path: Path) -> None:
    (tmp_path / "hsteps.py").write_text(STEP)
    (tmp_path / "exp.yaml").write_text(EXPERIMENT)


def _written(tmp_path: Path) -> list[str]:
    """Files anything wrote besides the test's own inputs and Snakemake's bookkeeping."""
    return [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
            if p.is_file() and p.name not in ("hsteps.py", "exp.yaml") and ".snakemake" not in p.parts
            and "__pycache__" not in p.parts]  # fmt: skip


@pytest.mark.parametrize("kind", ["single quote", "double quote", "dollar paren", "backtick"])
def test_shell_characters_in_prefix_experiment_and_target_are_refused_in_one_line(tmp_path, snakemake_cmd, kind):
    _setup(tmp_path)
    canary = tmp_path / "canary"
    value = payloads(canary)[kind]
    env = {"PYTHONPATH": str(tmp_path)}
    cases = [
        ("--configfile", "exp.yaml", "--config", f"prefix={tmp_path / value}"),
        ("--config", f"experiment={value}.yaml", f"prefix={tmp_path / 'art'}"),
        ("--configfile", "exp.yaml", "--config", f"prefix={tmp_path / 'art'}", f"target={value}"),
    ]
    for args in cases:
        proc = snakemake_cmd(*args, cwd=tmp_path, env=env, check=False)
        lines = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
        assert proc.returncode != 0 and len(lines) == 1 and "are refused" in lines[0], (args, proc.stderr)
        assert re.search(r"--config \w+=[\"'].+ holds ", lines[0]), lines[0]  # the value refused, shown quoted
        assert "Traceback" not in proc.stderr
    assert not canary.exists()
    assert _written(tmp_path) == []


def test_spaces_and_semicolons_in_prefix_and_experiment_path_work_literally(tmp_path, snakemake_cmd):
    _setup(tmp_path)
    canary = tmp_path / "canary"
    (tmp_path / "my exp; v2.yaml").write_text(EXPERIMENT)
    prefix = tmp_path / f"my art; touch {canary}"
    proc = snakemake_cmd("--config", "experiment=my exp; v2.yaml", f"prefix={prefix}",
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 0
    record = json.loads((prefix / "raw/a/v1/.artifact.json").read_text())
    assert record["path"] == "raw/a/v1" and (prefix / "raw/a/v1/data.txt").read_text() == "a"
    assert not canary.exists()
    assert sorted(_written(tmp_path)) == sorted(
        str(p.relative_to(tmp_path)) for p in prefix.rglob("*") if p.is_file()
    ) + ["my exp; v2.yaml"]  # fmt: skip


def test_a_newline_in_a_config_value_is_never_executed(tmp_path, snakemake_cmd):
    # Snakemake parses `--config` values as YAML, which folds a line break into a space:
    # the prefix is then the literal folder "x touch <canary>"
    _setup(tmp_path)
    canary = tmp_path / "canary"
    proc = snakemake_cmd("--configfile", "exp.yaml", "--config", f"prefix={tmp_path / payloads(canary)['newline']}",
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=False)  # fmt: skip
    assert not canary.exists()
    assert all(p.startswith("x") for p in _written(tmp_path)), _written(tmp_path)
    if proc.returncode == 0:
        assert (tmp_path / f"x touch {canary}" / "raw/a/v1/.artifact.json").exists()


def test_shell_characters_in_experiment_config_values_reach_the_step_literally(tmp_path, snakemake_cmd):
    _setup(tmp_path)
    canary = tmp_path / "canary"
    text = "; ".join(payloads(canary).values()) + f"; a b; touch {canary}"
    (tmp_path / "exp.yaml").write_text(
        "artifacts:\n  raw/a@v1:\n    step: hsteps:make\n    config:\n      text: " + json.dumps(text) + "\n"
    )
    snakemake_cmd("--configfile", "exp.yaml", "--config", f"prefix={tmp_path / 'art'}",
                  cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert (tmp_path / "art/raw/a/v1/data.txt").read_text() == text
    assert not canary.exists()


def test_shell_characters_in_an_artifact_name_are_refused(tmp_path, snakemake_cmd):
    _setup(tmp_path)
    canary = tmp_path / "canary"
    (tmp_path / "exp.yaml").write_text(
        "artifacts:\n  " + json.dumps(f"raw/a$(touch {canary})@v1") + ": {step: 'hsteps:make'}\n"
    )
    proc = snakemake_cmd("--configfile", "exp.yaml", "--config", f"prefix={tmp_path / 'art'}",
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=False)  # fmt: skip
    lines = [l for l in proc.stderr.splitlines() if l.startswith("marin-rules: ")]
    assert proc.returncode != 0 and len(lines) == 1 and "bad artifact name" in lines[0], proc.stderr
    assert not canary.exists() and _written(tmp_path) == []


SELF_ALIAS = 'artifacts:\n  raw/a@v1:\n    step: "hsteps:make"\n    config:\n      text: &x [*x]\n'
SELF_ALIAS_LINE = ("rec.yaml:5:17: artifacts.raw/a@v1.config.text[0]: an alias of artifacts.raw/a@v1.config.text, "
                   "inside it: a value that holds itself has no end; write it out, or alias a value defined elsewhere")  # fmt: skip


def test_a_value_holding_itself_is_one_line_from_snakemake_and_marin(tmp_path, snakemake_cmd, capsys, monkeypatch):
    from marin_rules.cli import main

    _setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rec.yaml").write_text(SELF_ALIAS)
    proc = snakemake_cmd("--config", "experiment=rec.yaml", f"prefix={tmp_path / 'art'}", "-n",
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=False)  # fmt: skip
    said = proc.stdout + proc.stderr  # Snakemake prints its own errors on stdout
    assert proc.returncode != 0 and "Traceback" not in said and "RecursionError" not in said
    assert [l for l in said.splitlines() if l.startswith("marin-rules: ")] == [f"marin-rules: {SELF_ALIAS_LINE}"]
    assert main(["status", "-d", str(tmp_path), "--configfile", "rec.yaml", "--prefix", "art"]) == 1
    assert capsys.readouterr().err == f"marin: {tmp_path / SELF_ALIAS_LINE}\n"  # marin names the file in full
    assert _written(tmp_path) == ["rec.yaml"]


def test_a_value_holding_itself_given_with_configfile_is_one_line(tmp_path, snakemake_cmd):
    _setup(tmp_path)
    (tmp_path / "rec.yaml").write_text(SELF_ALIAS)
    proc = snakemake_cmd("--configfile", "rec.yaml", "--config", f"prefix={tmp_path / 'art'}", "-n",
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=False)  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "RecursionError" not in said, said[-3000:]
    # Snakemake hands the --configfile on as an absolute path
    assert [l for l in said.splitlines() if l.startswith("marin-rules: ")] == [f"marin-rules: {tmp_path / SELF_ALIAS_LINE}"]
