"""Helper for test_model_mesh.py, run as its own process: 8 fake CPU devices must be
configured before JAX initialises, which other test files in the pytest process have
already done with one device.

Prints one JSON line: for each backend, the loss and gradient norms on one device (no
mesh) and on (data, expert) meshes of 8 devices, plus the largest gradient difference.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from marin_rules.model.config import ModelConfig  # noqa: E402
from marin_rules.model import moe  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marin_rules.model.sharding import BATCH_AXES, make_mesh, state_shardings  # noqa: E402
from marin_rules.model.transformer import MoETransformer, loss_and_aux  # noqa: E402

def run(moe_impl: str, mesh_shape):
    config = ModelConfig(
        vocab_size=97, max_seq_len=16, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64,
        n_experts=4, top_k=2, d_expert=32, moe_every=1, moe_impl=moe_impl, capacity_factor=8.0,
    )
    model = MoETransformer(config, rngs=nnx.Rngs(0))
    batch = jax.random.randint(jax.random.key(0), (16, 17), 0, 97, dtype=jnp.int32)
    step = nnx.jit(nnx.value_and_grad(loss_and_aux, has_aux=True))
    if mesh_shape is None:
        (loss, metrics), grads = step(model, batch)
    else:
        mesh = make_mesh(*mesh_shape)
        with jax.set_mesh(mesh):
            nnx.update(model, jax.device_put(nnx.state(model), state_shardings(model, mesh)))
            batch = jax.device_put(batch, NamedSharding(mesh, P(BATCH_AXES, None)))
            (loss, metrics), grads = step(model, batch)
        w = model.blocks[0].ffn.w_gate[...]
        assert len(w.sharding.device_set) == 8 and w.addressable_shards[0].data.shape[0] == 4 // mesh_shape[1]
    return float(loss), float(metrics["dropped_fraction"]), [np.asarray(g) for g in jax.tree.leaves(grads)]


def count_calls(fn, counter):
    def wrapped(*args, **kwargs):
        counter.append(1)
        return fn(*args, **kwargs)
    return wrapped


def main() -> None:
    """argv: impl:DxE[,DxE...] per backend, e.g. capacity:2x4,8x1 ragged:2x4"""
    assert len(jax.devices()) == 8, jax.devices()
    expert_parallel_calls: list = []
    moe._capacity_expert_parallel = count_calls(moe._capacity_expert_parallel, expert_parallel_calls)
    out = {}
    for arg in sys.argv[1:]:
        impl, _, shapes = arg.partition(":")
        loss, _, grads = run(impl, None)
        out[impl] = {"single": loss}
        for shape in [tuple(int(n) for n in s.split("x")) for s in shapes.split(",")]:
            m_loss, dropped, m_grads = run(impl, shape)
            diff = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-12)) for a, b in zip(grads, m_grads))
            out[impl][f"{shape[0]}x{shape[1]}"] = {"loss": m_loss, "dropped": dropped, "grad_rel_diff": diff}
    out["expert_parallel_traces"] = len(expert_parallel_calls)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
