"""Bad experiment files through a real `snakemake` run: one line naming the file (and
line) or the artifact and field, a non-zero exit, and nothing written under the prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

GOOD_STEPS = "def make(ctx):\n    return {}\n\ncount = 3\n"
DOWNLOAD = "  raw/a@v1: {step: download, config: {heldout: [hamlet]}}\n"

CASES = {
    "duplicate key": (
        "artifacts:\n" + DOWNLOAD + "  side/b@v1: {step: steps_e2e:make}\n  side/b@v1: {step: steps_e2e:make}\n",
        "exp.yaml:4:3: duplicate key 'side/b@v1' (first at line 3)",
    ),
    "YAML syntax": (
        "artifacts:\n" + DOWNLOAD + "  side/b@v1:\n    step: steps_e2e:make\n   deps: {}\n",
        "exp.yaml:5:4: not valid YAML: expected <block end>, but found '<block mapping start>'",
    ),
    "step not callable": (
        "artifacts:\n  side/b@v1: {step: steps_e2e:count}\n",
        "side/b@v1: step: 'steps_e2e:count' is not callable:",
    ),
    "dep without @": (
        "artifacts:\n" + DOWNLOAD + "  side/b@v1: {step: steps_e2e:make, deps: {src: raw/a}}\n",
        "side/b@v1: deps.src: expected 'name@version', got 'raw/a' (did you mean raw/a@v1?)",
    ),
    "misspelled dep": (
        "artifacts:\n" + DOWNLOAD + "  side/b@v1: {step: steps_e2e:make, deps: {src: raw/b@v1}}\n",
        "side/b@v1: deps.src: raw/b@v1 is not defined in this experiment (did you mean raw/a@v1?)",
    ),
}


@pytest.mark.parametrize(
    "case,how",
    [(case, "--config experiment=") for case in sorted(CASES)]
    # Snakemake parses a --configfile itself first, keeping the last of duplicate keys:
    # the experiment loader still refuses the file.
    + [("duplicate key", "--configfile")],
)
def test_bad_experiment_fails_in_one_line_and_writes_nothing(tmp_path, snakemake_cmd, case, how):
    text, message = CASES[case]
    (tmp_path / "steps_e2e.py").write_text(GOOD_STEPS)
    (tmp_path / "exp.yaml").write_text(text)
    prefix = tmp_path / "art"
    where = ["--configfile", "exp.yaml", "--config"] if how == "--configfile" else ["--config", "experiment=exp.yaml"]
    proc = snakemake_cmd(
        *where, f"prefix={prefix}", "--cores", "1", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, check=False
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if message in line]
    assert len(lines) == 1 and lines[0].startswith("marin-rules: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not prefix.exists() or not any(Path(prefix).rglob("*"))
