"""Files of a built artifact damaged in place (their recorded sizes kept, so the size
check passes): every reader names the field, the file and the fix in one line, and
never trains or scores on what it read. Real data from the data steps; the damage is
done by hand, as a bad disk or a stray editor would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from marin_rules.artifacts.errors import StepError
from marin_rules.data.loader import make_loader
from marin_rules.eval.lm import load_tokenizer
from marin_rules.train.metrics import MetricsLog
from train_helpers.tokens import make_tokens


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return Path(make_tokens(str(tmp_path_factory.mktemp("damaged"))))


@pytest.fixture
def tokens(built, tmp_path) -> Path:
    copy = tmp_path / "tokens"
    shutil.copytree(built, copy)
    return copy


def garble_first_bytes(path: Path, n: int = 6) -> None:
    data = bytearray(path.read_bytes())
    data[:n] = b"\x00" * n
    path.write_bytes(bytes(data))  # same size: the record's size check cannot see it


def loader(tokens: Path):
    return make_loader(str(tokens), seq_len=16, batch_size=4, seed=0)


def test_a_garbled_index_json_is_named_with_the_rebuild_command(tokens):
    garble_first_bytes(tokens / "index.json", 1)
    with pytest.raises(StepError) as error:
        loader(tokens)
    message = str(error.value)
    assert message.startswith(f"deps.data: {tokens / 'index.json'} is unreadable (JSONDecodeError")
    assert message.endswith(f"rebuild it with: snakemake -f {tokens / '.artifact.json'}") and "\n" not in message


def test_a_garbled_token_shard_is_named_not_reported_as_pickled_data(tokens):
    shard = next((tokens / "shards").rglob("train/tokens-00000.npy"))
    garble_first_bytes(shard)
    with pytest.raises(StepError, match=rf"deps.data: {shard} is unreadable \(not a numpy array file\)") as error:
        loader(tokens)
    assert "pickle" not in str(error.value)


def test_token_ids_outside_the_vocabulary_stop_the_loader_not_the_learning_rate(tokens):
    for shard in (tokens / "shards").rglob("train/tokens-*.npy"):
        np.load(shard, mmap_mode="r+")[:] = 60000
    with pytest.raises(StepError, match=r"token id 60000 outside the vocabulary of 512 ids") as error:
        loader(tokens).batch(0)
    assert str(error.value).startswith("deps.data: ") and "learning_rate" not in str(error.value)


def test_a_garbled_tokenizer_json_is_named_by_evaluation(built):
    path = Path(json.loads((built / "index.json").read_text())["tokenizer"])
    copy = built.parent / "tok-garbled" / "tokenizer.json"
    copy.parent.mkdir(exist_ok=True)
    copy.write_bytes(b"\x00" + (built / path).resolve().read_bytes()[1:])
    with pytest.raises(StepError, match=rf"deps.model: {copy} is unreadable \(Exception: expected value"):
        load_tokenizer(str(copy))


def test_a_torn_metrics_line_is_dropped_on_resume_not_blocking_it(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"split": "train", "step": 10, "loss": 3.0}\n{"split": "train", "step": 20, "lo')
    resumed = MetricsLog.resume(str(log), up_to_step=20)
    assert resumed.records == [{"split": "train", "step": 10, "loss": 3.0}]
    assert "1 unreadable line(s) dropped while resuming" in capsys.readouterr().err


def test_a_garbled_model_json_is_named_before_any_checkpoint_is_read(tmp_path):
    from marin_rules.train.load import load_trained

    (tmp_path / "model.json").write_text('{"model": {"d_model": 1')  # torn mid-write by hand
    with pytest.raises(StepError, match=rf"deps.model: {tmp_path / 'model.json'} is unreadable \(JSONDecodeError"):
        load_trained(str(tmp_path))
