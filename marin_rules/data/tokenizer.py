"""The `train_tokenizer` step: a byte-level BPE trained with HF `tokenizers`.

Model: the tokenizer is trained on the training split of `deps.corpus` only (never
the held-out plays), with the special tokens of `config.special_tokens` (roles bos,
eos, pad) given the first ids, in that order. Byte-level pre-tokenization keeps
every string encodable. No post-processor: steps add special tokens themselves
(`tokenize` appends eos to each document). Training is deterministic: the same
corpus and config give a byte-identical `tokenizer.json`.

`config.pretrained: <location of a tokenizer.json>` uses an existing tokenizer
instead (copied as is); its vocabulary must hold the configured special tokens.

Losslessness: with a corpus, the step checks decode(encode(text)) == text on the first
LOSSLESS_SAMPLE_CHARS characters of its training documents (`sample_round_trip`) and
records `lossless` (and, where a text did not come back, `lossless_example`) in its
result, with one stderr line when it is lossy: a tokenizer that maps text to [UNK] or
drops whitespace is a legitimate choice for training, but bits per byte and
perplexities compared across tokenizers measure its tokens, not the bytes. Our
byte-level BPE is always lossless. `tokenize` and `evaluate` check the texts they
encode with the same functions.

Output:
- `tokenizer.json`: loads with `tokenizers.Tokenizer.from_file`, and with
  `transformers.PreTrainedTokenizerFast.from_pretrained(<artifact folder>)` thanks
  to `tokenizer_config.json` and `special_tokens_map.json` beside it;
- `special_tokens.json`: `{"bos": {"token": "<|bos|>", "id": 0}, "eos": ..., "pad": ...}`,
  written last.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from marin_rules.artifacts import storage
from marin_rules.artifacts.context import StepContext
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import FILE_DIGESTS, named_digests
from marin_rules.artifacts.records import unreadable_file
from marin_rules.data import dolma
from marin_rules.data.checks import SPECIAL_ROLES, check_train_tokenizer, special_tokens_from

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKENS_FILE = "special_tokens.json"
HF_TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json")  # what transformers reads
TOKENIZER_ARTIFACT_FILES = (*HF_TOKENIZER_FILES, SPECIAL_TOKENS_FILE)  # what a train_tokenizer artifact holds
LOSSLESS_SAMPLE_CHARS = 2**18  # characters of the first documents round-tripped (cost: see sample_round_trip)
EXCERPT_CHARS = (16, 24)  # characters shown before and from where a text and its decoding differ


def train_tokenizer(ctx: StepContext) -> dict[str, Any]:
    check_train_tokenizer(ctx.config, ctx.deps)
    special = special_tokens_from(ctx.config)
    special_location = storage.join(ctx.output, SPECIAL_TOKENS_FILE)
    dolma.remove(special_location)  # written last: its presence means the files beside it are whole
    started = time.perf_counter()
    result: dict[str, Any]
    if ctx.config.get("pretrained") is not None:
        source = ctx.config["pretrained"]
        try:
            if not storage.exists(source):
                raise StepError(f"config.pretrained: no tokenizer.json at {source!r}")
            data = storage.read_bytes(source)
        except (StepError, ImportError):
            raise
        except Exception as e:  # noqa: BLE001 - a remote store's own errors (httpx's ConnectError is no OSError)
            raise StepError(f"config.pretrained: {storage.storage_problem(source, e)}") from e
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:
            raise StepError(f"config.pretrained: {source!r} is not a tokenizers JSON file: {e}") from e
        result = {"pretrained": source}
    else:
        corpus = ctx.deps["corpus"]
        texts = TextCounter(dolma.read_split(corpus, "train"), ctx.key)
        tokenizer = train_bpe(
            texts, ctx.config["vocab_size"], special, min_frequency=ctx.config.get("min_frequency", 2)
        )
        if texts.documents == 0:
            raise StepError(f"deps.corpus: the training split of {corpus} is empty")
        data = tokenizer.to_str().encode("utf-8")
        result = {"train_documents": texts.documents, "train_bytes": texts.bytes}
        got, asked = tokenizer.get_vocab_size(with_added_tokens=True), ctx.config["vocab_size"]
        if got < asked:
            print(f"{ctx.key}: note: the corpus gave {got:,} of the {asked:,} ids asked for (no pair of tokens is left "
                  f"that occurs min_frequency={ctx.config.get('min_frequency', 2)} times); tokenize and train use "
                  f"{got:,}", file=sys.stderr)  # fmt: skip
    ids = special_ids(tokenizer, special)
    if "corpus" in ctx.deps:  # a pretrained tokenizer without one is checked by `tokenize`
        corpus = ctx.deps["corpus"]
        docs = dolma.read_range(corpus, "train", 0, dolma.read_manifest(corpus)["train_documents"])
        check = sample_round_trip(bulk_encoder(data.decode("utf-8")), (doc["text"] for doc in docs), "training document")
        result.update(check.result())
        if not check.lossless:
            print(f"{ctx.key}: {lossy_message('this tokenizer', check.example)}", file=sys.stderr)
    storage.write_bytes_atomic(storage.join(ctx.output, TOKENIZER_FILE), data)
    for name, content in hf_files(special).items():
        storage.write_json_atomic(storage.join(ctx.output, name), content)
    storage.write_json_atomic(
        special_location, {role: {"token": special[role], "id": ids[role]} for role in SPECIAL_ROLES}
    )
    return {
        **result,
        # what consumers check the files against (a size cannot see an id changed in place)
        FILE_DIGESTS: named_digests(ctx.output, (TOKENIZER_FILE, SPECIAL_TOKENS_FILE)),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "requested_vocab_size": ctx.config.get("vocab_size"),
        "special_tokens": {role: ids[role] for role in SPECIAL_ROLES},
        "seconds": round(time.perf_counter() - started, 3),
    }


def train_bpe(texts: Iterator[str], vocab_size: int, special: dict[str, str], *, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE over `texts`, special tokens first (ids 0, 1, ... in role order)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = byte_level_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    unique_special = list(dict.fromkeys(special[role] for role in SPECIAL_ROLES))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=unique_special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),
    )
    _interruptible(lambda: tokenizer.train_from_iterator(texts, trainer=trainer))
    return tokenizer


def byte_level_pre_tokenizer() -> pre_tokenizers.ByteLevel:
    """How `train_bpe` cuts text into the pieces BPE merges within (GPT-2's: runs of
    letters, of digits, of other symbols, with a leading space)."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


