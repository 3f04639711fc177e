"""A prefix moved mid-training stays usable: no artifact holds an absolute path of the
machine that built it, and the stopped run resumes at the new place.

A whole prefix (a download, a tokenizer, tokens and a train artifact) is built in
one folder; the train run is killed with SIGKILL after checkpoint 10, then the
prefix folder is renamed. No file under it may mention the old folder (but orbax's
commit notes, see below); the train step, started again on the moved locations,
resumes from checkpoint 10 (the recipe still matches), finishes, and then no file
at all names a folder of the machine; the trained model loads with its tokenizer
from the new place.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from train_helpers import runs
from train_helpers.tokens import make_tokens

pytestmark = pytest.mark.slow


def files_mentioning(root: Path, text: str) -> list[str]:
    needle = text.encode()
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and needle in p.read_bytes()]


def test_a_killed_run_resumes_after_its_prefix_folder_moved(tmp_path):
    from marin_rules.train.load import load_trained

    old, new = tmp_path / "prefix-old", tmp_path / "prefix-new"
    tokens = make_tokens(str(old))
    output = old / "checkpoints" / "tiny" / "v1"
    spec = runs.write_spec(tmp_path / "spec.json", output=str(output), config=runs.tiny_config(), data=tokens)
    proc = runs.start(spec, runs.train_env(1), tmp_path / "killed")
    runs.wait_for(lambda: (output / "checkpoints" / "10").is_dir(), proc, 180, "checkpoint 10")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (output / "model.json").exists()

    os.rename(old, new)
    # the tokens' index.json, the recipe, model metadata: none names the old folder; only
    # orbax's commit notes of the checkpoints saved before the kill do (the run rewrites
    # them when it finishes), and orbax reads nothing from them
    stale = files_mentioning(new, str(old))
    assert stale and all(name.endswith("commit_success.txt") for name in stale), stale
    moved = new / "checkpoints" / "tiny" / "v1"
    spec = runs.write_spec(tmp_path / "spec2.json", output=str(moved), config=runs.tiny_config(),
                           data=str(new / "tokens"))  # fmt: skip
    resumed = runs.run(spec, runs.train_env(1), tmp_path / "resumed", timeout=240)
    assert resumed["resumed_from_step"] == 10 and resumed["steps"] == 20
    assert files_mentioning(new, str(tmp_path)) == []  # the finished artifact too
    info = json.loads((moved / "model.json").read_text())
    assert info["tokenizer"] == "../../../tokenizer/tokenizer.json"
    trained = load_trained(str(moved))
    assert trained.step == 20 and Path(trained.tokenizer) == new / "tokenizer" / "tokenizer.json"
