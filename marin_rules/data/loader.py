"""The training data loader: fixed-length sequences from `tokenize` artifacts.

Model: a source (one tokenized artifact, one split) is a token stream cut into
`n = (tokens - 1) // seq_len` windows of `seq_len + 1` tokens, window `w` starting
at token `w * seq_len` (inputs and shifted targets share the boundary token). A
source's k-th example is window `perm_e[k mod n]` of epoch `e = k // n`, where
`perm_e` is a permutation seeded by (seed, source, epoch).

Global batch rows are numbered `g = step * batch_size + r`. Rows come in blocks of
BLOCK rows; in every block each source owns a fixed number of rows (its weight
times BLOCK, rounded by largest remainder) at positions shuffled by (seed, block).
So mixture proportions are exact per block, source `s`'s example number of row g is
`block * count_s + (its rank within the block)`, and every batch is a pure function
of (step, seed): a resumed run sees exactly the batches it would have seen.
A step's batch of b rows is cut into `micro_batches` consecutive micro-batches of
m = b / micro_batches rows (gradient accumulation), and process `i` of `p`
data-parallel processes takes rows `[i * m/p, (i+1) * m/p)` of EACH micro-batch. So
every micro-batch holds the same rows whatever the process count: 2 processes x 2
micro-batches train exactly what 1 process x 2 micro-batches does.

index.json must agree with the `tokenize` record beside it (vocab_size, dtype, each
split's token count: `_check_against_record`), so an index edited in place is refused,
never trained on. A single location is a mixture of one. All sources must share one
tokenizer (same tokenizer.json digest). Local shards are memory-mapped; remote ones
(`gs://...`) are read whole into memory when the loader is made.
"""

from __future__ import annotations

import functools
import io
import math
import tokenize
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import ConfigError, StepError
from marin_rules.artifacts.files import content_problems, is_inside, recorded_digests
from marin_rules.artifacts.records import read_record, unreadable_file
from marin_rules.data.checks import MIXTURE_BLOCK, TOKEN_DTYPES, check_mixture
from marin_rules.data.relative import resolve_location
from marin_rules.data.tokenize import INDEX, tokenizer_digest
BLOCK = MIXTURE_BLOCK  # rows per mixture block: proportions are exact to 1/BLOCK within a block
FIELD = "deps.data"


