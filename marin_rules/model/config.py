"""The model's configuration: one frozen dataclass, validated at the boundary, no JAX.

Model: a decoder-only transformer whose feed-forward layers are either dense SwiGLU
(`d_ff` hidden) or mixture-of-experts layers (`n_experts` SwiGLU experts of `d_expert`
hidden, `top_k` chosen per token by a router, optionally plus one always-on shared
expert). Layer `i` (0-based) is an MoE layer when `moe_every > 0` and
`(i + 1) % moe_every == 0`; `moe_every = 0` is the plain dense transformer (the
benchmark's baseline), and a `moe_every` above `n_layers` (which would make no layer
MoE) is refused. This module is imported by experiment checkers that must not
import JAX, so it holds the FLOP and parameter counts too (pure Python).

References: nanoGPT `model.py` (config shape, FLOP count), Switch Transformer
(balance loss), ST-MoE (router z-loss), Marin grug MoE (quantile-balanced router bias).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.validation import INT32_MAX, Bool, Int, Number, OneOf, check_fields, check_instance

ROUTER_GATES = ("softmax", "sigmoid")
BALANCES = ("aux_loss", "quantile")
MOE_IMPLS = ("dense", "capacity", "ragged")
DROPLESS_IMPLS = ("dense", "ragged")  # backends whose output for a token depends on that token only
COMPUTE_DTYPES = ("float32", "bfloat16")

# a dimension or count of the model: int32 is as far as array shapes and indexing go in
# jitted code; larger gave an XLA type error at the first step, after a plan priced it
SIZE_WHY = "model sizes are int32 in jitted code"
Size = Annotated[int, Int(min=1, max=INT32_MAX, max_why=SIZE_WHY)]


MOE_SETTINGS = (
    "n_experts", "top_k", "d_expert", "shared_expert", "router_gate", "balance", "balance_loss_coef",
    "z_loss_coef", "moe_impl", "capacity_factor",
)  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: Annotated[Size, "token ids; filled in from the tokenizer when left out"] = 4096
    max_seq_len: Annotated[Size, "longest context trained; rotary tables are built for it"] = 256
    d_model: Annotated[Size, "residual width: small enough to train on 2 CPU cores in minutes"] = 192
    n_layers: Annotated[Size, "depth of the default ~5M-parameter experiment"] = 4
    n_heads: Annotated[Size, "query heads; head size d_model / n_heads must be even"] = 6
    n_kv_heads: Annotated[Size, "grouped-query attention: key/value heads, a divisor of n_heads"] = 2
    d_ff: Annotated[Size, "dense SwiGLU hidden size (layers that are not MoE)"] = 512
    n_experts: Annotated[Size, "experts per MoE layer"] = 4
    top_k: Annotated[Size, "experts chosen per token (at most n_experts)"] = 2
    d_expert: Annotated[Size, "expert SwiGLU hidden size; top_k * d_expert = d_ff keeps active params equal"] = 256
    moe_every: Annotated[int, Int(min=0, max=INT32_MAX, max_why=SIZE_WHY), "every n-th layer is MoE: 1 all (grug), 2 every other, 0 none (dense)"] = 1
    shared_expert: Annotated[bool, Bool(), "an always-on shared expert beside the routed ones (grug)"] = False
    router_gate: Annotated[str, OneOf(ROUTER_GATES), "combine weights: softmax (Mixtral) or sigmoid (grug, DeepSeek-V3)"] = "softmax"
    balance: Annotated[str, OneOf(BALANCES), "aux_loss (Switch loss in the objective) or quantile (grug router bias)"] = "aux_loss"
    balance_loss_coef: Annotated[float, Number(ge=0), "Switch Transformer's alpha"] = 0.01
    z_loss_coef: Annotated[float, Number(ge=0), "ST-MoE's router z-loss coefficient"] = 0.001
    moe_impl: Annotated[str, OneOf(MOE_IMPLS), "ragged: dropless sort + ragged_dot; dense: exact reference; capacity: GShard buckets"] = "ragged"
    capacity_factor: Annotated[float, Number(gt=0), "bucket slack per expert for moe_impl capacity (1.0-1.25 usual)"] = 1.25
    rope_theta: Annotated[float, Number(gt=0), "rotary base from RoFormer / Llama"] = 10000.0
    norm_eps: Annotated[float, Number(gt=0), "RMSNorm epsilon as in Llama"] = 1e-5
    tie_embeddings: Annotated[bool, Bool(), "share input embedding and output head (nanoGPT): fewer params"] = True
    compute_dtype: Annotated[str, OneOf(COMPUTE_DTYPES), "bfloat16 on TPU; float32 is faster on CPU"] = "float32"
    init_std: Annotated[float, Number(gt=0), "GPT-2 init; residual output projections are scaled by 1/sqrt(2*n_layers)"] = 0.02

    def __post_init__(self) -> None:
        check_instance(self)
        check_relations(vars(self), given=None)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer `i` (0-based) is an MoE layer."""
        return self.moe_every > 0 and (i + 1) % self.moe_every == 0

    @property
    def n_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.n_layers))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], vocab_size: int | None = None) -> "ModelConfig":
        """Build from an experiment file's mapping; `vocab_size` (from the tokenizer)
        fills the field when the mapping leaves it out. Unknown keys and bad values raise
        `ConfigError(field, message)` with `field` relative to the model config; an error
        about a value the mapping left out says it is the default."""
        values = check_fields(cls, d)
        if vocab_size is not None and "vocab_size" not in values:
            values["vocab_size"] = vocab_size
        check_relations({**vars(cls()), **values}, given=frozenset(values))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def unused_settings(self, given: frozenset[str] = frozenset()) -> dict[str, str]:
        """{setting: why, and how to fix} for each setting this model never reads: an
        experiment that writes one would change its fingerprint, and `marin diff` would
        show it, for nothing (`train.config.parse_train_config` refuses those written away from their default).
        `given`: the settings the experiment wrote (the others are named as defaults)."""

        def setting(name: str) -> str:
            value = getattr(self, name)
            return f"{name}: {value}" + ("" if name in given else " (the default)")

        if self.moe_every == 0:
            return {name: "the model is dense (moe_every: 0); remove it, or set moe_every > 0" for name in MOE_SETTINGS}
        unused = {}
        if self.moe_every == 1:
            unused["d_ff"] = (f"every layer is MoE, {setting('moe_every')}, and its experts are d_expert wide; remove "
                              "it, or set moe_every > 1 to have dense layers of d_ff between MoE ones")  # fmt: skip
        if self.moe_impl != "capacity":
            unused["capacity_factor"] = (f"only moe_impl: capacity has buckets, and {setting('moe_impl')} drops no "
                                         "token; remove it, or set moe_impl: capacity")  # fmt: skip
        if self.balance != "aux_loss":
            unused["balance_loss_coef"] = (f"with {setting('balance')} a router bias balances the experts, not a loss "
                                           "term; remove it, or set balance: aux_loss")  # fmt: skip
        return unused

    def dropless(self) -> ModelConfig:
        """This model with a dropless MoE dispatch, as evaluation, `load_trained` and
        training's validation run it: itself when `moe_impl` drops nothing, else `ragged`
        (dispatch backends share every weight and the math; `ragged` has no capacity limit)."""
        return self if self.moe_impl in DROPLESS_IMPLS else dataclasses.replace(self, moe_impl="ragged")


