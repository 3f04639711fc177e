"""The training loop: batches in, optimizer steps, metrics, checkpoints, a result.

Model: `run` checks the run can start (mesh, batch divisibility, the recipe of any
checkpoints: `recipe.py` refuses before anything compiles), builds a `Plan` (the
mesh, the jitted steps of `steps.py`, the MFU ceiling), restores or initialises the
`TrainState`, then `train_steps` runs update after update: step `s` (0-based) always
trains on `loader.batch(s)`, so a run restored from checkpoint `s` continues exactly
as if it had never stopped. At the end it saves the last checkpoint, measures the
final validation loss and the unigram baseline, and the writer process writes
`model.json` and `loss.png`, and records in the result the digests of the final
checkpoint's files (`final_checkpoint_digests`: what `load_trained` checks) and of its
own files (`file_digests`: `marin verify` and the report check them). Every
process of a multi-process run executes the same loop on its own rows of each batch;
only process 0 writes metrics, plots and `model.json`. It says in one line which
checkpoint a run resumes from; a run that starts from scratch first moves the
`metrics.jsonl` and `loss.png` an earlier attempt left into the artifact's `.history/`
(`say_where_it_starts`), so a retry never overwrites the log of the attempt that failed.

Recorded steps count completed updates: the record of step `s` (1-based) holds the
loss of the batch that update `s` trained on and the learning rate it used.
What is reported and written at the end lives in `report.py`: throughput counts each
update from fetching its batch to its loss, leaving out a process's first update
(compilation), validation and checkpoint saves; MFU is tokens/s *
FLOPs per token over the peak of every device of the run (`model/peak.py`, or
`runtime.peak_flops`); a measured peak that the run beats (MFU > 1: measured while a
shared machine was busier) is measured again (`raised_ceiling`).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np
from tqdm import tqdm

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.artifacts.files import FILE_DIGESTS, discard, history_entry, move_into_history, named_digests
from marin_rules.dev_versions import DISCARDED
from marin_rules.model.flops import flops_per_token
from marin_rules.model.peak import run_peak_flops
from marin_rules.model.sharding import make_mesh
from marin_rules.train import checkpoint, distributed
from marin_rules.train.config import TrainConfig, check_batch_split, mesh_on
from marin_rules.train.metrics import MetricsLog
from marin_rules.train.optim import make_optimizer
from marin_rules.train.recipe import claim_checkpoints
from marin_rules.train.report import OUTPUT_FILES, Clock, summary, train_record, write_outputs
from marin_rules.train.steps import batch_sharding, global_batch, init_model, make_eval_step, make_train_step
from marin_rules.train.unigram import unigram_counts, unigram_loss

VAL_SPLIT = "validation"


@dataclass(frozen=True)
class Data:
    """The batches a run sees: train loader, validation loader, and what they carry."""

    train: Any  # marin_rules.data.loader.TokenLoader
    val: Any
    vocab_size: int
    tokenizer: str  # location of tokenizer.json
    eos_id: int | None


class TrainState(NamedTuple):
    params: Any
    state: Any
    opt_state: Any

    def weights(self) -> dict:
        """The checkpoint's `model` item."""
        return {"params": self.params, "state": self.state}


@dataclass(frozen=True)
class Plan:
    """Everything fixed before the first step."""

    config: TrainConfig
    data: Data
    output: str
    sharding: Any  # of a batch [accum, rows, seq_len + 1]
    train_step: Any
    eval_step: Any
    peak_flops: float  # every device of the run, FLOP/s
    writer: bool
    peak_dtype: str | None = None  # the dtype peak_flops was measured in; None: given (runtime.peak_flops)

    @property
    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.config.seq_len

    def mfu(self, tokens_per_s: float | None) -> float | None:
        fpt = flops_per_token(self.config.model, self.config.seq_len)
        return tokens_per_s * fpt / self.peak_flops if tokens_per_s else None