def _interruptible(work: Callable[[], Any], poll_s: float = 0.5) -> Any:
    """`work()` in a daemon thread while this thread waits for it. BPE training runs in
    Rust without the GIL and never checks for signals: called here, it would hold off
    the job's SIGINT/SIGTERM handlers until it returned (minutes to hours on a large
    corpus). A signal's exception ends the wait at once; the thread ends with the process."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # noqa: BLE001 - raised again in the waiting thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="train-tokenizer", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(poll_s)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


# a BPE model's settings besides vocab and merges, as tokenizer.json names them and
# `models.BPE` takes them; a model with any other key keeps its cache (see bulk_encoder)
BPE_SETTINGS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                "byte_fallback", "ignore_merges")  # fmt: skip


def text_encoder(tokenizer_json: str) -> Tokenizer:
    """The tokenizer of `tokenizer_json` as loaded, but a special-token string inside a
    text is text (`encode_special_tokens`): what evaluation encodes requests with. Its
    word cache stays on: short texts that repeat words (a question's context once per
    choice) gain from it: the 320 strings of 256 cloze requests took 15-17 ms with it
    and 19-20 ms without (one core, `encode_batch_fast`)."""
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.encode_special_tokens = True
    return tokenizer


def bulk_encoder(tokenizer_json: str) -> Tokenizer:
    """`text_encoder` set up to encode whole corpora: a BPE model runs without its word
    cache. The ids are the same; the cache costs more than it saves
    when merging a word is cheap: on the Shakespeare corpus with the default 4,096-id
    BPE, one `encode_batch_fast` took 0.68-0.78 s without it and 0.81-1.02 s with it
    (fresh processes, 2 cores); on 97 MB of Python source, 16-18 s against 21-22 s
    at 4,096 ids, and the same within noise at 32,768. A model this function does not
    know entirely (another type, dropout, an unknown setting), or that `models.BPE` will
    not rebuild from its own file, is left as it is."""
    tokenizer = text_encoder(tokenizer_json)
    model = json.loads(tokenizer_json).get("model", {})
    known = {"type", "vocab", "merges", *BPE_SETTINGS}
    if model.get("type") != "BPE" or model.get("dropout") is not None or not set(model) <= known:
        return tokenizer
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    settings = {k: model[k] for k in BPE_SETTINGS if model.get(k) is not None}
    try:
        tokenizer.model = models.BPE(model.get("vocab", {}), merges, cache_capacity=0, **settings)
    except Exception:  # noqa: BLE001 - a model the library loads but will not rebuild: as loaded
        pass
    return tokenizer


# ---- losslessness ----------------------------------------------------------------


@dataclass(frozen=True)
class RoundTrip:
    """Whether a tokenizer gave back the texts it encoded (decode(encode(text)) == text):
    how much was checked, and where the first text that did not come back differs."""

    documents: int
    characters: int
    example: str | None = None  # one escaped line: "<which>: '<text>' comes back as '<decoded>'"

    @property
    def lossless(self) -> bool:
        return self.example is None

    @classmethod
    def from_result(cls, fields: dict[str, Any]) -> RoundTrip:
        """The check `result()` described (a shard's record carries it to the gather)."""
        checked = fields["lossless_checked"]
        return cls(checked["documents"], checked["characters"], fields.get("lossless_example"))

    def result(self) -> dict[str, Any]:
        """The fields a step's result records."""
        out: dict[str, Any] = {
            "lossless": self.lossless,
            "lossless_checked": {"documents": self.documents, "characters": self.characters},
        }
        if self.example is not None:
            out["lossless_example"] = self.example
        return out


def round_trip(
    tokenizer: Tokenizer, texts: Sequence[str], ids: Sequence[Sequence[int]] | None = None, what: str = "document"
) -> RoundTrip:
    """Decode each text's ids (`ids`, else its encoding as `bulk_encoder`'s tokenizer
    gives it) with special tokens kept, and compare with the text; stops at the first
    that does not come back, named `{what} <1-based number>`."""
    if ids is None:
        ids = [e.ids for e in tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]
    decoded = tokenizer.decode_batch([list(i) for i in ids], skip_special_tokens=False)
    characters = 0
    for n, (text, back) in enumerate(zip(texts, decoded), 1):
        characters += len(text)
        if back != text:
            return RoundTrip(n, characters, f"{what} {n}: {difference(text, back)}")
    return RoundTrip(len(texts), characters)


def sample_round_trip(
    tokenizer: Tokenizer, texts: Iterable[str], what: str = "document", max_chars: int = LOSSLESS_SAMPLE_CHARS
) -> RoundTrip:
    """`round_trip` on the first texts, up to `max_chars` characters in all (the last one
    cut there). Cost on the Shakespeare corpus (4.9 MB) with the 4,096-id BPE, 2 busy
    cores, five runs: 0.05-0.16 s inside `train_tokenizer` (whole step 0.75-2.2 s) and
    0.06-0.10 s inside `tokenize` (1.2-2.2 s), encoding most of it; 2**20 characters
    took 0.23-0.25 s. Capped, so it stays that small on a large corpus."""
    sample: list[str] = []
    size = 0
    for text in texts:
        if size >= max_chars:
            break
        sample.append(text[: max_chars - size])
        size += len(sample[-1])
    return round_trip(tokenizer, sample, what=what)


def difference(text: str, back: str) -> str:
    """Where `back` first differs from `text`: an escaped excerpt of each, one line."""
    at = len(os.path.commonprefix([text, back]))
    start = max(0, at - EXCERPT_CHARS[0])
    stop = at + EXCERPT_CHARS[1]

    def excerpt(s: str) -> str:
        return f"'{'…' if start else ''}{printable(s[start:stop])}{'…' if len(s) > stop else ''}'"

    return f"{excerpt(text)} comes back as {excerpt(back)}"


def lossy_message(subject: str, example: str) -> str:
    """One line: `subject` does not give back the texts it encodes, where (`example`:
    `RoundTrip.example`), and what to do."""
    return (
        f"{subject} does not encode texts losslessly ({example}): bits per byte, and perplexity compared "
        "across tokenizers, will not be meaningful; for those use a byte-level tokenizer (train one with vocab_size)"
    )


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


def load_special_tokens(location: str, field: str = "deps.tokenizer") -> dict[str, dict[str, Any]]:
    """The `special_tokens.json` of a tokenizer artifact (`{role: {"token": str, "id": int}}`
    for each of SPECIAL_ROLES); missing or damaged, one line naming it and `field` (the
    dependency it was reached through)."""
    path = storage.join(location, SPECIAL_TOKENS_FILE)
    if not storage.exists(path):
        raise StepError(f"{field}: {path} is missing: is {location} a finished `train_tokenizer` artifact?")
    try:
        special = storage.read_json(path)
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise unreadable_file(field, path, location, e) from None
    if type(special) is not dict:
        raise unreadable_file(field, path, location, f"it is {dolma.json_kind(special)}, not a JSON object")
    for role in SPECIAL_ROLES:
        entry = special.get(role)
        if type(entry) is not dict or type(entry.get("token")) is not str or type(entry.get("id")) is not int:
            why = f'`{role}` is not {{"token": <string>, "id": <integer>}}'
            raise unreadable_file(field, path, location, why)
    return special


LONG_RUN_CHARS = 50_000  # a run of text without whitespace this long gets a warning (`TextCounter`)


class TextCounter:
    """Iterates the texts of documents while counting them (for the result). The first
    text holding a piece of LONG_RUN_CHARS or more characters that BPE cannot cut
    (one pre-token: a run of one letter or symbol class without whitespace, such as
    `xxxx...` or `====...`; base64 and minified JSON mix classes and are cut) gets one
    stderr line from `key`: BPE training time grows with the square of the longest
    piece (this CPU, vocab 400: 40,000 characters 0.7 s, 80,000 2.9 s, 160,000 12 s;
    2,000,000 ran past 13 minutes). The words between whitespace bound the pieces, so
    only a word that long is pre-tokenized to look."""

    def __init__(self, docs: Iterator[dict[str, Any]], key: str = ""):
        self._docs, self._key = docs, key
        self.documents = 0
        self.bytes = 0
        self.warned = False

    def __iter__(self) -> Iterator[str]:
        for doc in self._docs:
            text = doc["text"]
            self.documents += 1
            self.bytes += len(text.encode("utf-8"))
            if not self.warned and len(text) >= LONG_RUN_CHARS:
                word = max(text.split(), key=len, default="")
                pieces = byte_level_pre_tokenizer().pre_tokenize_str(word) if len(word) >= LONG_RUN_CHARS else []
                longest = max((len(piece) for piece, _ in pieces), default=0)
                if longest >= LONG_RUN_CHARS:
                    self.warned = True
                    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
                    name = printable(str(metadata.get("path") or metadata.get("key") or doc.get("id")))
                    print(f"{self._key}: warning: document {name} holds a run of {longest:,} "
                          "characters that BPE cannot cut; its training time grows with the square of such a run "
                          "(160,000 characters: ~12 s; millions: hours): split or drop such text in the corpus",
                          file=sys.stderr)  # fmt: skip
            yield text
