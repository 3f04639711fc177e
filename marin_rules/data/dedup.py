"""The `dedup` step: a corpus without its near-duplicate documents, in the `download` layout.

Model: every document of `deps.corpus` (a `download` or `dedup` artifact: its
training split, then its held-out split, each in manifest order) is shingled, signed
with MinHash and clustered by LSH + connected components (`dedup_lsh`; bands and
rows derived from `config.threshold` by `dedup_config.lsh_bands`). One document per
cluster is kept, chosen by a stable key, not by position: the smallest document
`id` (download's xxh3-128 of the text; ties broken by the text's own hash). The
held-out split is what evaluation reads and is never thinned: a cluster that holds
held-out documents keeps all of them and drops its training documents (a training
copy of a held-out text would leak it). Which documents are kept therefore does not
depend on shard order; the kept documents are written unchanged, in input order,
as Dolma shards `train/` and `heldout/` with a `manifest.json` (written last) that
has every field `download` writes, so `train_tokenizer`, `tokenize` and `evaluate`
read it like a download. A corpus adopted from elsewhere needs only `train_documents`
in its manifest (the adoption check's layout): a missing `heldout_documents` is
counted from the held-out shards it lists, and a missing held-out split is an empty one.

The signing (most of the work) is cut into `runtime.shards` (default 1) contiguous
ranges of that document sequence (`marin_rules.artifacts.shards`): in a workflow run
each is its own Snakemake job (`dedup_shard`) writing its signatures to
`shards/{k}-of-{n}/signatures.pkl`, and the `dedup` job gathers them in order,
clusters and writes the output; the result does not depend on the shard count.

The result (the record's `result`): documents in and out, duplicates removed (and
how many of them were training copies of held-out documents), the number of
clusters, a histogram of cluster sizes, and the LSH parameters used.
"""

from __future__ import annotations

import collections
import io
import itertools
import json
import pickle
import sys
from dataclasses import dataclass
import time
from importlib.metadata import version
from typing import Any, Iterator

import xxhash
from tqdm import tqdm

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import FILE_DIGESTS, named_digests
from marin_rules.artifacts.shards import Shard, all_shards, shard_count
from marin_rules.data import dolma
from marin_rules.data.dedup_config import candidate_probability, check_dedup, lsh_bands, settings
from marin_rules.data.dedup_lsh import Clusterer, cluster, signatures
from rensa import RMinHash


def dedup(ctx: StepContext) -> dict[str, Any]:
    """The whole step in this process: every shard's signatures, then the gather."""
    return gather_dedup(ctx, [sign_shard(ctx, s) for s in all_shards(shard_count(ctx.runtime))])


def sign_shard(ctx: StepContext, shard: Shard) -> dict[str, Any]:
    """Sign this shard's range of the corpus's documents (training split, then held-out)."""
    check_dedup(ctx.config, ctx.deps)
    cfg = settings(ctx.config)
    corpus = ctx.deps["corpus"]
    started = time.perf_counter()
    n_train, n_heldout = document_counts(corpus, dolma.read_manifest(corpus))
    span = shard.document_range(n_train + n_heldout)
    texts = itertools.chain(
        _read_range(corpus, "train", span.start, min(span.stop, n_train)),
        _read_range(corpus, "heldout", max(0, span.start - n_train), max(0, span.stop - n_train)),
    )
    bands, rows = lsh_bands(cfg.threshold, cfg.num_perm)
    num_workers = int(ctx.runtime.get("num_workers") or cfg.num_workers or 1)
    keys: list[tuple[str, str]] = []
    sizes: list[int] = []

    def remember(docs: Iterator[dict[str, Any]]) -> Iterator[str]:
        for doc in docs:  # what the gather needs of each document, so it never parses them again
            keys.append(stable_key(doc))
            sizes.append(len(doc["text"].encode("utf-8")))
            yield doc["text"]

    sigs = signatures(
        remember(texts), ngram=cfg.ngram, unit=cfg.ngram_unit, num_perm=bands * rows, seed=cfg.seed,
        num_workers=num_workers,
    )  # fmt: skip
    progress = tqdm(sigs, total=len(span), desc=f"dedup {shard.name}", unit="doc", file=sys.stderr, mininterval=1.0)
    signed = list(progress)
    if len(signed) != len(span):
        raise StepError(f"deps.corpus: {corpus} lists {n_train + n_heldout} documents but holds fewer")
    path = storage.join(shard.location(ctx.output), SIGNATURES)
    storage.write_bytes_atomic(path, dump_signatures(Signed(signed, keys, sizes)))
    return {"documents": len(signed), "signatures": f"{shard.folder}/{SIGNATURES}", "num_workers": num_workers,
            "seconds": round(time.perf_counter() - started, 3)}  # fmt: skip


