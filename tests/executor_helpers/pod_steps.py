"""User steps (`executor_helpers.pod_steps:...`) for the tpu executor's tests."""

from __future__ import annotations

import json
import os
import time


def write_numbers(ctx):
    """A non-TPU user step: runs on the submitting host."""
    os.makedirs(ctx.output, exist_ok=True)
    with open(os.path.join(ctx.output, "numbers.json"), "w") as f:
        json.dump(list(range(1, 9)), f)
    return {"count": 8, "distributed": ctx.runtime.get("distributed")}


def pod_psum(ctx):
    """Join the pod from runtime.distributed, sum one number per device across processes."""
    d = ctx.runtime["distributed"]
    import jax

    jax.distributed.initialize(
        coordinator_address=d["coordinator"], num_processes=d["num_processes"], process_id=d["process_id"]
    )
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    numbers = list(range(1, jax.device_count() + 1))
    with open(os.path.join(ctx.deps["text"], "manifest.json")) as f:
        json.load(f)  # the upstream (a local rule's output) is readable from every process
    mesh = Mesh(np.array(jax.devices()), ("d",))
    n = jax.local_device_count()
    shards = [
        jax.device_put(jnp.array([float(numbers[jax.process_index() * n + i])]), dev)
        for i, dev in enumerate(jax.local_devices())
    ]
    x = jax.make_array_from_single_device_arrays((jax.device_count(),), NamedSharding(mesh, P("d")), shards)
    total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x))
    with open(os.path.join(ctx.output, f"process-{jax.process_index()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "sum": total}, f)
    return {
        "sum": total,
        "writer_pid": os.getpid(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
    }


def pod_fails_on_process_1(ctx):
    """Process 1 fails at once; process 0 waits for it in jax.distributed.initialize."""
    d = ctx.runtime["distributed"]
    if d["process_id"] == 1:
        raise RuntimeError("process 1 lost its TPU")
    import jax

    jax.distributed.initialize(
        coordinator_address=d["coordinator"], num_processes=d["num_processes"], process_id=d["process_id"]
    )
    return {}


def where_am_i(ctx):
    """A pod step for the fake gcloud: reports what the worker told it."""
    with open(os.path.join(ctx.deps["numbers"], "numbers.json")) as f:
        numbers = json.load(f)
    return {"distributed": ctx.runtime["distributed"], "cwd": os.getcwd(), "total": sum(numbers)}


def hold_until_released(ctx):
    """A pod step that runs until the file `config.release` exists (at most 120 s)."""
    deadline = time.monotonic() + 120
    while not os.path.exists(ctx.config["release"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {}
