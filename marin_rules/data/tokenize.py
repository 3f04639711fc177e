"""The `tokenize` step: documents -> token shards that training reads.

Model: the training documents of `deps.corpus` (a `download` artifact), in their
order and capped by `config.sample_count`, are encoded with `deps.tokenizer`'s
tokenizer.json; each document's ids are followed by the eos id (special-token
strings inside a text are encoded as plain text, so eos only ever ends a
document). A fixed, evenly spaced `validation_fraction` of the documents (at least
one when the fraction is above zero) forms the validation split, the rest the
train split: the two never share a document. Each split is one stream of tokens
stored as numpy files of dtype uint16 when the vocabulary fits in 65,536 ids, else
uint32 (`config.dtype` may force one; it must hold every id).

The work is cut into `runtime.shards` (default 1) contiguous ranges of documents
(`marin_rules.artifacts.shards`): in a workflow run each is its own Snakemake job
(`tokenize_shard`, on whatever executor runs the workflow) writing
`shards/{k}-of-{n}/{split}/tokens-00000.npy`, ..., and the `tokenize` job gathers
them. A split's stream is its shards' files in order, the same tokens for any shard
count: the count is an execution choice, outside the fingerprint.

Encoding (`encoding.py`) runs in batches of documents: in a thread of this process for
one worker, across a pool of `num_workers` spawned processes otherwise, with results
consumed in order so the output does not depend on the worker count. `num_workers` and `batch_size`
only change speed: put them in the entry's `runtime` to keep them out of the
fingerprint (they are read from `config` too). A tqdm bar on stderr shows progress.

The first shard also decodes the ids of the corpus's first documents (whole ones, from
the first until they hold `tokenizer.LOSSLESS_SAMPLE_CHARS` characters), as it encoded
them, and compares them with their texts (`round_trip`): the result records `lossless`
(and `lossless_example` where a text did not come back), whatever the shard count, and
a lossy tokenizer gets one stderr line from the gather, a warning: training on it is
fine, but bits per byte and perplexities compared across tokenizers are not meaningful.
Reusing the step's own ids costs a decode, not a second read and encoding. Every
shard also counts the tokens that are the model's unknown token (`unknown_tokens`:
WordPiece's [UNK], for text it cannot encode) over all its documents: any makes the
tokenizer lossy, even where the sample came back whole.

`index.json` is written last; its presence means every shard it lists is whole:
{format, vocab_size, dtype, tokenizer (location of tokenizer.json), tokenizer_digest,
bos_id, eos_id, pad_id, corpus, splits: {train|validation: {tokens, documents,
shards: [{path, tokens, documents}]}}}. `tokenizer` and `corpus` are relative to the
artifact's folder (`relative.py`), so the prefix can move. Each shard entry also gives
its file's digest as written (`digest`, xxh3); the result gives those and index.json's
(`file_digests`), which `marin verify` checks (a token file edited in place keeps its
size: only its content tells).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Iterator

import numpy as np
import xxhash
from tokenizers import Tokenizer
from tqdm import tqdm

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import FILE_DIGESTS, DigestingWriter, named_digests
from marin_rules.artifacts.records import unreadable_file
from marin_rules.artifacts.shards import Shard, all_shards, shard_count
from marin_rules.data import dolma
from marin_rules.data.checks import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_NUM_WORKERS,
    DEFAULT_VALIDATION_FRACTION,
    check_tokenize,
    token_dtype,
)
from marin_rules.data.encoding import encode_stream
from marin_rules.data.relative import relative_location
from marin_rules.data.tokenizer import (
    LOSSLESS_SAMPLE_CHARS, TOKENIZER_FILE, RoundTrip, bulk_encoder, load_special_tokens, lossy_message, round_trip,
)

INDEX = "index.json"
INDEX_FORMAT = "marin-rules-tokens/1"
SPLITS = ("train", "validation")
SHARD_TOKENS = 2**26  # tokens per shard file (128 MiB as uint16)


def tokenize(ctx: StepContext) -> dict[str, Any]:
    """The whole step in this process: every shard of `runtime.shards`, then the gather
    (what the shard jobs and the gather job do between them in a workflow run)."""
    return gather_tokens(ctx, [tokenize_shard(ctx, s) for s in all_shards(shard_count(ctx.runtime))])


def tokenize_shard(ctx: StepContext, shard: Shard) -> dict[str, Any]:
    """Encode this shard's contiguous range of the corpus's training documents into
    `{shard folder}/{split}/tokens-*.npy`; returns its splits (paths relative to the
    artifact) and counts. Which split a document goes to depends on its place in the
    whole corpus, so the gathered streams do not depend on the shard count."""
    check_tokenize(ctx.config, ctx.deps)
    started = time.perf_counter()
    setting = {**ctx.config, **{k: v for k, v in ctx.runtime.items() if k in ("num_workers", "batch_size")}}
    num_workers = int(setting.get("num_workers") or DEFAULT_NUM_WORKERS)
    batch_size = int(setting.get("batch_size") or DEFAULT_BATCH_SIZE)
    fraction = float(ctx.config.get("validation_fraction", DEFAULT_VALIDATION_FRACTION))
    corpus = ctx.deps["corpus"]
    vocab = describe_tokenizer(ctx.deps["tokenizer"], ctx.config.get("dtype"))
    output = shard.location(ctx.output)
    dolma.remove(storage.join(ctx.output, INDEX))  # a retry: no old index may describe rewritten files
    for split in SPLITS:  # a retry: what an interrupted attempt left is rewritten
        folder = storage.join(output, split)
        if storage.exists(folder):
            for stale in storage.list_files(folder, "tokens-*.npy"):
                dolma.remove(stale)

    available = dolma.read_manifest(corpus)["train_documents"]
    n_docs = min(available, ctx.config.get("sample_count") or available)
    labels = split_labels(n_docs, fraction)
    span = shard.document_range(n_docs)
    last = span.stop == available  # the split's end: a manifest undercounting its shards is found
    texts = (doc["text"] for doc in dolma.read_range(corpus, "train", span.start, span.stop, last=last))
    texts = _warn_of_huge_documents(texts, ctx.key, span.start)
    sample: list[str] = []  # the first shard: texts of the corpus's first documents, for `round_trip`
    sampled: set[int] = set()  # their places in the shard (a book-sized one is left out: `_sampled`)
    sample_ids: list[list[int]] = []
    if shard.index == 0:
        texts = _sampled(texts, sample, sampled)

    writers = {split: ShardWriter(output, split, vocab["dtype"]) for split in SPLITS}
    progress = tqdm(total=len(span), desc=f"tokenize {shard.name}", unit="doc", file=sys.stderr, mininterval=1.0)
    position = span.start
    unknown = 0  # tokens that are the unknown token: text the tokenizer could not encode
    for tokens, lengths in encode_stream(
        texts, vocab["tokenizer_json"], vocab["eos_id"], vocab["dtype"], num_workers=num_workers,
        batch_size=batch_size, tokenizer=vocab["tokenizer"],
    ):
        if vocab["unk_id"] is not None:
            unknown += int(np.count_nonzero(tokens == vocab["unk_id"]))
        start = 0
        for length in lengths:
            writers[labels[position]].add(tokens[start : start + length])
            if position - span.start in sampled:  # kept before it was encoded: its ids, eos left out
                sample_ids.append(tokens[start : start + length - 1].tolist())
            start += length
            position += 1
        progress.update(len(lengths))
    progress.close()
    if position != span.stop:
        raise StepError(f"deps.corpus: {corpus} lists {n_docs} training documents but holds {position}")
    splits = {split: writer.close(prefix=shard.folder) for split, writer in writers.items()}
    check = None
    if shard.index == 0:
        check = _round_trip_first_documents(vocab["tokenizer"], corpus, span.stop, n_docs, sample, sample_ids)
    return {
        "documents": len(span), "splits": splits, "num_workers": num_workers,
        "round_trip": None if check is None else check.result(),  # the first shard's
        "unknown_tokens": unknown,
        "vocab": {k: v for k, v in vocab.items() if k not in ("tokenizer_json", "tokenizer")},  # the gather need not parse it again
        "seconds": round(time.perf_counter() - started, 3),
    }  # fmt: skip


def gather_tokens(ctx: StepContext, shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Join the shards' results, in order, into `index.json` (written last): each split
    is the concatenation of its shards' token files. Returns the step's result."""
    check_tokenize(ctx.config, ctx.deps)
    fraction = float(ctx.config.get("validation_fraction", DEFAULT_VALIDATION_FRACTION))
    tokenizer_location = storage.join(ctx.deps["tokenizer"], TOKENIZER_FILE)
    corpus = ctx.deps["corpus"]
    vocab = shards[0]["vocab"]
    if any(s["vocab"][k] != vocab[k] for s in shards for k in vocab.keys() & s["vocab"].keys()):  # (a newer key
        # such as unk_id is missing from a shard an older version finished)
        raise StepError(
            f"deps.tokenizer: the shards were encoded with different tokenizers; delete {ctx.output}/shards and run again"
        )
    index_location = storage.join(ctx.output, INDEX)
    dolma.remove(index_location)
    splits = {
        split: {
            "tokens": sum(s["splits"][split]["tokens"] for s in shards),
            "documents": sum(s["splits"][split]["documents"] for s in shards),
            "shards": [f for s in shards for f in s["splits"][split]["shards"]],
        }
        for split in SPLITS
    }
    n_docs = sum(s["documents"] for s in shards)
    if splits["train"]["tokens"] == 0:
        raise StepError(f"deps.corpus: no training documents in {corpus}")
    checked = shards[0].get("round_trip") or {}  # absent from shards an older version recorded
    check = RoundTrip.from_result(checked) if checked else None
    counts = [s.get("unknown_tokens") for s in shards]  # None: a shard an older version finished
    unknown = None if None in counts else sum(counts)
    if unknown and check is not None and check.lossless:  # past the sample: the whole corpus counted
        check = RoundTrip(check.documents, check.characters,
                          f"{unknown} of the {sum(sp['tokens'] for sp in splits.values())} tokens are the unknown token")
    if check is not None and not check.lossless:
        subject = f"the tokenizer at {printable(ctx.deps['tokenizer'])}"
        print(f"{ctx.key}: {lossy_message(subject, check.example)}", file=sys.stderr)
    index = {
        "format": INDEX_FORMAT,
        "vocab_size": vocab["vocab_size"],
        "dtype": vocab["dtype"],
        "tokenizer": relative_location(ctx.output, tokenizer_location),
        "tokenizer_digest": vocab["digest"],
        "bos_id": vocab["bos_id"],
        "eos_id": vocab["eos_id"],
        "pad_id": vocab["pad_id"],
        "corpus": relative_location(ctx.output, corpus),
        "validation_fraction": fraction,
        "splits": splits,
    }
    storage.write_json_atomic(index_location, index)
    seconds = sum(s["seconds"] for s in shards)
    total = sum(s["tokens"] for s in splits.values())
    validation_share = splits["validation"]["tokens"] / total if total else 0.0
    if fraction > 0 and not fraction / 2 <= validation_share <= fraction * 2:
        print(
            f"{ctx.key}: validation holds {validation_share:.1%} of the tokens "
            f"({splits['validation']['documents']} of {n_docs} documents), asked {fraction:.1%}: the split "
            "takes whole documents; more, shorter documents give a closer split",
            file=sys.stderr,
        )
    return {
        "tokens": total,
        "documents": n_docs,
        "train_tokens": splits["train"]["tokens"],
        "train_documents": splits["train"]["documents"],
        "validation_tokens": splits["validation"]["tokens"],
        "validation_documents": splits["validation"]["documents"],
        "validation_token_share": round(validation_share, 4),
        "vocab_size": vocab["vocab_size"],
        "dtype": vocab["dtype"],
        **{f"{role}_id": vocab[f"{role}_id"] for role in ("bos", "eos", "pad")},  # index.json's, for its readers
        "num_workers": shards[0]["num_workers"],
        "shards": len(shards),
        "seconds": round(seconds, 3),  # encoding time summed over the shards
        "tokens_per_second": round(total / seconds) if seconds > 0 else None,
        **(check.result() if check is not None else {}),
        "unknown_tokens": unknown,
        # index.json and every token file by content, for `marin verify` (the token files' as written)
        FILE_DIGESTS: {**named_digests(ctx.output, [INDEX]), **{s["path"]: s["digest"] for split in splits.values()
                                                                 for s in split["shards"] if "digest" in s}},
    }