@dataclass(frozen=True)
class TokenSource:
    """One split of one tokenized artifact, as a stream of tokens."""

    location: str
    index: dict[str, Any]
    shards: tuple[np.ndarray, ...]
    starts: np.ndarray  # token offset of each shard, then the total

    @property
    def n_tokens(self) -> int:
        return int(self.starts[-1])

    def window(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the stream, across shard boundaries."""
        out = np.empty(length, dtype=np.int32)
        filled = 0
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while filled < length:
            offset = start + filled - int(self.starts[shard])
            piece = self.shards[shard][offset : offset + length - filled]
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
            shard += 1
        return out


def load_source(location: str, split: str = "train") -> TokenSource:
    """Open one split of a `tokenize` artifact (memory-mapped when local)."""
    index_location = storage.join(location, INDEX)
    if not storage.exists(index_location):
        raise StepError(f"{FIELD}: {index_location} is missing: is {location} a finished `tokenize` artifact?")
    index = _read_index(index_location, location)
    _check_against_record(index, index_location, location)
    capacity = int(np.iinfo(index["dtype"]).max) + 1
    if index["vocab_size"] > capacity:
        raise StepError(
            f"{FIELD}: {location} stores {index['dtype']} tokens but its vocabulary has {index['vocab_size']} ids"
        )
    if split not in index["splits"]:
        raise StepError(f"{FIELD}: {location} has no {split!r} split (it has {sorted(index['splits'])})")
    shards = tuple(_load_shard(storage.join(location, s["path"]), location) for s in index["splits"][split]["shards"])
    for shard, entry in zip(shards, index["splits"][split]["shards"]):
        if len(shard) != entry["tokens"] or shard.dtype != np.dtype(index["dtype"]):
            raise unreadable_file(FIELD, storage.join(location, entry["path"]), location, "its length or dtype differs from index.json")
    starts = np.concatenate([[0], np.cumsum([len(s) for s in shards], dtype=np.int64)])
    return TokenSource(location, index, shards, starts)


def _check_tokenizer_digest(tokenizer: str, digest: str, location: str) -> None:
    """The tokenizer index.json names must be the one the tokens were made with (its
    `tokenizer_digest`, as `tokenize` computes it): a tokenizer.json
    replaced since (outside the artifact, as adopted data may point) would decode the
    ids to other text, and evaluation would score the model with it. (One not there is
    left to those that read it: the tokens themselves load without it.)"""
    try:
        now = tokenizer_digest(storage.read_text(tokenizer))
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as e:
        raise StepError(f"{FIELD}: the tokenizer {tokenizer} that {location}/index.json names cannot be read "
                        f"({type(e).__name__}: {e})") from None  # fmt: skip
    if now != digest:
        raise StepError(
            f"{FIELD}: {tokenizer} is not the tokenizer {location} was tokenized with (digest {now} now, "
            f"{digest} in its index.json): it changed since; tokenize again with it, or put that tokenizer back"
        )


def _read_index(index_location: str, location: str) -> dict[str, Any]:
    """index.json with the fields the loader reads; a damaged one is named (one line)."""
    try:
        index = storage.read_json(index_location)
        if index["dtype"] not in TOKEN_DTYPES:  # what tokenize writes; numpy's own error named no field
            choices = ", ".join(map(repr, TOKEN_DTYPES))
            why = f"dtype: expected one of {choices}, got {index['dtype']!r}"
            raise unreadable_file(FIELD, index_location, location, why)
        int(index["vocab_size"]), str(index["tokenizer"]), str(index["tokenizer_digest"])  # noqa: B018
        for role in ("bos_id", "eos_id", "pad_id"):
            int(index[role])
        for entry in index["splits"].values():
            for shard in entry["shards"]:
                str(shard["path"]), int(shard["tokens"])  # noqa: B018
                if not _inside(shard["path"]):
                    raise ValueError(f"shard path {shard['path']!r} is outside the artifact folder")
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise unreadable_file(FIELD, index_location, location, e) from None
    return index


def _check_against_record(index: dict[str, Any], index_location: str, location: str) -> None:
    """index.json against the result of the `tokenize` record at `location`: its
    vocab_size, dtype, special-token ids and each split's token count (what its shards list) must be the
    recorded ones, else the one-line `unreadable_file` naming the field (index.json
    edited or damaged in place, its size kept), and then its whole content the digest
    the record gives (`file_digests`), which also finds shards listed in another order.
    No such record (data adopted in place), or a result without a figure: that figure
    is not compared."""
    record = read_record(location)
    if record is None or record.step != "tokenize" or not isinstance(record.result, dict):
        return
    result = record.result
    found = {key: index.get(key) for key in ("vocab_size", "dtype", "bos_id", "eos_id", "pad_id")}
    for split, entry in index["splits"].items():
        found[f"{split}_tokens"] = sum(int(shard["tokens"]) for shard in entry["shards"])
    for key, value in found.items():
        if key in result and result[key] != value:
            field = f"splits.{key[: -len('_tokens')]} (its shards' tokens)" if key.endswith("_tokens") else key
            raise unreadable_file(FIELD, index_location, location, f"{field} is {value!r}, but the record of "
                                  f"{record.key} gives result.{key} = {result[key]!r}")  # fmt: skip
    recorded = recorded_digests(result).get(INDEX)
    if recorded and content_problems(location, {INDEX: recorded}):  # same fields, other content: shards reordered
        raise unreadable_file(FIELD, index_location, location, f"its content is not what the record of {record.key} "
                              f"gives ({recorded})")  # fmt: skip


def _inside(path: str) -> bool:
    """Is `path` (a shard listed by index.json) inside the artifact folder (`is_inside`,
    a Windows separator read as one, and no URL)?"""
    return is_inside(path.replace("\\", "/")) and "://" not in path


# what np.load raises on a damaged file: a garbled magic reads as "pickled data" (ValueError);
# the header is parsed by ast.literal_eval (SyntaxError, numpy's ValueError), retried as a Python 2
# header through the tokenize module (tokenize.TokenError); a bad dtype or shape may escape as
# TypeError or OverflowError; a short file is EOFError or OSError
NPY_ERRORS = (ValueError, SyntaxError, tokenize.TokenError, TypeError, OverflowError, OSError, EOFError)


def _load_shard(location: str, artifact: str) -> np.ndarray:
    remote = storage.is_remote(location)
    try:
        # a remote shard is read first, outside the parsing: a network error on gs:// is not a damaged file
        source = io.BytesIO(storage.read_bytes(location)) if remote else storage.local_path(location)
        try:
            return np.load(source, mmap_mode=None if remote else "r", allow_pickle=False)
        except FileNotFoundError:
            raise  # a local shard that is missing: named below
        except NPY_ERRORS as e:
            raise unreadable_file(FIELD, location, artifact, "not a numpy array file") from e
    except FileNotFoundError:
        raise unreadable_file(FIELD, location, artifact, f"missing, though {INDEX} lists it") from None


class TokenLoader:
    """Batches of `seq_len + 1` tokens from a weighted mixture of token sources."""

    def __init__(self, sources: list[TokenSource], weights: list[float], *, split: str, seq_len: int, batch_size: int, seed: int):
        self.sources = tuple(sources)
        self.weights = tuple(weights)
        self.split, self.seq_len, self.batch_size, self.seed = split, seq_len, batch_size, seed
        self.counts = block_counts(weights, BLOCK)
        self.num_sequences = tuple(max(0, (s.n_tokens - 1) // seq_len) for s in sources)
        for source, count, n in zip(self.sources, self.counts, self.num_sequences):
            if count and n == 0:
                raise StepError(
                    f"{FIELD}: the {split} split of {source.location} has {source.n_tokens} tokens, "
                    f"fewer than seq_len + 1 = {seq_len + 1}; lower seq_len or add data"
                )
        first = sources[0].index
        for source in sources[1:]:
            if source.index["tokenizer_digest"] != first["tokenizer_digest"]:
                tokenizers = [f"{resolve_location(s.location, s.index['tokenizer'])} (digest {s.index['tokenizer_digest']})"
                              for s in (source, sources[0])]  # fmt: skip
                raise StepError(
                    f"{FIELD}: {source.location} was tokenized with {tokenizers[0]}, "
                    f"{sources[0].location} with {tokenizers[1]}: a mixture needs one tokenizer"
                )
        self.vocab_size: int = int(first["vocab_size"])
        self.tokenizer: str = resolve_location(sources[0].location, first["tokenizer"])  # tokenizer.json
        _check_tokenizer_digest(self.tokenizer, first["tokenizer_digest"], sources[0].location)
        self.bos_id: int = int(first["bos_id"])
        self.eos_id: int = int(first["eos_id"])
        self.pad_id: int = int(first["pad_id"])

    def batch(self, step: int, process_index: int = 0, process_count: int = 1, micro_batches: int = 1) -> np.ndarray:
        """This process's rows of global batch `step`, micro-batch after micro-batch
        (see the module docstring): int32 [batch_size // process_count, seq_len + 1],
        which reshapes to [micro_batches, rows per micro-batch, seq_len + 1]."""
        if not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        shards = process_count * micro_batches
        if process_count < 1 or micro_batches < 1 or self.batch_size % shards or not 0 <= process_index < process_count:
            raise ValueError(
                f"batch_size {self.batch_size} must split evenly over process_count {process_count} x "
                f"micro_batches {micro_batches}, and process_index must be in [0, {process_count}); got {process_index}"
            )
        micro = self.batch_size // micro_batches
        local = micro // process_count
        out = np.empty((micro_batches * local, self.seq_len + 1), dtype=np.int32)
        for j in range(micro_batches):
            first = int(step) * self.batch_size + j * micro + process_index * local
            for row in range(local):
                source, example = self.example_of_row(first + row)
                out[j * local + row] = self._sequence(source, example)
        if out.size and (int(out.max()) >= self.vocab_size or int(out.min()) < 0):
            self._refuse_ids_outside_vocab(out, step, process_index, process_count, micro_batches)
        return out

    def _refuse_ids_outside_vocab(self, out: np.ndarray, step: int, process_index: int, process_count: int,
                                  micro_batches: int) -> None:  # fmt: skip
        """Name the source whose tokens lie outside the vocabulary (a damaged shard:
        the model would look them up out of range and train on NaNs)."""
        micro = self.batch_size // micro_batches
        local = micro // process_count
        bad = int(np.flatnonzero(((out >= self.vocab_size) | (out < 0)).any(axis=1))[0])
        j, row = divmod(bad, local)
        source, _ = self.example_of_row(int(step) * self.batch_size + j * micro + process_index * local + row)
        location = self.sources[source].location
        value = int(out[bad][(out[bad] >= self.vocab_size) | (out[bad] < 0)][0])
        raise unreadable_file(
            FIELD, storage.join(location, INDEX) + " shards", location,
            f"token id {value} outside the vocabulary of {self.vocab_size} ids",
        )  # fmt: skip

    def example_of_row(self, row: int) -> tuple[int, int]:
        """(source number, that source's example number) of global row `row`."""
        block, position = divmod(row, BLOCK)
        owners, ranks = _block_layout(self.counts, self.seed, block)
        source = int(owners[position])
        return source, block * self.counts[source] + int(ranks[position])

    def _sequence(self, source: int, example: int) -> np.ndarray:
        n = self.num_sequences[source]
        epoch, k = divmod(example, n)
        window = int(_permutation(n, self.seed, source, epoch)[k])
        return self.sources[source].window(window * self.seq_len, self.seq_len + 1)


def make_loader(
    sources: str | Mapping[str, float], *, split: str = "train", seq_len: int, batch_size: int, seed: int
) -> TokenLoader:
    """A loader over one tokenized artifact or a mixture `{location: weight}`.
    Weights must be >= 0 and sum to a positive number (`deps.data` errors otherwise);
    they are normalised. Sources are ordered by location, so the order of the
    mapping does not change the batches."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1, got {seq_len!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    weights = check_mixture(sources, FIELD)
    locations = sorted(weights)
    loaded = [load_source(location, split) for location in locations]
    return TokenLoader(
        loaded, [weights[loc] for loc in locations], split=split, seq_len=seq_len, batch_size=batch_size, seed=seed
    )


def block_counts(weights: list[float], block: int) -> tuple[int, ...]:
    """Rows per block for each source: weight * block rounded by largest remainder
    (ties to the earlier source), summing to `block`."""
    total = math.fsum(weights)
    if total <= 0:
        raise ConfigError(FIELD, f"mixture weights must sum to a positive number, got {list(weights)}")
    exact = [w / total * block for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: block - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


@functools.lru_cache(maxsize=8)
def _block_layout(counts: tuple[int, ...], seed: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """For one block: the source owning each position, and each position's rank
    among its source's positions."""
    owners = np.repeat(np.arange(len(counts)), counts)
    owners = np.random.default_rng([seed, 0x6D6978, block]).permutation(owners)
    ranks = np.empty(len(owners), dtype=np.int64)
    for source in range(len(counts)):
        where = np.flatnonzero(owners == source)
        ranks[where] = np.arange(len(where))
    return owners, ranks


@functools.lru_cache(maxsize=16)
def _permutation(n: int, seed: int, source: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, source, epoch]).permutation(n)
