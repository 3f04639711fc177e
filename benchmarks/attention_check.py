"""The model's causal attention through cuDNN's fused kernel against XLA's, on a GPU:
the same function (relative error of outputs and gradients) and the time of one
forward + backward pass of each, side by side.

Model: `jax.nn.dot_product_attention(q, k, v, is_causal=True)` on random bfloat16
inputs in the model's layout ([B, T, heads, head_dim], grouped-query: half as many
key/value heads), with `implementation="xla"` (the baseline: what runs on CPU and
TPU, and on GPU before `attention_implementation` picked cuDNN) and `"cudnn"`.
Errors are measured against a float32 XLA reference; times are medians of
`--repeats` runs each, the two interleaved. Needs a GPU (cuDNN); elsewhere it says so.

Usage: python benchmarks/attention_check.py [--batch 16] [--seq 1024] [--heads 16] [--head-dim 128]
Last line: JSON with both errors, both times and `ratio`: XLA's time over cuDNN's
(the baseline is XLA's attention, which `attention_implementation` picks elsewhere).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def attention_loss(impl: str):
    """A scalar of the attention output, so one grad call runs forward and backward."""

    def loss(q, k, v, probe):
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        return jnp.sum(y.astype(jnp.float32) * probe), y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def relative_error(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        sys.exit(f"attention_check: needs a GPU for cuDNN; this run has {jax.default_backend()}")
    B, T, N, H = args.batch, args.seq, args.heads, args.head_dim
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, T, N, H), jnp.float32)
    k = jax.random.normal(keys[1], (B, T, N // 2, H), jnp.float32)
    v = jax.random.normal(keys[2], (B, T, N // 2, H), jnp.float32)
    probe = jax.random.normal(keys[3], (B, T, N, H), jnp.float32)
    (_, ref_y), ref_grads = attention_loss("xla")(q, k, v, probe)  # float32 reference
    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    runs, errors = {}, {}
    for impl in ("xla", "cudnn"):
        runs[impl] = attention_loss(impl)
        (_, y), grads = runs[impl](*bf, probe)
        errors[impl] = {
            "output": relative_error(y, ref_y),
            **{f"grad_{n}": relative_error(g, r) for n, g, r in zip("qkv", grads, ref_grads)},
        }
    times: dict[str, list[float]] = {impl: [] for impl in runs}
    for _ in range(args.repeats):
        for impl, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run(*bf, probe))
            times[impl].append(time.perf_counter() - start)
    ms = {impl: round(float(np.median(t)) * 1e3, 3) for impl, t in times.items()}
    for impl in runs:
        print(f"{impl:6s} fwd+bwd {ms[impl]:8.3f} ms  errors vs float32 {errors[impl]}", file=sys.stderr)
    print(json.dumps({
        "benchmark": "attention_check", "shape_bthd": [B, T, N, H], "kv_heads": N // 2,
        "device_kind": jax.devices()[0].device_kind, "fwd_bwd_ms": ms,
        "ratio": round(ms["xla"] / ms["cudnn"], 2), "baseline": "XLA's attention (implementation='xla'), same inputs",
        "relative_errors": errors,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
