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
       [--accum 2] [--optimizer muon] [--backends dense,capacity,ragged] [--d-model 128]
       [--head-dim 32] [--compute-dtype float32|bfloat16] [--peak-n N] [--profile]
       [--balance aux_loss|quantile]
A backend written `capacity:1.0` runs with that `capacity_factor` (default: the model's
1.25), so `--backends capacity,capacity:1.0 --balance quantile` sets Marin grug's
recipe (quantile-balanced router bias, buckets without slack) beside the default.
On an accelerator the defaults change with the platform: bfloat16 compute (float32 on
CPU, where it is faster) and a 8192^3 peak matmul (2048^3 on CPU), since a 2048^3
product is too short to time a GPU's or TPU's rate. A longer `--seq` raises the
model's `max_seq_len` to match. `--profile` splits the dense step's time by XLA op (a jax.profiler trace): matmuls
or other ops, in the micro-batches' forward/backward or the optimizer update, and
how fast the model's FLOPs go through the matmul ops against the ceiling. `--d-model`
widens the default model (the headline figures are the default model's).
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

from marin_rules.model.config import MOE_SETTINGS, ModelConfig
from marin_rules.model.flops import active_params, flops_per_token, total_params
from marin_rules.model.peak import local_peak_flops
from marin_rules.model.sharding import make_mesh
from marin_rules.train.config import parse_train_config
from marin_rules.train.optim import make_optimizer
from marin_rules.train.steps import batch_sharding, global_batch, init_model, make_train_step

# the default experiment's model (experiments/default.yaml): what this project trains
MOE = dict(
    vocab_size=4096, max_seq_len=128, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
    n_experts=4, top_k=2, d_expert=256, moe_every=1,
)  # fmt: skip


def widened(model: dict, d_model: int) -> dict:
    """The model at width `d_model`: FFN and expert sizes and heads (of 32) scale with it."""
    scale = d_model / model["d_model"]
    sizes = {k: max(1, int(model[k] * scale)) for k in ("d_ff", "d_expert", "n_heads", "n_kv_heads") if k in model}
    return {**model, **sizes, "d_model": d_model}


def dense_baseline(model: dict) -> dict:
    hidden = model["top_k"] * model["d_expert"] + (model["d_expert"] if model.get("shared_expert") else 0)
    dense = {k: v for k, v in model.items() if k not in MOE_SETTINGS}  # settings a dense model refuses (unused)
    return {**dense, "moe_every": 0, "d_ff": hidden}


def sized(model: dict, args: argparse.Namespace) -> dict:
    """The model as this run trains it: `--compute-dtype`, a context of `--seq`, and
    with `--head-dim` that many dimensions per head (half as many key/value heads)."""
    model = {**model, "compute_dtype": args.compute_dtype, "max_seq_len": max(model["max_seq_len"], args.seq)}
    if args.head_dim:
        heads = model["d_model"] // args.head_dim
        model.update(n_heads=heads, n_kv_heads=max(1, heads // 2))
    return model


def compile_step(model: dict, args: argparse.Namespace):
    """(one step as a zero-argument callable, the TrainConfig, compile seconds, a
    zero-argument callable giving the compiled step's HLO text)."""
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

    def hlo() -> str:
        with jax.set_mesh(mesh):
            return step.lower(*carry, batch).compile().as_text()

    return run, config, compile_s, hlo


def profile(run, hlo: str, steps: int = 3) -> dict[str, float]:
    """Milliseconds per step of the step's XLA ops by kind, from a jax.profiler trace:
    matmuls (XNNPACK fusions and dots) or other ops, inside the micro-batch
    forward/backward or in the optimizer update (clipping, Muon, AdamW, bias)."""
    import collections
    import glob
    import gzip
    import re
    import tempfile

    names = dict(re.findall(r"%([\w.\-]+) = \S+ [\w\-]+\(.*?metadata=\{op_name=\"([^\"]*)\"", hlo))
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(steps):
                run()
        (trace,) = glob.glob(folder + "/**/*.trace.json.gz", recursive=True)
        with gzip.open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("name") in names]
    kinds: dict[str, float] = collections.Counter()
    for e in events:
        op = names[e["name"]]
        where = "fwd_bwd" if "jvp(" in op or "transpose(" in op else "update"
        what = "matmul" if e["name"].startswith(("ynn_fusion", "dot", "xnn_fusion")) else "other"
        kinds[f"{where}_{what}_ms"] += e["dur"] / 1e3 / steps
    return {k: round(v, 1) for k, v in sorted(kinds.items())}


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
    parser.add_argument("--backends", default="dense,capacity,ragged",
                        help="MoE backends; capacity:F sets that capacity_factor (default: the model's 1.25)")
    parser.add_argument("--balance", choices=("aux_loss", "quantile"), help="router balancing (default: the model's)")
    parser.add_argument("--d-model", type=int, default=MOE["d_model"], help="width (FFN sizes and heads scale with it)")
    parser.add_argument("--head-dim", type=int, help="dimensions per head (default: 32, the default model's)")
    parser.add_argument("--compute-dtype", choices=("float32", "bfloat16"), help="default: float32 on CPU, else bfloat16")
    parser.add_argument("--peak-n", type=int, help="side of the peak matmul (default: 2048 on CPU, else 8192)")
    parser.add_argument("--profile", action="store_true", help="also split the dense step's time by kind of XLA op")
    args = parser.parse_args()
    on_cpu = jax.default_backend() == "cpu"
    args.compute_dtype = args.compute_dtype or ("float32" if on_cpu else "bfloat16")
    args.peak_n = args.peak_n or (2048 if on_cpu else 8192)

    moe = sized(widened(MOE, args.d_model), args)
    if args.balance:
        moe["balance"] = args.balance
    variants = {"dense_model": dense_baseline(moe)}
    for backend in args.backends.split(","):
        impl, _, factor = backend.partition(":")
        variants[f"moe_{backend}"] = {**moe, "moe_impl": impl, **({"capacity_factor": float(factor)} if factor else {})}
    steps, configs, compile_s, hlos = {}, {}, {}, {}
    for name, model in tqdm(variants.items(), desc="compiling", file=sys.stderr):
        steps[name], configs[name], compile_s[name], hlos[name] = compile_step(model, args)
    dtype = configs["dense_model"].model.compute_dtype
    local_peak_flops(dtype, n=args.peak_n, repeats=1)  # compile the peak measurement too
    # round-robin: each round times one step of every variant, then the ceiling
    times: dict[str, list[float]] = {name: [] for name in variants}
    peaks: list[float] = []
    for _ in tqdm(range(args.rounds), desc="timing rounds", file=sys.stderr):
        for name, run in steps.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
        peaks.append(local_peak_flops(dtype, n=args.peak_n, repeats=1 if on_cpu else 3))
    results = {name: figures(configs[name], args, times[name], peaks, compile_s[name]) for name in variants}
    print(f"{dtype} {args.peak_n}^3 matmul ceiling per round (GFLOP/s): {[round(p / 1e9, 1) for p in peaks]}", file=sys.stderr)
    for name, r in results.items():
        print(f"{name:14s} step {r['step_s']:.3f}s  {r['tokens_per_s']:9.0f} tok/s  MFU {r['mfu']:.1%}  "
              f"compile {r['compile_s']:.1f}s", file=sys.stderr)  # fmt: skip
    best = max((k for k in results if k.startswith("moe_")), key=lambda k: results[k]["tokens_per_s"])
    breakdown = {}
    if args.profile:  # where the dense step's time goes, and how fast its matmuls run
        breakdown = profile(steps["dense_model"], hlos["dense_model"]())
        matmul_s = (breakdown.get("fwd_bwd_matmul_ms", 0) + breakdown.get("update_matmul_ms", 0)) / 1e3
        flops = results["dense_model"]["flops_per_token"] * args.batch * args.seq
        breakdown["matmul_share"] = round(matmul_s * 1e3 / sum(v for k, v in breakdown.items() if k.endswith("_ms")), 3)
        breakdown["model_flops_per_matmul_second_over_peak"] = round(flops / matmul_s / float(np.median(peaks)), 3)
        print(f"dense step by op kind (ms/step): {breakdown}", file=sys.stderr)
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
        "device_kind": jax.devices()[0].device_kind,
        "peak_n": args.peak_n,
        "moe_config": ModelConfig(**moe).to_dict(),
        "results": results,
        "dense_step_breakdown": breakdown,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
