"""The lm-eval model `marin`: a trained marin-rules checkpoint behind lm-eval's LM API.

Model: `MarinLM` turns lm-eval requests into token arrays and hands them to a
`Scorer` (scoring.py): the trained model, or the unigram baseline (baseline.py), so
both are scored by exactly the same tokenization, batching and tasks.

- `loglikelihood`: each (context, continuation) is tokenized (lm-eval's `TemplateLM`
  rules: trailing context spaces move to the continuation; an empty context becomes
  the prefix token) and truncated on the left to `max_length + 1` tokens. A history
  that several requests share (the context of a multiple-choice question's choices)
  becomes a prefix: requests are sorted so that equal prefixes sit together, and each
  batch of `batch_size` scored windows is packed into rows of `max_length` tokens
  (packing.py): every distinct prefix once, followed by the continuations that
  share it, short sequences sharing a row, one forward pass per batch. The output
  head runs only at scored positions. Shapes are bucketed, and a batch reuses a
  larger shape already used in the same `loglikelihood` call (one task: lm-eval
  sends a task's requests together) while that costs at most
  `packing.MAX_PADDING_COST` times its own, so a task compiles a few programs.
- `loglikelihood_rolling`: lm-eval's `get_rolling_token_windows` over the model's
  context: every token of a document is predicted exactly once, each window seeing
  at least `rolling_context` tokens of history (default half the context); the
  windows of all documents are batched together. The call also decodes every text's
  tokens and records in `round_trip` whether each came back as it was: where one did
  not (a [UNK], dropped whitespace), bits per byte divides by bytes the tokens do not
  describe, and the evaluate step says so beside the figure.
- `generate_until`: greedy decoding with stop sequences, the end-of-text token and
  `max_gen_toks`, `batch_size` prompts at a time: one prefill of the prompts into a
  key/value cache, then one cached step per new token (a fixed-shape program). A
  prompt is its context's tokens, as loglikelihood takes a context (no prefix token
  before them; the prefix token alone for an empty context), cut to the last
  `max_length - max_gen_toks`.

From the command line the class must be imported before lm-eval looks the name up
(lm-eval 0.4.13 has no plugin entry points): `python -m marin_rules.eval.cli` is
`lm_eval` with `marin` and `marin-unigram` registered, e.g.
`python -m marin_rules.eval.cli --model marin --model_args checkpoint=PATH
--tasks marin_shakespeare_bpb --include_path DIR`.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tokenizers import Tokenizer
from tqdm import tqdm

from marin_rules.artifacts import storage
from marin_rules.artifacts.records import unreadable_file
from marin_rules.data.tokenizer import RoundTrip, round_trip, text_encoder
from marin_rules.eval import packing
from marin_rules.eval.config import DEFAULT_BATCH_SIZE
from marin_rules.eval.packing import Piece
from marin_rules.eval.scoring import Scorer

log = logging.getLogger(__name__)

DEFAULT_MAX_GEN_TOKS = 256


class ModelArgError(ValueError):
    """A bad `model_args` value of the `marin` model (`marin-lm-eval` prints it as one line)."""


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int
    pad: int


def load_tokenizer(location: str) -> tuple[Tokenizer, SpecialTokens]:
    """A tokenizer.json (local or remote) and its special token ids, from the
    `special_tokens.json` beside it, else from well-known token strings."""
    try:
        # as the tokenize step: "<|endoftext|>" in a text is text
        tokenizer = text_encoder(storage.read_text(location))
    except FileNotFoundError:  # named with its artifact's rebuild command, as a damaged one
        raise unreadable_file("deps.model", location, storage.parent(location), "missing") from None
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise unreadable_file("deps.model", location, storage.parent(location), e) from None
    sidecar = storage.join(storage.parent(location), "special_tokens.json")
    ids: dict[str, int | None] = {}
    if storage.exists(sidecar):
        try:
            entries = storage.read_json(sidecar)
            if not isinstance(entries, dict):
                raise ValueError(f"expected a JSON object, got {type(entries).__name__}")
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise unreadable_file("deps.model", sidecar, storage.parent(location), e) from None
        for role, entry in entries.items():
            ids[role] = entry.get("id") if isinstance(entry, dict) else tokenizer.token_to_id(str(entry))
    for role, names in {
        "bos": ("<|bos|>", "<s>", "<bos>"),
        "eos": ("<|endoftext|>", "</s>", "<eos>"),
        "pad": ("<|pad|>", "<pad>"),
    }.items():
        if ids.get(role) is None:
            ids[role] = next((tokenizer.token_to_id(n) for n in names if tokenizer.token_to_id(n) is not None), None)
    if ids["eos"] is None:
        raise ValueError(f"tokenizer {location}: no end-of-text token; write special_tokens.json beside it")
    return tokenizer, SpecialTokens(ids["bos"], ids["eos"], ids["pad"] if ids["pad"] is not None else ids["eos"])


def _as_batch_size(value: Any) -> int:
    if value is None or value == "auto" or (isinstance(value, str) and value.startswith("auto")):
        return DEFAULT_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise ModelArgError(f"batch_size: expected an integer >= 1, got {value!r}")
    return size


@register_model("marin")
class MarinLM(TemplateLM):
    def __init__(
        self,
        scorer: Scorer,
        tokenizer: Tokenizer,
        special: SpecialTokens,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        rolling_context: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
    ):
        super().__init__()
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.special = special
        self.batch_size = _as_batch_size(batch_size)
        self.rolling_context = max(1, scorer.max_length // 2) if rolling_context is None else int(rolling_context)
        if not 1 <= self.rolling_context <= scorer.max_length:
            raise ModelArgError(f"rolling_context: expected 1..{scorer.max_length}, got {rolling_context}")
        self.max_gen_toks = int(max_gen_toks)
        self.round_trip: RoundTrip | None = None  # of the texts of the last loglikelihood_rolling call

    # ---- construction from lm-eval's model_args ------------------------------------

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "MarinLM":
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "MarinLM":
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        extra.pop("device", None)  # JAX picks its own backend
        extra.pop("max_batch_size", None)
        return cls.from_args(**{**extra, **arg_dict})

    @classmethod
    def from_args(cls, **kwargs: Any) -> "MarinLM":
        return cls.from_checkpoint(**kwargs)

    @classmethod
    def from_checkpoint(cls, checkpoint: str, **kwargs: Any) -> "MarinLM":
        """`checkpoint`: a `train` artifact's location (local or gs://)."""
        from marin_rules.train.load import load_trained

        return cls.from_trained(load_trained(str(checkpoint)), **kwargs)

    @classmethod
    def from_trained(cls, trained: Any, *, max_length: int | None = None, **kwargs: Any) -> "MarinLM":
        """From `load_trained`'s TrainedModel(model, config, tokenizer). The context
        (`max_length`) defaults to the length the model was trained on: positions past
        it were never seen (a model trained at 64 tokens with `max_seq_len` 256 scored
        3.15 bits per byte in 256-token windows, 2.47 in 64-token ones). A larger
        `max_length` may be asked for, up to `max_seq_len` (the rotary tables end
        there); one beyond it is refused, not silently shortened (lm-eval passes
        `max_length` only when `model_args` give it)."""
        from marin_rules.eval.model_scorer import ModelScorer

        limit = trained.config.max_seq_len
        if max_length is not None and int(max_length) < 1:
            raise ModelArgError(f"max_length: expected a context of at least 1 token, got {max_length}")
        if max_length is not None and int(max_length) > limit:
            raise ModelArgError(
                f"max_length: {max_length} is longer than the model's max_seq_len {limit}; "
                f"give at most {limit}, or leave it out for the trained length"
            )
        length = min(trained.seq_len or limit, limit) if max_length is None else int(max_length)
        tokenizer, special = load_tokenizer(trained.tokenizer)
        return cls(ModelScorer(trained.model, length), tokenizer, special, **kwargs)

    # ---- what TemplateLM needs -----------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.special.eos

    @property
    def prefix_token_id(self) -> int:
        # training data is documents each followed by eos (no bos): a document's first
        # token was always seen right after an eos, so eos is the prefix that matches
        return self.special.eos

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=False).ids

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    # ---- loglikelihood -------------------------------------------------------------

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's `TemplateLM.loglikelihood`, tokenizing every distinct string once
        in one parallel `encode_batch_fast` (the tokens are those of `_encode_pair`)."""
        pairs = [tuple(request.args) for request in requests]
        return self._loglikelihood_tokens(
            [(pair, *self._encode_pair_cached(pair, encoded)) for pair, encoded in zip(pairs, self._encode_all(pairs))],
            disable_tqdm=disable_tqdm,
        )

    def _encode_all(self, pairs: list[tuple[str, str]]) -> list[dict[str, list[int]]]:
        """For each pair, the token ids of the strings `_encode_pair_cached` needs."""
        needed = [self._pair_strings(context, continuation) for context, continuation in pairs]
        distinct = list(dict.fromkeys(text for strings in needed for text in strings))
        ids = dict(zip(distinct, (e.ids for e in self.tokenizer.encode_batch_fast(distinct, add_special_tokens=False))))
        return [{text: ids[text] for text in strings} for strings in needed]

    @staticmethod
    def _pair_strings(context: str, continuation: str) -> tuple[str, ...]:
        if context == "":
            return (continuation,)
        stripped = context.rstrip()
        return (context + continuation, stripped)

    def _encode_pair_cached(self, pair: tuple[str, str], encoded: dict[str, list[int]]) -> tuple[list[int], list[int]]:
        """TemplateLM's rules: an empty context becomes the prefix token (unless the
        continuation already starts with it); trailing context spaces move to the
        continuation; the continuation is the whole encoding after the context's."""
        context, continuation = pair
        if context == "":
            tokens = encoded[continuation]
            if tokens and tokens[0] == self.prefix_token_id:
                return tokens[:1], tokens[1:]
            return [self.prefix_token_id], tokens
        whole, context_ids = encoded[context + continuation], encoded[context.rstrip()]
        return context_ids, whole[len(context_ids) :]

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """Score each (cache key, context tokens, continuation tokens), batched."""
        pieces = self._split(requests)
        order = sorted(range(len(pieces)), key=lambda p: (-len(pieces[p].prefix), pieces[p].prefix, -len(pieces[p].suffix)))
        L = self.max_length
        batches = packing.make_batches([pieces[p] for p in order], L, self.batch_size)
        logps = np.zeros(len(requests), np.float64)
        greedy = np.ones(len(requests), bool)
        with tqdm(total=len(order), desc="marin loglikelihood", disable=disable_tqdm, leave=False) as bar:

            def add_up(scores: tuple[Any, Any], spans: list[tuple[Piece, int, int]]) -> None:
                out_logp, out_greedy = (np.asarray(out).reshape(-1) for out in scores)  # waits for the batch
                for piece, a, b in spans:
                    logps[piece.request] += np.sum(out_logp[a:b], dtype=np.float64)
                    greedy[piece.request] &= bool(np.all(out_greedy[a:b]))
                bar.update(len(spans))

            previous = None  # a batch in flight while the next one is laid out and started
            for rows, shape in zip(batches, packing.choose_shapes(batches, L, self.batch_size)):
                batch, spans = packing.layout(rows, shape, self.special.pad)
                scores = self.scorer.score(batch)
                if previous is not None:
                    add_up(*previous)
                previous = (scores, spans)
            if previous is not None:
                add_up(*previous)
        results = [(float(lp), bool(g)) for lp, g in zip(logps, greedy)]
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def _split(self, requests: list[tuple[Any, list[int], list[int]]]) -> list[Piece]:
        """Every scored window of every request, as a `Piece`. A history that several
        pieces share becomes their common prefix (run once per batch); any other
        window is all suffix, scored at its last positions only."""
        windows = [(i, seq, n) for i, (_, ctx, cont) in enumerate(requests) for seq, n in self._pieces(ctx, cont)]
        histories = [tuple(seq[: len(seq) - 1 - n]) for _, seq, n in windows]
        shared = collections.Counter(histories)
        pieces = []
        for (i, seq, n), history in zip(windows, histories):
            split = len(history) if shared[history] > 1 else 0
            pieces.append(Piece(i, history if split else (), seq[split:-1], seq[split + 1 :], n))
        return pieces

    def _pieces(self, context: list[int], continuation: list[int]) -> list[tuple[list[int], int]]:
        """(token sequence of at most max_length + 1, number of final targets scored)
        covering every continuation token once. A continuation that fits is one piece
        with as much context as fits; a longer one is cut into pieces of
        `max_length - rolling_context + 1` targets, each after at least
        `rolling_context` tokens of history where the sequence has them."""
        L = self.max_length
        full = list(context) + list(continuation)
        if len(continuation) <= L:
            return [(full[-(L + 1) :], len(continuation))]
        step = L - self.rolling_context + 1
        out = []
        for a in range(len(context), len(full), step):
            b = min(a + step, len(full))
            out.append((full[max(0, b - L - 1) : b], b - a))
        return out

    def rolling_windows(self, tokens: list[int]) -> list[tuple[list[int], list[int]]]:
        """(context, continuation) windows predicting every token of `tokens` once."""
        return [
            lm_utils.make_disjoint_window(w)
            for w in lm_utils.get_rolling_token_windows(
                token_list=tokens,
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=self.rolling_context,
            )
        ]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's summed log-likelihood; `self.round_trip` then says whether the
        tokenizer gave the texts back (bits per byte counts their bytes)."""
        texts = [request.args[0] for request in requests]
        encoded = [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]  # tok_encode's ids
        self.round_trip = round_trip(self.tokenizer, texts, encoded, "text")
        windows, owners = [], []
        for j, tokens in enumerate(encoded):
            for context, continuation in self.rolling_windows(tokens):
                windows.append((None, context, continuation))
                owners.append(j)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for owner, (logp, _) in zip(owners, scores):
            totals[owner] += logp
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (request.args[0],), total)
        return totals

    # ---- generation ----------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        L = self.max_length
        prepared = []
        for request in requests:
            context, kwargs = request.args[0], dict(request.args[1] or {})
            if kwargs.get("do_sample"):
                log.warning("marin: do_sample requested; decoding greedily")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen = max(1, min(int(kwargs.get("max_gen_toks", self.max_gen_toks)), L - 1))
            # as loglikelihood's contexts and lm-eval's HF model: the context's own tokens, the
            # prefix token standing in for an empty one, or one that encodes to nothing (a
            # tokenizer that drops whitespace); L = 1: one token of the context
            tokens = ((self.tok_encode(context) if context else []) or [self.prefix_token_id])[-max(1, L - max_gen) :]
            prepared.append((tokens, until, max_gen))
        outputs = [""] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -len(prepared[i][0]))
        with tqdm(total=len(order), desc="marin generate_until", disable=disable_tqdm, leave=False) as bar:
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                texts = self._generate_batch([prepared[i] for i in chunk])
                for i, text in zip(chunk, texts):
                    outputs[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        return outputs

    def _generate_batch(self, rows: list[tuple[list[int], list[str], int]]) -> list[str]:
        L = self.max_length
        prompts = np.full((self.batch_size, packing.bucket(max(len(t) for t, _, _ in rows), L, packing.MIN_ROW_LENGTH, halves=False)), self.special.pad, np.int32)
        lengths = np.ones(self.batch_size, np.int32)  # padding rows: one pad token
        for r, (tokens, _, _) in enumerate(rows):
            prompts[r, : len(tokens)] = tokens
            lengths[r] = len(tokens)
        cache_length = packing.bucket(max(len(tokens) + max_gen for tokens, _, max_gen in rows), L, packing.MIN_ROW_LENGTH, halves=False)
        next_tokens, state = self.scorer.prefill(prompts, lengths, cache_length)
        generated: list[list[int]] = [[] for _ in rows]
        active = [True] * len(rows)
        while True:
            for r, (_, until, max_gen) in enumerate(rows):
                if not active[r]:
                    continue
                token = int(next_tokens[r])
                if token == self.eot_token_id:
                    active[r] = False
                    continue
                generated[r].append(token)
                text = self.tok_decode(generated[r])
                if len(generated[r]) >= max_gen or any(stop in text for stop in until):
                    active[r] = False
            if not any(active):
                break
            # feed each row its newest token at the next position (finished rows: anything, anywhere)
            feed = np.full(self.batch_size, self.special.pad, np.int32)
            positions = np.full(self.batch_size, cache_length - 1, np.int32)
            for r, (tokens, _, _) in enumerate(rows):
                if active[r]:
                    feed[r], positions[r] = generated[r][-1], len(tokens) + len(generated[r]) - 1
            next_tokens, state = self.scorer.decode(state, feed, positions)
        texts = []
        for r, (_, until, _) in enumerate(rows):
            text = self.tok_decode(generated[r])
            for stop in until:
                text = text.split(stop)[0]
            texts.append(text)
        return texts
