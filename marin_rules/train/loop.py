"""The training loop: batches in, optimizer steps, metrics, checkpoints, a result.

Model: the model lives as three pytrees, `params` (the `nnx.Param`s the optimizer
updates), `state` (other model variables, e.g. the quantile router bias) and the
optimizer state, all placed on a ('data', 'expert') mesh. One jitted `train_step`
takes them and a batch [grad_accum_steps, micro_batch, seq_len + 1], averages the
micro-batches' gradients, applies one optimizer update, then lets the model package
replace its router bias (`update_router_bias`). Step `s` (0-based) always trains on
`loader.batch(s)`, so a run restored from checkpoint `s` continues exactly as if it
had never stopped, provided the checkpoints belong to the same recipe (`recipe.py`
refuses them otherwise, before anything compiles). Every process of a multi-process run executes the same loop on
its own rows of each batch; only process 0 writes metrics, plots and `model.json`.

Recorded steps count completed updates: the record of step `s` (1-based) holds the
loss of the batch that update `s` trained on and the learning rate it used.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import StepError
from marin_rules.model.flops import active_params, flops_per_token, total_params
from marin_rules.model.sharding import BATCH_AXES, make_mesh, state_shardings
from marin_rules.model.transformer import MoETransformer, loss_and_aux, update_router_bias
from marin_rules.train import checkpoint, distributed
from marin_rules.train.config import TrainConfig
from marin_rules.train.metrics import MetricsLog, plot_losses
from marin_rules.train.optim import learning_rates, make_optimizer
from marin_rules.train.recipe import claim_checkpoints

VAL_SPLIT = "validation"


@dataclass(frozen=True)
class Data:
    """The batches a run sees: train loader, validation loader, and what they carry."""

    train: Any  # marin_rules.data.loader.TokenLoader
    val: Any
    vocab_size: int
    tokenizer: str  # location of tokenizer.json
    eos_id: int | None


def measure_peak_flops(n: int = 2048, repeats: int = 3) -> float:
    """This machine's f32 matmul throughput (FLOP/s) on the first local device: the
    ceiling MFU is measured against (no vendor figure exists for a CPU)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def init_model(model_config: Any, seed: int, mesh: Any) -> tuple[Any, Any, Any]:
    """(graphdef, params, state) of a freshly initialised model, created in one jitted
    call directly into its shardings (one compilation instead of one per weight;
    every process gets its part of the same global arrays)."""

    def create():
        return MoETransformer(model_config, rngs=nnx.Rngs(params=seed))

    abstract = nnx.eval_shape(create)
    shardings = state_shardings(abstract, mesh)
    graphdef, _ = nnx.split(abstract)
    weights = jax.jit(lambda: nnx.state(create()), out_shardings=shardings)()
    model = nnx.merge(graphdef, weights)
    return nnx.split(model, nnx.Param, ...)


def batch_spec() -> P:
    """[accum, rows, seq_len+1]: rows split over ('data', 'expert') like the model wants."""
    return P(None, BATCH_AXES, None)


