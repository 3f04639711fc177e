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

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.model.config import ModelConfig
from marin_rules.validation import INT32_MAX, MAX_SEED, Int, ListOf, Number, OneOf, Optional, Rule, json_schema, parse

OPTIMIZERS = ("adamw", "muon")
NAME_AT_VERSION_HINT = "a 'name@version' string or a mapping of 'name@version' to a weight"
INT32_WHY = "steps and sizes are int32 in the jitted training step"

Count = Annotated[int, Int(min=1, max=INT32_MAX, max_why=INT32_WHY)]


class ModelRule(Rule):
    """`config.model`: a `ModelConfig` mapping, checked by `ModelConfig.from_dict`."""

    what = "the model settings (e.g. {d_model: 128, n_layers: 2})"
    settings = ModelConfig
    filled_in = frozenset({"vocab_size"})  # the tokenizer's when left out (`parse_train_config`)

    def check(self, value: Any, field: str) -> ModelConfig:
        try:
            return ModelConfig.from_dict(value)
        except ConfigError as e:
            raise e.within(field) from None

    def schema(self) -> dict[str, Any]:
        return json_schema(ModelConfig)


@dataclass(frozen=True)
class OptimizerConfig:
    name: Annotated[str, OneOf(OPTIMIZERS), "adamw everywhere, or muon for hidden matrices + adamw for the rest"] = "adamw"
    learning_rate: Annotated[float, Number(gt=0), "peak AdamW learning rate"] = 3e-3
    weight_decay: Annotated[float, Number(ge=0), "decoupled; not applied to norms, biases, router"] = 0.1
    betas: Annotated[
        tuple[float, float], ListOf(Number(ge=0, lt=1), "two numbers in [0, 1)", length=2), "AdamW's beta1, beta2"
    ] = (0.9, 0.95)
    muon_lr: Annotated[float, Number(gt=0), "peak learning rate of the Muon group (only with name: muon)"] = 0.02
    warmup_steps: Annotated[int, Int(min=0), "linear warmup: update s uses peak * (s+1) / warmup_steps (at most num_train_steps)"] = 0
    min_lr_ratio: Annotated[float, Number(ge=0, le=1), "cosine decays to peak * min_lr_ratio, reached one step after the last update"] = 0.1
    grad_clip: Annotated[float, Number(ge=0), "global-norm clipping; 0 turns it off"] = 1.0


@dataclass(frozen=True)
class MeshConfig:
    data: Annotated[int | None, Optional(Int(min=1)), "data-parallel size; null: all devices not used by expert"] = None
    expert: Annotated[int, Int(min=1), "expert-parallel size"] = 1


@dataclass(frozen=True)
class TrainConfig:
    model: Annotated[ModelConfig, ModelRule(), "the model (marin_rules/model/config.py)"]
    num_train_steps: Annotated[Count, "optimizer updates"]
    batch_size: Annotated[Count, "global sequences per optimizer step (all processes, all micro-batches)"]
    seq_len: Annotated[Count, "input tokens per sequence (at most model.max_seq_len)"]
    optimizer: Annotated[OptimizerConfig, "AdamW (or Muon + AdamW) and its schedule"] = OptimizerConfig()
    grad_accum_steps: Annotated[Count, "micro-batches per step; must divide batch_size"] = 1
    seed: Annotated[int, Int(min=0, max=MAX_SEED), "initialisation and data order"] = 0
    checkpoint_every: Annotated[Count, "steps between checkpoints"] = 100
    eval_every: Annotated[int, Int(min=0, max=INT32_MAX, max_why=INT32_WHY), "steps between validation losses; 0: only at the end"] = 0
    eval_batches: Annotated[Count, "validation batches of batch_size sequences per evaluation"] = 4
    log_every: Annotated[Count, "steps between metrics lines"] = 10
    mesh: Annotated[MeshConfig, "how devices split into data x expert parallelism"] = field(default_factory=MeshConfig)

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps


