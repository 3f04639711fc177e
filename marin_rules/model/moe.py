"""Expert dispatch backends: how tokens reach their `top_k` SwiGLU experts and back.

Model: every backend computes y[t] = sum_j weights[t, j] * FFN_{experts[t, j]}(x[t]),
with expert weights stacked as w_gate, w_up [E, D, I] and w_down [E, I, D], and
returns (y [T, D], dropped assignments as a fraction of T*k). They differ in cost:

- `dense`: every expert on every token, then masked by the combine weights. E/k times
  the useful FLOPs; the exact reference the others are tested against.
- `capacity`: GShard buckets. Each expert takes at most C = ceil(capacity_factor *
  T*k / E) assignments (first choices before second choices, then token order); the
  rest are dropped (counted, contribute 0). Tokens go into an [E, C, D] buffer by
  scatter and come back by gather. Under a mesh whose `expert` axis is > 1 this runs
  in `jax.shard_map`: each (data, expert) shard buckets its own tokens, an
  `all_to_all` over `expert` sends every bucket to the shard holding that expert,
  the local experts run, and a second `all_to_all` brings results home.
  Not causal across the batch: the T tokens ranked for a bucket are every token of
  the shard (all rows, all positions), so a LATER token (or another row) can take
  the slot an earlier token would have had and change that earlier token's output.
  Fine for training (the usual GShard trade); evaluation and generation score one
  sequence at a time and should see no effect from other tokens: they use a
  dropless backend instead (`ModelConfig.dropless`, and `load_trained(..., dropless=True)`).
- `ragged`: dropless. Assignments sorted by expert, one `jax.lax.ragged_dot` per
  matrix over the contiguous groups, weighted results scatter-added back: on TPU.
  On CPU and GPU, XLA lowers ragged_dot to a masked dense matmul (measured 4x slower
  than the useful work with 4 experts on this CPU; on an H200 with jax 0.11.2 the
  training step ran at 0.38 of the dense model's, slower than running every expert),
  so there the assignments first go into `capacity`'s buckets at factor 1.25
  (`SPECULATIVE_CAPACITY`), which skips the sort and the expert weight copies; when
  an expert's bucket would overflow (`lax.cond`, decided per call, so nothing is
  ever dropped) the exact path runs instead: buckets with room for every token
  (C = T) when that is no more rows than padded blocks, else the grouped matmul as
  padded blocks with gathered expert weights (`grouped_ffn_blocked`, rows per block
  from `PADDED_BLOCK_ROWS`). Forward at T = 1,024 (top-2 of 4, d_model 128,
  d_expert 256, this CPU): blocks 4.8 ms, C = T 3.8 ms, speculative buckets 3.0 ms.

Every backend takes `live` ([T] bool or None: all): the inputs whose outputs are used.
Only `ragged` on CPU/GPU uses it: evaluation's packed rows (eval/packing.py) end in
13-35% padding, so it tries buckets that the padding takes no slot of (its outputs
are 0), at factor 1.0 (`LIVE_CAPACITY`), then 1.25, then the exact path. Live outputs
are bitwise those of the path above where that takes its speculative buckets too, and
within float rounding where it takes the exact path (the live inputs fit, all of them
do not: ~1e-7 in f32), as the two paths above differ; the MoE layer took 11.0 instead
of 13.7 ms at T = 2,048 with 75% live (one core of this CPU). Training has no padding.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from marin_rules.model.sharding import BATCH_AXES, EXPERT_AXIS, current_mesh


def expert_ffn(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """SwiGLU per expert on bucketed tokens: x [E, C, D] -> [E, C, D]."""
    h = jax.nn.silu(jnp.einsum("ecd,edi->eci", x, w_gate)) * jnp.einsum("ecd,edi->eci", x, w_up)
    return jnp.einsum("eci,eid->ecd", h, w_down)


def dispatch_dense(x, experts, weights, w_gate, w_up, w_down, *, capacity_factor, live=None):
    del capacity_factor, live
    T, E = x.shape[0], w_gate.shape[0]
    h = jax.nn.silu(jnp.einsum("td,edi->tei", x, w_gate)) * jnp.einsum("td,edi->tei", x, w_up)
    y_all = jnp.einsum("tei,eid->ted", h, w_down)
    combine = jnp.zeros((T, E), weights.dtype).at[jnp.arange(T)[:, None], experts].add(weights)
    y = jnp.einsum("ted,te->td", y_all, combine.astype(y_all.dtype))
    return y, jnp.zeros((), jnp.float32)


def grouped_ffn_ragged_dot(xs, group_sizes, w_gate, w_up, w_down):
    """SwiGLU over rows grouped by expert (xs [M, D], contiguous groups of
    `group_sizes` [E]) with `jax.lax.ragged_dot`: a grouped-matmul kernel on TPU/GPU."""
    h = jax.nn.silu(jax.lax.ragged_dot(xs, w_gate, group_sizes)) * jax.lax.ragged_dot(xs, w_up, group_sizes)
    return jax.lax.ragged_dot(h, w_down, group_sizes)


def grouped_ffn_blocked(xs, group_sizes, w_gate, w_up, w_down, block: int = 512):
    """The same as `grouped_ffn_ragged_dot` for CPU and GPU, where XLA lowers ragged_dot
    to a masked dense matmul (E times the FLOPs). Each group is padded to a multiple of
    `block` rows; every block belongs to one expert, whose weights are gathered for a
    batched matmul (megablocks-style). Cost: (M + E*block) rows instead of E*M, plus
    one copy of an expert's weights per block: 512-row blocks took 7.5 / 13.3 / 39 ms
    against 11.5 / 34.6 / 72 ms with 128 for 2,048 / 4,096 / 8,192 tokens (top-2 of 4
    experts, d_model 128, d_expert 256, forward, this CPU)."""
    M, D = xs.shape
    E = w_gate.shape[0]
    block, n_blocks = blocked_layout(M, E, block)
    padded_sizes = -(-group_sizes // block) * block
    padded_end = jnp.cumsum(padded_sizes)
    start = jnp.cumsum(group_sizes) - group_sizes
    expert_of_row = jnp.repeat(jnp.arange(E), group_sizes, total_repeat_length=M)
    row = (padded_end - padded_sizes)[expert_of_row] + jnp.arange(M) - start[expert_of_row]
    buffer = jnp.zeros((n_blocks * block, D), xs.dtype).at[row].set(xs, unique_indices=True)
    buffer = buffer.reshape(n_blocks, block, D)
    block_expert = jnp.minimum(jnp.searchsorted(padded_end, jnp.arange(n_blocks) * block, side="right"), E - 1)
    y = expert_ffn(buffer, w_gate[block_expert], w_up[block_expert], w_down[block_expert])
    return y.reshape(n_blocks * block, -1)[row]


def blocked_layout(M: int, E: int, block: int = 512) -> tuple[int, int]:
    """(rows per block, blocks) of `grouped_ffn_blocked` for M assignments to E
    experts: blocks * rows bounds the padded rows it multiplies."""
    block = max(1, min(block, -(-M // E)))
    return block, -(-M // block) + E  # static upper bound on sum_e ceil(size_e / block)


def expert_counts(experts: jax.Array, n_experts: int) -> jax.Array:
    """Assignments per expert [E] of `experts` [T, k] (an id of n_experts or more counts nowhere)."""
    return jnp.zeros((n_experts,), jnp.int32).at[experts.reshape(-1)].add(1)


SPECULATIVE_CAPACITY = 1.25  # CPU/GPU `ragged`: bucket factor tried first (see the module docstring)
# CPU/GPU `ragged`: rows per padded block. Each block copies its expert's weights, so
# a chip that multiplies faster than it copies wants longer blocks (on a GPU a block
# of B rows costs about (peak FLOP/s / memory bytes/s) / B of its matmul time in weight
# copies: ~15% at 1,024 rows on an H200), at most E * B padded rows.
PADDED_BLOCK_ROWS = {"cpu": 512, "gpu": 1024}
LIVE_CAPACITY = 1.0  # CPU/GPU `ragged` with `live` inputs: bucket factor tried first (then 1.25), padding taking no slot


def dispatch_ragged(x, experts, weights, w_gate, w_up, w_down, *, capacity_factor, live=None):
    del capacity_factor
    none_dropped = jnp.zeros((), jnp.float32)
    block = PADDED_BLOCK_ROWS.get(jax.default_backend())
    if block is None:
        return _sorted_grouped(x, experts, weights, w_gate, w_up, w_down, grouped_ffn_ragged_dot), none_dropped
    if live is None:
        return _dropless_padded(x, experts, weights, w_gate, w_up, w_down, block), none_dropped
    T, k = experts.shape
    E = w_gate.shape[0]
    kept = jnp.where(live[:, None], experts, E)  # expert E: out of range, so no slot and an output of 0
    load = jnp.max(expert_counts(kept, E))
    y = functools.reduce(  # the first bucket size the live inputs fit, else the exact path over all inputs
        lambda otherwise, cap: lambda: jax.lax.cond(
            load <= cap, lambda: _bucketed(x, kept, weights, w_gate, w_up, w_down, cap=cap)[0], otherwise
        ),
        sorted({c for f in (LIVE_CAPACITY, SPECULATIVE_CAPACITY) if (c := capacity(T, k, E, f)) < T}, reverse=True),
        lambda: _exact_padded(x, experts, weights, w_gate, w_up, w_down, block),
    )()
    return y, none_dropped


@functools.partial(jax.custom_jvp, nondiff_argnums=(6,))
def _dropless_padded(x, experts, weights, w_gate, w_up, w_down, block):
    """Speculative buckets, the exact path when one would overflow (module docstring).
    Differentiated (training), it is the exact path alone (`_dropless_padded_jvp`):
    reverse mode through `lax.cond` keeps both branches' residuals, which made the
    backward pass 2.4x slower than the branch it runs."""
    T, k = experts.shape
    E = w_gate.shape[0]
    cap = capacity(T, k, E, SPECULATIVE_CAPACITY)
    exact = lambda: _exact_padded(x, experts, weights, w_gate, w_up, w_down, block)  # noqa: E731
    if cap >= T:
        return exact()
    fits = jnp.max(expert_counts(experts, E)) <= cap
    return jax.lax.cond(fits, lambda: _bucketed(x, experts, weights, w_gate, w_up, w_down, cap=cap)[0], exact)


@_dropless_padded.defjvp
def _dropless_padded_jvp(block, primals, tangents):
    x, experts, weights, w_gate, w_up, w_down = primals
    dx, _, dweights, dw_gate, dw_up, dw_down = tangents  # experts are integers: no tangent
    exact = lambda x, weights, *w: _exact_padded(x, experts, weights, *w, block)  # noqa: E731
    return jax.jvp(exact, (x, weights, w_gate, w_up, w_down), (dx, dweights, dw_gate, dw_up, dw_down))


def _exact_padded(x, experts, weights, w_gate, w_up, w_down, block):
    """Dropless in whichever layout multiplies fewer rows: buckets with room for every
    token (E*T rows) or padded blocks of `block` rows (`blocked_layout`)."""
    T, k = experts.shape
    E = w_gate.shape[0]
    if E * T <= math.prod(blocked_layout(T * k, E, block)):
        return _bucketed(x, experts, weights, w_gate, w_up, w_down, cap=T)[0]
    grouped = functools.partial(grouped_ffn_blocked, block=block)
    return _sorted_grouped(x, experts, weights, w_gate, w_up, w_down, grouped)


def _sorted_grouped(x, experts, weights, w_gate, w_up, w_down, grouped_ffn):
    """Assignments sorted by expert, `grouped_ffn` over the contiguous groups, weighted
    results scatter-added back to their tokens."""
    T, k = experts.shape
    E = w_gate.shape[0]
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token = order // k
    xs = x[token]  # [T*k, D], grouped by expert
    group_sizes = expert_counts(experts, E)
    ys = grouped_ffn(xs, group_sizes, w_gate, w_up, w_down)
    ys = ys * weights.reshape(-1)[order][:, None].astype(ys.dtype)
    return jnp.zeros_like(x).at[token].add(ys)


def capacity(n_tokens: int, k: int, n_experts: int, capacity_factor: float) -> int:
    """Slots per expert for `n_tokens` local tokens: ceil(cf * T * k / E), at least 1
    and at most T (an expert is chosen at most once per token, so T slots never drop)."""
    return min(n_tokens, max(1, math.ceil(capacity_factor * n_tokens * k / n_experts)))


def _bucket_slots(experts: jax.Array, n_experts: int, cap: int) -> jax.Array:
    """Slot e * cap + position for each assignment [T, k]; n_experts * cap (out of
    range, hence dropped) when the expert's bucket is full. Priority: all first
    choices in token order, then all second choices, and so on (GShard)."""
    T, k = experts.shape
    by_choice = experts.T.reshape(-1)  # [k*T]: choice-major
    onehot = jax.nn.one_hot(by_choice, n_experts, dtype=jnp.int32)
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1).reshape(k, T).T
    slot = experts * cap + position
    return jnp.where(position < cap, slot, n_experts * cap)


def _bucket(x, experts, n_experts, cap):
    """Scatter tokens into [E, cap, D]; returns (buffer, slots, dropped count)."""
    T, k = experts.shape
    slots = _bucket_slots(experts, n_experts, cap)
    source = jnp.broadcast_to(x[:, None, :], (T, k, x.shape[-1])).reshape(T * k, -1)
    buffer = jnp.zeros((n_experts * cap, x.shape[-1]), x.dtype)
    buffer = buffer.at[slots.reshape(-1)].add(source, mode="drop")
    dropped = jnp.sum(slots == n_experts * cap).astype(jnp.float32)
    return buffer.reshape(n_experts, cap, -1), slots, dropped


def _unbucket(y_buckets, slots, weights):
    """Gather each assignment's result ([E, cap, D] -> [T, D]), weighted; dropped = 0."""
    flat = y_buckets.reshape(-1, y_buckets.shape[-1])
    gathered = flat.at[slots].get(mode="fill", fill_value=0)  # [T, k, D]
    return jnp.sum(gathered * weights[..., None].astype(gathered.dtype), axis=1)


