"""Encoding documents into token ids for `tokenize`: batches, workers, eos.

Model: documents arrive in order and are cut into batches (at most `batch_size`
documents and about `max_bytes` of text). With one worker, batches are encoded by
two threads of this process: tokenizers releases the GIL and spreads each call's
documents over its own thread pool, so two calls in flight keep that pool busy
while the last documents of one batch finish, and reading, reading ids out and
writing overlap with encoding. With more workers, in a pool of spawned processes.
Results come back in document order, so the output does not depend on the worker
count. Each document's ids are
followed by the eos id; special-token strings inside a text are encoded as text.
"""

from __future__ import annotations

import collections
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer

from marin_rules.data.tokenizer import bulk_encoder

TASK_BYTES = 2**18  # a batch handed to a worker process also ends once it holds this much text
THREAD_TASK_BYTES = 2**20  # one worker: tokenizers parallelises over a call's documents, so give it several
THREAD_TASKS = 2  # one worker: calls in flight at once (see the model above)


def batches(texts: Iterator[str], batch_size: int, max_bytes: int = TASK_BYTES) -> Iterator[list[str]]:
    """Consecutive documents, at most `batch_size` of them and about `max_bytes` of text."""
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if len(batch) >= batch_size or size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_stream(
    texts: Iterator[str],
    tokenizer_json: str,
    eos_id: int,
    dtype: str,
    *,
    num_workers: int,
    batch_size: int,
    tokenizer: Tokenizer | None = None,
) -> Iterator[tuple[np.ndarray, list[int]]]:
    """(tokens, per-document lengths) for each batch, in document order. With one
    worker, encoding runs in threads of this process (tokenizers releases the GIL),
    so reading the next documents and writing shards overlap with it; they use
    `tokenizer` when given (`bulk_encoder(tokenizer_json)` already made), else make it.
    Worker processes each make their own from `tokenizer_json`."""
    if num_workers <= 1:
        _init_worker(tokenizer_json, eos_id, dtype, tokenizer)
        pool, max_bytes, in_flight = ThreadPoolExecutor(THREAD_TASKS), THREAD_TASK_BYTES, 2 * THREAD_TASKS
    else:
        # spawn, not fork: the parent may hold threads (a tokenizers thread pool, JAX).
        # A ProcessPoolExecutor, not a multiprocessing.Pool: a worker that dies (killed,
        # out of memory, a failing initializer) raises BrokenProcessPool instead of hanging.
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            num_workers, mp_context=context, initializer=_init_worker, initargs=(tokenizer_json, eos_id, dtype)
        )
        max_bytes, in_flight = TASK_BYTES, 2 * num_workers
    with pool:
        pending: collections.deque = collections.deque()
        for batch in batches(texts, batch_size, max_bytes):
            pending.append(pool.submit(encode_batch, batch))
            if len(pending) >= in_flight:  # bounded: memory stays flat on large corpora
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_json: str, eos_id: int, dtype: str, tokenizer: Tokenizer | None = None) -> None:
    # bulk_encoder: a literal "<|endoftext|>" in a text is text, not eos
    tokenizer = tokenizer if tokenizer is not None else bulk_encoder(tokenizer_json)
    _WORKER.update(tokenizer=tokenizer, eos_id=eos_id, dtype=np.dtype(dtype))


def encode_batch(texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
    """Encode documents; each one's ids end with eos. Returns the concatenated ids
    and each document's length (eos included)."""
    encodings = _WORKER["tokenizer"].encode_batch_fast(list(texts), add_special_tokens=False)
    lengths = [len(e) + 1 for e in encodings]  # len(e), not len(e.ids): reading ids builds a list
    out = np.empty(sum(lengths), dtype=_WORKER["dtype"])
    start = 0
    for encoding, length in zip(encodings, lengths):
        out[start : start + length - 1] = np.fromiter(encoding.ids, out.dtype, length - 1)
        out[start + length - 1] = _WORKER["eos_id"]
        start += length
    return out, lengths
