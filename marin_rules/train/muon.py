"""Muon's update for the hidden matrices, written so that no matrix is copied.

Model: the update `optax.contrib.muon` makes with its defaults, for weights laid out
[..., in, out] (leading axes, such as a stack of experts, are batch axes):
1. Nesterov momentum with bias correction (decay `beta`);
2. each matrix divided by its Frobenius norm (+ 1e-8), then 5 quintic Newton-Schulz
   steps X <- c0 X + (c1 A + c2 A^2) X with A = X X^T and
   (c0, c1, c2) = (3.4445, -4.7750, 2.0315), which push every singular value of X
   towards 1 (Jordan's coefficients, as optax);
3. scaled by sqrt(max(1, out / in)).
Weight decay and the learning rate follow in `train/optim.py`.

The one difference is how step 2 is written. Newton-Schulz is cheaper on the smaller
Gram matrix; optax reaches it for a tall matrix (in > out) by transposing X, and
vmaps over the leading axes, and XLA on CPU compiles both into strided copies that
took 40% of a d_model 256 training step (benchmarks/train_throughput.py --profile).
Here a tall matrix keeps its layout and uses the Gram matrix on the other side:
X (X^T X) = (X X^T) X, so it is the same polynomial of X; every product names its
axes (einsum), so leading axes are batch axes of the matmuls and nothing moves in
memory. Results equal optax's to float rounding (tests/test_train_optim.py).

`muon_transform` wraps it as the trainer's Muon group in the same optimizer-state
layout `optax.contrib.muon` has (its unused AdamW slot and placeholders included,
optax's `MuonState`), so checkpoints written while the trainer used optax's Muon
still restore: a stopped run resumes across the change. A test compares the layouts
and fails when a new optax changes its own.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonState

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-8


def orthogonalize(x: jax.Array, steps: int = NS_STEPS) -> jax.Array:
    """Newton-Schulz on the last two axes of `x` (step 2 of the module docstring)."""
    c0, c1, c2 = NS_COEFFS
    x = x / (jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True)) + EPS)
    tall = x.shape[-2] > x.shape[-1]
    for _ in range(steps):
        if tall:  # A = X^T X [out, out]; X <- c0 X + X (c1 A + c2 A^2)
            a = jnp.einsum("...ki,...kj->...ij", x, x)
            b = c1 * a + c2 * jnp.einsum("...ij,...jk->...ik", a, a)
            x = c0 * x + jnp.einsum("...ij,...jk->...ik", x, b)
        else:  # A = X X^T [in, in]; X <- c0 X + (c1 A + c2 A^2) X
            a = jnp.einsum("...ik,...jk->...ij", x, x)
            b = c1 * a + c2 * jnp.einsum("...ij,...jk->...ik", a, a)
            x = c0 * x + jnp.einsum("...ij,...jk->...ik", b, x)
    return x


def width_scale(x: jax.Array) -> float:
    """sqrt(max(1, out / in)) of a weight [..., in, out] (step 3)."""
    return max(1.0, x.shape[-1] / x.shape[-2]) ** 0.5


def scale_by_muon(beta: float) -> optax.GradientTransformation:
    """Steps 1-3 of the module docstring, on every leaf (each of rank >= 2)."""

    def init(params: Any) -> MuonState:
        coeffs = jnp.asarray(NS_COEFFS, jnp.float32)  # kept in the state as optax keeps them (unused here)
        return MuonState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params), ns_coeffs=coeffs)

    def update(updates: Any, state: MuonState, params: Any = None) -> tuple[Any, MuonState]:
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        nesterov = jax.tree.map(
            lambda m, g: beta * m + (1 - beta) * g,
            optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
            optax.tree.bias_correction(updates, beta, count),
        )
        updates = jax.tree.map(lambda x: width_scale(x) * orthogonalize(x), nesterov)
        return updates, MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs)

    return optax.GradientTransformation(init, update)


def muon_transform(beta: float, weight_decay: float, learning_rate: Callable[[Any], Any]) -> optax.GradientTransformation:
    """The Muon group's whole update (module docstring): `scale_by_muon`, decoupled
    weight decay, the learning rate; laid out as `optax.contrib.muon` lays out its state."""
    muon = optax.chain(
        scale_by_muon(beta),
        optax.identity(),  # where optax.contrib.muon scales by shape (done in scale_by_muon)
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )
    unused = optax.adamw(learning_rate)  # optax.contrib.muon's AdamW slot: no leaf of this group reaches it
    return optax.partition({"adam": unused, "muon": muon}, lambda params: jax.tree.map(lambda _: "muon", params))
