"""Packing scored windows into rows (marin_rules/eval/packing.py): pure numpy facts.

What the model sees is checked against a direct forward pass in test_eval_lm.py;
here: every piece lands once, rows and batches respect their limits, shared
prefixes run once, each input's position and branch are those of its own sequence.
"""

from __future__ import annotations

import numpy as np

from marin_rules.eval.packing import Piece, bucket, choose_shapes, layout, make_batches, unit_length

PAD = 0


def piece(request: int, prefix: tuple[int, ...], suffix_len: int, scored: int) -> Piece:
    suffix = [100 + request * 10 + i for i in range(suffix_len)]
    return Piece(request, prefix, suffix, [t + 1 for t in suffix], scored)


def test_bucket_sizes_are_powers_of_two_and_halves_capped():
    assert [bucket(n, 64) for n in (1, 2, 3, 4, 5, 7, 9, 13, 17, 40, 70)] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48, 64]
    assert bucket(17, 128, 16, halves=False) == 32


def test_every_piece_is_packed_once_within_row_and_batch_limits():
    rng = np.random.default_rng(0)
    context = tuple(range(1, 41))
    pieces = [piece(i, context, int(rng.integers(3, 20)), 2) for i in range(8)]  # 8 choices of one context
    pieces += [piece(8 + i, (), int(rng.integers(5, 60)), 5) for i in range(20)]  # distinct windows
    row_length, batch_size = 64, 6
    batches = make_batches(pieces, row_length, batch_size)
    placed = [p.request for rows in batches for row in rows for unit in row for p in unit]
    assert sorted(placed) == list(range(28))
    for rows in batches:
        assert sum(len(unit) for row in rows for unit in row) <= batch_size
        assert all(sum(unit_length(u) for u in row) <= row_length for row in rows)
    # the shared context runs once per unit, and units hold as many choices as fit
    units = [unit for rows in batches for row in rows for unit in row if unit[0].prefix]
    assert sum(len(u) for u in units) == 8 and len(units) < 8


def test_layout_positions_branches_and_scored_spans_are_each_pieces_own():
    context = (7, 8, 9)
    pieces = [piece(0, context, 4, 2), piece(1, context, 2, 2), piece(2, (), 5, 3)]
    batches = make_batches(pieces, 16, 8)
    (shape,) = choose_shapes(batches, 16, 8)
    batch, spans = layout(batches[0], shape, PAD)
    assert batch.tokens.shape == (shape.rows, shape.length)
    flat_tokens, flat_positions = batch.tokens.reshape(-1), batch.positions.reshape(-1)
    flat_targets, flat_branches = batch.targets.reshape(-1), batch.branches.reshape(-1)
    for p, a, b in spans:
        assert b - a == p.scored
        assert flat_targets[a:b].tolist() == p.targets[-p.scored :]
        start = len(p.prefix)
        assert flat_positions[a:b].tolist() == list(range(start + len(p.suffix) - p.scored, start + len(p.suffix)))
        assert flat_tokens[a:b].tolist() == p.suffix[-p.scored :]
        assert len(set(flat_branches[a:b].tolist())) == 1 and flat_branches[a] > 0
    real = batch.segments >= 0
    assert (batch.branches[real] == 0).sum() == len(context)  # the context once, for both choices
    assert (batch.tokens[~real] == PAD).all()
    assert set(batch.scored.tolist()) == {i for _, a, b in spans for i in range(a, b)}
