"""The baseline a language model must beat: the smoothed unigram of its training data.

Model: token counts of the training data (exact over every token of each of the
loader's sources, mixed by the sources' weights), add-one smoothed, scored as
cross-entropy in nats per token on the same validation batches the run evaluates on.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def unigram_counts(train: Any, *, vocab_size: int) -> np.ndarray:
    """Token counts of the training data of `train` (a `data.loader.TokenLoader`): see
    the module docstring."""
    counts = np.zeros(vocab_size, np.float64)
    for source, weight in zip(train.sources, train.weights):
        c = np.zeros(vocab_size, np.float64)
        for shard in source.shards:
            for i in range(0, len(shard), 1 << 22):
                c += np.bincount(np.asarray(shard[i : i + (1 << 22)]), minlength=vocab_size)[:vocab_size]
        counts += weight * c / max(c.sum(), 1.0)
    return counts * sum(int(s.n_tokens) for s in train.sources)


def unigram_loss(counts: np.ndarray, val: Any, *, val_batches: int) -> float:
    """Cross-entropy (nats/token) on the validation batches' targets of the add-one
    smoothed unigram distribution `counts`."""
    counts = counts + 1.0
    logp = np.log(counts / counts.sum())
    total, n = 0.0, 0
    for s in range(val_batches):
        targets = np.asarray(val.batch(s))[:, 1:].ravel()
        total -= float(logp[targets].sum())
        n += targets.size
    return total / max(n, 1)
