"""Training throughput of the MoE with each dispatch backend against a dense model with
the same active parameters, side by side in one run.

Model: for each variant, one jitted full train step (forward, backward, AdamW update,
router-bias update) is compiled and warmed up; then `--steps` rounds each time one
step of every variant in turn (so load swings on a shared machine hit all alike) on
a fixed random batch, and the median step time counts. MFU = tokens/s * flops_per_token (nanoGPT count, active parameters) /
peak, where peak is this machine's f32 matmul rate measured here on a 2048^3 matmul.
The dense baseline is the same config with `moe_every=0` and `d_ff = top_k * d_expert`
(+ d_expert with a shared expert): the same active FFN parameters, no router.

Usage: python benchmarks/train_throughput.py [--steps 5] [--batch 8] [--seq 256]
Last line: JSON with benchmark, ratio (best MoE backend tokens/s / dense), baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import active_params, flops_per_token, total_params
from marin_rules.model.transformer import MoETransformer, loss_and_aux, update_router_bias

MOE = ModelConfig(
    vocab_size=4096, max_seq_len=256, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2,
    d_ff=512, n_experts=4, top_k=2, d_expert=256, moe_every=1,
)


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> float:
    """Best f32 FLOP/s of an n^3 matmul on this machine."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    mm = jax.jit(lambda a, b: a @ b)
    mm(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        mm(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def dense_baseline(config: ModelConfig) -> ModelConfig:
    hidden = config.top_k * config.d_expert + (config.d_expert if config.shared_expert else 0)
    return dataclasses.replace(config, moe_every=0, d_ff=hidden)


def compile_step(config: ModelConfig, batch: int, seq: int):
    """A zero-argument callable running one jitted train step (compiled and warmed
    up here) and the compile time."""
    model = MoETransformer(config, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-4, weight_decay=0.1), wrt=nnx.Param)
    tokens = jax.random.randint(jax.random.key(0), (batch, seq + 1), 0, config.vocab_size, jnp.int32)

    @nnx.jit
    def step(model, optimizer, tokens):
        (loss, metrics), grads = nnx.value_and_grad(loss_and_aux, has_aux=True)(model, tokens)
        optimizer.update(model, grads)
        update_router_bias(model, metrics)
        return loss

    t = time.perf_counter()
    step(model, optimizer, tokens).block_until_ready()
    compile_s = time.perf_counter() - t
    step(model, optimizer, tokens).block_until_ready()  # one more warm-up step
    return (lambda: float(step(model, optimizer, tokens))), compile_s


def figures(config: ModelConfig, batch: int, seq: int, times: list[float], compile_s: float, peak: float) -> dict:
    step_s = float(np.median(times))
    tokens_per_s = batch * seq / step_s
    fpt = flops_per_token(config, seq)
    return {
        "step_s": round(step_s, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(tokens_per_s * fpt / peak, 4),
        "compile_s": round(compile_s, 2),
        "flops_per_token": fpt,
        "active_params": active_params(config),
        "total_params": total_params(config),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--backends", default="dense,capacity,ragged")
    args = parser.parse_args()

    variants = {"dense_model": dense_baseline(MOE)}
    for impl in args.backends.split(","):
        variants[f"moe_{impl}"] = dataclasses.replace(MOE, moe_impl=impl)
    steps, compile_s = {}, {}
    for name, config in tqdm(variants.items(), desc="compiling", file=sys.stderr):
        steps[name], compile_s[name] = compile_step(config, args.batch, args.seq)
    peak = matmul_peak_flops()
    # round-robin: each round times one step of every variant, so load swings on a
    # shared machine hit all of them alike; the median over rounds is reported
    times = {name: [] for name in variants}
    for _ in tqdm(range(args.steps), desc="timing rounds", file=sys.stderr):
        for name, run in steps.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    peak = max(peak, matmul_peak_flops())
    print(f"f32 2048^3 matmul peak: {peak / 1e9:.1f} GFLOP/s", file=sys.stderr)
    results = {
        name: figures(config, args.batch, args.seq, times[name], compile_s[name], peak)
        for name, config in variants.items()
    }
    for name, r in results.items():
        print(f"{name:14s} step {r['step_s']:.3f}s  {r['tokens_per_s']:9.0f} tok/s  MFU {r['mfu']:.1%}  "
              f"compile {r['compile_s']:.1f}s", file=sys.stderr)
    best = max((k for k in results if k.startswith("moe_")), key=lambda k: results[k]["tokens_per_s"])
    print(json.dumps({
        "benchmark": "train_throughput",
        "ratio": round(results[best]["tokens_per_s"] / results["dense_model"]["tokens_per_s"], 3),
        "baseline": "dense model, same active params",
        "best_moe_backend": best.removeprefix("moe_"),
        "peak_f32_flops": round(peak),
        "batch": args.batch,
        "seq_len": args.seq,
        "moe_config": MOE.to_dict(),
        "results": results,
    }))


if __name__ == "__main__":
    main()
