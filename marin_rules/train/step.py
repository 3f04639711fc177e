"""The `train` step: `train(ctx)` trains a mixture-of-experts model on token data.

Model: `ctx.config` is the recipe (`config.py`), `ctx.deps["data"]` the token data
(one tokenized artifact's location, or a mixture `{location: weight}`), `ctx.runtime`
the execution choices that never enter the fingerprint (`distributed`, and
`peak_flops` to skip measuring the MFU ceiling), `ctx.output` where the artifact
goes (local or gs://). Running the same step again on the same output resumes
from the last checkpoint, if the checkpoints were written by the same recipe
(config and deps; `recipe.py` says what may change) and refuses with a StepError
otherwise. The artifact: `checkpoints/` (with `checkpoints/recipe.json`),
`model.json`, `metrics.jsonl`, `loss.png`; the returned summary becomes the
record's `result`.
"""

from __future__ import annotations

from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.identity import parse_key
from marin_rules.dev_versions import keeps_history
from marin_rules.train import distributed
from marin_rules.train.config import parse_train_config
from marin_rules.train.recipe import make_recipe


def train(ctx: StepContext) -> dict:
    # join the other processes first: nothing may touch a JAX backend before this
    distributed.initialize(distributed.parse_distributed(ctx.runtime.get("distributed")))

    from marin_rules.train.loop import Data, VAL_SPLIT, run
    from marin_rules.data.loader import make_loader

    first = parse_train_config(ctx.config)  # fail fast, before any data is opened
    if "data" not in ctx.deps:
        raise StepError("deps.data: missing; the train step needs its token data")
    recipe = make_recipe(ctx.config, ctx.deps, ctx.output)
    sources = ctx.deps["data"]
    seed = first.seed
    train_loader = make_loader(
        sources, split="train", seq_len=first.seq_len, batch_size=first.batch_size, seed=seed
    )
    val_loader = make_loader(
        sources, split=VAL_SPLIT, seq_len=first.seq_len, batch_size=first.batch_size, seed=seed
    )
    config = parse_train_config(ctx.config, vocab_size=train_loader.vocab_size)
    if config.model.vocab_size < train_loader.vocab_size:
        raise StepError(
            f"config.model.vocab_size: {config.model.vocab_size} is smaller than the tokenizer's "
            f"{train_loader.vocab_size}; leave it out to take the tokenizer's"
        )
    data = Data(
        train=train_loader,
        val=val_loader,
        vocab_size=train_loader.vocab_size,
        tokenizer=train_loader.tokenizer,
        eos_id=getattr(train_loader, "eos_id", None),
    )
    keep_history = keeps_history(parse_key(ctx.key))  # a dev version's damaged checkpoints are deleted
    return run(config, data, ctx.output, ctx.runtime, recipe=recipe, keep_history=keep_history)