def _round_trip_first_documents(
    tokenizer: Tokenizer, corpus: str, stop: int, n_docs: int, sample: list[str], sample_ids: list[list[int]]
) -> RoundTrip:
    """`round_trip` of the corpus's first documents (`_sampled`), the same for any shard
    count: those of the first shard with the ids it wrote, and when its range ended
    before LOSSLESS_SAMPLE_CHARS, the next ones (from `stop`) read and encoded here
    (`tokenizer`: the step's `bulk_encoder`)."""
    size = sum(map(len, sample))
    if size < LOSSLESS_SAMPLE_CHARS and stop < n_docs:
        more: list[str] = []
        read = 0  # characters read, books left out included: a corpus of books ends the search soon
        for doc in dolma.read_range(corpus, "train", stop, n_docs):
            if size >= LOSSLESS_SAMPLE_CHARS or read >= 16 * LOSSLESS_SAMPLE_CHARS:
                break
            read += len(doc["text"])
            if not _book_sized(doc["text"]):  # as `_sampled`
                more.append(doc["text"])
                size += len(doc["text"])
        sample.extend(more)
        sample_ids.extend(e.ids for e in tokenizer.encode_batch_fast(more, add_special_tokens=False))
    return round_trip(tokenizer, sample, sample_ids, "training document")