def raised_ceiling(plan: Plan, tokens_per_s: float | None, measure: Any = run_peak_flops) -> Plan:
    """`plan`, or, when the run just beat its MFU ceiling (MFU > 1: the ceiling was
    measured while the machine was busier, as a shared CPU often is), `plan` with the
    ceiling measured again (`measure(dtype, mesh=)`) and the higher of the two kept, said in one
    line, once per run (each log step would pay for it while MFU stays above 1). A
    ceiling given as `runtime.peak_flops` is the user's and stays."""
    mfu = plan.mfu(tokens_per_s)
    if mfu is None or mfu <= 1 or plan.peak_dtype is None:
        return plan
    again = measure(plan.peak_dtype, mesh=plan.sharding.mesh)
    peak = max(plan.peak_flops, again)
    if plan.writer:
        print(f"train: MFU {mfu:.2f} against the matmul ceiling measured at the start ({plan.peak_flops / 1e9:,.1f} "
              f"GFLOP/s): measured again, {again / 1e9:,.1f} GFLOP/s; MFU from now on is against "
              f"{peak / 1e9:,.1f} GFLOP/s", file=sys.stderr, flush=True)  # fmt: skip
    return replace(plan, peak_flops=peak, peak_dtype=None)  # once: a second measure would cost every log step


def mesh_shape(config: TrainConfig) -> tuple[int, int]:
    """(data, expert) of the run's mesh on this run's devices (`config.mesh_on`)."""
    try:
        return mesh_on(config, jax.device_count())
    except ConfigError as e:
        raise StepError(str(e)) from None


def check_divisible(config: TrainConfig, shards: int) -> None:
    try:
        check_batch_split(config, shards, jax.process_count())
    except ConfigError as e:
        raise StepError(str(e)) from None


def open_checkpoints(output: str, recipe: Mapping[str, Any] | None, writer: bool) -> tuple[Any, int]:
    """The checkpoint manager at `output` and its latest step (0: none), once the
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


def start_state(
    config: TrainConfig, mesh: Any, manager: Any, output: str, keep_history: bool = True
) -> tuple[Any, Any, TrainState, int]:
    """(graphdef, optimizer, state, step): fresh weights at step 0, or those of the newest
    checkpoint that restores (`checkpoint.restore_latest`: damaged newer ones are set
    aside, or deleted without `keep_history`)."""
    graphdef, params, state = init_model(config.model, config.seed, mesh)
    tx = make_optimizer(config.optimizer, config.num_train_steps)
    opt_state = jax.jit(tx.init)(params)
    start, weights, restored = checkpoint.restore_latest(
        manager, output, {"params": params, "state": state}, opt_state, keep_history
    )
    if start:
        params, state, opt_state = weights["params"], weights["state"], restored
    return graphdef, tx, TrainState(params, state, opt_state), start


RESTARTED = "restarted"  # the `.history/<UTC time>-restarted/` of an earlier attempt's logs
EARLIER_LOGS = ("metrics.jsonl", "loss.png")


def say_where_it_starts(config: TrainConfig, output: str, start: int, keep_history: bool = True) -> None:
    """One line on the writer's stderr when resuming from checkpoint `start`. A run that
    starts from scratch moves the logs an earlier attempt left (one that saved no
    checkpoint that restores) to `.history/<UTC time>-restarted/`, or deletes them
    without `keep_history` (a dev version), and says so, instead of overwriting them."""
    if start:
        where = storage.join(checkpoint.checkpoint_dir(output), str(start))
        print(f"train: resuming from checkpoint {start} of {config.num_train_steps} ({where})",
              file=sys.stderr, flush=True)  # fmt: skip
        return
    found = [name for name in EARLIER_LOGS if storage.exists(storage.join(output, name))]
    if not found:
        return
    if keep_history:
        entry = history_entry(move_into_history(output, found[0], RESTARTED))
        for name in found[1:]:
            storage.move(storage.join(output, name), storage.join(entry, name))
        where = f"moved to {entry}"
    else:
        for name in found:
            discard(storage.join(output, name))
        where = DISCARDED
    print(f"train: no checkpoint to resume from; {' and '.join(found)} of an earlier attempt: {where}; "
          "training from scratch", file=sys.stderr, flush=True)  # fmt: skip


def validation_loss(plan: Plan, ts: TrainState) -> float:
    """Mean loss over `eval_batches` validation batches of `batch_size` rows each, run
    as the training step's micro-batches (the same rows whatever `grad_accum_steps`)."""
    pid, nproc, accum = jax.process_index(), jax.process_count(), plan.config.grad_accum_steps
    losses = []
    for s in range(plan.config.eval_batches):
        micro_batches = global_batch(plan.data.val.batch(s, pid, nproc, accum), accum, plan.sharding)
        losses += [plan.eval_step(ts.params, ts.state, micro_batches[j]) for j in range(accum)]
    return float(np.mean(jax.device_get(losses)))


