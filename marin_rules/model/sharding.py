"""Where every weight and activation lives on a ('data', 'expert') device mesh.

Model: data parallelism plus expert parallelism. The batch (and every activation's
leading batch/token dimension) is split over both axes, ('data', 'expert'), as is
usual for expert parallelism; stacked expert weights [E, ...] are split over
`expert` and replicated over `data`; every other weight is replicated. The mesh uses
Auto axis types (GSPMD propagation), so the model code carries no `out_sharding`.

The model itself takes no mesh argument: it runs unchanged on one device. Under a
mesh, the caller puts the weights (`state_shardings`) and batch (`BATCH_AXES`) in
place and traces inside `with jax.set_mesh(mesh):`, where the model reads the mesh
(`current_mesh`) to pin activations and to run the `capacity` backend's
expert-parallel `shard_map`. `path_names` spells a pytree path as the attribute
names of `nnx.state(model)` (used here and by the optimizer's parameter roles).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"
EXPERT_AXIS = "expert"
BATCH_AXES = (DATA_AXIS, EXPERT_AXIS)  # the batch is split over both axes
EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")  # names of stacked [E, ...] expert weights


def make_mesh(data: int, expert: int, devices: list | None = None) -> Mesh:
    """A (data, expert) mesh over the first data*expert devices (all processes' devices
    under `jax.distributed`), Auto axis types."""
    devices = jax.devices() if devices is None else devices
    if data < 1 or expert < 1:
        raise ValueError(f"mesh axes must be >= 1, got data={data}, expert={expert}")
    if data * expert > len(devices):
        raise ValueError(
            f"mesh data={data} x expert={expert} needs {data * expert} devices, "
            f"only {len(devices)} exist (on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N)"
        )
    grid = np.array(devices[: data * expert]).reshape(data, expert)
    return Mesh(grid, BATCH_AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def current_mesh() -> Any | None:
    """The mesh set by `jax.set_mesh`, or None when there is none (single device)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or EXPERT_AXIS not in mesh.axis_names:
        return None
    return mesh


def partition_spec(path: tuple, value: Any) -> P:
    """The spec of one model variable from its path in `nnx.state(model)`: stacked
    expert weights split on their expert dimension, everything else replicated."""
    names = path_names(path)
    name = names[-1] if names else ""
    if name in EXPERT_WEIGHTS and getattr(value, "ndim", 0) == 3:
        return P(EXPERT_AXIS, None, None)
    return P()


def state_shardings(model: nnx.Module, mesh: Mesh) -> Any:
    """A pytree shaped like `nnx.state(model)` of `NamedSharding`s (also usable as an
    orbax restore target's shardings)."""
    state = nnx.state(model)
    return jax.tree_util.tree_map_with_path(
        lambda path, v: NamedSharding(mesh, partition_spec(path, v)), state
    )


def constrain_batch(x: jax.Array) -> jax.Array:
    """Pin an activation's leading (batch or token) dimension to ('data', 'expert')
    when tracing under a mesh; the identity otherwise."""
    mesh = current_mesh()
    if mesh is None:
        return x
    spec = P(BATCH_AXES, *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def path_names(path: tuple) -> tuple[str, ...]:
    """The names along a pytree path (`DictKey`, `GetAttrKey`, `SequenceKey`) of a
    model state, without the trailing `value` of a variable: ("blocks", "0", "attn", "w_q")."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    return tuple(n for n in names if n != "value")
