"""Parameter and FLOP counts of a `ModelConfig`, in pure Python (no JAX).

Model: training costs 6 FLOPs per active matmul parameter per token (2 forward, 4
backward) plus the attention scores/values term, as nanoGPT's `estimate_mfu` counts
them. MoE layers count only the `top_k` chosen experts (and the shared one): the
"active" parameters. MFU = tokens/s * flops_per_token / peak FLOP/s.
"""

from __future__ import annotations

from marin_rules.model.config import ModelConfig


def active_params(config: ModelConfig) -> int:
    """Parameters one token touches in a forward pass: attention, norms, the router, the
    `top_k` chosen experts (plus the shared expert), the dense FFNs, and the embedding
    table (counted once when tied, twice when the head is separate)."""
    c = config
    attn = c.d_model * c.n_heads * c.head_dim * 2 + c.d_model * c.n_kv_heads * c.head_dim * 2
    norms = 2 * c.d_model
    total = 0
    for i in range(c.n_layers):
        if c.is_moe_layer(i):
            ffn = c.d_model * c.n_experts + c.top_k * 3 * c.d_model * c.d_expert
            ffn += 3 * c.d_model * c.d_expert if c.shared_expert else 0
        else:
            ffn = 3 * c.d_model * c.d_ff
        total += attn + norms + ffn
    embed = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    return total + c.d_model + embed


def total_params(config: ModelConfig) -> int:
    """All parameters (every expert), as stored in a checkpoint (router bias excluded)."""
    c = config
    moe_layers = c.n_moe_layers
    inactive = moe_layers * (c.n_experts - c.top_k) * 3 * c.d_model * c.d_expert
    return active_params(c) + inactive


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> int:
    """Training FLOPs per token, nanoGPT's way: 6 per active parameter (forward 2 +
    backward 4) plus the attention scores and values, 12 * layers * heads * head_dim *
    seq_len. Like nanoGPT's count, the norm scales are in (about 0.05% here, no matmul);
    the input embedding lookup is no matmul and is left out; the output head is counted
    (it is the tied table, or its own matrix)."""
    c = config
    t = c.max_seq_len if seq_len is None else seq_len
    return 6 * matmul_params(c) + 12 * c.n_layers * c.n_heads * c.head_dim * t


def matmul_params(config: ModelConfig) -> int:
    """The N of `flops_per_token`'s 6N: `active_params` without the input embedding
    table when the head is a matrix of its own (a lookup, no matmul); the same as
    `active_params` when they are tied (the table is the head's matmul). The norm
    scales stay in, as nanoGPT counts them."""
    return active_params(config) - config.vocab_size * config.d_model * (0 if config.tie_embeddings else 1)