def gather_dedup(ctx: StepContext, signed: list[dict[str, Any]]) -> dict[str, Any]:
    """Cluster every shard's signatures, in order; keep one document per cluster; write."""
    check_dedup(ctx.config, ctx.deps)
    cfg = settings(ctx.config)
    corpus = ctx.deps["corpus"]
    started = time.perf_counter()
    upstream = dolma.read_manifest(corpus)
    manifest_location = storage.join(ctx.output, dolma.MANIFEST)
    dolma.remove(manifest_location)  # a retry: no old manifest may describe new shards
    for split in dolma.SPLITS:
        for stale in dolma.split_shards(ctx.output, split):
            dolma.remove(stale)

    n_train, n_heldout = document_counts(corpus, upstream)
    total = n_train + n_heldout
    if not n_train:
        raise StepError(f"deps.corpus: the training split of {corpus} is empty")
    bands, rows = lsh_bands(cfg.threshold, cfg.num_perm)
    parts = [load_signatures(storage.read_bytes(storage.join(ctx.output, s["signatures"]))) for s in signed]
    keys = [key for part in parts for key in part.keys]
    text_bytes = [size for part in parts for size in part.text_bytes]
    if len(keys) != total or len(text_bytes) != total:
        raise StepError(f"runtime.shards: the shards signed {len(keys)} documents, {corpus} holds {total}; "
                        f"delete {ctx.output}/shards and run again")  # fmt: skip
    sigs = itertools.chain.from_iterable(part.signatures for part in parts)
    progress = tqdm(sigs, total=total, desc="dedup clusters", unit="doc", file=sys.stderr, mininterval=1.0)
    clusterer = Clusterer(cfg.threshold, bands * rows, bands)
    clusters = cluster(progress, clusterer)
    keep, leaked = choose_kept(clusters, keys, n_train)

    # the kept documents' lines, copied unchanged; gzip level 1: writing at download's
    # level 5 would cost as much as the MinHash work
    first = {"train": 0, "heldout": n_train}
    listed = {"train": n_train, "heldout": n_heldout}  # (a split the manifest lists no shards of has none)
    kept_lines = {  # every split the manifest lists is read: a count of 0 with lines is a surplus too
        split: [line for i, line in _counted(corpus, split, first[split], listed[split]) if i in keep]
        if split in upstream["shards"] else [] for split in dolma.SPLITS
    }
    digests: dict[str, str] = {}  # each shard's, from its bytes as written: `marin verify` checks them
    shards = {split: dolma.write_lines(ctx.output, split, kept_lines[split], compresslevel=1, digests=digests)
              for split in dolma.SPLITS}  # fmt: skip
    kept_bytes = {
        split: sum(text_bytes[i] for i in keep if (i >= n_train) == (split == "heldout")) for split in dolma.SPLITS
    }
    heldout_titles = [json.loads(line).get("metadata", {}).get("title") for line in kept_lines["heldout"]]

    sizes = collections.Counter(len(c) for c in clusters)
    lsh = {
        "library": f"rensa {version('rensa')}",
        "threshold": cfg.threshold,
        "num_perm": cfg.num_perm,
        "permutations_used": bands * rows,
        "bands": bands,
        "rows": rows,
        "candidate_probability_at_threshold": round(candidate_probability(cfg.threshold, bands, rows), 4),
        "ngram": cfg.ngram,
        "ngram_unit": cfg.ngram_unit,
        "seed": cfg.seed,
        "candidate_pairs": clusterer.candidate_pairs,
        "edges": clusterer.edges,
    }
    result = {
        "documents_in": total,
        "documents_out": len(keep),
        "duplicates_removed": total - len(keep),
        "train_copies_of_heldout_removed": leaked,
        "clusters": len(clusters),
        "duplicate_clusters": sum(n for size, n in sizes.items() if size > 1),
        "cluster_sizes": {str(size): sizes[size] for size in sorted(sizes)},
        "lsh": lsh,
        "num_workers": signed[0]["num_workers"],
        "shards": len(signed),
        "seconds": round(time.perf_counter() - started + sum(s["seconds"] for s in signed), 3),
    }
    counts = {split: len(lines) for split, lines in kept_lines.items()}
    manifest = output_manifest(upstream, corpus, counts, kept_bytes, heldout_titles, shards, result)
    storage.write_json_atomic(manifest_location, manifest)
    return {**result, FILE_DIGESTS: {**digests, **named_digests(ctx.output, [dolma.MANIFEST])}}