HUGE_DOCUMENT_CHARS = 2**23  # a document this long gets a warning: encoding one holds ~140 bytes per character
ENCODING_BYTES_PER_CHAR = 140  # measured: tokenizers' encode_batch_fast of one 2M-8M character document, this CPU


def _warn_of_huge_documents(texts: Iterator[str], key: str, first: int) -> Iterator[str]:
    """`texts` (the corpus's training documents from number `first`), with one stderr line
    at the first of HUGE_DOCUMENT_CHARS or more: HF tokenizers encodes a document whole,
    holding about ENCODING_BYTES_PER_CHAR bytes per character of it at once (a 39 MB
    document took 5.4 GB), so a corpus of book-sized or larger documents needs that much
    memory per worker, however it is sharded."""
    warned = False
    for number, text in enumerate(texts, first + 1):
        if not warned and len(text) >= HUGE_DOCUMENT_CHARS:
            warned = True
            print(f"{key}: warning: training document {number} holds {len(text):,} characters; the tokenizer "
                  f"encodes a document whole, holding about {ENCODING_BYTES_PER_CHAR} bytes per character "
                  f"({len(text) * ENCODING_BYTES_PER_CHAR / 2**30:.1f} GiB for this one): split such documents "
                  "in the corpus if memory is short", file=sys.stderr, flush=True)  # fmt: skip
        yield text


