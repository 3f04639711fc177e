"""Loglikelihood requests per second of the `marin` lm-eval model against a plain
scorer and against itself at batch 1, side by side; and the scoring pass's MFU.

Model: two workloads of N loglikelihood requests built from a held-out play by the
cloze task's own code (four lines as context, a line as continuation):
- `choices` (the headline): the requests lm-eval issues for the cloze task, every
  choice of each question, so each context comes with four continuations. This is
  the shape of every multiple-choice task (hellaswag, arc, mmlu, ...).
- `distinct`: only the true line of each question, every context different.
Each is scored three ways, all on the same model (dropless dispatch) and tokens:
- `batched`: `MarinLM.loglikelihood` as evaluation runs it (`--batch-size` requests
  per jitted call, packed into rows of `max_length` tokens: each distinct context
  once followed by its continuations, short sequences sharing a row, bucketed
  shapes, one forward pass, the head only at scored positions: eval/packing.py);
- `batch-1`: the same code with batch size 1 (one request per call);
- `plain` (the baseline): what a straightforward lm-eval model does: per request,
  lm-eval's own `_encode_pair` tokenization, then one jitted forward pass of the
  model at a fixed padded length (`max_length`, no cache, no shared context, the
  head at every position), log-softmax, and the sum over the continuation.
All three are warmed up first (every shape compiled), then timed over `--repeats`
runs, alternating, and the best of each is kept; every run's scores are checked
against the plain ones. MFU: useful forward FLOPs (each distinct context once, each
continuation token once, attention over the real history, the head only at scored
positions, no padding) per second of the batched run, over the FLOP/s of a matmul in
the model's compute dtype measured in the same run (before and after the timed runs;
the higher is kept).
The model has the default experiment's architecture (untrained unless
`--checkpoint` names a train artifact: throughput does not depend on the weights);
the tokenizer is trained on the spot by the data package's own steps.
Target: ratio (batched / plain, `choices`) >= 10.

    .venv/bin/python benchmarks/eval_throughput.py [--requests 256] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

from marin_rules.eval.config import DEFAULT_BATCH_SIZE

DEFAULT_EXPERIMENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments", "default.yaml")
DEFAULT_MODEL = "checkpoints/nano-moe@v1"


def build(checkpoint: str | None, work: str):
    import yaml
    from flax import nnx

    from marin_rules.artifacts.context import StepContext
    from marin_rules.data.download import download
    from marin_rules.data.tokenizer import train_tokenizer
    from marin_rules.eval.config import ClozeOptions
    from marin_rules.eval.lm import MarinLM, load_tokenizer
    from marin_rules.eval.model_scorer import ModelScorer
    from marin_rules.eval.tasks import cloze_docs, read_heldout
    from marin_rules.model.config import ModelConfig
    from marin_rules.model.transformer import MoETransformer

    raw, tok = os.path.join(work, "raw"), os.path.join(work, "tok")
    download(StepContext("raw/b", "v1", {"sample_count": 8, "heldout": ["hamlet"]}, {}, output=raw))
    docs = cloze_docs(read_heldout(raw), ClozeOptions(), seed=0)
    if checkpoint:
        from marin_rules.train.load import load_trained

        lm = MarinLM.from_trained(load_trained(checkpoint))
        return lm, docs, "checkpoint " + checkpoint
    with open(DEFAULT_EXPERIMENT, encoding="utf-8") as f:
        artifacts = yaml.safe_load(f)["artifacts"]
    vocab = artifacts["tokenizers/shakespeare-bpe@v1"]["config"]["vocab_size"]
    train_tokenizer(StepContext("tok/b", "v1", {"vocab_size": vocab}, {"corpus": raw}, output=tok))
    tokenizer, special = load_tokenizer(os.path.join(tok, "tokenizer.json"))
    config = ModelConfig.from_dict(artifacts[DEFAULT_MODEL]["config"]["model"], vocab_size=tokenizer.get_vocab_size())
    model = MoETransformer(config, rngs=nnx.Rngs(params=0))
    return MarinLM(ModelScorer(model, config.max_seq_len), tokenizer, special), docs, "default experiment's model (untrained)"


class PlainLM:
    """The baseline: lm-eval's per-request tokenization, then one forward pass per
    request at a fixed padded length, no cache, nothing shared between requests."""

    def __init__(self, lm):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        self.lm, self.length, self.vocab_size = lm, lm.max_length, lm.scorer.model.config.vocab_size
        graphdef, state = nnx.split(lm.scorer.model)  # the scorer's dropless model

        @jax.jit
        def forward(state, tokens):
            logits, _ = nnx.merge(graphdef, state)(tokens)
            return jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)

        self._forward, self._state = forward, state

    def loglikelihood(self, requests, disable_tqdm: bool = True) -> list[tuple[float, bool]]:
        import numpy as np

        from marin_rules.eval.model_scorer import spread_padding

        out = []
        for request in requests:
            context, continuation = self.lm._encode_pair(*request.args)
            sequence = (context + continuation)[-(self.length + 1) :]
            inputs = np.full((1, self.length), self.lm.special.pad, np.int32)
            inputs[0, : len(sequence) - 1] = sequence[:-1]
            padding = np.arange(self.length)[None, :] >= len(sequence) - 1
            inputs = spread_padding(inputs, padding, self.vocab_size)  # padded as ModelScorer.score pads
            logp = np.asarray(self._forward(self._state, inputs))
            positions = range(len(sequence) - 1 - len(continuation), len(sequence) - 1)
            targets = [sequence[t + 1] for t in positions]
            out.append((float(sum(logp[t, y] for t, y in zip(positions, targets))),
                        all(int(np.argmax(logp[t])) == y for t, y in zip(positions, targets))))  # fmt: skip
        return out


def useful_flops(lm, pairs) -> float:
    """Forward FLOPs the requests need at least: each distinct context once, each
    continuation token once, attention over the real history, head at scored tokens."""
    from marin_rules.model.flops import active_params

    c = lm.scorer.model.config
    embedding = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    trunk = 2 * (active_params(c) - embedding - (2 * c.n_layers + 1) * c.d_model)  # matmuls but the head
    attend = 4 * c.n_layers * c.n_heads * c.head_dim  # scores and values, per key attended
    head = 2 * c.d_model * c.vocab_size
    contexts, total = set(), 0.0
    for pair in pairs:
        context, continuation = lm._encode_pair(*pair)
        sequence = (context + continuation)[-(lm.max_length + 1) :]
        n_ctx = len(sequence) - len(continuation)
        if tuple(sequence[:n_ctx]) not in contexts:
            contexts.add(tuple(sequence[:n_ctx]))
            total += sum(trunk + attend * (p + 1) for p in range(n_ctx))
        total += sum(trunk + attend * (p + 1) for p in range(n_ctx, len(sequence) - 1)) + head * len(continuation)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoint", default=None, help="a train artifact (default: untrained default model)")
    args = parser.parse_args()

    from marin_rules.eval.lm import MarinLM
    from marin_rules.model.peak import local_peak_flops

    with tempfile.TemporaryDirectory() as work:
        lm, docs, what = build(args.checkpoint, work)
    workloads = {
        "choices": [(d["context"], choice) for d in docs for choice in d["choices"]][: args.requests],
        "distinct": [(d["context"], d["choices"][d["label"]]) for d in docs][: args.requests],
    }
    models = {
        "batched": MarinLM(lm.scorer, lm.tokenizer, lm.special, batch_size=args.batch_size),
        "batch-1": MarinLM(lm.scorer, lm.tokenizer, lm.special, batch_size=1),
        "plain": PlainLM(lm),
    }
    print(f"{what}; batch size {args.batch_size}", file=sys.stderr)
    dtype = lm.scorer.model.config.compute_dtype  # a bfloat16 checkpoint is held to a bfloat16 ceiling
    peak_before = local_peak_flops(dtype)
    figures = {name: measure(pairs, models, args.repeats, name) for name, pairs in workloads.items()}
    peak = max(peak_before, local_peak_flops(dtype))
    for name, rps in figures.items():
        print(f"{name:8s}: " + ", ".join(f"{k} {v:7.1f} requests/s" for k, v in rps.items())
              + f"; batched/plain {rps['batched'] / rps['plain']:.1f}, batched/batch-1 {rps['batched'] / rps['batch-1']:.1f}",
              file=sys.stderr)  # fmt: skip
    rps, distinct = figures["choices"], figures["distinct"]
    flops = useful_flops(lm, workloads["choices"])
    mfu = flops * rps["batched"] / len(workloads["choices"]) / peak
    print(
        json.dumps(
            {
                "benchmark": "eval_throughput",
                "ratio": round(rps["batched"] / rps["plain"], 2),
                "workload": "cloze choices: 4 continuations per context, as lm-eval issues a multiple-choice task",
                "baseline": "plain scorer: lm-eval's per-request tokenization, one forward pass per request at "
                "the fixed padded length max_length, no cache, no shared context, head at every position",
                "batched_requests_per_s": round(rps["batched"], 1),
                "plain_requests_per_s": round(rps["plain"], 1),
                "batch1_requests_per_s": round(rps["batch-1"], 1),
                "ratio_vs_batch1": round(rps["batched"] / rps["batch-1"], 2),
                "distinct_contexts_ratio": round(distinct["batched"] / distinct["plain"], 2),
                "distinct_ratio_vs_batch1": round(distinct["batched"] / distinct["batch-1"], 2),
                "distinct_batched_requests_per_s": round(distinct["batched"], 1),
                "distinct_plain_requests_per_s": round(distinct["plain"], 1),
                "scoring_mfu": round(mfu, 4),
                "useful_gflop_per_request": round(flops / len(workloads["choices"]) / 1e9, 4),
                "matmul_peak_gflops": round(peak / 1e9, 1),
                "peak_dtype": dtype,
                "requests": len(workloads["choices"]),
                "batch_size": args.batch_size,
                "max_length": lm.max_length,
                "model": what,
                "target": ">= 10",
            }
        )
    )


def measure(pairs, models, repeats: int, name: str) -> dict[str, float]:
    """Best requests/s of each model over `repeats` alternating timed runs, after a
    warm-up; each run's scores checked against the plain scorer's."""
    from lm_eval.api.instance import Instance

    requests = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]

    def timed(model) -> tuple[float, list]:
        start = time.perf_counter()
        out = model.loglikelihood(requests, disable_tqdm=True)
        return time.perf_counter() - start, out

    print(f"{name}: warming up (compiling every shape) on {len(requests)} requests", file=sys.stderr)
    _, reference = timed(models["plain"])
    for label in ("batched", "batch-1"):
        timed(models[label])
    best = {label: math.inf for label in models}
    for r in range(repeats):
        for label, model in models.items():
            seconds, out = timed(model)
            best[label] = min(best[label], seconds)
            worst_gap = max(abs(a[0] - b[0]) for a, b in zip(out, reference))
            assert worst_gap < 1e-3, f"{label} disagrees with the plain scores by {worst_gap}"
            print(f"{name} repeat {r}: {label:8s} {len(requests) / seconds:8.1f} requests/s", file=sys.stderr)
    return {label: len(requests) / seconds for label, seconds in best.items()}


if __name__ == "__main__":
    main()
