"""The model as a `Scorer` (scoring.py): one jitted program per padded shape.

Model: `score` runs the batch's packed rows (packing.py) in one forward pass, each
input attending to what its segment and branch let it see (`packed_mask`: padding is
a segment of its own, so no real input sees it), with the head only at the scored
positions and the padding marked as not `live` (its expert work is skipped where
the dispatch can: model/moe.py); `prefill` + `decode` are cached greedy decoding
(right padding: a causal model's outputs at real positions do not depend on the
padding after them). A
request's score must not depend on the rest of its batch either, so the scorer
always runs a dropless MoE dispatch (`dropless`): a model trained with `moe_impl:
capacity` (which drops assignments ranked over the whole batch, so later tokens can
change earlier outputs) is rebuilt with `ragged` around the same weights; `dense`
and `ragged` are kept as they are.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from marin_rules.eval.scoring import ScoreBatch
from marin_rules.model.transformer import MoETransformer, empty_cache

def dropless(model: nnx.Module) -> nnx.Module:
    """`model` with a dropless MoE dispatch (`ModelConfig.dropless`): itself when its
    `moe_impl` drops nothing, else the same weights in a module built with the dropless
    backend (dispatch backends lay out the same computation and share every parameter)."""
    evaluated = model.config.dropless()
    if evaluated is model.config:
        return model
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: MoETransformer(evaluated, rngs=nnx.Rngs(0))))
    _, state = nnx.split(model)
    return nnx.merge(graphdef, state)


def _positions(start: jax.Array, length: int) -> jax.Array:
    return start[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]


def packed_mask(positions: jax.Array, segments: jax.Array, branches: jax.Array) -> jax.Array:
    """[R, T, T] (query, key): same segment, key position <= query position, key in
    the shared history (branch 0) or in the query's own branch (see scoring.py)."""
    same = segments[:, :, None] == segments[:, None, :]
    earlier = positions[:, None, :] <= positions[:, :, None]
    branch = (branches[:, None, :] == 0) | (branches[:, None, :] == branches[:, :, None])
    return same & earlier & branch


def _score(model, tokens, positions, segments, branches, targets, scored):
    R, T = tokens.shape
    mask, live = packed_mask(positions, segments, branches), segments >= 0  # padding: no live input sees it
    hidden, _, _ = model.trunk(tokens, positions=positions, mask=mask, live=live)
    logits = model.logits(hidden.reshape(R * T, -1)[scored])  # the head only where scores are needed
    target_logits = jnp.take_along_axis(logits, targets.reshape(-1)[scored][:, None], axis=-1)[:, 0]
    # logit - logsumexp, not a full log_softmax: one pass less over [K, V]
    logp = target_logits - jax.nn.logsumexp(logits, axis=-1)
    greedy = target_logits >= jnp.max(logits, axis=-1)
    flat = jnp.zeros(R * T, jnp.float32).at[scored].set(logp)
    return flat.reshape(R, T), jnp.zeros(R * T, bool).at[scored].set(greedy).reshape(R, T)


def _prefill(model, prompts, lengths, cache_length):
    B, T = prompts.shape
    cache = empty_cache(model.config, B, cache_length)
    hidden, _, cache = model.trunk(prompts, positions=_positions(jnp.zeros(B, jnp.int32), T), cache=cache)
    last = jnp.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)[:, 0]
    return jnp.argmax(model.logits(last), axis=-1).astype(jnp.int32), cache


def _decode(model, cache, tokens, positions):
    hidden, _, cache = model.trunk(tokens[:, None], positions=positions[:, None], cache=cache)
    return jnp.argmax(model.logits(hidden[:, 0]), axis=-1).astype(jnp.int32), cache


class Programs(NamedTuple):
    score: Any
    prefill: Any
    decode: Any


@functools.lru_cache(maxsize=None)
def programs(graphdef: Any, treedef: Any) -> Programs:
    """The jitted programs of one architecture, taking the weights as a flat list of
    leaves: every ModelScorer of the same architecture shares one compiled program
    per input shape, and a call neither hashes the graph nor flattens the state
    (about 5 ms per call for the default model, as much as 1/6 of a scoring batch)."""

    def model(leaves):
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

    return Programs(
        score=jax.jit(lambda leaves, rows, scored: _score(model(leaves), *rows, scored)),
        prefill=jax.jit(lambda leaves, *args: _prefill(model(leaves), *args), static_argnums=3),
        decode=jax.jit(lambda leaves, *args: _decode(model(leaves), *args), donate_argnums=1),
    )


def spread_padding(tokens: np.ndarray, padding: np.ndarray, vocab_size: int) -> np.ndarray:
    """`tokens` with the padding inputs (seen by no real input, so any ids score the
    same) spread over the vocabulary. The scoring pass marks padding as not live, so the
    CPU MoE dispatch (model/moe.py) first tries buckets it takes no slot of; when those
    overflow, every input is bucketed, and identical pad tokens would all route to the
    same experts and overflow those buckets too, sending the batch to the slower exact path."""
    out = np.array(tokens, np.int32)
    out[padding] = np.arange(np.count_nonzero(padding)) % vocab_size
    return out


class ModelScorer:
    """A flax nnx `MoETransformer` (anything with `trunk`, `logits` and `config`) as
    a Scorer, through a dropless dispatch. Each distinct input shape compiles once."""

    def __init__(self, model: nnx.Module, max_length: int):
        self.max_length = max_length
        self.model = dropless(model)
        graphdef, state = nnx.split(self.model)
        self._leaves, treedef = jax.tree.flatten(state)
        self._programs = programs(graphdef, treedef)

    def score(self, batch: ScoreBatch) -> tuple[jax.Array, jax.Array]:
        tokens = spread_padding(batch.tokens, batch.segments < 0, self.model.config.vocab_size)
        # the five [R, T] arrays travel as one
        rows = np.stack([tokens, batch.positions, batch.segments, batch.branches, batch.targets]).astype(np.int32)
        # still computing when returned (JAX dispatches asynchronously): np.asarray waits
        return self._programs.score(self._leaves, rows, np.asarray(batch.scored, np.int32))

    def prefill(self, prompts: np.ndarray, lengths: np.ndarray, cache_length: int) -> tuple[np.ndarray, Any]:
        tokens, cache = self._programs.prefill(
            self._leaves, np.asarray(prompts, np.int32), np.asarray(lengths, np.int32), int(cache_length)
        )
        return np.asarray(tokens), cache

    def decode(self, state: Any, tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, Any]:
        out, cache = self._programs.decode(self._leaves, state, np.asarray(tokens, np.int32), np.asarray(positions, np.int32))
        return np.asarray(out), cache
