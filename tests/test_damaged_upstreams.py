"""Files of a built artifact damaged in place (their recorded sizes kept, so the size
check passes): every reader names the field, the file and the fix in one line, and
never trains, scores or exports what it read; in a real run the fix is a command that
runs as printed. Real data from the data steps and a model in the training checkpoint
layout; the damage is done by hand, as a bad disk or a stray editor would."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.records import write_success
from marin_rules.data.loader import make_loader
from marin_rules.eval.lm import load_tokenizer
from marin_rules.train.metrics import MetricsLog
from conftest import REPO, SNAKEMAKE
from test_workflow import ws  # noqa: F401 (fixture)
from train_helpers.tokens import make_tokens


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Token shards, with the corpus and tokenizer beside them (`raw/`, `tokenizer/`), each
    with the success record a workflow run writes."""
    tokens = Path(make_tokens(str(tmp_path_factory.mktemp("damaged"))))
    for folder, step in (("raw", "download"), ("tokenizer", "train_tokenizer"), ("tokens", "tokenize")):
        record_built(tokens.parent / folder, step)
    return tokens


def record_built(location: Path, step: str, config: dict | None = None, result: dict | None = None) -> None:
    """The success record a workflow run leaves (its absence means data adopted in place)."""
    entry = {"name": f"x/{location.name}", "version": "v1", "step": step, "fingerprint": "0" * 16,
             "config": config or {}, "deps": {}, "runtime": {}}  # fmt: skip
    write_success(str(location), entry, result or {}, {})


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


@pytest.mark.parametrize("content", [b"\x00{", b'["<|bos|>"]'], ids=["garbage", "not-an-object"])
def test_a_damaged_special_tokens_json_beside_a_models_tokenizer_is_named_by_evaluation(built, content):
    path = Path(json.loads((built / "index.json").read_text())["tokenizer"])
    copy = built.parent / "tok-special" / "tokenizer.json"
    copy.parent.mkdir(exist_ok=True)
    copy.write_bytes((built / path).resolve().read_bytes())
    (copy.parent / "special_tokens.json").write_bytes(content)
    with pytest.raises(StepError) as error:
        load_tokenizer(str(copy))
    assert str(error.value).startswith(f"deps.model: {copy.parent / 'special_tokens.json'} is unreadable ("), error.value
    assert "\n" not in str(error.value)


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


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory) -> Path:
    from test_eval_lm import tiny_artifacts  # a tiny model in the training checkpoint layout, built once

    return Path(tiny_artifacts(str(tmp_path_factory.getbasetemp() / "eval-artifacts"))["model"])


