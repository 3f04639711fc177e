"""The unigram baseline: every token scored by its frequency in the training text.

Model: p(token) = (count(token) + 1) / (N + V), add-one smoothed counts of the
training split of a `download` artifact tokenized with the evaluated model's own
tokenizer (one end-of-text token counted per document, as training sees them).
It ignores context entirely, so it is the floor any trained model must clear. It is
an lm-eval model too (`UnigramLM`, registered as `marin-unigram`, the same `MarinLM`
class with a `UnigramScorer`), scored by the same tasks, tokenization and batching.
"""

from __future__ import annotations

import gzip
import json
from typing import Any, Iterator

import numpy as np
from lm_eval.api.registry import register_model
from tokenizers import Tokenizer

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import StepError
from marin_rules.eval.lm import MarinLM, SpecialTokens, load_tokenizer
from marin_rules.eval.scoring import ScoreBatch

UNIGRAM_MAX_LENGTH = 1024  # no context is used: any window length gives the same scores
ENCODE_BATCH = 256


class UnigramScorer:
    """A Scorer from token counts: log p is a table lookup, the argmax is constant."""

    def __init__(self, counts: np.ndarray, max_length: int = UNIGRAM_MAX_LENGTH):
        counts = np.asarray(counts, np.float64)
        self.max_length = max_length
        self.counts = counts
        self.logprobs = np.log(counts + 1.0) - np.log(counts.sum() + len(counts))
        self.argmax = int(np.argmax(self.logprobs))

    def score(self, batch: ScoreBatch) -> tuple[np.ndarray, np.ndarray]:
        return self.logprobs[batch.targets], batch.targets == self.argmax

    def prefill(self, prompts: np.ndarray, lengths: np.ndarray, cache_length: int) -> tuple[np.ndarray, None]:
        return np.full(len(prompts), self.argmax, np.int32), None

    def decode(self, state: None, tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, None]:
        return np.full(len(tokens), self.argmax, np.int32), None


def training_texts(data_location: str) -> Iterator[str]:
    """The `text` of every document in a download artifact's `train/*.jsonl.gz`."""
    folder = storage.join(data_location, "train")
    files = storage.list_files(folder, "*.jsonl.gz") if storage.exists(folder) else []
    if not files:
        raise StepError(f"deps.data: no training documents under {folder} for the unigram baseline")
    for location in files:
        with storage.open_file(location, "rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line).get("text", "")


def unigram_counts(texts: Iterator[str], tokenizer: Tokenizer, special: SpecialTokens) -> np.ndarray:
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    counts = np.zeros(vocab, np.int64)
    batch: list[str] = []

    def flush() -> None:
        for encoding in tokenizer.encode_batch_fast(batch, add_special_tokens=False):
            counts[:] += np.bincount(np.asarray(encoding.ids, np.int64), minlength=vocab)[:vocab]
        counts[special.eos] += len(batch)
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) >= ENCODE_BATCH:
            flush()
    if batch:
        flush()
    if counts.sum() == 0:
        raise StepError("deps.data: the training split is empty; the unigram baseline has nothing to count")
    return counts


@register_model("marin-unigram")
class UnigramLM(MarinLM):
    @classmethod
    def from_args(cls, **kwargs: Any) -> "UnigramLM":
        return cls.from_corpus(**kwargs)

    @classmethod
    def from_corpus(cls, tokenizer: str, corpus: str, **kwargs: Any) -> "UnigramLM":
        """`tokenizer`: a tokenizer.json location; `corpus`: a download artifact."""
        tok, special = load_tokenizer(str(tokenizer))
        return cls.from_counts(unigram_counts(training_texts(str(corpus)), tok, special), tok, special, **kwargs)

    @classmethod
    def from_counts(cls, counts: np.ndarray, tokenizer: Tokenizer, special: SpecialTokens, **kwargs: Any) -> "UnigramLM":
        return cls(UnigramScorer(counts), tokenizer, special, **kwargs)