def check_relations(c: Mapping[str, Any], given: frozenset[str] | None) -> None:
    """Rules between fields. `given`: the settings the experiment wrote (a value not
    among them is named as the default); None when built in code (all given)."""

    def own(name: str) -> str:  # the offending field: `6 (the default; set n_heads)`
        return f"{c[name]} (the default; set {name})" if given is not None and name not in given else f"{c[name]}"

    def other(name: str) -> str:  # another field named in the message: `d_model=192 (the default)`
        return f"{name}={c[name]}" + (" (the default)" if given is not None and name not in given else "")

    if c["d_model"] % c["n_heads"]:
        raise ConfigError("n_heads", f"must divide {other('d_model')}, got {own('n_heads')}")
    if (c["d_model"] // c["n_heads"]) % 2:
        raise ConfigError(
            "n_heads",
            f"head size d_model/n_heads must be even for rotary, got {c['d_model'] // c['n_heads']} "
            f"({other('d_model')}, {other('n_heads')})",
        )
    if c["n_heads"] % c["n_kv_heads"]:
        raise ConfigError("n_kv_heads", f"must divide {other('n_heads')}, got {own('n_kv_heads')}")
    if c["moe_every"] > c["n_layers"]:  # no layer i with (i + 1) % moe_every == 0: silently dense
        raise ConfigError(
            "moe_every",
            f"{own('moe_every')} makes no layer MoE with {other('n_layers')}; "
            f"use moe_every: 0 for a dense model, or at most {c['n_layers']}",
        )
    if c["top_k"] > c["n_experts"]:
        raise ConfigError("top_k", f"expected at most {other('n_experts')}, got {own('top_k')}")
    if c["balance"] == "quantile" and c["top_k"] >= c["n_experts"] and c["moe_every"] > 0:
        raise ConfigError(
            "balance",
            "'quantile' needs top_k < n_experts (it thresholds at the (top_k+1)-th expert), "
            f"got {other('top_k')}, {other('n_experts')}",
        )