def _book_sized(text: str) -> bool:
    """Is a document left out of the round-trip sample (over 4 x LOSSLESS_SAMPLE_CHARS), to
    bound the memory its ids take there?"""
    return len(text) > 4 * LOSSLESS_SAMPLE_CHARS


def _sampled(texts: Iterator[str], sample: list[str], sampled: set[int]) -> Iterator[str]:
    """`texts`, each kept in `sample` (before it is encoded), its place among them in
    `sampled`, until the kept ones hold LOSSLESS_SAMPLE_CHARS characters: whole
    documents, so their ids are whole too; one over 4 x that (a book-sized document) is
    left out, to bound the memory."""
    size = 0
    for place, text in enumerate(texts):
        if size < LOSSLESS_SAMPLE_CHARS and not _book_sized(text):
            sample.append(text)
            sampled.add(place)
            size += len(text)
        yield text


def tokenizer_digest(tokenizer_json: str) -> str:
    """The digest of a tokenizer.json's text that index.json records (`tokenizer_digest`)."""
    return xxhash.xxh3_64_hexdigest(tokenizer_json.encode("utf-8"))


def describe_tokenizer(location: str, dtype: str | None) -> dict[str, Any]:
    """Load a `train_tokenizer` artifact and check its ids fit the token dtype."""
    path = storage.join(location, TOKENIZER_FILE)
    if not storage.exists(path):
        raise StepError(f"deps.tokenizer: {path} is missing: is {location} a finished `train_tokenizer` artifact?")
    special = load_special_tokens(location)
    try:
        tokenizer_json = storage.read_text(path)
        tokenizer = bulk_encoder(tokenizer_json)  # parsed once: the vocabulary checks, encoding, round trip
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise unreadable_file("deps.tokenizer", path, location, e) from None
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(ids) + 1)
    dtype = dtype or token_dtype(vocab_size)
    capacity = int(np.iinfo(dtype).max) + 1
    if vocab_size > capacity:
        raise StepError(
            f"config.dtype: {dtype} holds ids below {capacity}, but the tokenizer at {location} has "
            f"{vocab_size} ids: use {token_dtype(vocab_size)} (or leave dtype out)"
        )
    for role, entry in special.items():
        if tokenizer.token_to_id(entry["token"]) != entry["id"]:
            raise StepError(
                f"deps.tokenizer: special_tokens.json says {role} is {entry['token']!r} = {entry['id']}, "
                f"but tokenizer.json gives {tokenizer.token_to_id(entry['token'])}"
            )
    return {
        "tokenizer_json": tokenizer_json,
        "tokenizer": tokenizer,
        "unk_id": unknown_token_id(tokenizer, tokenizer_json, {special[role]["id"] for role in ("bos", "eos", "pad")}),
        "vocab_size": vocab_size,
        "dtype": dtype,
        "digest": tokenizer_digest(tokenizer_json),
        **{f"{role}_id": special[role]["id"] for role in ("bos", "eos", "pad")},
    }


