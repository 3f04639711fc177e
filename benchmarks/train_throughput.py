"""Training throughput of the trainer's own step, per MoE backend and for a dense model
with the same active parameters, side by side, with the matmul ceiling measured alongside.

Model: every variant runs the very step `marin_rules/train/loop.py` runs
(`train/steps.py:make_train_step`: gradient accumulation over `--accum` micro-batches,
global-norm clipping, the configured optimizer (Muon + AdamW by default), the
router-bias update), built from a `TrainConfig` by the trainer's own `init_model`
and `make_optimizer`, on a 1x1 mesh, with batches placed by `global_batch` as the
loop places them. Each is compiled and warmed up; then `--rounds` rounds each time
one step of every variant in turn, followed by one matmul peak measurement in the
model's compute dtype (`model/peak.py`), so load swings on a shared machine hit all
alike, and each round's MFU is measured against that round's ceiling. Figures are
medians over rounds. MFU = tokens/s * flops_per_token (nanoGPT count, active
parameters) / peak. The dense baseline is the same config with `moe_every=0` and
`d_ff = top_k * d_expert` (+ d_expert with a shared expert): the same active FFN
parameters, no router.

Usage: python benchmarks/train_throughput.py [--rounds 5] [--batch 16] [--seq 128]
       [--accum 2] [--optimizer muon] [--backends dense,capacity,ragged]
Last line: JSON with benchmark, ratio (best MoE backend tokens/s / dense; target
>= 0.9), baseline, and every variant's figures (dense MFU target: >= 0.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np
from tqdm import tqdm

from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import active_params, flops_per_token, total_params
from marin_rules.model.peak import local_peak_flops
from marin_rules.model.sharding import make_mesh
from marin_rules.train.config import parse_train_config
from marin_rules.train.optim import make_optimizer
from marin_rules.train.steps import batch_sharding, global_batch, init_model, make_train_step

# the default experiment's model (experiments/default.yaml): what this project trains
MOE = dict(
    vocab_size=4096, max_seq_len=128, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
    d_ff=512, n_experts=4, top_k=2, d_expert=256, moe_every=1,
)  # fmt: skip


def dense_baseline(model: dict) -> dict:
    hidden = model["top_k"] * model["d_expert"] + (model["d_expert"] if model.get("shared_expert") else 0)
    return {**model, "moe_every": 0, "d_ff": hidden}


def compile_step(model: dict, args: argparse.Namespace):
    """(one step as a zero-argument callable, the TrainConfig, compile seconds)."""
    config = parse_train_config({
        "model": model, "optimizer": {"name": args.optimizer}, "num_train_steps": 1000,
        "batch_size": args.batch, "seq_len": args.seq, "grad_accum_steps": args.accum,
    })  # fmt: skip
    mesh = make_mesh(1, 1)
    with jax.set_mesh(mesh):
        graphdef, params, state = init_model(config.model, 0, mesh)
        tx = make_optimizer(config.optimizer, config.num_train_steps)
        opt_state = jax.jit(tx.init)(params)
        step = make_train_step(graphdef, tx, config.grad_accum_steps)
        rows = np.random.default_rng(0).integers(0, config.model.vocab_size, (args.batch, args.seq + 1))
        batch = global_batch(rows.astype(np.int32), config.grad_accum_steps, batch_sharding(mesh))
    carry = [params, state, opt_state]

    def run() -> float:
        with jax.set_mesh(mesh):
            *new, metrics = step(*carry, batch)
            carry[:] = new
            return float(metrics["loss"])  # waits for the step

    t = time.perf_counter()
    run()
    compile_s = time.perf_counter() - t
    run()  # one more warm-up step
    return run, config, compile_s


def figures(config, args, times: list[float], peaks: list[float], compile_s: float) -> dict:
    fpt = flops_per_token(config.model, args.seq)
    tokens = args.batch * args.seq
    mfus = [tokens / t * fpt / p for t, p in zip(times, peaks)]
    step_s = float(np.median(times))
    return {
        "step_s": round(step_s, 4),
        "tokens_per_s": round(tokens / step_s, 1),
        "mfu": round(float(np.median(mfus)), 4),  # each round against its own ceiling
        "compile_s": round(compile_s, 2),
        "flops_per_token": fpt,
        "active_params": active_params(config.model),
        "total_params": total_params(config.model),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--optimizer", default="muon", choices=("muon", "adamw"))
    parser.add_argument("--backends", default="dense,capacity,ragged")
    args = parser.parse_args()

    variants = {"dense_model": dense_baseline(MOE)}
    for impl in args.backends.split(","):
        variants[f"moe_{impl}"] = {**MOE, "moe_impl": impl}
    steps, configs, compile_s = {}, {}, {}
    for name, model in tqdm(variants.items(), desc="compiling", file=sys.stderr):
        steps[name], configs[name], compile_s[name] = compile_step(model, args)
    dtype = configs["dense_model"].model.compute_dtype
    local_peak_flops(dtype, repeats=1)  # compile the peak measurement too
    # round-robin: each round times one step of every variant, then the ceiling
    times: dict[str, list[float]] = {name: [] for name in variants}
    peaks: list[float] = []
    for _ in tqdm(range(args.rounds), desc="timing rounds", file=sys.stderr):
        for name, run in steps.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
        peaks.append(local_peak_flops(dtype, repeats=1))
    results = {name: figures(configs[name], args, times[name], peaks, compile_s[name]) for name in variants}
    print(f"{dtype} 2048^3 matmul ceiling per round (GFLOP/s): {[round(p / 1e9, 1) for p in peaks]}", file=sys.stderr)
    for name, r in results.items():
        print(f"{name:14s} step {r['step_s']:.3f}s  {r['tokens_per_s']:9.0f} tok/s  MFU {r['mfu']:.1%}  "
              f"compile {r['compile_s']:.1f}s", file=sys.stderr)  # fmt: skip
    best = max((k for k in results if k.startswith("moe_")), key=lambda k: results[k]["tokens_per_s"])
    print(json.dumps({
        "benchmark": "train_throughput",
        "ratio": round(results[best]["tokens_per_s"] / results["dense_model"]["tokens_per_s"], 3),
        "baseline": "dense model with the same active params, same trainer step (train/steps.py)",
        "best_moe_backend": best.removeprefix("moe_"),
        "dense_mfu": results["dense_model"]["mfu"],
        "peak_flops_per_round": [round(p) for p in peaks],
        "compute_dtype": dtype,
        "optimizer": args.optimizer,
        "grad_accum_steps": args.accum,
        "batch": args.batch,
        "seq_len": args.seq,
        "devices": jax.device_count(),
        "moe_config": ModelConfig(**MOE).to_dict(),
        "results": results,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
