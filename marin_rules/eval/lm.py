"""The lm-eval model `marin`: a trained marin-rules checkpoint behind lm-eval's LM API.

Model: `MarinLM` turns lm-eval requests into token arrays and hands them to a
`Scorer` (scoring.py): the trained model, or the unigram baseline (baseline.py), so
both are scored by exactly the same tokenization, batching and tasks.

- `loglikelihood`: each (context, continuation) is tokenized (lm-eval's `TemplateLM`
  rules: trailing context spaces move to the continuation; an empty context becomes
  the prefix token), truncated on the left to `max_length + 1` tokens, sorted by
  length (longest first), and scored `batch_size` rows per forward pass. Rows are
  right-padded to a bucketed length (powers of two from 16, capped at `max_length`)
  and batches to `batch_size` rows, so a whole evaluation compiles a handful of shapes.
- `loglikelihood_rolling`: lm-eval's `get_rolling_token_windows` over the model's
  context: every token of a document is predicted exactly once, each window seeing
  at least `rolling_context` tokens of history (default half the context); the
  windows of all documents are batched together.
- `generate_until`: greedy decoding with stop sequences, the end-of-text token and
  `max_gen_toks`. No key/value cache: the model's API is `model(tokens) -> logits`
  with no cache, so each new token costs a full forward pass over a fixed padded
  buffer of a bucketed length (one compile per bucket). Generation is not used by
  the local tasks; it is correct and bounded, not fast.

From the command line the class must be imported before lm-eval looks the name up
(lm-eval 0.4.13 has no plugin entry points): `python -m marin_rules.eval.cli` is
`lm_eval` with `marin` and `marin-unigram` registered, e.g.
`python -m marin_rules.eval.cli --model marin --model_args checkpoint=PATH
--tasks marin_shakespeare_bpb --include_path DIR`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tokenizers import Tokenizer
from tqdm import tqdm

from marin_rules.artifacts import storage

if TYPE_CHECKING:  # the JAX scorer is imported only where a model is loaded
    from marin_rules.eval.scoring import Scorer

log = logging.getLogger(__name__)

MIN_BUCKET = 16
DEFAULT_BATCH_SIZE = 16
DEFAULT_MAX_GEN_TOKS = 256


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int
    pad: int


def load_tokenizer(location: str) -> tuple[Tokenizer, SpecialTokens]:
    """A tokenizer.json (local or remote) and its special token ids, from the
    `special_tokens.json` beside it, else from well-known token strings."""
    tokenizer = Tokenizer.from_str(storage.read_text(location))
    tokenizer.encode_special_tokens = True  # as the tokenize step: "<|endoftext|>" in a text is text
    sidecar = storage.join(storage.parent(location), "special_tokens.json")
    ids: dict[str, int | None] = {}
    if storage.exists(sidecar):
        for role, entry in storage.read_json(sidecar).items():
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


def bucket_length(n: int, max_length: int) -> int:
    """The padded length for a row of `n` tokens: the next power of two >= 16, capped."""
    size = MIN_BUCKET
    while size < n:
        size *= 2
    return min(size, max_length)


def _as_batch_size(value: Any) -> int:
    if value is None or value == "auto" or (isinstance(value, str) and value.startswith("auto")):
        return DEFAULT_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {value!r}")
    return size


@register_model("marin")
class MarinLM(TemplateLM):
    def __init__(
        self,
        scorer: "Scorer",
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
            raise ValueError(f"rolling_context: expected 1..{scorer.max_length}, got {rolling_context}")
        self.max_gen_toks = int(max_gen_toks)

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
        """From `load_trained`'s TrainedModel(model, config, tokenizer)."""
        from marin_rules.eval.scoring import ModelScorer

        length = trained.config.max_seq_len if max_length is None else min(int(max_length), trained.config.max_seq_len)
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

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """Score each (cache key, context tokens, continuation tokens), batched."""
        pieces = [(i, seq, n) for i, (_, ctx, cont) in enumerate(requests) for seq, n in self._pieces(ctx, cont)]
        logps = np.zeros(len(requests), np.float64)
        greedy = np.ones(len(requests), bool)
        order = sorted(range(len(pieces)), key=lambda p: -len(pieces[p][1]))
        with tqdm(total=len(order), desc="marin loglikelihood", disable=disable_tqdm, leave=False) as bar:
            for start in range(0, len(order), self.batch_size):
                chunk = [pieces[p] for p in order[start : start + self.batch_size]]
                T = bucket_length(max(len(seq) - 1 for _, seq, _ in chunk), self.max_length)
                inputs = np.full((self.batch_size, T), self.special.pad, np.int32)
                targets = np.zeros((self.batch_size, T), np.int32)
                for row, (_, seq, _) in enumerate(chunk):
                    inputs[row, : len(seq) - 1] = seq[:-1]
                    targets[row, : len(seq) - 1] = seq[1:]
                row_logp, row_greedy = self.scorer.token_logprobs(inputs, targets)
                for row, (i, seq, n) in enumerate(chunk):
                    end = len(seq) - 1
                    logps[i] += np.sum(row_logp[row, end - n : end], dtype=np.float64)
                    greedy[i] &= bool(np.all(row_greedy[row, end - n : end]))
                bar.update(len(chunk))
        results = [(float(lp), bool(g)) for lp, g in zip(logps, greedy)]
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

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
        windows, owners = [], []
        for j, request in enumerate(requests):
            for context, continuation in self.rolling_windows(self.tok_encode(request.args[0])):
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
            tokens = self.tok_encode(context) if context else []
            tokens = ([self.prefix_token_id] + tokens)[-(L - max_gen) :]
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
        T = bucket_length(max(len(tokens) + max_gen for tokens, _, max_gen in rows), self.max_length)
        buffer = np.full((self.batch_size, T), self.special.pad, np.int32)
        positions = np.ones(self.batch_size, np.int32)  # padding rows: any valid position
        for r, (tokens, _, _) in enumerate(rows):
            buffer[r, : len(tokens)] = tokens
            positions[r] = len(tokens)
        generated: list[list[int]] = [[] for _ in rows]
        active = [True] * len(rows)
        while any(active):
            next_tokens = self.scorer.next_tokens(buffer, positions - 1)
            for r, (_, until, max_gen) in enumerate(rows):
                if not active[r]:
                    continue
                token = int(next_tokens[r])
                if token == self.eot_token_id:
                    active[r] = False
                    continue
                generated[r].append(token)
                buffer[r, positions[r]] = token
                positions[r] += 1
                text = self.tok_decode(generated[r])
                if len(generated[r]) >= max_gen or any(stop in text for stop in until):
                    active[r] = False
        texts = []
        for r, (_, until, _) in enumerate(rows):
            text = self.tok_decode(generated[r])
            for stop in until:
                text = text.split(stop)[0]
            texts.append(text)
        return texts