def parse_train_config(config: Any, vocab_size: int | None = None) -> TrainConfig:
    """The validated recipe. `vocab_size` (from the data) fills the model's if absent."""
    tc = parse(TrainConfig, config, "config")
    if vocab_size is not None and "vocab_size" not in config["model"]:
        tc = dataclasses.replace(tc, model=dataclasses.replace(tc.model, vocab_size=vocab_size))
    written_model = frozenset(config["model"])
    for name, why in tc.model.unused_settings(written_model).items():
        # set away from its default it changes the fingerprint and shows in marin diff for nothing
        # (a default written out, as a file copied from an older default experiment has, is let be)
        if name in written_model and getattr(tc.model, name) != ModelConfig.__dataclass_fields__[name].default:
            raise ConfigError(f"config.model.{name}", f"{getattr(tc.model, name)} is not used by this model: {why}")
    if tc.batch_size % tc.grad_accum_steps:
        raise ConfigError(
            "config.grad_accum_steps",
            f"batch_size {tc.batch_size} is not divisible by grad_accum_steps {tc.grad_accum_steps}; "
            "pick a divisor of batch_size",
        )
    if tc.seq_len > tc.model.max_seq_len:
        default = "" if "max_seq_len" in config["model"] else " (the model's default; set model.max_seq_len)"
        raise ConfigError(
            "config.seq_len", f"expected at most model.max_seq_len={tc.model.max_seq_len}{default}, got {tc.seq_len}"
        )
    ep = tc.mesh.expert
    if ep > 1 and tc.model.moe_every > 0 and tc.model.n_experts % ep:
        raise ConfigError(
            "config.mesh.expert", f"must divide model.n_experts={tc.model.n_experts} (each device holds whole experts), got {ep}"
        )
    check_batch_shards(tc)
    written = config.get("optimizer") or {}
    if tc.optimizer.name != "muon" and "muon_lr" in written:  # else silently unused
        default = "" if "name" in written else ", the default"
        raise ConfigError(
            "config.optimizer.muon_lr",
            f"used only with name: muon (name is {tc.optimizer.name}{default}); remove it or set name: muon",
        )
    if tc.optimizer.warmup_steps > tc.num_train_steps:
        raise ConfigError(
            "config.optimizer.warmup_steps",
            f"expected at most num_train_steps={tc.num_train_steps}, got {tc.optimizer.warmup_steps}",
        )
    return tc


def check_batch_shards(tc: TrainConfig) -> None:
    """At load, the part of the run's batch split (`check_batch_split`, which the run
    checks on its devices) that needs no devices: batch_size must divide into grad_accum_steps x mesh data x
    expert. Without `mesh.data` (all devices not used by expert) the data size comes
    from the devices, but the shards are still a multiple of `mesh.expert`."""
    data, expert = tc.mesh.data, tc.mesh.expert
    shards = (data or 1) * expert
    need = shards * tc.grad_accum_steps
    if tc.batch_size % need:
        shards_are = f"{shards} = mesh data {data} x expert {expert}" if data else (
            f"mesh expert {expert} x the data size the devices give")
        raise batch_split_error(tc, need, shards_are)


def mesh_on(tc: TrainConfig, devices: int, where: str = "this run") -> tuple[int, int]:
    """(data, expert) sizes of the run's mesh on `devices` devices (`mesh.data`, else
    every device not used by `mesh.expert`); a mesh larger than `devices` is the
    one-line error, `where` naming the run ("this run", or a pod type for the plan)."""
    expert = tc.mesh.expert
    data = tc.mesh.data if tc.mesh.data is not None else max(1, devices // expert)
    if data * expert > devices:
        raise ConfigError(
            "config.mesh",
            f"data={data} x expert={expert} needs {data * expert} devices, {where} has {devices}; "
            "lower config.mesh.data or config.mesh.expert",
        )
    return data, expert


def check_batch_split(tc: TrainConfig, shards: int, processes: int) -> None:
    """batch_size must divide into grad_accum_steps x `shards` (mesh data x expert) and
    into grad_accum_steps x `processes` (each process reads whole rows of each micro-batch)."""
    need = math.lcm(shards, processes) * tc.grad_accum_steps
    if tc.batch_size % need:
        per_process = f" and by grad_accum_steps x processes ({processes})" if processes > 1 else ""
        raise batch_split_error(tc, need, f"{shards} = mesh data x expert", per_process)


def batch_split_error(tc: TrainConfig, need: int, shards_are: str, per_process: str = "") -> ConfigError:
    """The one batch-split message of both checks: what batch_size must divide into,
    and the nearest multiple of `need` to try."""
    return ConfigError(
        "config.batch_size",
        f"{tc.batch_size} must be divisible by grad_accum_steps ({tc.grad_accum_steps}) x batch shards "
        f"({shards_are}){per_process}; try {need * max(1, tc.batch_size // need)}",
    )


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


def check_built_data(config: Mapping[str, Any], built: Mapping[str, Mapping[str, Any]]) -> None:
    """While planning, against the results of the `tokenize` builds of `deps.data` that
    this run serves as they are (`built`: key -> result): every split must hold at least
    seq_len + 1 tokens, or the run's loader refuses it at the job's start, after a plan
    priced it and the job began its attempt (`data.loader.TokenLoader`)."""
    seq_len = config.get("seq_len")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool):
        return
    for key, result in built.items():
        for split in ("train", "validation"):
            tokens = result.get(f"{split}_tokens")
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens < seq_len + 1:
                raise ConfigError(
                    "config.seq_len",
                    f"{seq_len} needs seq_len + 1 = {seq_len + 1} tokens in each split of deps.data, but the {split} "
                    f"split of {key} has {tokens}; lower seq_len, or give it more data (under a new version)",
                )


