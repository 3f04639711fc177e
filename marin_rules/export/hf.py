"""The `export_hf` step: a trained model as a Hugging Face folder.

Model: `ctx.deps["model"]` is a finished `train` artifact. The step loads its latest
weights (`load_trained`), picks the architecture that computes the same function
(`layout.py`: Mixtral, or Qwen2-MoE), and writes into `ctx.output`:
`config.json`, `model.safetensors` (float32, the names and shapes `transformers`
5.x uses) and the tokenizer files beside the model (`tokenizer.json`,
`tokenizer_config.json`, `special_tokens_map.json`), so that
`AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)`
load it (the tokenizer files checked first against their own artifact's record, by
`load_trained`; every file written with the mode the umask gives, as elsewhere);
`tokenizer_config.json` says `split_special_tokens: true`, so the exported tokenizer
reads a literal `<|endoftext|>` in a text as text, as training and evaluation do. Weight mapping (ours are [in, out], torch Linear weights [out, in]):
q/k/v/o, router and dense SwiGLU matrices transposed; per expert `gate_up_proj` =
concat(w_gate.T, w_up.T) [E, 2I, D] and `down_proj` = w_down.T [E, D, I]; RMSNorm
scales as they are; the embedding as it is (the head tied to it, or `lm_head` =
head.T). Rotary is rotate-half in both: no permutation.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Any

import numpy as np

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.artifacts.records import unreadable_file
from marin_rules.data.tokenizer import HF_TOKENIZER_FILES
from marin_rules.export.layout import MIXTRAL, architecture, check_export_hf, hf_config



def _t(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32).T)


def _a(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32))


def state_dict(model: Any) -> dict[str, np.ndarray]:
    """Our MoETransformer's weights under the names `config.json`'s architecture uses."""
    c = model.config
    arch = architecture(c)
    out = {"model.embed_tokens.weight": _a(model.embed[...]), "model.norm.weight": _a(model.norm.scale[...])}
    if model.head is not None:
        out["lm_head.weight"] = _t(model.head[...])
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = _a(block.attn_norm.scale[...])
        out[p + "post_attention_layernorm.weight"] = _a(block.ffn_norm.scale[...])
        for ours, theirs in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "o_proj")):
            out[f"{p}self_attn.{theirs}.weight"] = _t(getattr(block.attn, ours)[...])
        ffn = block.ffn
        if not block.is_moe:
            for ours, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
                out[f"{p}mlp.{theirs}.weight"] = _t(getattr(ffn, ours)[...])
            continue
        gate, up, down = (np.asarray(getattr(ffn, n)[...], np.float32) for n in ("w_gate", "w_up", "w_down"))
        out[p + "mlp.gate.weight"] = _t(ffn.router.w[...])
        out[p + "mlp.experts.gate_up_proj"] = _a(np.concatenate([gate, up], axis=2).transpose(0, 2, 1))
        out[p + "mlp.experts.down_proj"] = _a(down.transpose(0, 2, 1))
        if arch != MIXTRAL:
            _shared_expert(out, p, ffn, c)
    return out


def _shared_expert(out: dict[str, np.ndarray], p: str, ffn: Any, c: Any) -> None:
    """Qwen2-MoE adds sigmoid(x W_g) * shared(x): W_g = 0 gives 0.5, so the down
    projection is doubled; without a shared expert every weight is 0."""
    out[p + "mlp.shared_expert_gate.weight"] = np.zeros((1, c.d_model), np.float32)
    if ffn.shared is None:
        for name, shape in (("gate_proj", (c.d_expert, c.d_model)), ("up_proj", (c.d_expert, c.d_model)),
                            ("down_proj", (c.d_model, c.d_expert))):  # fmt: skip
            out[f"{p}mlp.shared_expert.{name}.weight"] = np.zeros(shape, np.float32)
        return
    out[p + "mlp.shared_expert.gate_proj.weight"] = _t(ffn.shared.w_gate[...])
    out[p + "mlp.shared_expert.up_proj.weight"] = _t(ffn.shared.w_up[...])
    out[p + "mlp.shared_expert.down_proj.weight"] = _t(2.0 * np.asarray(ffn.shared.w_down[...], np.float32))


def _special_ids(tokenizer_dir: str, eos_id: int | None) -> dict[str, int | None]:
    location = storage.join(tokenizer_dir, "special_tokens.json")
    ids: dict[str, int | None] = {"bos": None, "eos": eos_id, "pad": None}
    if storage.exists(location):
        for role, entry in _read_mapping(location, tokenizer_dir).items():
            if isinstance(entry, dict) and isinstance(entry.get("id"), int):
                ids[role] = entry["id"]
    return ids


def _read_mapping(location: str, artifact: str) -> dict[str, Any]:
    """A JSON object of the tokenizer's artifact; a damaged one is the one-line `unreadable_file`."""
    try:
        data = storage.read_json(location)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise unreadable_file("deps.model", location, artifact, e) from None
    return data


def _save_local(weights: dict[str, np.ndarray], path: str) -> None:
    """`model.safetensors` written atomically, with the mode the umask gives a new file, as
    every other file of the artifact (safetensors' `save_file` makes it 0600)."""
    from safetensors.numpy import save_file

    tmp = storage.temporary_sibling(path)
    with open(tmp, "wb"):  # created as any file is: its mode is the one to keep
        pass
    mode = stat.S_IMODE(os.stat(tmp).st_mode)
    try:
        save_file(weights, tmp, metadata={"format": "pt"})
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def export_hf(ctx: StepContext) -> dict[str, Any]:
    check_export_hf(ctx.config, ctx.deps)  # deps here: role -> location
    try:
        from safetensors.numpy import save
    except ImportError:
        raise StepError(
            "export_hf writes model.safetensors with the `safetensors` package: pip install safetensors"
        ) from None

    from marin_rules.train.load import load_trained

    trained = load_trained(ctx.deps["model"])
    try:
        arch = architecture(trained.config)
    except ConfigError as e:  # the experiment loader refuses these; a model trained elsewhere may reach here
        raise StepError(f"deps.model: {ctx.deps['model']} cannot be exported: {e}") from None
    tokenizer_dir = storage.parent(trained.tokenizer)
    special = _special_ids(tokenizer_dir, trained.eos_id)
    weights = state_dict(trained.model)
    storage.makedirs(ctx.output)
    local = not storage.is_remote(ctx.output)
    target = storage.join(ctx.output, "model.safetensors")
    if local:
        _save_local(weights, storage.local_path(target))
    else:
        storage.write_bytes_atomic(target, save(weights, metadata={"format": "pt"}))
    storage.write_json_atomic(storage.join(ctx.output, "config.json"), hf_config(trained.config, special))
    copied = []
    for name in HF_TOKENIZER_FILES:
        source = storage.join(tokenizer_dir, name)
        if storage.exists(source):
            if name == "tokenizer_config.json":  # also from tokenizers built before it said so
                settings = {**_read_mapping(source, tokenizer_dir), "split_special_tokens": True}
                storage.write_json_atomic(storage.join(ctx.output, name), settings)
            else:
                storage.write_bytes_atomic(storage.join(ctx.output, name), storage.read_bytes(source))
            copied.append(name)
    if "tokenizer.json" not in copied:
        raise StepError(f"deps.model: no tokenizer.json beside {trained.tokenizer}; the export needs its tokenizer")
    return {
        "architecture": arch,
        "step": trained.step,
        "parameters": int(sum(w.size for w in weights.values())),
        "files": ["config.json", "model.safetensors", *copied],
    }