def damaged_checkpoint(trained_model: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the model whose last checkpoint's embedding holds random bytes of its size
    (so `marin verify` passes): (the copy, the damaged file)."""
    copy = tmp_path / "model"
    shutil.copytree(trained_model, copy)
    record_built(copy, "train")
    (chunk,) = (copy / "checkpoints").glob("*/model/params.embed.value/0.0")
    chunk.write_bytes(np.random.default_rng(0).bytes(chunk.stat().st_size))
    return copy, chunk


# orbax leaves the reads of the other arrays of a failed restore unawaited; Python may report
# them when they are collected, after the failure was handled (as in test_train_checkpoint.py)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("step", ["evaluate", "export_hf"])
def test_a_damaged_checkpoint_is_one_line_naming_it_with_the_rebuild_command_in_evaluate_and_export(
    trained_model, tmp_path, step
):
    from marin_rules.artifacts.context import StepContext
    from marin_rules.eval.step import evaluate
    from marin_rules.export.hf import export_hf

    model, chunk = damaged_checkpoint(trained_model, tmp_path)
    raw = trained_model.parent / "raw"
    ctx = {
        "evaluate": StepContext("evals/m", "v1", {"tasks": ["marin_shakespeare_bpb"], "limit": 2},
                                {"model": str(model), "data": str(raw)}, output=str(tmp_path / "eval")),
        "export_hf": StepContext("exports/m", "v1", {}, {"model": str(model)}, output=str(tmp_path / "hf")),
    }[step]  # fmt: skip
    with pytest.raises(StepError) as error:
        {"evaluate": evaluate, "export_hf": export_hf}[step](ctx)
    message = str(error.value)
    assert message.startswith(f"deps.model: {chunk.parents[2]} is unreadable (ValueError: "), message
    assert str(chunk) in message  # the file, from the innermost cause
    assert message.endswith(f"the artifact is damaged; rebuild it with: snakemake -f {model / '.artifact.json'}")
    assert "\n" not in message and "TensorStore" not in message  # not orbax's dump of the array's spec


def test_a_checkpoint_step_never_saved_is_named_as_missing_not_as_damage(trained_model):
    from marin_rules.train.load import load_trained

    with pytest.raises(StepError, match=rf"^no checkpoint 99 under {trained_model / 'checkpoints'}$"):
        load_trained(str(trained_model), step=99)


TOKENS_AND_MODEL = {
    "raw/s@v1": {"step": "download", "config": {"source": "package:shakespeare", "sample_count": 3}},
    "tokenizers/bpe@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/s@v1"}, "config": {"vocab_size": 384}},
    "tokenized/s@v1": {"step": "tokenize", "deps": {"corpus": "raw/s@v1", "tokenizer": "tokenizers/bpe@v1"},
                       "config": {"validation_fraction": 0.05}},
    "checkpoints/nano@v1": {"step": "train", "deps": {"data": "tokenized/s@v1"}, "config": {
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "n_experts": 4, "top_k": 2,
                  "d_expert": 32, "max_seq_len": 32},
        "optimizer": {"name": "adamw", "learning_rate": 0.01}, "num_train_steps": 4, "batch_size": 4, "seq_len": 32}},
}  # fmt: skip


def test_an_unreadable_upstream_files_rebuild_command_runs_as_printed_and_rebuilds_it(ws):  # noqa: F811
    ws.write(TOKENS_AND_MODEL)
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=tokenized/s@v1")
    tokens = Path(ws.prefix) / "tokenized/s/v1"
    shard = next((tokens / "shards").rglob("train/tokens-00000.npy"))
    garble_first_bytes(shard)
    built = ws.record("tokenized/s@v1")["provenance"]["ended"]
    proc = ws.snakemake(check=False)  # training on it stops at its loader
    assert proc.returncode != 0
    line = next(ln for ln in (proc.stdout + proc.stderr).splitlines() if "is unreadable (not a numpy array file)" in ln)
    printed = line.split("the artifact is damaged; rebuild it with: ")[1]  # the command ends the line
    # the run's experiment, prefix and Snakefile are not the defaults: the command names them
    assert printed == shlex.join(["snakemake", "-f", str(tokens / ".artifact.json"), "-s", str(REPO / "Snakefile"),
                                  "-d", str(ws.root), "--configfile", str(ws.root / "exp.yaml"),
                                  "--config", f"prefix={ws.prefix}"])  # fmt: skip
    (failure,) = (Path(ws.prefix) / "checkpoints/nano/v1/.failures").glob("*.json")
    assert json.loads(failure.read_text())["error"]["message"].endswith(printed)  # the record says the same
    elsewhere = ws.root / "elsewhere"
    elsewhere.mkdir()
    rebuilt = subprocess.run([SNAKEMAKE, *shlex.split(printed)[1:]], cwd=elsewhere, env={**os.environ, **ws.env},
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr[-4000:]
    assert ws.record("tokenized/s@v1")["provenance"]["ended"] != built
    assert np.load(shard, allow_pickle=False).size > 0  # readable again


def test_run_step_completes_an_unreadable_files_rebuild_command_in_the_failure_record_and_on_stderr(tmp_path, capsys):
    from marin_rules.artifacts.context import StepContext
    from marin_rules.artifacts.records import Provenance, unreadable_file
    from marin_rules.job.run import run_step

    upstream, out = str(tmp_path / "tokenized/x/v1"), str(tmp_path / "checkpoints/m/v1")
    flags = f"--configfile {tmp_path / 'exp.yaml'} --config prefix={tmp_path}"
    record_built(Path(upstream), "tokenize")  # built by the workflow: the line says how to rebuild it

    def step(ctx):
        raise unreadable_file("deps.data", f"{upstream}/index.json", upstream, "not valid JSON")

    entry = {"name": "checkpoints/m", "version": "v1", "step": "train", "fingerprint": "0" * 16, "config": {},
             "deps": {}, "runtime": {}}  # fmt: skip
    ctx = StepContext("checkpoints/m", "v1", {}, {"data": upstream}, output=out)
    with pytest.raises(StepError) as error:
        run_step(ctx, entry, Provenance(str(tmp_path), [], None, None), step, hint_flags=flags)
    expected = f"the artifact is damaged; rebuild it with: snakemake -f {upstream}/.artifact.json {flags}"
    assert str(error.value).endswith(expected)
    (failure,) = (Path(out) / ".failures").glob("*.json")
    assert json.loads(failure.read_text())["error"]["message"].endswith(expected)
    assert capsys.readouterr().err.rstrip().endswith(expected)  # the error last: the command ends the line


# ---- a corpus, a tokenizer and token shards damaged where their readers look first ----


def tokenize_from(built: Path, tmp_path: Path, damage) -> str:
    """Run `tokenize` on copies of the built corpus and tokenizer, `damage(raw, tokenizer)`
    done to them first; the message of the StepError it raises."""
    from marin_rules.artifacts.context import StepContext
    from marin_rules.data.tokenize import tokenize

    raw, tok = tmp_path / "raw", tmp_path / "tokenizer"
    shutil.copytree(built.parent / "raw", raw)
    shutil.copytree(built.parent / "tokenizer", tok)
    damage(raw, tok)
    ctx = StepContext("tokenized/y", "v1", {"validation_fraction": 0.2}, {"corpus": str(raw), "tokenizer": str(tok)},
                      output=str(tmp_path / "out"))  # fmt: skip
    with pytest.raises(StepError) as error:
        tokenize(ctx)
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"not json{", "JSONDecodeError: "),
        (b'{"shards": 3}', "no `shards` object"),
        (b"[1, 2]", "it is an array, not a JSON object"),
        (b'{"shards": {"train": ["shard-00000.jsonl.gz"]}}', "`train_documents` is missing, not a count"),
        (b'{"shards": {"train": ["shard-00000.jsonl.gz"]}, "train_documents": "6"}', "`train_documents` is a string"),
        (b'{"shards": {"train": ["../../../../etc/passwd"]}, "train_documents": 6}', "shards.train is not a list of"),
    ],
    ids=["garbage", "shards-not-an-object", "not-an-object", "no-count", "count-a-string", "shard-outside"],
)
def test_a_damaged_corpus_manifest_is_one_line_naming_it_not_a_raw_json_or_key_error(built, tmp_path, content, reason):
    message = tokenize_from(built, tmp_path, lambda raw, tok: (raw / "manifest.json").write_bytes(content))
    manifest, raw = tmp_path / "raw" / "manifest.json", tmp_path / "raw"
    assert message.startswith(f"deps.corpus: {manifest} is unreadable ({reason}"), message
    assert message.endswith(f"the artifact is damaged; rebuild it with: snakemake -f {raw / '.artifact.json'}")


def test_a_corpus_shard_its_manifest_lists_but_lacks_is_named_not_a_file_not_found_error(built, tmp_path):
    shard = tmp_path / "raw" / "train" / "shard-00000.jsonl.gz"
    message = tokenize_from(built, tmp_path, lambda raw, tok: shard.unlink())
    assert message.startswith(f"deps.corpus: {shard} is missing, though manifest.json lists it: "), message


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"\x00{", "JSONDecodeError: "),
        (b'["<|bos|>", "<|endoftext|>"]', "it is an array, not a JSON object"),
        (b'{"bos": {"token": "<|bos|>", "id": 0}, "eos": {"token": "<|endoftext|>", "id": "1"}, "pad": {}}',
         '`eos` is not {"token": <string>, "id": <integer>}'),
    ],
    ids=["garbage", "not-an-object", "id-a-string"],
)
def test_a_damaged_special_tokens_json_is_one_line_naming_it(built, tmp_path, content, reason):
    message = tokenize_from(built, tmp_path, lambda raw, tok: (tok / "special_tokens.json").write_bytes(content))
    tok = tmp_path / "tokenizer"
    assert message.startswith(f"deps.tokenizer: {tok / 'special_tokens.json'} is unreadable ({reason}"), message
    assert message.endswith(f"rebuild it with: snakemake -f {tok / '.artifact.json'}")


@pytest.mark.parametrize("path", ["../../../../etc/passwd", "/etc/passwd", "shards/../../raw/manifest.json"])
def test_an_index_listing_a_shard_outside_the_artifact_is_refused_not_followed(tokens, path):
    index = json.loads((tokens / "index.json").read_text())
    index["splits"]["train"]["shards"][0]["path"] = path
    (tokens / "index.json").write_text(json.dumps(index))
    with pytest.raises(StepError) as error:
        loader(tokens)
    message = str(error.value)
    assert message.startswith(f"deps.data: {tokens / 'index.json'} is unreadable (ValueError: shard path {path!r} "
                              "is outside the artifact folder)"), message  # fmt: skip
    assert "\n" not in message


def test_a_shard_the_index_lists_but_lacks_is_one_line_naming_both(tokens):
    shard = next((tokens / "shards").rglob("train/tokens-00000.npy"))
    shard.unlink()
    with pytest.raises(StepError) as error:
        loader(tokens)
    message = str(error.value)
    assert message.startswith(f"deps.data: {shard} is unreadable (missing, though index.json lists it): "), message
    assert message.endswith(f"rebuild it with: snakemake -f {tokens / '.artifact.json'}")


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::SyntaxWarning", "ignore::UserWarning")
def test_every_garbled_npy_header_is_the_one_line_error_never_a_parser_exception(built, tmp_path):
    """numpy parses the header with ast.literal_eval, and retries a Python 2 header with
    the tokenize module: a garbled one may raise SyntaxError or tokenize.TokenError."""
    from marin_rules.artifacts.records import UnreadableFile
    from marin_rules.data.loader import _load_shard

    good = next((built / "shards").rglob("train/tokens-00000.npy")).read_bytes()
    header = 10 + int.from_bytes(good[8:10], "little")  # magic, version, length, then the header text
    rng = np.random.default_rng(0)
    shard = tmp_path / "tokens-00000.npy"
    printable = np.frombuffer(b"()[]{}'\":,. Lx0123456789\\\n\t#", dtype=np.uint8)
    for _ in range(400):
        data = bytearray(good)
        for position in rng.integers(8, header, size=rng.integers(1, 4)):
            data[position] = int(rng.choice(printable)) if rng.random() < 0.8 else int(rng.integers(256))
        shard.write_bytes(bytes(data))
        try:
            _load_shard(str(shard), str(tmp_path))
        except UnreadableFile as e:
            assert str(e).startswith(f"deps.data: {shard} is unreadable (not a numpy array file): ")
            assert "\n" not in str(e)


def test_damaged_data_adopted_in_place_say_to_restore_them_not_to_run_a_rebuild_that_cannot(tokens):
    """An `adopt` step with copy false hands its consumers the source folder itself, which
    holds no record: no `snakemake -f` can rebuild it."""
    (tokens / ".artifact.json").unlink()
    garble_first_bytes(tokens / "index.json", 1)
    with pytest.raises(StepError) as error:
        loader(tokens)
    message = str(error.value)
    assert message.startswith(f"deps.data: {tokens / 'index.json'} is unreadable (JSONDecodeError")
    assert message.endswith(f"the data are damaged, and {tokens} is not built by this workflow (no .artifact.json: "
                            "an adopted source?); restore its files there, or adopt a good copy under a new version")
    assert "snakemake" not in message and "\n" not in message


# ---- what a consumer reads is checked against its upstream's own record ----


def recorded_model(trained_model: Path, tmp_path: Path, digests: bool = True) -> Path:
    """A copy of the model and of its tokenizer (which its model.json then names), each with
    the success record a workflow run writes: the train record's recipe holds the model's
    config and seq_len, its result the digests of the final checkpoint (unless `digests`
    is false: a record of an older build)."""
    from marin_rules.train import checkpoint
    from test_eval_lm import TINY_MODEL

    model, tokenizer = tmp_path / "model", tmp_path / "tokenizer"
    shutil.copytree(trained_model, model)
    shutil.copytree(trained_model.parent / "tokenizer", tokenizer)
    record_built(tokenizer, "train_tokenizer")
    info = json.loads((model / "model.json").read_text())
    (model / "model.json").write_text(json.dumps({**info, "tokenizer": str(tokenizer / "tokenizer.json")}))
    result = {checkpoint.DIGESTS_KEY: checkpoint.model_digests(str(model), 1)} if digests else {}
    record_built(model, "train", {"model": TINY_MODEL, "seq_len": 64}, result)
    return model


def consumer(step: str, model: Path, tmp_path: Path):
    """The `evaluate` or `export_hf` step on `model`, and its output folder."""
    from marin_rules.artifacts.context import StepContext
    from marin_rules.eval.step import evaluate
    from marin_rules.export.hf import export_hf

    out = tmp_path / "out"
    if step == "evaluate":
        ctx = StepContext("evals/m", "v1", {"tasks": ["marin_shakespeare_bpb"], "limit": 2},
                          {"model": str(model), "data": str(model.parent.parent / "raw")}, output=str(out))  # fmt: skip
        return lambda: evaluate(ctx), out
    return lambda: export_hf(StepContext("exports/m", "v1", {}, {"model": str(model)}, output=str(out))), out


def written(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []


def garble_in_place(path: Path, at: int = 100) -> None:
    """`printf XXXXXXXXXXXXXXXX | dd of=PATH bs=1 seek=100 conv=notrunc`: the size kept."""
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"X" * 16)


def test_a_checkpoint_garbled_in_place_restores_as_other_weights_without_the_digests(trained_model, tmp_path):
    """Why the digests: orbax's zstd frames carry no checksum, so these bytes restore."""
    from marin_rules.train.load import load_trained

    model = recorded_model(trained_model, tmp_path, digests=False)  # a record of an older build: loaded as before
    garble_in_place(model / "checkpoints/1/model/params.embed.value/0.0")
    assert float(np.abs(np.asarray(load_trained(str(model)).model.embed[...])).max()) > 1e30


@pytest.mark.parametrize("step", ["evaluate", "export_hf"])
def test_a_checkpoint_garbled_in_place_is_refused_by_its_recorded_digest_and_nothing_is_written(
    trained_model, tmp_path, step
):
    from marin_rules.train.load import load_trained

    model = recorded_model(trained_model, tmp_path)
    load_trained(str(model))  # the digests recorded are those of the files as built
    chunk = model / "checkpoints/1/model/params.embed.value/0.0"
    garble_in_place(chunk)
    run, out = consumer(step, model, tmp_path)
    with pytest.raises(StepError) as error:
        run()
    message = str(error.value)
    assert message.startswith(f"deps.model: {chunk} is unreadable (its bytes are not those whose digest the record "
                              "of x/model@v1 holds in result.final_checkpoint_digests): "), message  # fmt: skip
    assert message.endswith(f"the artifact is damaged; rebuild it with: snakemake -f {model / '.artifact.json'}")
    assert "\n" not in message and written(out) == []


def test_a_checkpoint_file_the_digests_list_but_lacks_is_named(trained_model, tmp_path):
    from marin_rules.train.load import load_trained

    model = recorded_model(trained_model, tmp_path)
    (model / "checkpoints/1/model/params.norm.scale.value/.zarray").unlink()
    missing = (r"params.norm.scale.value/.zarray is unreadable \(missing, though the record of x/model@v1 holds in "
               r"result.final_checkpoint_digests its digest\)")  # fmt: skip
    with pytest.raises(StepError, match=missing):
        load_trained(str(model))


def test_weights_that_are_not_finite_are_refused_naming_the_parameter(trained_model, tmp_path):
    """Independently of any record: a checkpoint holding a NaN (a damaged or diverged run)."""
    import jax.numpy as jnp
    from flax import nnx

    from marin_rules.train import checkpoint
    from marin_rules.train.load import load_trained

    model = tmp_path / "model"
    shutil.copytree(trained_model, model)
    _, params, state = nnx.split(load_trained(str(model)).model, nnx.Param, ...)
    w_up = params["blocks"][1]["ffn"]["w_up"]
    w_up[...] = w_up[...].at[0, 0, 0].set(jnp.nan)
    manager = checkpoint.open_manager(str(model))
    checkpoint.save(manager, 2, {"params": params, "state": state}, {"count": jnp.zeros((), jnp.int32)})
    manager.close()
    with pytest.raises(StepError) as error:
        load_trained(str(model))
    message = str(error.value)
    assert message.startswith(f"deps.model: {model / 'checkpoints' / '2'} is unreadable (parameter "
                              "params.blocks.1.ffn.w_up holds 1 non-finite value(s) (nan or inf): a damaged "
                              "checkpoint, or a run that diverged): "), message  # fmt: skip
    assert "\n" not in message
    assert load_trained(str(model), step=1).step == 1  # the checkpoint before it is whole


@pytest.mark.parametrize("field, value", [("top_k", 1), ("n_experts", 8), ("d_model", 64)])
def test_a_model_json_edited_against_its_record_is_refused_naming_the_field(trained_model, tmp_path, field, value):
    from marin_rules.train.load import load_trained

    model = recorded_model(trained_model, tmp_path)
    info = json.loads((model / "model.json").read_text())
    recorded = info["model"][field]
    info["model"][field] = value
    (model / "model.json").write_text(json.dumps(info))
    run, out = consumer("export_hf", model, tmp_path)
    with pytest.raises(StepError) as error:
        run()
    message = str(error.value)
    assert message.startswith(f"deps.model: {model / 'model.json'} is unreadable (model.{field} is {value}, but the "
                              f"record of x/model@v1 gives config.model.{field} = {recorded}): "), message  # fmt: skip
    assert message.endswith(f"rebuild it with: snakemake -f {model / '.artifact.json'}") and written(out) == []
    info["model"][field] = recorded
    info["seq_len"] = 32  # the recipe's seq_len, too
    (model / "model.json").write_text(json.dumps(info))
    with pytest.raises(StepError, match=r"seq_len is 32, but the record of x/model@v1 gives config.seq_len = 64"):
        load_trained(str(model))


def test_a_recipe_value_written_another_way_is_no_disagreement(trained_model, tmp_path):
    """The recipe's values are compared as the model config parses them (1e4 is 10000.0)."""
    from marin_rules.train.load import load_trained
    from test_eval_lm import TINY_MODEL

    model = recorded_model(trained_model, tmp_path, digests=False)
    record_built(model, "train", {"model": {**TINY_MODEL, "rope_theta": 1e4, "init_std": 0.02}, "seq_len": 64})
    assert load_trained(str(model)).config.top_k == TINY_MODEL["top_k"]


@pytest.mark.parametrize("step", ["evaluate", "export_hf"])
@pytest.mark.parametrize("damage", ["truncated", "garbled", "missing"])
def test_the_models_tokenizer_is_checked_against_its_own_record_before_export_and_evaluation(
    trained_model, tmp_path, step, damage
):
    model = recorded_model(trained_model, tmp_path, digests=False)
    tokenizer = tmp_path / "tokenizer"
    path = tokenizer / "tokenizer.json"
    size = path.stat().st_size
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:3000])
    elif damage == "garbled":
        garble_first_bytes(path, 1)
    else:
        path.unlink()
    run, out = consumer(step, model, tmp_path)
    with pytest.raises(StepError) as error:
        run()
    message = str(error.value)
    reason = {"truncated": f"the model's tokenizer x/tokenizer@v1: truncated tokenizer.json: 3000 of {size} bytes",
              "garbled": "Exception: expected value at line 1 column 1",
              "missing": "the model's tokenizer x/tokenizer@v1: missing tokenizer.json"}[damage]  # fmt: skip
    assert message.startswith(f"deps.model: {path} is unreadable ({reason}"), message
    assert message.endswith(f"the artifact is damaged; rebuild it with: snakemake -f {tokenizer / '.artifact.json'}")
    assert "\n" not in message and written(out) == []


