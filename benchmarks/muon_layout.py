"""Does Muon get faster if same-shaped matrices are orthogonalised together?

Model: the trainer hands optax's Muon one leaf per weight (a hidden matrix [in, out]
or an expert stack [E, in, out], whose leading axis optax vmaps), so each leaf is
its own Newton-Schulz chain of small matmuls. The alternative timed here stacks every
Muon matrix of the same shape (transposed so rows <= cols, as Newton-Schulz works)
into one [N, m, n] leaf, and also splits that stack into chunks of 1, 2, 4, ... matrices.
Both run `optax.contrib.scale_by_muon` (the transform `optax.contrib.muon` is built
on; momentum, bias correction, Newton-Schulz), jitted, on the Muon parameters of the
default experiment's model (`--model moe`) or its dense baseline (`--model dense`),
built by the trainer's own `init_model`; updates are checked equal. Timings are
interleaved and repeated; medians. Ratio = as-is time / stacked time (> 1 would mean
stacking pays off).

    .venv/bin/python benchmarks/muon_layout.py [--model moe] [--repeats 20]
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import collections
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
from marin_rules.train.optim import param_groups
from marin_rules.train.steps import init_model

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from train_throughput import MOE, dense_baseline  # noqa: E402  (the benchmarks' one model definition)


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


def as_batch(x: jax.Array) -> jax.Array:
    """[..., in, out] -> [N, m, n] with m <= n."""
    x = x.reshape(-1, *x.shape[-2:])
    return x if x.shape[1] <= x.shape[2] else jnp.swapaxes(x, 1, 2)


def by_shape(leaves: list[jax.Array]) -> list[jax.Array]:
    """Every matrix as [m, n] (m <= n), stacked per shape: [N, m, n] arrays."""
    groups = collections.defaultdict(list)
    for x in leaves:
        groups[as_batch(x).shape[1:]].append(as_batch(x))
    return [jnp.concatenate(group) for group in groups.values()]


def dims(fn):
    return lambda tree: jax.tree.map(fn, tree)


def stacked_update(chunk: int | None):
    """Momentum + Newton-Schulz over same-shaped matrices stacked (in chunks of
    `chunk`); returns the per-shape stacks."""
    tx = optax.contrib.scale_by_muon(weight_dimension_numbers=dims(lambda _: MuonDimensionNumbers(1, 2)))

    def update(leaves):
        stacks = by_shape(leaves)
        pieces = [[s[i : i + (chunk or s.shape[0])] for i in range(0, s.shape[0], chunk or s.shape[0])] for s in stacks]
        flat = [p for ps in pieces for p in ps]
        out, _ = tx.update(flat, tx.init(flat))
        it = iter(out)
        return [jnp.concatenate([next(it) for _ in ps]) for ps in pieces]

    return update


def as_is_update(leaves):
    """What the trainer runs: one leaf per weight; returns the per-shape stacks."""
    per_leaf = dims(lambda x: MuonDimensionNumbers(x.ndim - 2, x.ndim - 1))  # as train/optim.py
    tx = optax.contrib.scale_by_muon(weight_dimension_numbers=per_leaf)
    out, _ = tx.update(leaves, tx.init(leaves))
    return by_shape(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("moe", "dense"), default="moe")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    model = MOE if args.model == "moe" else dense_baseline(MOE)
    leaves = muon_matrices(model)
    matrices = sum(as_batch(x).shape[0] for x in leaves)
    variants = {"as_is": jax.jit(as_is_update), "stacked": jax.jit(stacked_update(None))}
    for chunk in (1, 2, 4, 8):
        variants[f"stacked_chunks_of_{chunk}"] = jax.jit(stacked_update(chunk))
    reference = variants["as_is"](leaves)
    max_diff = {}
    for name, fn in variants.items():
        max_diff[name] = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(reference, fn(leaves)))
        if max_diff[name] > 1e-5:
            raise SystemExit(f"{name}: updates differ from the trainer's by {max_diff[name]}")
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
        "benchmark": "muon_layout",
        "ratio": round(ms["as_is"] / ms["stacked"], 3),
        "baseline": "optax scale_by_muon on the trainer's own leaves (one Newton-Schulz chain per weight)",
        "model": args.model,
        "muon_matrices": matrices,
        "shapes": sorted({str(tuple(as_batch(x).shape[1:])) for x in leaves}),
        "median_ms": ms,
        "max_abs_diff_vs_as_is": max_diff,
        "repeats": args.repeats,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
