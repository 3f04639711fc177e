"""Which Hugging Face architecture computes exactly what a `ModelConfig` computes.

Model (pure Python, no JAX): our decoder (RMSNorm, rotate-half rotary, grouped-query
attention without biases, SwiGLU experts, softmax router whose top-k weights are
renormalised when k > 1) is, weight for weight,
- `MixtralForCausalLM` when every layer is MoE, there is no shared expert and k >= 2
  (Mixtral always renormalises the top-k weights);
- `Qwen2MoeForCausalLM` otherwise: a shared expert (its gate weight set to 0, so
  sigmoid gives 0.5, and its down projection doubled), dense layers between MoE
  layers (`decoder_sparse_step` = moe_every; all layers `mlp_only_layers` for a
  dense model), top-1 without renormalisation (`norm_topk_prob: false`); its
  attention biases are off (`qkv_bias: false`).
Refused, with the reason: a sigmoid router gate, and quantile balancing (a router
bias that changes which experts are chosen); neither architecture has them.
When d_model or d_expert is not a multiple of `ALIGNED_WIDTH`, config.json selects
transformers' eager experts loop (its grouped-matmul kernel refuses such rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.model.config import ModelConfig

MIXTRAL = "MixtralForCausalLM"
QWEN2_MOE = "Qwen2MoeForCausalLM"
# transformers' default experts kernel (torch grouped_mm) needs rows of a multiple of 16
# bytes ("strides should be multiple of 16 bytes"): 8 bf16 values. Wider or narrower
# experts get `experts_implementation: eager` in config.json (same logits, a loop).
ALIGNED_WIDTH = 8


def architecture(c: ModelConfig) -> str:
    """The architecture for `c`, or ConfigError(field, reason) when none reproduces it."""
    if c.n_moe_layers > 0 and c.router_gate != "softmax":
        raise ConfigError(
            "model.router_gate",
            f"{c.router_gate!r} gate has no Hugging Face equivalent (Mixtral and Qwen2-MoE combine "
            "experts with softmax weights); only router_gate 'softmax' models can be exported",
        )
    if c.n_moe_layers > 0 and c.balance == "quantile":
        raise ConfigError(
            "model.balance",
            "'quantile' balancing adds a router bias to expert selection, which neither Mixtral nor "
            "Qwen2-MoE has; only balance 'aux_loss' models can be exported",
        )
    if c.n_moe_layers > 0 and c.moe_every == 1 and not c.shared_expert and c.top_k >= 2:
        return MIXTRAL
    return QWEN2_MOE


def hf_config(c: ModelConfig, special: Mapping[str, int | None]) -> dict[str, Any]:
    """config.json for `c`; `special` holds bos/eos/pad token ids (None when absent)."""
    arch = architecture(c)
    common = {
        "architectures": [arch],
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": c.init_std,
        "use_cache": True,
        "dtype": "float32",
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "pad_token_id": special.get("pad"),
    }
    if c.n_moe_layers > 0 and (c.d_model % ALIGNED_WIDTH or c.d_expert % ALIGNED_WIDTH):
        common["experts_implementation"] = "eager"
    if arch == MIXTRAL:
        return {
            **common,
            "model_type": "mixtral",
            "intermediate_size": c.d_expert,
            "num_local_experts": c.n_experts,
            "num_experts_per_tok": c.top_k,
            "router_aux_loss_coef": c.balance_loss_coef,
            "output_router_logits": False,
            "sliding_window": None,
        }
    dense = c.n_moe_layers == 0
    return {
        **common,
        "model_type": "qwen2_moe",
        "intermediate_size": c.d_ff,
        "moe_intermediate_size": c.d_expert,
        "shared_expert_intermediate_size": c.d_expert,
        "num_experts": c.n_experts,
        "num_experts_per_tok": c.top_k,
        "norm_topk_prob": c.top_k > 1,
        "decoder_sparse_step": max(1, c.moe_every),
        "mlp_only_layers": list(range(c.n_layers)) if dense else [],
        "router_aux_loss_coef": c.balance_loss_coef,
        "output_router_logits": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": c.n_layers,
        "qkv_bias": False,
    }


def check_exportable(model: Mapping[str, Any], field: str = "deps.model") -> None:
    """Refuse, at experiment load, a train recipe's `model:` mapping no layout reproduces."""
    try:
        architecture(ModelConfig.from_dict(model))
    except ConfigError as e:
        raise ConfigError(field, f"cannot be exported to Hugging Face: {e}") from None


@dataclass(frozen=True)
class ExportHfConfig:
    """`export_hf` takes no settings: the layout follows from the model's config."""


def check_export_hf(config: Any, deps: Any) -> None:
    """The experiment loader's checker for `step: export_hf`."""
    if not isinstance(config, Mapping):
        raise ConfigError("config", f"expected a mapping, got {config!r}")
    if config:
        raise ConfigError(f"config.{sorted(config)[0]}", "export_hf takes no config settings; leave config out")
    if not isinstance(deps, Mapping) or set(deps) != {"model"} or not isinstance(deps["model"], str):
        raise ConfigError("deps", "export_hf needs exactly deps: {model: <a train artifact>}")


def check_export_hf_upstream(config: Any, upstream: Mapping[str, Mapping[str, Any]]) -> None:
    """With the upstream entries' configs (role -> config): the model must be exportable."""
    model = (upstream.get("model") or {}).get("model")
    if isinstance(model, Mapping):
        check_exportable(model)
