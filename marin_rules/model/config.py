"""The model's configuration: one frozen dataclass, validated at the boundary, no JAX.

Model: a decoder-only transformer whose feed-forward layers are either dense SwiGLU
(`d_ff` hidden) or mixture-of-experts layers (`n_experts` SwiGLU experts of `d_expert`
hidden, `top_k` chosen per token by a router, optionally plus one always-on shared
expert). Layer `i` (0-based) is an MoE layer when `moe_every > 0` and
`(i + 1) % moe_every == 0`; `moe_every = 0` is the plain dense transformer (the
benchmark's baseline). This module is imported by experiment checkers that must not
import JAX, so it holds the FLOP and parameter counts too (pure Python).

References: nanoGPT `model.py` (config shape, FLOP count), Switch Transformer
(balance loss), ST-MoE (router z-loss), Marin grug MoE (quantile-balanced router bias).
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError, got

# The settings the experiment wrote, while `from_dict` builds a config: an error about a
# value the user never wrote says it is the default (None: built in code, all given).
_GIVEN: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("model_config_given", default=None)

ROUTER_GATES = ("softmax", "sigmoid")
BALANCES = ("aux_loss", "quantile")
MOE_IMPLS = ("dense", "capacity", "ragged")
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4096  # the project's default byte-level BPE tokenizer size
    max_seq_len: int = 256  # longest context trained; rotary tables are built for it
    d_model: int = 192  # residual width: small enough to train on 2 CPU cores in minutes
    n_layers: int = 4  # depth of the default ~5M-parameter experiment
    n_heads: int = 6  # query heads; head size d_model / n_heads = 32
    n_kv_heads: int = 2  # grouped-query attention: 3 query heads share one key/value head
    d_ff: int = 512  # dense SwiGLU hidden size (layers that are not MoE)
    n_experts: int = 4  # experts per MoE layer
    top_k: int = 2  # experts chosen per token
    d_expert: int = 256  # expert SwiGLU hidden size; top_k * d_expert = d_ff keeps active params equal
    moe_every: int = 1  # every layer is MoE (grug); 2 = every other layer; 0 = no MoE at all
    shared_expert: bool = False  # grug adds an always-on shared expert; off keeps the baseline simple
    router_gate: str = "softmax"  # 'softmax' (Mixtral) or 'sigmoid' (grug, DeepSeek-V3) combine weights
    balance: str = "aux_loss"  # 'aux_loss' (Switch loss in the objective) or 'quantile' (grug router bias)
    balance_loss_coef: float = 0.01  # Switch Transformer's alpha
    z_loss_coef: float = 0.001  # ST-MoE's router z-loss coefficient
    moe_impl: str = "ragged"  # dropless sort + ragged_dot; 'dense' is the exact reference
    capacity_factor: float = 1.25  # GShard bucket slack per expert for 'capacity' (1.0-1.25 usual)
    rope_theta: float = 10000.0  # rotary base from RoFormer / Llama
    norm_eps: float = 1e-5  # RMSNorm epsilon as in Llama
    tie_embeddings: bool = True  # share input embedding and output head (nanoGPT): fewer params
    compute_dtype: str = "float32"  # bf16 is slower than f32 on CPU; use bfloat16 on TPU
    init_std: float = 0.02  # GPT-2 init; residual output projections are scaled by 1/sqrt(2*n_layers)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def has_moe(self) -> bool:
        return self.n_moe_layers > 0

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
        `ConfigError(field, message)` with `field` relative to the model config."""
        if not isinstance(d, Mapping):
            raise ConfigError("", f"expected a mapping of model settings, got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in d if k not in names)
        if unknown:
            raise ConfigError(
                unknown[0], f"unknown model setting(s) {', '.join(unknown)}; known: {', '.join(names)}"
            )
        values = dict(d)
        if vocab_size is not None and "vocab_size" not in values:
            values["vocab_size"] = vocab_size
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in values.items():
            _check_type(name, value, fields[name].default)
        token = _GIVEN.set(frozenset(values))
        try:
            return cls(**values)
        finally:
            _GIVEN.reset(token)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_type(name: str, value: Any, default: Any) -> None:
    """Type checks by the default's type; ranges are checked in `_validate`."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(name, f"expected true or false, got {value!r}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"expected an integer, got {value!r}")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, f"expected a number, got {got(value)}")
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(name, f"expected a string, got {value!r}")


def _int_at_least(c: ModelConfig, name: str, low: int) -> None:
    v = getattr(c, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(name, f"expected an integer >= {low}, got {v!r}")


def _number_in(c: ModelConfig, name: str, low: float, *, inclusive: bool) -> None:
    v = getattr(c, name)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v >= low if inclusive else v > low)
    if not ok:
        raise ConfigError(name, f"expected a number {'>=' if inclusive else '>'} {low}, got {got(v)}")


def _choice(c: ModelConfig, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(c, name)
    if v not in choices:
        raise ConfigError(name, f"expected one of {', '.join(map(repr, choices))}, got {v!r}")


def _validate(c: ModelConfig) -> None:
    for name in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"):
        _int_at_least(c, name, 1)
    for name in ("n_experts", "top_k", "d_expert"):
        _int_at_least(c, name, 1)
    _int_at_least(c, "moe_every", 0)
    if not isinstance(c.shared_expert, bool):
        raise ConfigError("shared_expert", f"expected true or false, got {c.shared_expert!r}")
    if not isinstance(c.tie_embeddings, bool):
        raise ConfigError("tie_embeddings", f"expected true or false, got {c.tie_embeddings!r}")
    _choice(c, "router_gate", ROUTER_GATES)
    _choice(c, "balance", BALANCES)
    _choice(c, "moe_impl", MOE_IMPLS)
    _choice(c, "compute_dtype", COMPUTE_DTYPES)
    _number_in(c, "balance_loss_coef", 0.0, inclusive=True)
    _number_in(c, "z_loss_coef", 0.0, inclusive=True)
    _number_in(c, "capacity_factor", 0.0, inclusive=False)
    _number_in(c, "rope_theta", 0.0, inclusive=False)
    _number_in(c, "norm_eps", 0.0, inclusive=False)
    _number_in(c, "init_std", 0.0, inclusive=False)
    if c.d_model % c.n_heads:
        raise ConfigError("n_heads", f"must divide {_other(c, 'd_model')}, got {_own(c, 'n_heads')}")
    if c.head_dim % 2:
        raise ConfigError(
            "n_heads",
            f"head size d_model/n_heads must be even for rotary, got {c.head_dim} "
            f"({_other(c, 'd_model')}, {_other(c, 'n_heads')})",
        )
    if c.n_heads % c.n_kv_heads:
        raise ConfigError("n_kv_heads", f"must divide {_other(c, 'n_heads')}, got {_own(c, 'n_kv_heads')}")
    if c.top_k > c.n_experts:
        raise ConfigError("top_k", f"expected at most {_other(c, 'n_experts')}, got {_own(c, 'top_k')}")
    if c.balance == "quantile" and c.top_k >= c.n_experts and c.moe_every > 0:
        raise ConfigError(
            "balance",
            "'quantile' needs top_k < n_experts (it thresholds at the (top_k+1)-th expert), "
            f"got {_other(c, 'top_k')}, {_other(c, 'n_experts')}",
        )


def _is_default(name: str) -> bool:
    given = _GIVEN.get()
    return given is not None and name not in given


def _own(c: ModelConfig, name: str) -> str:
    """The offending field's value, `6 (the default; set n_heads)` when not written."""
    value = getattr(c, name)
    return f"{value} (the default; set {name})" if _is_default(name) else f"{value}"


def _other(c: ModelConfig, name: str) -> str:
    """Another field named in a message, `d_model=192 (the default)` when not written."""
    value = getattr(c, name)
    return f"{name}={value} (the default)" if _is_default(name) else f"{name}={value}"
