"""A synthetic, learnable token source shaped like `marin_rules.data.loader.TokenLoader`.

Model: token t+1 follows token t by a fixed random permutation with probability
0.9, else a uniform token; `batch(step, process_index, process_count)` is a pure
function of its arguments and process i gets rows [i*b, (i+1)*b) of the global batch,
as the real loader's contract says. Used to test the loop without tokenized files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FakeLoader:
    vocab_size: int = 64
    seq_len: int = 16
    batch_size: int = 8
    seed: int = 0
    split: str = "train"
    tokenizer: str = "fake://tokenizer.json"
    eos_id: int = 0

    def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> np.ndarray:
        salt = 0 if self.split == "train" else 1_000_003
        rng = np.random.default_rng([self.seed, salt, step])
        follow = np.random.default_rng(1234).permutation(self.vocab_size)
        rows = np.empty((self.batch_size, self.seq_len + 1), np.int32)
        rows[:, 0] = rng.integers(0, self.vocab_size, self.batch_size)
        noise = rng.random((self.batch_size, self.seq_len)) < 0.1
        random_tokens = rng.integers(0, self.vocab_size, (self.batch_size, self.seq_len))
        for t in range(self.seq_len):
            rows[:, t + 1] = np.where(noise[:, t], random_tokens[:, t], follow[rows[:, t]])
        b = self.batch_size // process_count
        return rows[process_index * b : (process_index + 1) * b]


def fake_data(seq_len: int, batch_size: int, eval_batch_size: int, vocab_size: int = 64, seed: int = 0):
    from marin_rules.train.loop import Data

    train = FakeLoader(vocab_size, seq_len, batch_size, seed, "train")
    val = FakeLoader(vocab_size, seq_len, eval_batch_size, seed, "validation")
    return Data(train=train, val=val, vocab_size=vocab_size, tokenizer=train.tokenizer, eos_id=0)
