"""What a training run reports: step timing, metrics-log records, the result, the files.

Model: `Clock` times updates (batch and step), keeping a process's first one (it
includes compilation), validation and checkpoint saves out of throughput;
`train_record` is one line of `metrics.jsonl`; `summary` is the result the step returns (final losses, unigram
baseline, parameter and FLOP counts, tokens/s, MFU = tokens/s * FLOPs per token /
the run-wide peak); `write_outputs` writes the writer process's files (`loss.png`,
titled by `plot_title` with the model's depth and MoE layers; `model.json`, whose
locations are relative to the artifact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from marin_rules.artifacts import storage
from marin_rules.data.relative import relative_location
from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import active_params, flops_per_token, total_params
from marin_rules.train.config import TrainConfig
from marin_rules.train.metrics import MetricsLog, plot_losses
from marin_rules.train.optim import learning_rates


@dataclass
class Clock:
    """Step timing. Each update is timed from fetching its batch to its loss on the host
    (`add`); what happens between updates (logging, validation, checkpoint saves) is
    not, while an asynchronous checkpoint write that slows the next updates is. A
    process's first update (it includes compilation) is kept apart; the window is the
    updates since the last log line."""

    first_step_s: float | None = None
    timed_steps: int = 0
    timed_s: float = 0.0
    window_steps: int = 0
    window_s: float = 0.0

    def add(self, elapsed: float) -> None:
        if self.first_step_s is None:
            self.first_step_s = elapsed
            return
        self.timed_steps += 1
        self.timed_s += elapsed
        self.window_steps += 1
        self.window_s += elapsed

    def restart_window(self) -> None:
        self.window_steps, self.window_s = 0, 0.0

    def window_tokens_per_s(self, tokens_per_step: int) -> float | None:
        return self.window_steps * tokens_per_step / self.window_s if self.window_s else None

    def tokens_per_s(self, tokens_per_step: int) -> float | None:
        return self.timed_steps * tokens_per_step / self.timed_s if self.timed_s else None


def train_record(config: TrainConfig, step: int, metrics: Any, objective: float, tokens_per_s: float | None,
                 mfu: float | None) -> dict:  # fmt: skip
    """The metrics-log record of update `step` (1-based)."""
    host = jax.device_get(metrics)
    return {
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
        **learning_rates(config.optimizer, config.num_train_steps, step - 1),
        "tokens": step * config.batch_size * config.seq_len,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
    }


def summary(config: TrainConfig, start: int, losses: dict, last: dict, clock: Clock, peak_flops: float,
            mesh: tuple[int, int]) -> dict:  # fmt: skip
    """The run's result: `losses` holds `final_val` and `unigram`; `last` is the last train record."""
    model = config.model
    tokens_per_step = config.batch_size * config.seq_len
    fpt = flops_per_token(model, config.seq_len)
    tokens_per_s = clock.tokens_per_s(tokens_per_step)
    return {
        "final_train_loss": last.get("loss"),
        "final_val_loss": losses["final_val"],
        "unigram_val_loss": losses["unigram"],
        "steps": config.num_train_steps,
        "resumed_from_step": start,
        "tokens_seen": config.num_train_steps * tokens_per_step,
        "params": total_params(model),
        "active_params": active_params(model),
        "flops_per_token": fpt,
        "tokens_per_s": tokens_per_s,
        "peak_flops": peak_flops,
        "mfu": tokens_per_s * fpt / peak_flops if tokens_per_s else None,
        "compile_and_first_step_s": clock.first_step_s,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "mesh": {"data": mesh[0], "expert": mesh[1]},
    }


def plot_title(model: ModelConfig) -> str:
    """The title of `loss.png`: the model's depth and which of its layers are MoE."""
    if not model.n_moe_layers:
        return f"{model.n_layers}-layer dense"
    depth = f"{model.n_layers}-layer MoE" if model.moe_every == 1 else (
        f"{model.n_layers}-layer, MoE every {model.moe_every} layers")
    shared = " + shared" if model.shared_expert else ""
    return f"{depth}, {model.n_experts} experts{shared}, top-{model.top_k}"


OUTPUT_FILES = ("metrics.jsonl", "loss.png", "model.json")  # the writer's files beside the checkpoints


def write_outputs(config: TrainConfig, output: str, log: MetricsLog, losses: dict, tokenizer: str,
                  eos_id: int | None) -> None:  # fmt: skip
    """The writer's files: the final validation record, `loss.png`, `model.json`
    (locations in it are relative to the artifact, so the prefix can move)."""
    model, final_val, unigram = config.model, losses["final_val"], losses["unigram"]
    log.log({"split": "val", "step": config.num_train_steps, "loss": final_val})
    plot_losses(log, storage.join(output, "loss.png"), title=plot_title(model), baseline=unigram)
    info = {
        "model": model.to_dict(),
        "vocab_size": model.vocab_size,
        "tokenizer": relative_location(output, tokenizer),
        "eos_id": eos_id,
        "seq_len": config.seq_len,
        "final_step": config.num_train_steps,
        "checkpoints": "checkpoints",
    }
    storage.write_json_atomic(storage.join(output, "model.json"), info)
