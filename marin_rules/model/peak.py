"""The ceiling MFU is measured against: the matmul rate of this run's devices, measured.

Model: no vendor figure exists for a CPU, and a shared machine's ceiling moves, so
the peak is measured: one n^3 matmul per local device, all at once (a batch of
matrices sharded over `jax.local_devices()`), in the dtype the model computes in,
best of `repeats`. That is the rate of every local device together; a run of several
processes (one host each, the same kind of devices) has `jax.process_count()` times
that. So MFU = tokens/s * FLOPs per token / `run_peak_flops(...)` counts every device
(a host with 4 chips in one process counts 4 chips), and 8 fake CPU devices sharing
2 cores count the 2 cores once. Given the run's mesh, it counts the devices the mesh
computes on, not those it leaves idle (`mesh: {data: 2}` on a host of 8): their rate,
measured on this process's devices of the mesh, per device times the mesh's size.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def local_peak_flops(dtype: str = "float32", n: int = 2048, repeats: int = 3, devices: list | None = None) -> float:
    """FLOP/s of `devices` (default: all of this process's) together on n^3 matmuls in `dtype`."""
    devices = jax.local_devices() if devices is None else devices
    sharding = NamedSharding(Mesh(devices, ("d",)), P("d"))
    shape = (len(devices), n, n)
    a = jax.jit(lambda: jax.random.normal(jax.random.key(0), shape, jnp.dtype(dtype)), out_shardings=sharding)()
    mm = jax.jit(lambda x: jnp.einsum("bij,bjk->bik", x, x), out_shardings=sharding)
    mm(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 * len(devices) / best


def run_peak_flops(dtype: str = "float32", n: int = 2048, repeats: int = 3, mesh: Mesh | None = None) -> float:
    """FLOP/s of every device of the run (all processes; with `mesh`, the devices it
    computes on), the MFU denominator."""
    if mesh is None:
        return local_peak_flops(dtype, n, repeats) * jax.process_count()
    mine = [d for d in mesh.devices.flat if d.process_index == jax.process_index()] or jax.local_devices()
    return local_peak_flops(dtype, n, repeats, mine) / len(mine) * mesh.devices.size
