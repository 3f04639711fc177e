"""Loglikelihood requests per second of the `marin` lm-eval model: batched against one
request at a time, side by side.

Model: N cloze-style requests (four lines of a held-out play as context, the next
line as continuation) are scored by `MarinLM.loglikelihood`, once with the default
batching (sorted by length, padded to bucketed lengths, `--batch-size` rows per
jitted forward) and once with batch size 1 (one forward pass per request, the same
code otherwise). Both are warmed up first (every shape compiled), then each is timed
over `--repeats` runs, alternating, and the best is kept. The model has the default
experiment's architecture (untrained unless `--checkpoint` names a train artifact:
throughput does not depend on the weights); the tokenizer is trained on the spot by
the data package's own steps. Target: ratio (batched / one at a time) >= 5.

    .venv/bin/python benchmarks/eval_throughput.py [--requests 256] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def build(checkpoint: str | None, work: str):
    from flax import nnx

    from marin_rules.artifacts.context import StepContext
    from marin_rules.data.download import download
    from marin_rules.data.tokenizer import train_tokenizer
    from marin_rules.eval.lm import MarinLM, load_tokenizer
    from marin_rules.eval.scoring import ModelScorer
    from marin_rules.eval.tasks import cloze_docs, read_heldout
    from marin_rules.eval.config import ClozeOptions
    from marin_rules.model.config import ModelConfig
    from marin_rules.model.transformer import MoETransformer

    raw, tok = os.path.join(work, "raw"), os.path.join(work, "tok")
    download(StepContext("raw/b", "v1", {"sample_count": 8, "heldout": ["hamlet"]}, {}, output=raw))
    docs = cloze_docs(read_heldout(raw), ClozeOptions(), seed=0)
    if checkpoint:
        from marin_rules.train.load import load_trained

        lm = MarinLM.from_trained(load_trained(checkpoint))
        return lm, docs, "checkpoint " + checkpoint
    train_tokenizer(StepContext("tok/b", "v1", {"vocab_size": 4096}, {"corpus": raw}, output=tok))
    tokenizer, special = load_tokenizer(os.path.join(tok, "tokenizer.json"))
    config = ModelConfig.from_dict(
        {"d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 512, "n_experts": 4,
         "top_k": 2, "d_expert": 256, "max_seq_len": 128, "moe_impl": "ragged"},
        vocab_size=tokenizer.get_vocab_size(),
    )  # fmt: skip
    model = MoETransformer(config, rngs=nnx.Rngs(params=0))
    return MarinLM(ModelScorer(model, config.max_seq_len), tokenizer, special), docs, "default experiment's model (untrained)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoint", default=None, help="a train artifact (default: untrained default model)")
    args = parser.parse_args()

    from lm_eval.api.instance import Instance

    from marin_rules.eval.lm import MarinLM

    with tempfile.TemporaryDirectory() as work:
        lm, docs, what = build(args.checkpoint, work)
    pairs = [(d["context"], d["choices"][d["label"]]) for d in docs[: args.requests]]
    requests = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    batched = MarinLM(lm.scorer, lm.tokenizer, lm.special, batch_size=args.batch_size)
    single = MarinLM(lm.scorer, lm.tokenizer, lm.special, batch_size=1)

    def timed(model: MarinLM) -> tuple[float, list]:
        start = time.perf_counter()
        out = model.loglikelihood(requests, disable_tqdm=True)
        return time.perf_counter() - start, out

    print(f"warming up (compiling every shape) on {len(requests)} requests, {what}", file=sys.stderr)
    _, ref = timed(batched)
    timed(single)
    best = {"batched": float("inf"), "single": float("inf")}
    for r in range(args.repeats):
        for name, model in (("batched", batched), ("single", single)):
            seconds, out = timed(model)
            best[name] = min(best[name], seconds)
            worst_gap = max(abs(a[0] - b[0]) for a, b in zip(out, ref))
            assert worst_gap < 1e-3, f"{name} disagrees with the batched scores by {worst_gap}"
            print(f"repeat {r}: {name:8s} {len(requests) / seconds:8.1f} requests/s", file=sys.stderr)
    batched_rps = len(requests) / best["batched"]
    single_rps = len(requests) / best["single"]
    print(f"batched ({args.batch_size} rows/forward): {batched_rps:.1f} requests/s")
    print(f"one request at a time:          {single_rps:.1f} requests/s")
    print(
        json.dumps(
            {
                "benchmark": "eval_throughput",
                "ratio": round(batched_rps / single_rps, 2),
                "baseline": "MarinLM.loglikelihood with batch_size=1 (one forward pass per request)",
                "batched_requests_per_s": round(batched_rps, 1),
                "single_requests_per_s": round(single_rps, 1),
                "requests": len(requests),
                "batch_size": args.batch_size,
                "max_length": lm.max_length,
                "model": what,
                "target": ">= 5",
            }
        )
    )


if __name__ == "__main__":
    main()
