"""The data steps: raw text -> tokenizer -> token shards, and the loader training reads.

- `checks`: config checkers and option defaults (standard library only: dry runs stay fast)
- `download`: the `download` step (sources -> Dolma `.jsonl.gz` shards, held-out plays)
- `dolma`: reading and writing those shards
- `tokenizer`: the `train_tokenizer` step (byte-level BPE, `tokenizer.json`)
- `tokenize`: the `tokenize` step (token `.npy` shards + `index.json`)
- `loader`: `make_loader(...)`, fixed-length batches from one or a mixture of token artifacts
- `relative`: locations one artifact stores of another, relative to it (prefixes can move)

Nothing here imports `tokenizers` or numpy at package import time.
"""
