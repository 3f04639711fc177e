"""The scoring interface the lm-eval wrapper talks to (no JAX here).

Model: a `Scorer` sees only padded integer arrays, never text or requests. The wrapper
(lm.py, laid out by packing.py) sends a `ScoreBatch`: rows of packed inputs, each
tagged with its position in its own sequence, its segment (one shared history and
the continuations after it) and its branch (0: the shared history; b > 0: the b-th
continuation, which sees the history and itself, never a sibling). Continuations
sharing a context (the choices of a multiple-choice question) share one history, so
the context is run once. The scorer returns, for every input, log p(target | what it
sees) and whether the target is the argmax.

Generation is `prefill(prompts, lengths, cache_length) -> (next tokens, state)` then
`decode(state, tokens, positions) -> (next tokens, state)` one token at a time;
`state` is the scorer's own (the model's key/value cache).

The scorers: the model (model_scorer.py, JAX) and the unigram baseline (baseline.py,
numpy). This module imports neither JAX nor lm-eval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class ScoreBatch:
    """tokens, positions, segments, branches, targets [R, T]: input j of row r is
    tokens[r, j] at position positions[r, j] of its own sequence; it attends to the
    inputs of row r with its segment, a position <= its own, and branch 0 or its
    own branch; targets[r, j] is the token it must predict.
    Padding has segment -1. scored [K]: the flat indices (r * T + j) of the inputs
    whose scores are needed, padded to a bucketed K by repeating one of them. Scores
    elsewhere are not computed (returned as 0)."""

    tokens: np.ndarray
    positions: np.ndarray
    segments: np.ndarray
    branches: np.ndarray
    targets: np.ndarray
    scored: np.ndarray


class Scorer(Protocol):
    max_length: int

    def score(self, batch: ScoreBatch) -> tuple[np.ndarray, np.ndarray]:
        """(log p(target) [R, T], target is the argmax [R, T]): arrays, or arrays still
        being computed (JAX's, dispatched asynchronously) that `np.asarray` waits for;
        the caller lays out the next batch meanwhile."""
        ...

    def prefill(self, prompts: np.ndarray, lengths: np.ndarray, cache_length: int) -> tuple[np.ndarray, Any]: ...

    def decode(self, state: Any, tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, Any]: ...
