"""The `train_tokenizer` step: a byte-level BPE trained with HF `tokenizers`.

Model: the tokenizer is trained on the training split of `deps.corpus` only (never
the held-out plays), with the special tokens of `config.special_tokens` (roles bos,
eos, pad) given the first ids, in that order. Byte-level pre-tokenization keeps
every string encodable. No post-processor: steps add special tokens themselves
(`tokenize` appends eos to each document). Training is deterministic: the same
corpus and config give a byte-identical `tokenizer.json`.

`config.pretrained: <location of a tokenizer.json>` uses an existing tokenizer
instead (copied as is); its vocabulary must hold the configured special tokens.

Output:
- `tokenizer.json`: loads with `tokenizers.Tokenizer.from_file`, and with
  `transformers.PreTrainedTokenizerFast.from_pretrained(<artifact folder>)` thanks
  to `tokenizer_config.json` and `special_tokens_map.json` beside it;
- `special_tokens.json`: `{"bos": {"token": "<|bos|>", "id": 0}, "eos": ..., "pad": ...}`,
  written last.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.errors import StepError
from marin_rules.data import dolma
from marin_rules.data.checks import SPECIAL_ROLES, check_train_tokenizer, special_tokens_from

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKENS_FILE = "special_tokens.json"


def train_tokenizer(ctx: StepContext) -> dict[str, Any]:
    check_train_tokenizer(ctx.config, ctx.deps)
    special = special_tokens_from(ctx.config)
    special_location = storage.join(ctx.output, SPECIAL_TOKENS_FILE)
    dolma.remove(special_location)  # written last: its presence means the files beside it are whole
    started = time.perf_counter()
    result: dict[str, Any]
    if ctx.config.get("pretrained") is not None:
        source = ctx.config["pretrained"]
        if not storage.exists(source):
            raise StepError(f"config.pretrained: no tokenizer.json at {source!r}")
        data = storage.read_bytes(source)
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:
            raise StepError(f"config.pretrained: {source!r} is not a tokenizers JSON file: {e}") from e
        result = {"pretrained": source}
    else:
        corpus = ctx.deps["corpus"]
        texts = TextCounter(dolma.read_split(corpus, "train"))
        tokenizer = train_bpe(
            texts, ctx.config["vocab_size"], special, min_frequency=ctx.config.get("min_frequency", 2)
        )
        if texts.documents == 0:
            raise StepError(f"deps.corpus: the training split of {corpus} is empty")
        data = tokenizer.to_str().encode("utf-8")
        result = {"train_documents": texts.documents, "train_bytes": texts.bytes}
    ids = special_ids(tokenizer, special)
    storage.write_bytes_atomic(storage.join(ctx.output, TOKENIZER_FILE), data)
    for name, content in hf_files(special).items():
        storage.write_json_atomic(storage.join(ctx.output, name), content)
    storage.write_json_atomic(
        special_location, {role: {"token": special[role], "id": ids[role]} for role in SPECIAL_ROLES}
    )
    return {
        **result,
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "requested_vocab_size": ctx.config.get("vocab_size"),
        "special_tokens": {role: ids[role] for role in SPECIAL_ROLES},
        "seconds": round(time.perf_counter() - started, 3),
    }


def train_bpe(texts: Iterator[str], vocab_size: int, special: dict[str, str], *, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE over `texts`, special tokens first (ids 0, 1, ... in role order)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    unique_special = list(dict.fromkeys(special[role] for role in SPECIAL_ROLES))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=unique_special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


# a BPE model's settings besides vocab and merges, as tokenizer.json names them and
# `models.BPE` takes them; a model with any other key keeps its cache (see bulk_encoder)
BPE_SETTINGS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                "byte_fallback", "ignore_merges")  # fmt: skip


def bulk_encoder(tokenizer_json: str) -> Tokenizer:
    """The tokenizer of `tokenizer_json` set up to encode whole corpora: a special-token
    string inside a text is text (`encode_special_tokens`), and a BPE model runs
    without its word cache. The ids are the same; the cache costs more than it saves
    when merging a word is cheap: on the Shakespeare corpus with the default 4,096-id
    BPE, one `encode_batch_fast` took 0.68-0.78 s without it and 0.81-1.02 s with it
    (fresh processes, 2 cores); on 97 MB of Python source, 16-18 s against 21-22 s
    at 4,096 ids, and the same within noise at 32,768. A model this function does not
    know entirely (another type, dropout, an unknown setting) is left as it is."""
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.encode_special_tokens = True
    model = json.loads(tokenizer_json).get("model", {})
    known = {"type", "vocab", "merges", *BPE_SETTINGS}
    if model.get("type") != "BPE" or model.get("dropout") is not None or not set(model) <= known:
        return tokenizer
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    settings = {k: model[k] for k in BPE_SETTINGS if model.get(k) is not None}
    tokenizer.model = models.BPE(model.get("vocab", {}), merges, cache_capacity=0, **settings)
    return tokenizer


def special_ids(tokenizer: Tokenizer, special: dict[str, str]) -> dict[str, int]:
    ids = {}
    for role in SPECIAL_ROLES:
        token_id = tokenizer.token_to_id(special[role])
        if token_id is None:
            raise StepError(
                f"config.special_tokens.{role}: {special[role]!r} is not in the tokenizer's vocabulary; "
                "name a token it has (e.g. '<|endoftext|>' for GPT-2)"
            )
        ids[role] = token_id
    return ids


def hf_files(special: dict[str, str]) -> dict[str, dict[str, Any]]:
    """What `transformers.PreTrainedTokenizerFast.from_pretrained` reads besides tokenizer.json."""
    tokens = {f"{role}_token": special[role] for role in SPECIAL_ROLES}
    return {
        # split_special_tokens: a literal "<|endoftext|>" in a text is text, as our encoding reads it
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                                  "split_special_tokens": True, **tokens},
        "special_tokens_map.json": tokens,
    }


def load_special_tokens(location: str) -> dict[str, dict[str, Any]]:
    """The `special_tokens.json` of a tokenizer artifact, with an error naming it."""
    path = storage.join(location, SPECIAL_TOKENS_FILE)
    if not storage.exists(path):
        raise StepError(f"deps.tokenizer: {path} is missing: is {location} a finished `train_tokenizer` artifact?")
    return json.loads(storage.read_text(path))


class TextCounter:
    """Iterates the texts of documents while counting them (for the result)."""

    def __init__(self, docs: Iterator[dict[str, Any]]):
        self._docs = docs
        self.documents = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[str]:
        for doc in self._docs:
            self.documents += 1
            self.bytes += len(doc["text"].encode("utf-8"))
            yield doc["text"]
