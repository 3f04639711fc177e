"""The scoring interface the lm-eval wrapper talks to, and its JAX implementation.

Model: a `Scorer` sees only padded integer arrays, never text or requests:
`token_logprobs(inputs [B, T], targets [B, T]) -> (log p(target_t | inputs_<=t) [B, T],
target_t is the argmax [B, T])` and `next_tokens(inputs [B, T], positions [B]) ->
argmax token after position p of each row [B]`. `max_length` is the longest input it
takes. The lm-eval class (lm.py) turns requests into such arrays (sorted, padded to a
few bucketed lengths, batched); a scorer is a model (`ModelScorer`, one jitted forward
per call) or a baseline (`baseline.UnigramScorer`).

Rows are right-padded: a causal model's outputs at real positions do not depend on the
padding after them, and the project's MoE dispatch is dropless, so a token's score
does not depend on the other rows of its batch either.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class Scorer(Protocol):
    max_length: int

    def token_logprobs(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def next_tokens(self, inputs: np.ndarray, positions: np.ndarray) -> np.ndarray: ...


def _logits(graphdef, state, inputs):
    return nnx.merge(graphdef, state)(inputs)[0]


# The model's structure (graphdef) is a static argument: every ModelScorer of the same
# architecture shares one compiled program per input shape.
@partial(jax.jit, static_argnums=0)
def _token_logprobs(graphdef, state, inputs, targets):
    logits = _logits(graphdef, state, inputs)
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    # logit - logsumexp, not a full log_softmax: one pass less over [B, T, V]
    target_logp = target_logits - jax.nn.logsumexp(logits, axis=-1)
    return target_logp, target_logits >= jnp.max(logits, axis=-1)


@partial(jax.jit, static_argnums=0)
def _next_tokens(graphdef, state, inputs, positions):
    logits = _logits(graphdef, state, inputs)
    at = jnp.take_along_axis(logits, positions[:, None, None], axis=1)[:, 0]
    return jnp.argmax(at, axis=-1).astype(jnp.int32)


class ModelScorer:
    """A flax nnx model `model(tokens[B, T]) -> (logits[B, T, V], aux)` as a Scorer.
    Each distinct input shape compiles once; callers keep the shapes few."""

    def __init__(self, model: nnx.Module, max_length: int):
        self.max_length = max_length
        self._graphdef, self._state = nnx.split(model)

    def token_logprobs(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logp, greedy = _token_logprobs(
            self._graphdef, self._state, jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32)
        )
        return np.asarray(logp, np.float64), np.asarray(greedy)

    def next_tokens(self, inputs: np.ndarray, positions: np.ndarray) -> np.ndarray:
        out = _next_tokens(self._graphdef, self._state, jnp.asarray(inputs, jnp.int32), jnp.asarray(positions, jnp.int32))
        return np.asarray(out)
