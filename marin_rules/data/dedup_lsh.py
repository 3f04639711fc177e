"""Near-duplicate clusters of documents: shingles, MinHash LSH, connected components.

Model: a document becomes a set of shingles (`ngram` consecutive words of its
lower-cased text split on whitespace, or `ngram` consecutive characters of the text
lower-cased with whitespace runs collapsed to one space; a document shorter than one
shingle is one shingle). `rensa` (Rust R-MinHash, the maintained library) signs each
set with `num_perm` permutations and indexes it in an LSH of `bands` x `rows`. Each
document is queried before it is inserted, so every pair that shares a band is seen
exactly once, whatever the order; a candidate pair becomes an edge when its
signatures' estimated Jaccard similarity reaches the threshold (LSH alone admits
pairs below it). The clusters are the connected components of those edges
(union-find), so a chain a~b~c is one cluster even when a and c are far apart.
Edges, hence clusters, do not depend on the order documents arrive in. Shingling
and signing (most of the work) may run in `num_workers` spawned processes; the
signatures, hence the clusters, are the same.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable, Iterator

from rensa import RMinHash, RMinHashLSH


def shingles(text: str, ngram: int, unit: str) -> list[str]:
    """The shingles of one document (repeats allowed: MinHash sees the set)."""
    if unit == "word":
        units = text.lower().split()
        flat = " ".join(units)
        if len(units) <= ngram:
            return [flat]
        # slices of the joined text, not a join per shingle (2-3x faster, same strings):
        # starts[i] is where word i begins; a shingle ends one space before word i+ngram
        starts = list(itertools.accumulate((len(u) + 1 for u in units), initial=0))
        return [flat[a : b - 1] for a, b in zip(starts, starts[ngram:])]
    flat = " ".join(text.lower().split())
    if len(flat) <= ngram:
        return [flat]
    return [flat[i : i + ngram] for i in range(len(flat) - ngram + 1)]


def signature(tokens: list[str], num_perm: int, seed: int) -> RMinHash:
    sig = RMinHash(num_perm=num_perm, seed=seed)
    sig.update(tokens)
    return sig


def sign_batch(texts: list[str], ngram: int, unit: str, num_perm: int, seed: int) -> list[RMinHash]:
    return [signature(shingles(t, ngram, unit), num_perm, seed) for t in texts]


def signatures(
    texts: Iterator[str], *, ngram: int, unit: str, num_perm: int, seed: int, num_workers: int, batch_size: int = 256
) -> Iterator[RMinHash]:
    """One signature per text, in order; shingling and signing (the costly part) in
    `num_workers` spawned processes when above 1 (same signatures either way)."""
    if num_workers <= 1:
        for text in texts:
            yield signature(shingles(text, ngram, unit), num_perm, seed)
        return
    # spawn, not fork, and a bounded queue of batches: as in tokenize.encode_stream
    with ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: collections.deque = collections.deque()
        while batch := list(itertools.islice(texts, batch_size)):
            pending.append(pool.submit(sign_batch, batch, ngram, unit, num_perm, seed))
            if len(pending) >= 4 * num_workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


class UnionFind:
    """Disjoint sets over 0..n-1 (path halving, union by size)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []

    def add(self) -> int:
        self.parent.append(len(self.parent))
        self.size.append(1)
        return len(self.parent) - 1

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a == b:
            return
        if self.size[a] < self.size[b]:
            a, b = b, a
        self.parent[b] = a
        self.size[a] += self.size[b]


class Clusterer:
    """Feed signatures one at a time (`add`); `components()` gives the clusters."""

    def __init__(self, threshold: float, num_perm: int, bands: int) -> None:
        self.threshold = threshold
        self.lsh = RMinHashLSH(threshold=threshold, num_perm=num_perm, num_bands=bands)
        self.signatures: list[RMinHash] = []
        self.sets = UnionFind()
        self.candidate_pairs = 0
        self.edges = 0

    def add(self, sig: RMinHash) -> int:
        """Link one document's signature to the near-duplicates seen so far; its index."""
        index = self.sets.add()
        for other in self.lsh.query(sig):
            self.candidate_pairs += 1
            if sig.jaccard(self.signatures[other]) >= self.threshold:
                self.edges += 1
                self.sets.union(index, other)
        self.lsh.insert(index, sig)
        self.signatures.append(sig)
        return index

    def components(self) -> list[list[int]]:
        """Every cluster as a sorted list of document indices (singletons included)."""
        groups: dict[int, list[int]] = {}
        for i in range(len(self.sets.parent)):
            groups.setdefault(self.sets.find(i), []).append(i)
        return list(groups.values())


def cluster(sigs: Iterable[RMinHash], clusterer: Clusterer) -> list[list[int]]:
    for sig in sigs:
        clusterer.add(sig)
    return clusterer.components()
