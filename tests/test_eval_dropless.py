"""Evaluation is dropless: a request's score does not depend on what else is in its batch.

The `capacity` MoE dispatch drops assignments ranked over the whole batch, so a
model run with it gives a token a different output when other tokens share the
batch. Here a real MoETransformer configured with `moe_impl: capacity` and a small
capacity factor (drops certain) shows that on a plain forward pass, and the `marin`
lm-eval model built on it scores every request alone exactly as inside a full batch,
and as the dropless reference dispatch (`dense`) on the same weights; training's
validation step scores it dropless too.
"""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lm_eval.api.instance import Instance

from marin_rules.eval.lm import MarinLM, load_tokenizer
from marin_rules.eval.model_scorer import ModelScorer, dropless
from marin_rules.model.config import ModelConfig
from marin_rules.model.transformer import MoETransformer
from test_eval_lm import TINY_MODEL, tiny_artifacts

PAIRS = [
    ("Fair is foul, and foul is fair:", " Hover through the fog and filthy air."),
    ("When shall we three meet again", " In thunder, lightning, or in rain?"),
    ("Out,", " damned spot!"),
    ("Is this a dagger which I see before me,", " The handle toward my hand?"),
    ("", "Double, double toil and trouble;"),
]


@pytest.fixture(scope="module")
def capacity_model(tmp_path_factory):
    paths = tiny_artifacts(str(tmp_path_factory.getbasetemp() / "eval-artifacts"))
    tokenizer, special = load_tokenizer(os.path.join(paths["tokenizer"], "tokenizer.json"))
    config = ModelConfig.from_dict(
        {**TINY_MODEL, "moe_impl": "capacity", "capacity_factor": 0.5}, vocab_size=tokenizer.get_vocab_size()
    )
    return MoETransformer(config, rngs=nnx.Rngs(params=5)), tokenizer, special


def test_capacity_dispatch_lets_other_rows_change_a_tokens_output(capacity_model):
    model, tokenizer, _ = capacity_model
    rows = [tokenizer.encode(c + x).ids[:12] for c, x in PAIRS[:4]]
    batch = jnp.asarray(rows, jnp.int32)
    together = np.asarray(model(batch)[0][0])
    alone = np.asarray(model(batch[:1])[0][0])
    assert np.max(np.abs(together - alone)) > 1e-3  # the problem evaluation must not have


def test_evaluation_runs_a_capacity_model_dropless(capacity_model):
    model, _, _ = capacity_model
    evaluated = dropless(model)
    assert evaluated.config.moe_impl == "ragged" and model.config.moe_impl == "capacity"
    for a, b in zip(nnx.to_flat_state(nnx.state(model, nnx.Param)), nnx.to_flat_state(nnx.state(evaluated, nnx.Param))):
        assert a[0] == b[0] and a[1].get_value() is b[1].get_value()  # the same weights, not a copy
    ragged = MoETransformer(dataclasses.replace(model.config, moe_impl="ragged"), rngs=nnx.Rngs(params=5))
    assert dropless(ragged) is ragged


def test_a_requests_score_does_not_depend_on_the_rest_of_its_batch(capacity_model):
    model, tokenizer, special = capacity_model
    lm = MarinLM(ModelScorer(model, TINY_MODEL["max_seq_len"]), tokenizer, special, batch_size=8)
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)]
    together = [logp for logp, _ in lm.loglikelihood(requests, disable_tqdm=True)]
    alone = [lm.loglikelihood([request], disable_tqdm=True)[0][0] for request in requests]
    assert alone == pytest.approx(together, abs=1e-5)
    dense = dataclasses.replace(model.config, moe_impl="dense")
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: MoETransformer(dense, rngs=nnx.Rngs(0))))
    reference = MarinLM(ModelScorer(nnx.merge(graphdef, nnx.state(model)), lm.max_length), tokenizer, special, batch_size=8)
    assert [logp for logp, _ in reference.loglikelihood(requests, disable_tqdm=True)] == pytest.approx(together, abs=1e-4)


def test_trainings_validation_loss_of_a_capacity_model_is_dropless(capacity_model):
    # train's validation step scores the same weights through `ragged`: a row's loss
    # does not depend on the other rows of its batch (it did through `capacity`)
    from marin_rules.model.transformer import loss_and_aux
    from marin_rules.train.steps import make_eval_step

    model, tokenizer, _ = capacity_model
    batch = jnp.asarray([tokenizer.encode(c + x).ids[:12] for c, x in PAIRS[:4]], jnp.int32)
    _, params, state = nnx.split(model, nnx.Param, ...)
    eval_step = make_eval_step(model.config)
    together, alone = float(eval_step(params, state, batch[:2])), float(eval_step(params, state, batch[:1]))
    second = float(eval_step(params, state, batch[1:2]))
    assert together == pytest.approx((alone + second) / 2, rel=1e-6)  # each row scored as if alone
    reference = loss_and_aux(dropless(model), batch)[1]["ce_loss"]
    assert float(eval_step(params, state, batch)) == float(reference)  # what evaluation's dropless model gives
    as_trained = float(loss_and_aux(model, batch)[1]["ce_loss"])
    assert abs(as_trained - float(reference)) > 1e-5  # capacity 0.5 drops (6e-5 on these random weights): the old step's loss differed