def document_counts(corpus: str, manifest: dict[str, Any]) -> tuple[int, int]:
    """The training and held-out document counts of `corpus`, whose manifest is `manifest`
    (`dolma.split_documents`: one adopted from elsewhere may lack `heldout_documents`, or a
    held-out split)."""
    return dolma.split_documents(corpus, manifest, "train"), dolma.split_documents(corpus, manifest, "heldout")


def _counted(corpus: str, split: str, first: int, count: int) -> Iterator[tuple[int, bytes]]:
    """(document index, JSON line) of the split, numbered from `first`; a line past the
    `count` the manifest gives is `dolma.surplus_error` (it would take another split's index)."""
    for i, line in enumerate(dolma.read_lines(corpus, split)):
        if i >= count:
            raise dolma.surplus_error(corpus, split, count, f"{corpus}/{split}")
        yield first + i, line


def _read_range(corpus: str, split: str, start: int, stop: int) -> Iterator[dict[str, Any]]:
    """`dolma.read_range`, reading nothing for an empty range (of a split the manifest may not list)."""
    return dolma.read_range(corpus, split, start, stop) if stop > start else iter(())


SIGNATURES = "signatures.pkl"


@dataclass(frozen=True)
class Signed:
    """A shard's signing: per document, in order, its signature, its stable key and the
    UTF-8 size of its text (what the gather needs, so it never parses documents again)."""

    signatures: list[RMinHash]
    keys: list[tuple[str, str]]
    text_bytes: list[int]


def dump_signatures(signed: Signed) -> bytes:
    return pickle.dumps((signed.signatures, signed.keys, signed.text_bytes), protocol=pickle.HIGHEST_PROTOCOL)


class _SignatureUnpickler(pickle.Unpickler):
    """Unpickles rensa signatures and plain data, nothing else: a planted or corrupt file
    cannot run code (the restricted `find_class` of Python's pickle documentation)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("rensa", "RMinHash"):
            return RMinHash
        raise pickle.UnpicklingError(f"{module}.{name} is not a MinHash signature")


def load_signatures(data: bytes) -> Signed:
    fix = "delete the artifact's shards/ and run again"
    try:
        sigs, keys, sizes = _SignatureUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - any damage is the same problem
        raise StepError(f"runtime.shards: a signature file is damaged ({e}); {fix}") from None
    if not (isinstance(sigs, list) and all(isinstance(s, RMinHash) for s in sigs) and len(keys) == len(sigs) == len(sizes)):
        raise StepError(f"runtime.shards: a signature file holds something else than signatures; {fix}")
    return Signed(sigs, [tuple(k) for k in keys], list(sizes))


def stable_key(doc: dict[str, Any]) -> tuple[str, str]:
    """How a document is chosen within its cluster: by id, then by its text's hash."""
    return (str(doc.get("id", "")), xxhash.xxh3_128_hexdigest(doc["text"].encode("utf-8")))


def choose_kept(clusters: list[list[int]], keys: list[tuple[str, str]], n_train: int) -> tuple[set[int], int]:
    """Indices kept (documents 0..n_train-1 are training, the rest held-out): per
    cluster its held-out documents if it has any, else the document with the smallest
    stable key. Also the count of training documents dropped because their cluster
    holds a held-out document."""
    keep: set[int] = set()
    leaked = 0
    for cluster in clusters:
        heldout = [i for i in cluster if i >= n_train]
        if heldout:
            keep.update(heldout)
            leaked += len(cluster) - len(heldout)
        else:
            keep.add(min(cluster, key=keys.__getitem__))
    return keep, leaked


def output_manifest(
    upstream: dict[str, Any], corpus: str, counts: dict[str, int], text_bytes: dict[str, int], heldout_titles: list,
    shards: dict[str, list[str]], result: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """`download`'s manifest fields, recomputed for the kept documents, plus `dedup`."""
    return {
        "format": "dolma",
        "source": upstream.get("source"),
        "granularity": upstream.get("granularity"),
        "shards": shards,
        "heldout_keys": upstream.get("heldout_keys", []),
        "documents": counts["train"] + counts["heldout"],
        "train_documents": counts["train"],
        "heldout_documents": counts["heldout"],
        "bytes": text_bytes["train"] + text_bytes["heldout"],
        "train_bytes": text_bytes["train"],
        "heldout_bytes": text_bytes["heldout"],
        "duplicates_dropped": upstream.get("duplicates_dropped", 0),
        "empty_dropped": upstream.get("empty_dropped", 0),
        "heldout": heldout_titles,
        "dedup": {"corpus": corpus, **{k: v for k, v in result.items() if k not in ("seconds", "num_workers", "shards")}},
    }
