"""The trainer's Muon update against optax's, on the default model's Muon weights.

Model: the trainer's Muon (`marin_rules/train/muon.py:scale_by_muon`: momentum with
bias correction, Newton-Schulz, width scaling) is optax's update written without
copies: a tall matrix uses the Gram matrix on its other side instead of being
transposed, and stacked experts are batch axes of the matmuls instead of a vmap. The
baseline is `optax.contrib.muon` (which the trainer used before; learning rate -1, no
weight decay, so its step is the update) on the same leaves. Leaves are the Muon
parameters of the default experiment's model (`--model moe`) or its dense baseline
(`--model dense`), built by the trainer's own `init_model`, gradient-shaped random
values; updates are checked equal (float rounding). Timings are interleaved and
repeated; medians. Ratio = optax time / the trainer's time (> 1: ours is faster).

    .venv/bin/python benchmarks/muon_update.py [--model moe] [--repeats 20] [--d-model 128]
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.contrib import MuonDimensionNumbers

from marin_rules.model.sharding import make_mesh
from marin_rules.train.config import parse_train_config
from marin_rules.train.muon import scale_by_muon
from marin_rules.train.optim import param_groups
from marin_rules.train.steps import init_model

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from train_throughput import MOE, dense_baseline, widened  # noqa: E402  (the benchmarks' one model definition)


def muon_matrices(model: dict) -> list[jax.Array]:
    """The model's Muon leaves as the optimizer sees them (gradient-shaped random values)."""
    config = parse_train_config(
        {"model": model, "optimizer": {"name": "muon"}, "num_train_steps": 10, "batch_size": 1, "seq_len": 8}
    )
    with jax.set_mesh(make_mesh(1, 1)):
        _, params, _ = init_model(config.model, 0, make_mesh(1, 1))
    groups = jax.tree.leaves(param_groups(params, "muon"))
    leaves = [np.asarray(x) for x, group in zip(jax.tree.leaves(params), groups) if group == "muon"]
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in leaves]


BETA = 0.95  # optax's default momentum, and the trainer's `betas[0]` default


def trainer_update(leaves):
    """What the trainer runs: one Newton-Schulz chain per weight."""
    tx = scale_by_muon(BETA)
    out, _ = tx.update(leaves, tx.init(leaves))
    return out


def optax_update(leaves):
    """`optax.contrib.muon` on the same leaves (leading axes are batch axes), with
    learning rate -1 so that its step is the update itself."""
    dims = lambda tree: jax.tree.map(lambda x: MuonDimensionNumbers(x.ndim - 2, x.ndim - 1), tree)  # noqa: E731
    tx = optax.contrib.muon(-1.0, beta=BETA, muon_weight_dimension_numbers=dims)
    out, _ = tx.update(leaves, tx.init(leaves), leaves)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("moe", "dense"), default="moe")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--d-model", type=int, default=MOE["d_model"], help="width (as train_throughput.py)")
    args = parser.parse_args()
    moe = widened(MOE, args.d_model)
    model = moe if args.model == "moe" else dense_baseline(moe)
    leaves = muon_matrices(model)
    matrices = sum(int(np.prod(x.shape[:-2])) for x in leaves)
    variants = {"optax": jax.jit(optax_update), "trainer": jax.jit(trainer_update)}
    reference = variants["optax"](leaves)
    max_diff = {}
    for name, fn in variants.items():
        max_diff[name] = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(reference, fn(leaves)))
        if max_diff[name] > 1e-5:
            raise SystemExit(f"{name}: updates differ from optax's by {max_diff[name]}")
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            started = time.perf_counter()
            jax.block_until_ready(fn(leaves))
            times[name].append(time.perf_counter() - started)
    ms = {name: round(float(np.median(t)) * 1e3, 2) for name, t in times.items()}
    for name, value in ms.items():
        print(f"{name:22s} {value:7.2f} ms", file=sys.stderr)
    print(json.dumps({
        "benchmark": "muon_update",
        "ratio": round(ms["optax"] / ms["trainer"], 3),
        "baseline": "optax.contrib.muon on the same leaves (learning rate -1: its step is the update)",
        "model": args.model,
        "d_model": args.d_model,
        "muon_matrices": matrices,
        "shapes": sorted({str(tuple(x.shape)) for x in leaves}),
        "median_ms": ms,
        "max_abs_diff_vs_optax": max_diff,
        "repeats": args.repeats,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
