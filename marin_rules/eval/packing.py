"""Packing scored windows into rows: the layout of a `ScoreBatch` (numpy, no JAX).

Model: a `Piece` is one scored window of a request: a `prefix` (history it may
share with other pieces: the context of a multiple-choice question's choices), a
`suffix` (its own inputs) and the `targets` after them, the last `scored` of which
count. A *unit* is a prefix followed by the suffixes of the pieces that share it,
each suffix a *branch* that sees the prefix and its own earlier tokens only (a tree
of sequences, run once). Units are packed first-fit decreasing into rows of at most
`row_length` tokens (the model's context), several short units per row; inside a
row each unit is a *segment* and no token sees another segment. So a batch runs
every shared context once, every continuation token once, and pads only the tail
of each row: no key/value cache, one forward pass.

Each input carries its position in its own sequence (prefix 0..p-1, each branch
p..), so rotary positions and causality are those of a plain forward pass over
prefix + that suffix: a piece scores exactly as it would alone.

Shapes (`PackShape`: rows, row length, scored positions) are bucketed (powers of
two and 1.5 times one) and a batch reuses a larger shape already used in the same
call while that costs at most `MAX_PADDING_COST` times its own: a compile costs
about 2-4 s on 2 CPU cores, so a task compiles a few programs, not one per batch.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from marin_rules.eval.scoring import ScoreBatch

MIN_ROW_LENGTH = 16  # the shortest padded row
MIN_SCORED = 8  # the fewest padded scored positions
MAX_PADDING_COST = 2.0  # a batch reuses a larger shape used in the same call while it costs at most 2x its own


@dataclass(frozen=True)
class Piece:
    """One scored window of request `request` (see the module docstring)."""

    request: int
    prefix: tuple[int, ...]
    suffix: list[int]
    targets: list[int]
    scored: int


@dataclass(frozen=True)
class PackShape:
    """The padded sizes of a ScoreBatch: rows, row length, scored positions."""

    rows: int
    length: int
    scored: int

    def holds(self, other: "PackShape") -> bool:
        return self.rows >= other.rows and self.length >= other.length and self.scored >= other.scored

    def cost(self) -> int:
        """Positions run through the model: row tokens and head positions."""
        return self.rows * self.length + self.scored


Unit = list[Piece]  # pieces sharing one prefix, in order


def bucket(n: int, cap: int, smallest: int = 1, *, halves: bool = True) -> int:
    """The next size >= n among powers of two >= `smallest` (with `halves`, also 1.5
    times one: 1, 2, 3, 4, 6, 8, 12, 16, 24, ...), capped at `cap`. Coarse on purpose:
    each new shape costs a compile, so few shapes beat tight padding."""
    size = smallest
    while size < n:
        if not halves:
            size *= 2
        elif size & (size - 1) == 0:  # a power of two: 16 -> 24 (and 1 -> 2)
            size = max(size + 1, size * 3 // 2)
        else:  # 1.5 times one: 24 -> 32
            size = size // 3 * 4
    return min(size, cap)


def unit_length(unit: Unit) -> int:
    return len(unit[0].prefix) + sum(len(p.suffix) for p in unit)


def make_units(pieces: list[Piece], row_length: int, max_pieces: int) -> list[Unit]:
    """Consecutive pieces with the same non-empty prefix, as many as fit in one row
    (at most `max_pieces`); a piece without a shared prefix is a unit of its own."""
    units: list[Unit] = []
    for piece in pieces:
        last = units[-1] if units else None
        if (
            last
            and piece.prefix
            and last[0].prefix == piece.prefix
            and len(last) < max_pieces
            and unit_length(last) + len(piece.suffix) <= row_length
        ):
            last.append(piece)
        else:
            units.append([piece])
    return units


def pack_rows(units: list[Unit], row_length: int, max_pieces: int) -> list[list[Unit]]:
    """Best-fit decreasing: longest unit first, each into the open row it fills
    best, at most `max_pieces` pieces per row; rows come out longest first."""
    rows: list[list[Unit]] = []
    pieces: list[int] = []
    space: list[tuple[int, int]] = []  # (free tokens, row), sorted
    for unit in sorted(units, key=unit_length, reverse=True):
        n = unit_length(unit)
        at = bisect.bisect_left(space, (n, -1))
        while at < len(space) and pieces[space[at][1]] + len(unit) > max_pieces:
            at += 1
        if at < len(space):
            free, r = space.pop(at)
        else:
            free, r = row_length, len(rows)
            rows.append([])
            pieces.append(0)
        rows[r].append(unit)
        pieces[r] += len(unit)
        bisect.insort(space, (free - n, r))
    return rows


def make_batches(pieces: list[Piece], row_length: int, batch_size: int) -> list[list[list[Unit]]]:
    """`pieces` (equal prefixes adjacent) as batches of packed rows, each batch at
    most `batch_size` pieces (one row at least)."""
    batches: list[list[list[Unit]]] = []
    count = 0
    for row in pack_rows(make_units(pieces, row_length, batch_size), row_length, batch_size):
        n = sum(len(unit) for unit in row)
        if not batches or count + n > batch_size:
            batches.append([])
            count = 0
        batches[-1].append(row)
        count += n
    return batches


def own_shape(rows: list[list[Unit]], row_length: int, max_rows: int) -> PackShape:
    length = bucket(max(sum(unit_length(u) for u in row) for row in rows), row_length, MIN_ROW_LENGTH)
    n_rows = bucket(len(rows), max(max_rows, len(rows)))
    scored = sum(p.scored for row in rows for unit in row for p in unit)
    return PackShape(n_rows, length, bucket(scored, n_rows * length, MIN_SCORED))


def choose_shapes(batches: list[list[list[Unit]]], row_length: int, max_rows: int) -> list[PackShape]:
    """A shape per batch: its own bucketed one, or one already chosen in this call
    that holds it at most MAX_PADDING_COST times the work."""
    chosen: list[PackShape] = []
    shapes = []
    for rows in batches:
        own = own_shape(rows, row_length, max_rows)
        fit = next((c for c in chosen if c.holds(own) and c.cost() <= MAX_PADDING_COST * own.cost()), None)
        if fit is None:
            chosen.append(own)
        shapes.append(fit or own)
    return shapes


def layout(rows: list[list[Unit]], shape: PackShape, pad: int) -> tuple[ScoreBatch, list[tuple[Piece, int, int]]]:
    """The padded arrays of `shape`, and for each piece the flat range [a, b) of
    its scored positions in the [rows, length] outputs."""
    R, T = shape.rows, shape.length
    tokens = np.full((R, T), pad, np.int32)
    positions = np.zeros((R, T), np.int32)
    segments = np.full((R, T), -1, np.int32)  # padding: a segment of its own
    branches = np.zeros((R, T), np.int32)
    targets = np.zeros((R, T), np.int32)
    spans = []
    for r, row in enumerate(rows):
        at = 0
        for s, unit in enumerate(row):
            prefix = unit[0].prefix
            end = at + len(prefix)
            tokens[r, at:end], positions[r, at:end], segments[r, at:end] = prefix, np.arange(len(prefix)), s
            at = end
            for b, piece in enumerate(unit, start=1):
                end = at + len(piece.suffix)
                tokens[r, at:end], targets[r, at:end] = piece.suffix, piece.targets
                positions[r, at:end] = np.arange(len(prefix), len(prefix) + len(piece.suffix))
                segments[r, at:end], branches[r, at:end] = s, b
                spans.append((piece, r * T + end - piece.scored, r * T + end))
                at = end
    real = [i for _, a, b in spans for i in range(a, b)]
    scored = np.full(shape.scored, real[0] if real else 0, np.int32)
    scored[: len(real)] = real
    return ScoreBatch(tokens, positions, segments, branches, targets, scored), spans