def global_batch(local: np.ndarray, accum: int, sharding: NamedSharding) -> jax.Array:
    """This process's rows [b, T+1] as its part of the global [accum, B/accum, T+1]."""
    rows, width = local.shape
    local = np.ascontiguousarray(local.reshape(accum, rows // accum, width), dtype=np.int32)
    global_shape = (accum, rows * jax.process_count() // accum, width)
    return jax.make_array_from_process_local_data(sharding, local, global_shape)


def make_train_step(graphdef: Any, tx: optax.GradientTransformation, accum: int):
    def loss_fn(params, state, tokens):
        return loss_and_aux(nnx.merge(graphdef, params, state), tokens)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(params, state, opt_state, batch):
        if accum == 1:
            (_, metrics), grads = grad_fn(params, state, batch[0])
        else:

            def micro(total, tokens):
                (_, m), g = grad_fn(params, state, tokens)
                return jax.tree.map(jnp.add, total, g), m

            zeros = jax.tree.map(jnp.zeros_like, params)
            grads, ms = jax.lax.scan(micro, zeros, batch)
            grads = jax.tree.map(lambda g: g / accum, grads)
            metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), ms)
        metrics["grad_norm"] = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        model = nnx.merge(graphdef, params, state)
        update_router_bias(model, metrics)
        _, _, state = nnx.split(model, nnx.Param, ...)
        metrics.pop("quantile_beta", None)
        return params, state, opt_state, metrics

    return jax.jit(train_step)


def make_eval_step(graphdef: Any):
    def eval_step(params, state, tokens):
        _, metrics = loss_and_aux(nnx.merge(graphdef, params, state), tokens)
        return metrics["ce_loss"]

    return jax.jit(eval_step)


def unigram_counts(train: Any, *, sample_batches: int, vocab_size: int) -> np.ndarray:
    """Token counts of the training data: exact over every token of each source,
    mixed by the sources' weights, when the loader exposes its token sources;
    otherwise over its first `sample_batches` batches."""
    sources = getattr(train, "sources", None)
    if sources:
        counts = np.zeros(vocab_size, np.float64)
        for source, weight in zip(sources, train.weights):
            c = np.zeros(vocab_size, np.float64)
            for shard in source.shards:
                for i in range(0, len(shard), 1 << 22):
                    c += np.bincount(np.asarray(shard[i : i + (1 << 22)]), minlength=vocab_size)[:vocab_size]
            counts += weight * c / max(c.sum(), 1.0)
        return counts * sum(int(s.n_tokens) for s in sources)
    counts = np.zeros(vocab_size, np.float64)
    for s in range(sample_batches):
        counts += np.bincount(np.asarray(train.batch(s))[:, 1:].ravel(), minlength=vocab_size)[:vocab_size]
    return counts


def unigram_loss(counts: np.ndarray, val: Any, *, val_batches: int) -> float:
    """Cross-entropy (nats/token) on the validation batches' targets of the add-one
    smoothed unigram distribution `counts`: the baseline a language model must beat."""
    counts = counts + 1.0
    logp = np.log(counts / counts.sum())
    total, n = 0.0, 0
    for s in range(val_batches):
        targets = np.asarray(val.batch(s))[:, 1:].ravel()
        total -= float(logp[targets].sum())
        n += targets.size
    return total / max(n, 1)


def mesh_shape(config: TrainConfig) -> tuple[int, int]:
    n = jax.device_count()
    expert = config.mesh.expert
    data = config.mesh.data if config.mesh.data is not None else max(1, n // expert)
    if data * expert > n:
        raise StepError(
            f"config.mesh: data={data} x expert={expert} needs {data * expert} devices, "
            f"this run has {n}; lower config.mesh.data or config.mesh.expert"
        )
    return data, expert


def check_divisible(config: TrainConfig, shards: int) -> None:
    need = shards * config.grad_accum_steps
    per_process = jax.process_count() * config.grad_accum_steps
    if config.batch_size % need or config.batch_size % per_process:
        raise StepError(
            f"config.batch_size: {config.batch_size} must be divisible by grad_accum_steps "
            f"({config.grad_accum_steps}) x batch shards ({shards} = mesh data x expert) and by "
            f"grad_accum_steps x processes ({jax.process_count()}); try {need * max(1, config.batch_size // need)}"
        )


def open_checkpoints(output: str, recipe: Mapping[str, Any] | None, writer: bool) -> tuple[Any, int]:
    """The checkpoint manager at `output` and the step to start from, once the
    checkpoints there are known to belong to `recipe` (see `recipe.py`; None skips
    the check). On a refusal the manager is closed and nothing is written."""
    manager = checkpoint.open_manager(output)
    start = checkpoint.latest_step(manager) or 0
    if recipe is not None:
        try:
            claim_checkpoints(output, recipe, resuming=bool(start), writer=writer)
        except BaseException:
            manager.close()
            raise
    return manager, start


def run(
    config: TrainConfig, data: Data, output: str, runtime: Mapping[str, Any], recipe: Mapping[str, Any] | None = None
) -> dict:
    """Train (or resume) the run at `output`; returns the result summary. `recipe`
    (`recipe.make_recipe` of the step's config and deps) is recorded with fresh
    checkpoints and must match the stored one to resume."""
    writer = distributed.is_writer()
    model_config = config.model
    data_size, expert_size = mesh_shape(config)
    check_divisible(config, data_size * expert_size)
    manager, start = open_checkpoints(output, recipe, writer)  # refuse before compiling anything
    mesh = make_mesh(data_size, expert_size)
    accum = config.grad_accum_steps
    tokens_per_step = config.batch_size * config.seq_len
    peak = float(runtime.get("peak_flops") or measure_peak_flops())
    fpt = flops_per_token(model_config, config.seq_len)

    with jax.set_mesh(mesh):
        graphdef, params, state = init_model(model_config, config.seed, mesh)
        tx = make_optimizer(config.optimizer, config.num_train_steps)
        opt_state = jax.jit(tx.init)(params)
        train_step = make_train_step(graphdef, tx, accum)
        eval_step = make_eval_step(graphdef)
        sharding = NamedSharding(mesh, batch_spec())
        pid, nproc = jax.process_index(), jax.process_count()

        if start:
            weights, opt_state = checkpoint.restore(manager, start, {"params": params, "state": state}, opt_state)
            params, state = weights["params"], weights["state"]
        log = MetricsLog.resume(storage.join(output, "metrics.jsonl"), start)

        def validation_loss() -> float:
            losses = []
            for s in range(config.eval_batches):
                tokens = global_batch(data.val.batch(s, pid, nproc), 1, sharding)[0]
                losses.append(eval_step(params, state, tokens))
            return float(np.mean(jax.device_get(losses)))

        bar = tqdm(
            total=config.num_train_steps,
            initial=start,
            desc=f"train {output.rstrip('/').rsplit('/', 1)[-1]}",
            file=sys.stderr,
            disable=not writer,
            dynamic_ncols=True,
        )
        first_step_s = None
        window_start, window_steps = time.perf_counter(), 0
        timed_steps, timed_s = 0, 0.0
        last_train: dict | None = None
        for s in range(start, config.num_train_steps):
            step = s + 1
            batch = global_batch(data.train.batch(s, pid, nproc), accum, sharding)
            t0 = time.perf_counter()
            params, state, opt_state, metrics = train_step(params, state, opt_state, batch)
            objective = float(metrics["loss"])  # waits for the step: also the NaN check
            elapsed = time.perf_counter() - t0
            if not math.isfinite(objective):
                bar.close()
                manager.wait_until_finished()
                raise StepError(
                    f"loss became {objective} at step {step}; lower config.optimizer.learning_rate "
                    f"(now {config.optimizer.learning_rate}) or set config.optimizer.grad_clip, "
                    f"and bump the version"
                )
            if first_step_s is None:
                first_step_s = elapsed  # includes compilation: kept out of throughput
                window_start, window_steps = time.perf_counter(), 0
            else:
                timed_steps += 1
                timed_s += elapsed
                window_steps += 1
            bar.update(1)
            if step % config.log_every == 0 or step == config.num_train_steps:
                now = time.perf_counter()
                tps = window_steps * tokens_per_step / (now - window_start) if window_steps else None
                host = jax.device_get(metrics)
                record = {
                    "split": "train",
                    "step": step,
                    "loss": float(host["ce_loss"]),
                    "objective": objective,
                    "balance_loss": float(host["balance_loss"]),
                    "z_loss": float(host["z_loss"]),
                    "dropped_fraction": float(host["dropped_fraction"]),
                    "routing_entropy": float(host["routing_entropy"]),
                    "expert_load": np.asarray(host["expert_load"]).round(4).tolist(),
                    "grad_norm": float(host["grad_norm"]),
                    **learning_rates(config.optimizer, config.num_train_steps, s),
                    "tokens": step * tokens_per_step,
                    "tokens_per_s": tps,
                    "mfu": tps * fpt / (peak * nproc) if tps else None,
                }
                last_train = record
                if writer:
                    log.log(record)
                bar.set_postfix(loss=f"{record['loss']:.3f}")
                window_start, window_steps = time.perf_counter(), 0
            if config.eval_every and step % config.eval_every == 0 and step != config.num_train_steps:
                val = validation_loss()
                if writer:
                    log.log({"split": "val", "step": step, "loss": val})
                window_start, window_steps = time.perf_counter(), 0
            if step % config.checkpoint_every == 0 or step == config.num_train_steps:
                checkpoint.save(manager, step, {"params": params, "state": state}, opt_state)
        bar.close()
        if checkpoint.latest_step(manager) != config.num_train_steps:
            checkpoint.save(manager, config.num_train_steps, {"params": params, "state": state}, opt_state)
        manager.wait_until_finished()
        manager.close()

        final_val = validation_loss()

    if last_train is None:  # resumed from the final checkpoint: nothing left to train
        earlier = [r for r in log.records if r.get("split") == "train"]
        last_train = earlier[-1] if earlier else {}
    counts = unigram_counts(
        data.train,
        sample_batches=min(config.num_train_steps, max(1, 2_000_000 // tokens_per_step)),
        vocab_size=data.vocab_size,
    )
    unigram = unigram_loss(counts, data.val, val_batches=config.eval_batches)
    tokens_per_s = timed_steps * tokens_per_step / timed_s if timed_s else None
    result = {
        "final_train_loss": last_train.get("loss"),
        "final_val_loss": final_val,
        "unigram_val_loss": unigram,
        "steps": config.num_train_steps,
        "resumed_from_step": start,
        "tokens_seen": config.num_train_steps * tokens_per_step,
        "params": total_params(model_config),
        "active_params": active_params(model_config),
        "flops_per_token": fpt,
        "tokens_per_s": tokens_per_s,
        "peak_flops": peak,
        "mfu": tokens_per_s * fpt / (peak * nproc) if tokens_per_s else None,
        "compile_and_first_step_s": first_step_s,
        "devices": jax.device_count(),
        "processes": nproc,
        "mesh": {"data": data_size, "expert": expert_size},
    }
    if writer:
        log.log({"split": "val", "step": config.num_train_steps, "loss": final_val})
        plot_losses(
            log,
            storage.join(output, "loss.png"),
            title=f"{model_config.n_layers}-layer MoE, {model_config.n_experts} experts, top-{model_config.top_k}",
            baseline=unigram,
        )
        storage.write_json_atomic(
            storage.join(output, "model.json"),
            {
                "model": model_config.to_dict(),
                "vocab_size": model_config.vocab_size,
                "tokenizer": data.tokenizer,
                "eos_id": data.eos_id,
                "seq_len": config.seq_len,
                "final_step": config.num_train_steps,
                "checkpoints": "checkpoints",
            },
        )
    return result
