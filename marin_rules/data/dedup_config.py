"""Settings of the `dedup` step, its load-time checker, and the LSH banding it derives.

Model: a `dedup` config names how documents become shingle sets (`ngram` words or
characters), how many MinHash permutations sign each set (`num_perm`, `seed`) and
the Jaccard similarity above which two documents count as near-duplicates
(`threshold`). The LSH banding (b bands of r rows, b * r <= num_perm) is derived
from the threshold, never configured: `lsh_bands` picks the (b, r) that minimise
the summed false-positive and false-negative areas under the LSH S-curve
P(s) = 1 - (1 - s^r)^b, i.e. integral_0^t P(s) ds + integral_t^1 (1 - P(s)) ds
with equal weights (the derivation datasketch's `MinHashLSH` uses). Signatures
then use b * r of the `num_perm` permutations (rensa's LSH needs rows * bands to
be the signature length). The step records b, r and the curve's value at the
threshold.

Standard library only: loading an experiment (dry runs) stays fast.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.validation import Int, Number, OneOf, Optional, check_fields

NGRAM_UNITS = ("word", "char")
CORPUS_KINDS = ("download", "dedup")  # what `deps.corpus` of a corpus reader may be


@dataclass(frozen=True)
class DedupConfig:
    threshold: Annotated[float, Number(gt=0, lt=1), "Jaccard similarity of shingle sets above which documents are near-duplicates"] = 0.8
    ngram: Annotated[int, Int(min=1, max=64), "shingle length, in units of ngram_unit"] = 5
    ngram_unit: Annotated[str, OneOf(NGRAM_UNITS), "shingles of words (split on whitespace, lower-cased) or of characters"] = "word"
    num_perm: Annotated[int, Int(min=16, max=1024), "MinHash permutations per document"] = 128
    seed: Annotated[int, Int(min=0, max=2**31 - 1), "seed of the MinHash permutations"] = 1
    num_workers: Annotated[int | None, Optional(Int(min=1)), "signing processes (speed only: better in runtime)"] = None


def check_dedup(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """`dedup`: one `deps.corpus` (a download or dedup artifact); `threshold` (default
    0.8), `ngram` (default 5) of `ngram_unit` (word | char), `num_perm` (128), `seed` (1);
    `num_workers` (signing processes) only changes speed: give it in `runtime`."""
    check_fields(DedupConfig, config, "config")
    if "corpus" not in deps:
        raise ConfigError("deps.corpus", "missing: name the corpus to deduplicate (a download or dedup artifact, name@version)")
    if not isinstance(deps["corpus"], str):
        raise ConfigError("deps.corpus", f"expected one artifact (name@version), got {deps['corpus']!r}")
    extra = sorted(set(deps) - {"corpus"})
    if extra:
        raise ConfigError(f"deps.{extra[0]}", "dedup takes only deps `corpus`")


def settings(config: Mapping[str, Any]) -> DedupConfig:
    """The checked config with defaults filled in."""
    return DedupConfig(**check_fields(DedupConfig, config, "config"))


def candidate_probability(s: float, bands: int, rows: int) -> float:
    """Probability that two sets of Jaccard similarity s share at least one band."""
    return 1.0 - (1.0 - s**rows) ** bands


@functools.cache
def lsh_bands(threshold: float, num_perm: int, steps: int = 200) -> tuple[int, int]:
    """(bands, rows) minimising false-positive + false-negative area (midpoint rule)."""
    best: tuple[float, int, int] | None = None
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            lo = threshold / steps
            fp = sum(candidate_probability((i + 0.5) * lo, bands, rows) for i in range(steps)) * lo
            hi = (1.0 - threshold) / steps
            fn = sum(1.0 - candidate_probability(threshold + (i + 0.5) * hi, bands, rows) for i in range(steps)) * hi
            if best is None or fp + fn < best[0]:
                best = (fp + fn, bands, rows)
    assert best is not None
    return best[1], best[2]