def check_finite(objective: float, step: int, config: TrainConfig) -> None:
    """A StepError when the loss of `step` (computed before that step's update) is not
    finite. At step 1 no update has happened: the initial model itself is not finite."""
    if math.isfinite(objective):
        return
    if step == 1:
        raise StepError(
            f"loss is {objective} at step 1, before any update: the initialised model's forward pass is not "
            "finite; check config.model (rope_theta, init_std, norm_eps) and run again"
        )
    opt = config.optimizer
    rates = f"config.optimizer.learning_rate (now {opt.learning_rate})"
    if opt.name == "muon":
        rates += f" or config.optimizer.muon_lr (now {opt.muon_lr})"
    clip = "set config.optimizer.grad_clip (now 0: off)" if opt.grad_clip <= 0 else f"lower config.optimizer.grad_clip (now {opt.grad_clip})"
    raise StepError(f"loss became {objective} at step {step}; lower {rates}, or {clip}, and run again")


def train_steps(
    plan: Plan, ts: TrainState, start: int, manager: Any, log: MetricsLog
) -> tuple[TrainState, dict | None, Clock, float]:
    """Updates `start`..num_train_steps-1 with their logs, validations and checkpoints.
    Returns the final state, the last train record logged (None if no step ran), the
    clock, and the MFU ceiling (`raised_ceiling`: measured again if the run beat it)."""
    config = plan.config
    pid, nproc, accum = jax.process_index(), jax.process_count(), config.grad_accum_steps
    clock, last, saved = Clock(), None, None
    name = plan.output.rstrip("/").rsplit("/", 1)[-1]
    bar = tqdm(total=config.num_train_steps, initial=start, desc=f"train {name}", file=sys.stderr,
               disable=not plan.writer, dynamic_ncols=True,
               mininterval=0.1 if sys.stderr.isatty() else 10.0)  # a job log: a line every 10 s, not 10 a second  # fmt: skip
    try:
        for s in range(start, config.num_train_steps):
            step, final = s + 1, s + 1 == config.num_train_steps
            t0 = time.perf_counter()
            batch = global_batch(plan.data.train.batch(s, pid, nproc, accum), accum, plan.sharding)
            *parts, metrics = plan.train_step(*ts, batch)
            ts = TrainState(*parts)
            objective = float(metrics["loss"])  # waits for the step: also the NaN check
            clock.add(time.perf_counter() - t0)
            check_finite(objective, step, config)
            bar.update(1)
            if step % config.log_every == 0 or final:
                tokens_per_s = clock.window_tokens_per_s(plan.tokens_per_step)
                plan = raised_ceiling(plan, tokens_per_s)
                last = train_record(config, step, metrics, objective, tokens_per_s, plan.mfu(tokens_per_s))
                if plan.writer:
                    log.log(last)
                bar.set_postfix(loss=f"{last['loss']:.3f}")
                clock.restart_window()
            if config.eval_every and step % config.eval_every == 0 and not final:
                val = validation_loss(plan, ts)
                if plan.writer:
                    log.log({"split": "val", "step": step, "loss": val})
            if step % config.checkpoint_every == 0 or final:
                checkpoint.save(manager, step, ts.weights(), ts.opt_state)  # begins once the one before is committed
                if plan.writer and saved is not None:
                    note_digests(plan.output, saved)
                saved = step
    finally:
        bar.close()
        manager.wait_until_finished()
        latest = manager.latest_step()  # the last one committed, a stop's too (a resume checks it)
        if plan.writer and latest is not None and latest > start:
            note_digests(plan.output, latest)
    return ts, last, clock, plan.peak_flops