def _capacity_local(x, experts, weights, w_gate, w_up, w_down, *, capacity_factor):
    T, k = experts.shape
    cap = capacity(T, k, w_gate.shape[0], capacity_factor)
    return _bucketed(x, experts, weights, w_gate, w_up, w_down, cap=cap)


def _bucketed(x, experts, weights, w_gate, w_up, w_down, *, cap):
    """The experts over [E, cap, D] buckets on this device: (y, dropped fraction)."""
    T, k = experts.shape
    buckets, slots, dropped = _bucket(x, experts, w_gate.shape[0], cap)
    y = _unbucket(expert_ffn(buckets, w_gate, w_up, w_down), slots, weights)
    return y, dropped / (T * k)


def _capacity_expert_parallel(mesh, x, experts, weights, w_gate, w_up, w_down, *, capacity_factor):
    E = w_gate.shape[0]
    ep = mesh.shape[EXPERT_AXIS]
    if E % ep:
        raise ValueError(f"n_experts={E} must be a multiple of the mesh's expert axis ({ep})")

    def shard(x, experts, weights, w_gate, w_up, w_down):
        T, k = experts.shape  # this shard's tokens; w_* hold its E/ep experts
        cap = capacity(T, k, E, capacity_factor)
        buckets, slots, dropped = _bucket(x, experts, E, cap)
        # [E, cap, D] -> [E/ep, ep*cap, D]: each expert's buckets from every peer
        local = jax.lax.all_to_all(buckets, EXPERT_AXIS, 0, 1, tiled=True)
        y_local = expert_ffn(local, w_gate, w_up, w_down)
        y_buckets = jax.lax.all_to_all(y_local, EXPERT_AXIS, 1, 0, tiled=True)
        y = _unbucket(y_buckets, slots, weights)
        dropped = jax.lax.psum(dropped, BATCH_AXES) / jax.lax.psum(float(T * k), BATCH_AXES)
        return y, dropped

    tokens, experts_spec = P(BATCH_AXES, None), P(EXPERT_AXIS, None, None)
    return jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(tokens, tokens, tokens, experts_spec, experts_spec, experts_spec),
        out_specs=(tokens, P()),
    )(x, experts, weights, w_gate, w_up, w_down)


def dispatch_capacity(x, experts, weights, w_gate, w_up, w_down, *, capacity_factor, live=None):
    del live  # training, its only user, has no padding
    mesh = current_mesh()
    if mesh is not None and mesh.shape.get(EXPERT_AXIS, 1) > 1:
        return _capacity_expert_parallel(
            mesh, x, experts, weights, w_gate, w_up, w_down, capacity_factor=capacity_factor
        )
    return _capacity_local(x, experts, weights, w_gate, w_up, w_down, capacity_factor=capacity_factor)


DISPATCH = {"dense": dispatch_dense, "capacity": dispatch_capacity, "ragged": dispatch_ragged}