def repeated_validation(config: Mapping[str, Any], built: Mapping[str, Mapping[str, Any]]) -> str | None:
    """A note (or None) when each validation reads more sequences (`eval_batches` x
    `batch_size`) than the validation split of a single built `deps.data` holds (its
    tokens - 1 over seq_len): the loader then draws them again, so the validation loss
    averages repeats, which take longer and add nothing."""
    seq_len, batch, batches = (config.get(k) for k in ("seq_len", "batch_size", "eval_batches"))
    batches = TrainConfig.__dataclass_fields__["eval_batches"].default if batches is None else batches
    if len(built) != 1 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (seq_len, batch, batches)):
        return None
    ((key, result),) = built.items()
    tokens = result.get("validation_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= seq_len:
        return None
    held = (tokens - 1) // seq_len
    if batches * batch <= held:
        return None
    if held < batch:  # no eval_batches helps: one batch already repeats them
        return (f"deps.data: the validation split of {key} holds {held} sequence(s) of {seq_len} tokens, fewer than "
                f"one validation batch of {batch}: each validation loss averages repeats; give it more validation "
                "tokens (a new version) or lower seq_len")  # fmt: skip
    return (f"config.eval_batches: {batches} batches of {batch} sequences ({batches * batch}) is more than the {held} "
            f"sequence(s) of {seq_len} tokens the validation split of {key} holds: each validation loss averages "
            f"repeats (slower, no more exact); at most {held // batch} batch(es) read each once")


def check_train(config: Any, deps: Any) -> None:
    """The experiment loader's checker for `step: train` (no JAX imported)."""
    parse_train_config(config)
    check_deps(deps)


def check_train_upstream(config: Mapping[str, Any], upstream: Mapping[str, Any]) -> None:
    """At load, what the recipes of `deps.data` settle (each `tokenize` entry of this
    experiment, a mixture's members too; adopted or user-step data is checked when the
    step runs). A run always measures the validation loss (every `eval_every` steps and
    at the end: `final_val_loss`, which scaling fits read), so the data needs a
    validation split. An explicit `model.vocab_size` must hold the ids of a tokenizer
    trained with a `vocab_size`."""
    from marin_rules.data.checks import DEFAULT_VALIDATION_FRACTION
    from marin_rules.steps import Upstream

    data = upstream.get("data")
    members = [data] if isinstance(data, Upstream) else list((data or {}).values())
    model_vocab = (config.get("model") or {}).get("vocab_size")
    tokenizers = {m.key: [t.key for t in m.upstreams("tokenizer")] for m in members if m.step == "tokenize"}
    if len({tuple(keys) for keys in tokenizers.values()}) > 1:
        used = ", ".join(f"{key} with {' '.join(keys)}" for key, keys in tokenizers.items())
        raise ConfigError(
            "deps.data",
            f"a mixture needs one tokenizer, but its members are tokenized differently ({used}); "
            "tokenize every member with the same tokenizer artifact",
        )
    for tokenized in (m for m in members if m.step == "tokenize"):
        if tokenized.get("validation_fraction", DEFAULT_VALIDATION_FRACTION) == 0:
            raise ConfigError(
                "deps.data",
                f"{tokenized.key} has validation_fraction: 0 (no validation split), but training always measures "
                f"the validation loss (at the end, and every eval_every steps); set validation_fraction > 0 on "
                f"{tokenized.key} (the default is {DEFAULT_VALIDATION_FRACTION})",
            )
        for tokenizer in tokenized.upstreams("tokenizer"):
            vocab = tokenizer.get("vocab_size") if tokenizer.step == "train_tokenizer" else None
            # A trained tokenizer has at most its vocab_size ids (fewer when the corpus runs
            # out of merges, so a smaller model.vocab_size might happen to fit); one below it
            # fails whenever the tokenizer reaches its size, so it is refused here.
            if isinstance(model_vocab, int) and isinstance(vocab, int) and model_vocab < vocab:
                raise ConfigError(
                    "config.model.vocab_size",
                    f"{model_vocab} is smaller than the vocab_size {vocab} of tokenizer {tokenizer.key} (of "
                    f"{tokenized.key}, deps.data); set it to at least {vocab}, or leave it out to take the tokenizer's",
                )