def unknown_token_id(tokenizer: Tokenizer, tokenizer_json: str, special_ids: set[int]) -> int | None:
    """The id of the model's unknown token (`unk_token`: WordPiece's [UNK], a BPE's;
    `unk_id`: a Unigram's), which stands for text it cannot encode; None for a model
    without one (byte-level BPE), or whose unknown token is one of `special_ids` (the
    eos this step appends would count as unknown)."""
    model = json.loads(tokenizer_json).get("model") or {}
    token = model.get("unk_token")
    found = tokenizer.token_to_id(token) if isinstance(token, str) else model.get("unk_id")
    return found if isinstance(found, int) and not isinstance(found, bool) and found not in special_ids else None


def split_labels(n_docs: int, fraction: float) -> list[str]:
    """Which split each document goes to: round(fraction * n) documents (at least one
    when fraction > 0), evenly spaced through the corpus, go to validation."""
    if fraction <= 0:
        return ["train"] * n_docs
    if n_docs < 2:
        raise StepError(
            f"config.validation_fraction: {n_docs} document(s) cannot be split into train and validation; "
            "use a larger corpus (training needs a validation split; validation_fraction: 0 suits "
            "data no train step reads)"
        )
    n_val = min(max(1, round(fraction * n_docs)), n_docs - 1)
    # document i is validation when the running count floor((i+1) * n_val / n) steps up
    return ["validation" if (i + 1) * n_val // n_docs > i * n_val // n_docs else "train" for i in range(n_docs)]


# ---- shards ---------------------------------------------------------------------


class ShardWriter:
    """Appends documents' tokens to one split, cutting `.npy` shards of SHARD_TOKENS."""

    def __init__(self, location: str, split: str, dtype: str):
        self.location, self.split, self.dtype = location, split, dtype
        self.shards: list[dict[str, Any]] = []
        self.pending: list[np.ndarray] = []
        self.pending_tokens = self.pending_docs = 0
        self.tokens = self.documents = 0

    def add(self, tokens: np.ndarray) -> None:
        self.pending.append(tokens)
        self.pending_tokens += len(tokens)
        self.pending_docs += 1
        self.tokens += len(tokens)
        self.documents += 1
        if self.pending_tokens >= SHARD_TOKENS:
            self._flush()

    def close(self, prefix: str = "") -> dict[str, Any]:
        """The split's counts and files (paths under `prefix`, relative to the artifact)."""
        if self.pending:
            self._flush()
        shards = [{**s, "path": f"{prefix}/{s['path']}" if prefix else s["path"]} for s in self.shards]
        return {"tokens": self.tokens, "documents": self.documents, "shards": shards}

    def _flush(self) -> None:
        path = f"{self.split}/tokens-{len(self.shards):05d}.npy"
        array = np.concatenate(self.pending).astype(self.dtype, copy=False)
        with storage.open_file(storage.join(self.location, path), "wb") as f:
            written = DigestingWriter(f)
            np.save(written, array, allow_pickle=False)
        self.shards.append({"path": path, "tokens": int(len(array)), "documents": self.pending_docs,
                            "digest": written.digest})  # fmt: skip
        self.pending, self.pending_tokens, self.pending_docs = [], 0, 0