def note_digests(output: str, step: int) -> None:
    """`checkpoint.record_step_digests`, which never stops the run (nor replaces the error
    that did): without its note a resume restores that checkpoint unchecked, as it says."""
    try:
        checkpoint.record_step_digests(output, step)
    except Exception as e:  # noqa: BLE001 - a listing or write that failed: the checkpoint itself is whole
        print(f"train: no digests noted for checkpoint {step} ({type(e).__name__}: {e}); a resume from it "
              "restores it unchecked", file=sys.stderr, flush=True)  # fmt: skip


def run(
    config: TrainConfig, data: Data, output: str, runtime: Mapping[str, Any], recipe: Mapping[str, Any] | None = None,
    keep_history: bool = True,
) -> dict:
    """Train (or resume) the run at `output`; returns the result summary. `recipe`
    (`recipe.make_recipe` of the step's config and deps) is recorded with fresh
    checkpoints and must match the stored one to resume. `runtime.peak_flops` (FLOP/s
    of all devices of the run) skips measuring the MFU ceiling. Without `keep_history`
    (a dev version) a checkpoint that does not restore, and the logs of an earlier
    attempt a fresh start replaces, are deleted, not set aside."""
    writer = distributed.is_writer()
    data_size, expert_size = mesh_shape(config)
    check_divisible(config, data_size * expert_size)
    manager, _ = open_checkpoints(output, recipe, writer)  # refuse before compiling anything
    mesh = make_mesh(data_size, expert_size)
    given = runtime.get("peak_flops")
    peak = float(given or run_peak_flops(config.model.compute_dtype, mesh=mesh))
    with jax.set_mesh(mesh):
        try:
            graphdef, tx, ts, start = start_state(config, mesh, manager, output, keep_history)  # may fall back to an earlier step
        except BaseException:
            manager.close()
            raise
        if writer:
            say_where_it_starts(config, output, start, keep_history)
        plan = Plan(config, data, output, batch_sharding(mesh), make_train_step(graphdef, tx, config.grad_accum_steps),
                    make_eval_step(config.model), peak, writer, None if given else config.model.compute_dtype)  # fmt: skip
        log = MetricsLog.resume(storage.join(output, "metrics.jsonl"), start)
        ts, last, clock, peak = train_steps(plan, ts, start, manager, log)  # its last step saves a checkpoint
        manager.close()
        if writer:
            checkpoint.neutral_commit_notes(output)
        final_val = validation_loss(plan, ts)  # (every process: no one waits on the writer's digests first)
        # what consumers check before loading
        digests = checkpoint.model_digests(output, config.num_train_steps) if writer else {}
    if last is None:  # resumed from the final checkpoint: nothing left to train
        last = next((r for r in reversed(log.records) if r.get("split") == "train"), {})
    counts = unigram_counts(data.train, vocab_size=data.vocab_size)
    unigram = unigram_loss(counts, data.val, val_batches=config.eval_batches)
    losses = {"final_val": final_val, "unigram": unigram}
    if writer:
        write_outputs(config, output, log, losses, data.tokenizer, data.eos_id)
    result = summary(config, start, losses, last, clock, peak, (data_size, expert_size))
    if not writer:
        return result
    # the files beside the checkpoints, by content too (`marin verify`, the report's gather)
    return {**result, checkpoint.DIGESTS_KEY: digests, FILE_DIGESTS: named_digests(output, OUTPUT_FILES)}