def test_the_models_tokenizer_is_named_as_the_prefix_is_spelled_so_its_rebuild_command_runs(
    trained_model, tmp_path, monkeypatch
):
    # a relative prefix (the default `artifacts`): Snakemake's output pattern is relative too,
    # and `snakemake -f /abs/.../.artifact.json` would find no rule for it
    from marin_rules.train.load import load_trained

    model = recorded_model(trained_model, tmp_path, digests=False)
    info = json.loads((model / "model.json").read_text())  # as training writes it: relative to the model
    (model / "model.json").write_text(json.dumps({**info, "tokenizer": "../tokenizer/tokenizer.json"}))
    (tmp_path / "tokenizer" / "tokenizer.json").unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StepError) as error:
        load_trained(os.path.relpath(model, tmp_path))
    assert str(error.value).startswith("deps.model: tokenizer/tokenizer.json is unreadable (")
    assert str(error.value).endswith("rebuild it with: snakemake -f tokenizer/.artifact.json")


def test_a_missing_tokenizer_json_is_named_by_evaluation_not_a_bare_file_not_found_error(built, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(built.parent / "tokenizer", folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(StepError) as error:
        load_tokenizer(str(folder / "tokenizer.json"))
    message = str(error.value)
    assert message.startswith(f"deps.model: {folder / 'tokenizer.json'} is unreadable (missing): the artifact is "
                              f"damaged; rebuild it with: snakemake -f {folder / '.artifact.json'}")  # fmt: skip


def tokenize_result(tokens: Path) -> dict:
    """The figures the `tokenize` step records in its result, as index.json holds them when built."""
    index = json.loads((tokens / "index.json").read_text())
    return {"vocab_size": index["vocab_size"], "dtype": index["dtype"], "eos_id": index["eos_id"],
            "train_tokens": index["splits"]["train"]["tokens"],
            "validation_tokens": index["splits"]["validation"]["tokens"]}  # fmt: skip


@pytest.mark.parametrize("field, before, after",
                         [("vocab_size", "512", "999"), ("dtype", "uint16", "uint32"), ("eos_id", None, None)])
def test_an_index_json_edited_against_its_tokenize_record_is_refused_naming_the_field(tokens, field, before, after):
    record_built(tokens, "tokenize", result=tokenize_result(tokens))
    if field == "eos_id":  # one digit for another: the same size
        before = str(tokenize_result(tokens)["eos_id"])
        after = str((int(before) + 5) % 10)
    loader(tokens)  # as built: the index agrees with its record
    text = (tokens / "index.json").read_text()
    assert f'"{field}": "{before}"' in text or f'"{field}": {before}' in text
    (tokens / "index.json").write_text(text.replace(f'"{field}": {before}', f'"{field}": {after}')
                                       .replace(f'"{field}": "{before}"', f'"{field}": "{after}"'))  # same size
    with pytest.raises(StepError) as error:
        loader(tokens)
    quoted = repr(after) if field == "dtype" else after
    recorded = repr(before) if field == "dtype" else before
    message = str(error.value)
    assert message.startswith(f"deps.data: {tokens / 'index.json'} is unreadable ({field} is {quoted}, but the record "
                              f"of x/tokens@v1 gives result.{field} = {recorded}): "), message  # fmt: skip


def test_an_index_json_with_its_shards_reordered_in_place_is_refused_by_its_recorded_digest(tokens):
    from marin_rules.artifacts.files import named_digests

    record_built(tokens, "tokenize", result={**tokenize_result(tokens), "file_digests": named_digests(str(tokens), ["index.json"])})
    loader(tokens)  # as built
    index = json.loads((tokens / "index.json").read_text())
    shards = index["splits"]["train"]["shards"]
    if len(shards) < 2:  # one shard: swap the splits' shard lists' order of keys instead (same fields, other bytes)
        index["splits"] = dict(reversed(list(index["splits"].items())))
    else:
        shards[0], shards[1] = shards[1], shards[0]
    (tokens / "index.json").write_text(json.dumps(index))
    with pytest.raises(StepError) as error:
        loader(tokens)
    assert str(error.value).startswith(
        f"deps.data: {tokens / 'index.json'} is unreadable (its content is not what the record of x/tokens@v1 gives (xxh3:"
    )


def test_token_counts_that_disagree_with_the_tokenize_record_are_refused_naming_the_split(tokens):
    result = tokenize_result(tokens)
    record_built(tokens, "tokenize", result={**result, "validation_tokens": result["validation_tokens"] + 7})
    with pytest.raises(StepError, match=r"splits.validation \(its shards' tokens\) is \d+, but the record of "
                                        r"x/tokens@v1 gives result.validation_tokens = \d+\)"):  # fmt: skip
        loader(tokens)


def test_a_trained_models_checkpoint_garbled_in_place_stops_its_export_in_a_real_run(ws):  # noqa: F811
    """The train step records the final checkpoint's digests (process 0, after the save is
    committed); a chunk garbled in place afterwards (the tester's `dd`) stops `export_hf`
    with one line naming the file, and the rebuild command of the model."""
    ws.write({**TOKENS_AND_MODEL, "exports/nano@v1": {"step": "export_hf", "deps": {"model": "checkpoints/nano@v1"}}})
    ws.snakemake("--config", f"prefix={ws.prefix}", "target=checkpoints/nano@v1")
    model = Path(ws.prefix) / "checkpoints/nano/v1"
    digests = ws.record("checkpoints/nano@v1")["result"]["final_checkpoint_digests"]
    chunk = "checkpoints/4/model/params.embed.value/0.0"
    assert digests[chunk].startswith("xxh3:") and "checkpoints/4/_CHECKPOINT_METADATA" in digests
    assert "checkpoints/4/model/commit_success.txt" in digests  # as rewritten without its location
    assert not any("/optimizer/" in rel for rel in digests)  # what consumers restore, not the optimizer state
    garble_in_place(model / chunk)
    proc = ws.snakemake(check=False)
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    line = next((ln for ln in said.splitlines() if "is unreadable (" in ln), said[-8000:])
    assert line.startswith("exports/nano@v1: step failed, ") and "\n" not in line
    assert f"deps.model: {model / chunk} is unreadable (its bytes are not those whose digest the record of " \
           "checkpoints/nano@v1 holds in result.final_checkpoint_digests): the artifact is damaged; rebuild it " \
           f"with: snakemake -f {model / '.artifact.json'} -s " in line  # fmt: skip
    assert not (Path(ws.prefix) / "exports/nano/v1/model.safetensors").exists()


def record_of(location: Path) -> dict:
    return json.loads((location / ".artifact.json").read_text())


def tokenizer_recorded_as_built(tokenizer: Path) -> None:
    """The tokenizer's record as `train_tokenizer` writes it now: its special-token ids
    and the digests of its files."""
    from marin_rules.artifacts.files import FILE_DIGESTS, named_digests

    special = {role: e["id"] for role, e in json.loads((tokenizer / "special_tokens.json").read_text()).items()}
    digests = named_digests(str(tokenizer), ("tokenizer.json", "special_tokens.json"))
    record_built(tokenizer, "train_tokenizer", None, {"special_tokens": special, FILE_DIGESTS: digests})


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("step", ["evaluate", "export_hf"])
def test_a_tokenizer_json_changed_in_place_but_parsing_is_refused_by_its_digest(trained_model, tmp_path, step):
    # two vocabulary entries swapped: the same size, still a tokenizer, another one
    model = recorded_model(trained_model, tmp_path, digests=False)
    tokenizer = tmp_path / "tokenizer"
    tokenizer_recorded_as_built(tokenizer)
    path = tokenizer / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    text = path.read_text()
    path.write_text(text.replace(f'"{a}":{vocab[a]}', "\0").replace(f'"{b}":{vocab[b]}', f'"{b}":{vocab[a]}')
                    .replace("\0", f'"{a}":{vocab[b]}'))  # fmt: skip
    assert path.stat().st_size == len(text.encode())
    run, out = consumer(step, model, tmp_path)
    with pytest.raises(StepError) as error:
        run()
    assert str(error.value).startswith(f"deps.model: {path} is unreadable (the model's tokenizer x/tokenizer@v1: "
                                       "changed tokenizer.json: its content is not what was recorded")  # fmt: skip
    assert written(out) == []


def test_special_token_ids_edited_in_place_are_refused_against_the_tokenizers_record(trained_model, tmp_path):
    model = recorded_model(trained_model, tmp_path, digests=False)
    tokenizer = tmp_path / "tokenizer"
    path = tokenizer / "special_tokens.json"
    special = json.loads(path.read_text())
    record_built(tokenizer, "train_tokenizer", None, {"special_tokens": {r: e["id"] for r, e in special.items()}})
    path.write_text(json.dumps({**special, "eos": {**special["eos"], "id": special["eos"]["id"] + 5}}, indent=2,
                               sort_keys=True) + "\n")  # the same size: eos 1 -> 6
    assert path.stat().st_size == json.loads(json.dumps(record_of(tokenizer)))["files"]["special_tokens.json"]
    run, out = consumer("export_hf", model, tmp_path)
    with pytest.raises(StepError) as error:
        run()
    assert str(error.value).startswith(
        f"deps.model: {path} is unreadable (the model's tokenizer x/tokenizer@v1: eos is {special['eos']['id'] + 5} "
        f"there, but its record gives result.special_tokens.eos = {special['eos']['id']})"
    )
    assert written(out) == []


def test_a_tokenizer_path_model_json_gets_wrong_is_the_models_damage(trained_model, tmp_path):
    model = recorded_model(trained_model, tmp_path, digests=False)
    info = json.loads((model / "model.json").read_text())
    wrong = info["tokenizer"][:-1] + " "  # "tokenizer.jso ": the model.json is what is damaged
    (model / "model.json").write_text(json.dumps({**info, "tokenizer": wrong}))
    run, out = consumer("export_hf", model, tmp_path)
    with pytest.raises(StepError) as error:
        run()
    assert str(error.value).endswith(f"rebuild it with: snakemake -f {model / '.artifact.json'}")


def test_verify_with_contents_finds_a_checkpoint_chunk_changed_in_place(trained_model, tmp_path):
    # `marin verify` reads the record's digests too; a consumer's check before its step, sizes only
    from marin_rules.artifacts.records import read_record, verify_files

    model = recorded_model(trained_model, tmp_path)
    record = read_record(str(model))
    assert verify_files(str(model), record, contents=True) == []
    (chunk,) = (model / "checkpoints").glob("*/model/params.embed.value/0.0")
    garble_in_place(chunk)
    assert verify_files(str(model), record) == []  # its size is the same
    (problem,) = verify_files(str(model), record, contents=True)
    assert problem.startswith(f"changed {chunk.relative_to(model)}: its content is not what was recorded")
