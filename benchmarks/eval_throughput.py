"""Loglikelihood requests per second of the `marin` lm-eval model: batched against one
request at a time, side by side.

Model: two workloads of N loglikelihood requests built from a held-out play by the
cloze task's own code (four lines as context, a line as continuation):
- `choices` (the headline): the requests lm-eval issues for the cloze task, every
  choice of each question, so each context comes with four continuations. This is
  the shape of every multiple-choice task (hellaswag, arc, mmlu, ...).
- `distinct`: only the true line of each question, every context different.
Each is scored by `MarinLM.loglikelihood` once with the default batching (sorted,
padded to bucketed lengths, `--batch-size` rows per jitted call, each distinct
context run once per call) and once with batch size 1 (one request per call, the
same code otherwise). Both are warmed up first (every shape compiled), then timed
over `--repeats` runs, alternating, and the best is kept. The model has the default
experiment's architecture (untrained unless `--checkpoint` names a train artifact:
throughput does not depend on the weights); the tokenizer is trained on the spot by
the data package's own steps. Target: ratio (batched / one at a time) >= 5.

    .venv/bin/python benchmarks/eval_throughput.py [--requests 512] [--batch-size 32]
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
    from marin_rules.eval.model_scorer import ModelScorer
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
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--checkpoint", default=None, help="a train artifact (default: untrained default model)")
    args = parser.parse_args()

    from marin_rules.eval.lm import MarinLM

    with tempfile.TemporaryDirectory() as work:
        lm, docs, what = build(args.checkpoint, work)
    workloads = {
        "choices": [(d["context"], choice) for d in docs for choice in d["choices"]][: args.requests],
        "distinct": [(d["context"], d["choices"][d["label"]]) for d in docs][: args.requests],
    }
    batched = MarinLM(lm.scorer, lm.tokenizer, lm.special, batch_size=args.batch_size)
    single = MarinLM(lm.scorer, lm.tokenizer, lm.special, batch_size=1)
    print(f"{what}; batch size {args.batch_size}", file=sys.stderr)
    figures = {name: measure(pairs, batched, single, args.repeats, name) for name, pairs in workloads.items()}
    for name, (batched_rps, single_rps, _) in figures.items():
        print(f"{name:8s}: batched {batched_rps:7.1f} requests/s, one at a time {single_rps:7.1f} requests/s, "
              f"ratio {batched_rps / single_rps:.2f}")  # fmt: skip
    (b_rps, s_rps, first_run), (db_rps, ds_rps, _) = figures["choices"], figures["distinct"]
    print(
        json.dumps(
            {
                "benchmark": "eval_throughput",
                "ratio": round(b_rps / s_rps, 2),
                "workload": "cloze choices: 4 continuations per context, as lm-eval issues a multiple-choice task",
                "baseline": "MarinLM.loglikelihood with batch_size=1 (one request per jitted call)",
                "batched_requests_per_s": round(b_rps, 1),
                "single_requests_per_s": round(s_rps, 1),
                "batched_first_run_s": round(first_run, 2),  # compiling every shape included
                "distinct_contexts_ratio": round(db_rps / ds_rps, 2),
                "distinct_batched_requests_per_s": round(db_rps, 1),
                "distinct_single_requests_per_s": round(ds_rps, 1),
                "requests": len(workloads["choices"]),
                "batch_size": args.batch_size,
                "max_length": lm.max_length,
                "model": what,
                "target": ">= 5",
            }
        )
    )


def measure(pairs, batched, single, repeats: int, name: str) -> tuple[float, float, float]:
    """Best requests/s of each model over `repeats` alternating timed runs, after a
    warm-up; and the batched warm-up's seconds (compiling included)."""
    from lm_eval.api.instance import Instance

    requests = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]

    def timed(model) -> tuple[float, list]:
        start = time.perf_counter()
        out = model.loglikelihood(requests, disable_tqdm=True)
        return time.perf_counter() - start, out

    print(f"{name}: warming up (compiling every shape) on {len(requests)} requests", file=sys.stderr)
    first_run, ref = timed(batched)
    timed(single)
    best = {"batched": float("inf"), "single": float("inf")}
    for r in range(repeats):
        for label, model in (("batched", batched), ("single", single)):
            seconds, out = timed(model)
            best[label] = min(best[label], seconds)
            worst_gap = max(abs(a[0] - b[0]) for a, b in zip(out, ref))
            assert worst_gap < 1e-3, f"{label} disagrees with the batched scores by {worst_gap}"
            print(f"{name} repeat {r}: {label:8s} {len(requests) / seconds:8.1f} requests/s", file=sys.stderr)
    return len(requests) / best["batched"], len(requests) / best["single"], first_run


if __name__ == "__main__":
    main()
