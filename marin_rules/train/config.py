"""The `train` step's recipe: `TrainConfig`, parsed and checked without JAX.

Model: `config` of a `train` artifact is a plain mapping (the experiment's literals);
`parse_train_config` turns it into a frozen `TrainConfig` or raises
`ConfigError(field, message)` with `field` relative to the artifact entry
(`config.optimizer.learning_rate`). `check_train(config, deps)` is the checker the
experiment loader runs before anything starts; this module must stay importable
without jax, flax, optax or orbax (dry runs stay fast).

`batch_size` is the global number of sequences per optimizer step (summed over all
processes and over the `grad_accum_steps` micro-batches); each sequence holds
`seq_len` input tokens. Steps count optimizer updates. The compute dtype (f32 or
bf16) is the model's own `config.model.compute_dtype`; weights and optimizer state
stay float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError, got, number_text_hint

OPTIMIZERS = ("adamw", "muon")
NAME_AT_VERSION_HINT = "a 'name@version' string or a mapping of 'name@version' to a weight"


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"  # adamw everywhere, or muon for hidden matrices + adamw for the rest
    learning_rate: float = 3e-3  # peak AdamW learning rate
    weight_decay: float = 0.1  # decoupled; not applied to norms, biases, router
    betas: tuple[float, float] = (0.9, 0.95)
    muon_lr: float = 0.02  # peak learning rate of the Muon group (only with name: muon)
    warmup_steps: int = 0  # linear warmup from 0 to the peak
    min_lr_ratio: float = 0.1  # cosine decays to peak * min_lr_ratio at the last step
    grad_clip: float = 1.0  # global-norm clipping; 0 turns it off


@dataclass(frozen=True)
class MeshConfig:
    data: int | None = None  # None: all devices not used by `expert`
    expert: int = 1


@dataclass(frozen=True)
class TrainConfig:
    model: Any  # marin_rules.model.config.ModelConfig
    model_dict: Mapping[str, Any]  # the model section as given (vocab filled in at run time)
    optimizer: OptimizerConfig
    num_train_steps: int
    batch_size: int
    seq_len: int
    grad_accum_steps: int = 1
    seed: int = 0
    checkpoint_every: int = 100
    eval_every: int = 0  # 0: validation loss only at the end
    eval_batches: int = 4
    log_every: int = 10
    mesh: MeshConfig = MeshConfig()

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps


TOP_KEYS = {
    "model",
    "optimizer",
    "num_train_steps",
    "batch_size",
    "seq_len",
    "grad_accum_steps",
    "seed",
    "checkpoint_every",
    "eval_every",
    "eval_batches",
    "log_every",
    "mesh",
}
OPTIMIZER_KEYS = set(OptimizerConfig.__dataclass_fields__)
MESH_KEYS = {"data", "expert"}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int(d: Mapping, key: str, field: str, default: Any, minimum: int) -> int:
    value = d.get(key, default)
    if value is None or not _is_int(value) or value < minimum:
        raise ConfigError(field, f"expected an integer >= {minimum}, got {value!r}")
    return value


def _number(d: Mapping, key: str, field: str, default: Any, lo: float, hi: float | None = None,
            lo_open: bool = False, hi_open: bool = False) -> float:
    value = d.get(key, default)
    ok = _is_number(value) and (value > lo if lo_open else value >= lo)
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        bound = f"{'>' if lo_open else '>='} {lo:g}"
        if hi is not None:
            bound += f" and {'<' if hi_open else '<='} {hi:g}"
        raise ConfigError(field, f"expected a number {bound}, got {got(value)}")
    return float(value)


def _unknown(d: Mapping, allowed: set[str], field: str) -> None:
    for key in d:
        if key not in allowed:
            raise ConfigError(
                f"{field}.{key}" if field else str(key),
                f"unknown key; expected one of {', '.join(sorted(allowed))}",
            )


def parse_optimizer(d: Any) -> OptimizerConfig:
    field = "config.optimizer"
    if d is None:
        d = {}
    if not isinstance(d, Mapping):
        raise ConfigError(field, f"expected a mapping, got {d!r}")
    _unknown(d, OPTIMIZER_KEYS, field)
    default = OptimizerConfig()
    name = d.get("name", default.name)
    if name not in OPTIMIZERS:
        raise ConfigError(f"{field}.name", f"expected one of {', '.join(OPTIMIZERS)}, got {name!r}")
    betas = d.get("betas", list(default.betas))
    if (
        not isinstance(betas, (list, tuple))
        or len(betas) != 2
        or not all(_is_number(b) and 0 <= b < 1 for b in betas)
    ):
        hint = next((h for h in map(number_text_hint, betas if isinstance(betas, (list, tuple)) else []) if h), "")
        raise ConfigError(f"{field}.betas", f"expected two numbers in [0, 1), got {betas!r}{hint}")
    return OptimizerConfig(
        name=name,
        learning_rate=_number(d, "learning_rate", f"{field}.learning_rate", default.learning_rate, 0, lo_open=True),
        weight_decay=_number(d, "weight_decay", f"{field}.weight_decay", default.weight_decay, 0),
        betas=(float(betas[0]), float(betas[1])),
        muon_lr=_number(d, "muon_lr", f"{field}.muon_lr", default.muon_lr, 0, lo_open=True),
        warmup_steps=_int(d, "warmup_steps", f"{field}.warmup_steps", default.warmup_steps, 0),
        min_lr_ratio=_number(d, "min_lr_ratio", f"{field}.min_lr_ratio", default.min_lr_ratio, 0, 1),
        grad_clip=_number(d, "grad_clip", f"{field}.grad_clip", default.grad_clip, 0),
    )


def parse_mesh(d: Any) -> MeshConfig:
    field = "config.mesh"
    if d is None:
        return MeshConfig()
    if not isinstance(d, Mapping):
        raise ConfigError(field, f"expected a mapping like {{data: 4, expert: 2}}, got {d!r}")
    _unknown(d, MESH_KEYS, field)
    data = d.get("data")
    if data is not None and (not _is_int(data) or data < 1):
        raise ConfigError(f"{field}.data", f"expected an integer >= 1, got {data!r}")
    return MeshConfig(data=data, expert=_int(d, "expert", f"{field}.expert", 1, 1))


def parse_model(d: Any, vocab_size: int | None = None) -> Any:
    """`config.model` as a `ModelConfig` (its own checker; errors re-rooted)."""
    from marin_rules.model.config import ModelConfig  # jax-free by contract

    if not isinstance(d, Mapping):
        raise ConfigError("config.model", f"expected a mapping of model settings, got {d!r}")
    try:
        return ModelConfig.from_dict(dict(d), vocab_size=vocab_size)
    except ConfigError as e:
        raise e.within("config.model") from None


def parse_train_config(config: Any, vocab_size: int | None = None) -> TrainConfig:
    """The validated recipe. `vocab_size` (from the data) fills the model's if absent."""
    if not isinstance(config, Mapping):
        raise ConfigError("config", f"expected a mapping, got {config!r}")
    _unknown(config, TOP_KEYS, "config")
    if "model" not in config:
        raise ConfigError("config.model", "missing; give the model settings (e.g. {d_model: 128, n_layers: 2})")
    model = parse_model(config["model"], vocab_size)
    for key in ("num_train_steps", "batch_size", "seq_len"):
        if key not in config:
            raise ConfigError(f"config.{key}", "missing; expected an integer >= 1")
    tc = TrainConfig(
        model=model,
        model_dict=dict(config["model"]),
        optimizer=parse_optimizer(config.get("optimizer")),
        num_train_steps=_int(config, "num_train_steps", "config.num_train_steps", None, 1),
        batch_size=_int(config, "batch_size", "config.batch_size", None, 1),
        seq_len=_int(config, "seq_len", "config.seq_len", None, 1),
        grad_accum_steps=_int(config, "grad_accum_steps", "config.grad_accum_steps", 1, 1),
        seed=_int(config, "seed", "config.seed", 0, 0),
        checkpoint_every=_int(config, "checkpoint_every", "config.checkpoint_every", 100, 1),
        eval_every=_int(config, "eval_every", "config.eval_every", 0, 0),
        eval_batches=_int(config, "eval_batches", "config.eval_batches", 4, 1),
        log_every=_int(config, "log_every", "config.log_every", 10, 1),
        mesh=parse_mesh(config.get("mesh")),
    )
    if tc.batch_size % tc.grad_accum_steps:
        raise ConfigError(
            "config.grad_accum_steps",
            f"batch_size {tc.batch_size} is not divisible by grad_accum_steps {tc.grad_accum_steps}; "
            "pick a divisor of batch_size",
        )
    max_seq = _model_max_seq_len(model)
    if max_seq is not None and tc.seq_len > max_seq:
        default = "" if "max_seq_len" in config["model"] else " (the model's default; set model.max_seq_len)"
        raise ConfigError("config.seq_len", f"expected at most model.max_seq_len={max_seq}{default}, got {tc.seq_len}")
    if tc.optimizer.warmup_steps > tc.num_train_steps:
        raise ConfigError(
            "config.optimizer.warmup_steps",
            f"expected at most num_train_steps={tc.num_train_steps}, got {tc.optimizer.warmup_steps}",
        )
    return tc


def _model_max_seq_len(model: Any) -> int | None:
    for name in ("max_seq_len", "max_seq_length", "block_size", "context_length"):
        value = getattr(model, name, None)
        if _is_int(value):
            return value
    return None


def check_deps(deps: Any) -> None:
    """`deps` must hold exactly the role `data`: one tokenized artifact, or a mixture
    mapping artifacts to weights (checked by the data package's `check_mixture`)."""
    from marin_rules.data.checks import check_mixture  # jax-free

    if not isinstance(deps, Mapping) or "data" not in deps:
        raise ConfigError("deps.data", f"missing; the train step needs its token data as {NAME_AT_VERSION_HINT}")
    for role in deps:
        if role != "data":
            raise ConfigError(f"deps.{role}", "unknown role; the train step takes only 'data'")
    check_mixture(deps["data"], "deps.data")


def check_train(config: Any, deps: Any) -> None:
    """The experiment loader's checker for `step: train` (no JAX imported)."""
    parse_train_config(config)
    check_deps(deps)
