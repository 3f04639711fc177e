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

Memory: a text is shingled a piece of about `PIECE_CHARS` characters at a time (cut
at whitespace, the last `ngram - 1` units carried over), and each piece's shingles
update the signature and are dropped, so signing holds little beyond the text (all
of a 100 MB document's shingles at once would be 17 million strings, GBs). The
shingles are the whole text's, in order, and MinHash keeps a minimum per permutation,
so updating piece by piece signs the same set; a text of up to `PIECE_CHARS`
characters (almost every document) is one piece.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable, Iterator

from rensa import RMinHash, RMinHashLSH


PIECE_CHARS = 1 << 16  # a text is shingled this many characters (or shingles) at a time


def shingles(text: str, ngram: int, unit: str) -> list[str]:
    """The shingles of one document (repeats allowed: MinHash sees the set)."""
    return [s for piece in shingle_pieces(text, ngram, unit) for s in piece]


def shingle_pieces(text: str, ngram: int, unit: str, piece_chars: int = PIECE_CHARS) -> Iterator[list[str]]:
    """The shingles of one document, in order, a list per piece of about `piece_chars`
    characters of its text (at most `piece_chars` shingles a list for `char`): one list
    for a text of up to `piece_chars` characters."""
    pieces = text_pieces(text, piece_chars)
    if unit == "word":
        return word_shingles(pieces, ngram)
    return char_shingles(pieces, ngram, piece_chars)


_SPACE = re.compile(r"\s")  # what str.split() splits on (the same Unicode whitespace)


def text_pieces(text: str, size: int) -> Iterator[str]:
    """`text` cut into runs of about `size` characters, each cut just before a whitespace
    character, so the runs' words (lower-cased) are the text's: a cut never falls inside
    a word, and lower-casing does not look across whitespace (final sigma). A text of up
    to `size` characters is one run: `text` itself, not a copy."""
    start = 0
    while len(text) - start > size:
        space = _SPACE.search(text, start + size)
        if space is None:
            break
        yield text[start : space.start()]
        start = space.start()
    yield text[start:]


def word_shingles(pieces: Iterator[str], ngram: int) -> Iterator[list[str]]:
    """`ngram` consecutive lower-cased words, a list per piece (the last `ngram - 1` words
    of a piece begin the next); fewer than `ngram` words in all are one shingle."""
    carry: list[str] = []
    done = False
    for piece in pieces:
        units = carry + piece.lower().split()
        if len(units) >= ngram:
            # slices of the joined text, not a join per shingle (2-3x faster, same strings):
            # starts[i] is where word i begins; a shingle ends one space before word i+ngram
            flat = " ".join(units)
            starts = list(itertools.accumulate((len(u) + 1 for u in units), initial=0))
            yield [flat[a : b - 1] for a, b in zip(starts, starts[ngram:])]
            done = True
        carry = units[len(units) - ngram + 1 :] if len(units) >= ngram else units
    if not done:
        yield [" ".join(carry)]


def char_shingles(pieces: Iterator[str], ngram: int, size: int) -> Iterator[list[str]]:
    """`ngram` consecutive characters of the lower-cased text with whitespace runs
    collapsed to one space, at most `size` per list (the last `ngram - 1` characters of
    a piece begin the next); a text of at most `ngram` such characters is one shingle."""
    carry, started, done = "", False, False
    for piece in pieces:
        words = piece.lower().split()
        if not words:
            continue
        flat = f"{carry} {' '.join(words)}" if started else " ".join(words)
        started = True
        count = len(flat) - ngram + 1
        for first in range(0, count, size):
            yield [flat[i : i + ngram] for i in range(first, min(first + size, count))]
            done = True
        carry = flat[max(0, len(flat) - ngram + 1) :]
    if not done:
        yield [carry]


def signature(pieces: Iterable[list[str]], num_perm: int, seed: int) -> RMinHash:
    """The MinHash of the union of `pieces` (updated a list at a time: same as at once)."""
    sig = RMinHash(num_perm=num_perm, seed=seed)
    for tokens in pieces:
        sig.update(tokens)
    return sig


def sign_batch(texts: list[str], ngram: int, unit: str, num_perm: int, seed: int) -> list[RMinHash]:
    return [signature(shingle_pieces(t, ngram, unit), num_perm, seed) for t in texts]


def signatures(
    texts: Iterator[str], *, ngram: int, unit: str, num_perm: int, seed: int, num_workers: int, batch_size: int = 256
) -> Iterator[RMinHash]:
    """One signature per text, in order; shingling and signing (the costly part) in
    `num_workers` spawned processes when above 1 (same signatures either way)."""
    if num_workers <= 1:
        for text in texts:
            yield signature(shingle_pieces(text, ngram, unit), num_perm, seed)
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
