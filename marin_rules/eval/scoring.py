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

from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class Scorer(Protocol):
    max_length: int

    def token_logprobs(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def next_tokens(self, inputs: np.ndarray, positions: np.ndarray) -> np.ndarray: ...


class ModelScorer:
    """A flax nnx model `model(tokens[B, T]) -> (logits[B, T, V], aux)` as a Scorer.
    Each distinct input shape compiles once; callers keep the shapes few."""

    def __init__(self, model: nnx.Module, max_length: int):
        self.max_length = max_length
        graphdef, state = nnx.split(model)
        self._state = state

        def logits(state, inputs):
            return nnx.merge(graphdef, state)(inputs)[0]

        def token_logprobs(state, inputs, targets):
            out = logits(state, inputs)
            logp = jax.nn.log_softmax(out, axis=-1)
            target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
            return target_logp, jnp.argmax(out, axis=-1) == targets

        def next_tokens(state, inputs, positions):
            out = logits(state, inputs)
            at = jnp.take_along_axis(out, positions[:, None, None], axis=1)[:, 0]
            return jnp.argmax(at, axis=-1).astype(jnp.int32)

        self._token_logprobs = jax.jit(token_logprobs)
        self._next_tokens = jax.jit(next_tokens)

    def token_logprobs(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logp, greedy = self._token_logprobs(self._state, jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32))
        return np.asarray(logp, np.float64), np.asarray(greedy)

    def next_tokens(self, inputs: np.ndarray, positions: np.ndarray) -> np.ndarray:
        out = self._next_tokens(self._state, jnp.asarray(inputs, jnp.int32), jnp.asarray(positions, jnp.int32))
        return np.asarray(out)
