"""The scoring interface the lm-eval wrapper talks to (no JAX here).

Model: a `Scorer` sees only padded integer arrays, never text or requests. The wrapper
(lm.py) splits every scored sequence into a *prefix* (the history whose tokens are
not scored) and a *suffix* (the inputs at the scored positions), and sends a
`ScoreBatch`: distinct prefixes once each, and suffix rows that name their prefix.
Continuations sharing a context (the choices of a multiple-choice question) share one
prefix row, so the context is run once. The scorer returns, for every suffix position,
log p(target | prefix, suffix up to it) and whether the target is the argmax.

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
    """prefixes [G, Tp]: right-padded histories (row g's real tokens sit at positions
    0..len-1); suffixes, targets [R, Tk]: the inputs at scored positions and the token
    each must predict; group [R]: the prefix row of each suffix row; start [R]: the
    position of suffix[:, 0], i.e. its prefix's length; cache_length: positions the
    key/value cache holds, >= every row's start + real suffix length; scored [K]: the
    flat indices (row * Tk + t) of the real suffix positions, padded to a bucketed K
    by repeating one of them. Scores elsewhere are not computed (returned as 0)."""

    prefixes: np.ndarray
    suffixes: np.ndarray
    targets: np.ndarray
    group: np.ndarray
    start: np.ndarray
    cache_length: int
    scored: np.ndarray


class Scorer(Protocol):
    max_length: int

    def score(self, batch: ScoreBatch) -> tuple[np.ndarray, np.ndarray]:
        """(log p(target) [R, Tk], target is the argmax [R, Tk])."""
        ...

    def prefill(self, prompts: np.ndarray, lengths: np.ndarray, cache_length: int) -> tuple[np.ndarray, Any]: ...

    def decode(self, state: Any, tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, Any]: ...
