"""The output head and its cross-entropy in one pass over chunks of tokens (training).

Model: for final-normed hidden states h [B, T, D], the head matrix W [D, V] and
targets y [B, T], `head_cross_entropy` is mean over tokens of logsumexp(h W) -
(h W)[y], the cross-entropy of the logits `model.logits(h)`. Done plainly, the
[B*T, V] logits go through memory several times (written, read by the softmax, read
again in the backward pass by two [B*T, V] products); at vocab 4,096 and d_model 128
that was the largest part of a training step. Here the sequence is cut into chunks
(every batch row in each chunk, so a batch-sharded array stays on its devices) of
about `CHUNK_TOKENS` tokens, and each chunk's logits are made, reduced to the loss,
turned into their gradient (softmax - one-hot) and multiplied back into dh and dW
while they are still in cache. So the gradient is computed in the forward pass, a
`custom_vjp` whose backward pass only scales it by the incoming cotangent: the same
three products as autodiff (logits forward, dh and dW backward), fewer passes over
memory, and one exp of the logits serves both the logsumexp and the softmax (they
had one each: 15% of a default-model step on this CPU went to exp). Without
differentiation (validation loss) only the loss is computed.

Precision: the products take h and W in the compute dtype and accumulate in f32;
the softmax is f32; its gradient is cast to the compute dtype for the two gradient
products (as autodiff's transposed products would take it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

CHUNK_TOKENS = 512  # 512 tokens x vocab 4,096 of f32 logits: 8 MiB, about one core's L2 + L3 share


def head_cross_entropy(hidden: jax.Array, head: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy in nats: hidden [B, T, D] and head [D, V] in the
    compute dtype, targets [B, T] int."""
    B, T, _ = hidden.shape
    return _loss(hidden, head, targets, _chunk_length(B, T))


def _chunk_length(rows: int, length: int) -> int:
    """The longest divisor of `length` whose chunk (all rows) holds <= CHUNK_TOKENS
    tokens; the whole length when no divisor comes within 4x of that (a prime
    length: one chunk, rather than a loop over many tiny ones)."""
    best = max(c for c in range(1, length + 1) if length % c == 0 and (rows * c <= CHUNK_TOKENS or c == 1))
    return length if 4 * best < min(length, CHUNK_TOKENS // rows) else best


def _chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [T / chunk, B, chunk, ...]: the sequence axis cut, rows kept."""
    B, T = x.shape[:2]
    return jnp.moveaxis(x.reshape(B, T // chunk, chunk, *x.shape[2:]), 1, 0)


def _unchunk(x: jax.Array) -> jax.Array:
    n, B, chunk = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(B, n * chunk, *x.shape[3:])


def _softmax_terms(h: jax.Array, head: jax.Array, y: jax.Array):
    """One chunk's (exp(logits - max) [B, c, V], its sum over V [B, c, 1], logsumexp
    [B, c], target logit [B, c]), the logits in f32: one exp serves the loss and the
    softmax, which is exp(logits - max) / sum."""
    logits = jnp.einsum("bcd,dv->bcv", h, head, preferred_element_type=jnp.float32)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    shifted = jnp.exp(logits - peak)
    total = jnp.sum(shifted, axis=-1, keepdims=True)
    target = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    return shifted, total, (peak + jnp.log(total))[..., 0], target


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _loss(hidden, head, targets, chunk):
    def body(total, xs):
        h, y = xs
        _, _, lse, target = _softmax_terms(h, head, y)
        return total + jnp.sum(lse - target), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (_chunks(hidden, chunk), _chunks(targets, chunk)))
    return total / targets.size


def _loss_fwd(hidden, head, targets, chunk):
    def body(carry, xs):
        total, d_head = carry
        h, y = xs
        shifted, total_exp, lse, target = _softmax_terms(h, head, y)
        grad = shifted * (1.0 / total_exp)  # softmax
        rows, cols = jnp.indices(y.shape)
        grad = grad.at[rows, cols, y].add(-1.0).astype(head.dtype)  # - one-hot
        d_h = jnp.einsum("bcv,dv->bcd", grad, head, preferred_element_type=jnp.float32)
        d_head = d_head + jnp.einsum("bcd,bcv->dv", h, grad, preferred_element_type=jnp.float32)
        return (total + jnp.sum(lse - target), d_head), d_h

    init = (jnp.zeros((), jnp.float32), jnp.zeros(head.shape, jnp.float32))
    (total, d_head), d_h = jax.lax.scan(body, init, (_chunks(hidden, chunk), _chunks(targets, chunk)))
    n = targets.size
    return total / n, ((_unchunk(d_h) / n).astype(hidden.dtype), (d_head / n).astype(head.dtype))


def _loss_bwd(chunk, residuals, g):
    d_h, d_head = residuals
    return g.astype(d_h.dtype) * d_h, g.astype(d_head.dtype) * d_head, None


_loss.defvjp(_loss_fwd, _loss_bwd)
