"""The chunked head + cross-entropy (model/head_loss.py) is the plain one: the same
loss and gradients as autodiff through the whole [B, T, V] logits, in f32 and in
bf16, with the sequence cut into several chunks; and loss_and_aux uses it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from marin_rules.model import head_loss
from marin_rules.model.config import ModelConfig
from marin_rules.model.head_loss import head_cross_entropy
from marin_rules.model.transformer import MoETransformer, loss_and_aux


def plain_cross_entropy(hidden, head, targets):
    logits = jnp.einsum("btd,dv->btv", hidden, head, preferred_element_type=jnp.float32)
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - target)


def _inputs(dtype, B=2, T=384, D=16, V=300):
    keys = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(keys[0], (B, T, D)).astype(dtype)
    head = (0.3 * jax.random.normal(keys[1], (D, V))).astype(dtype)
    targets = jax.random.randint(keys[2], (B, T), 0, V)
    return hidden, head, targets


# f32: sums in another order, up to 1.3e-6 of the largest entry seen (XLA's CPU reductions
# split differently under load), so 5e-6
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 5e-6), (jnp.bfloat16, 2e-2)])
def test_chunked_loss_and_gradients_equal_autodiff_through_the_whole_logits(dtype, tol):
    hidden, head, targets = _inputs(dtype)
    assert head_loss._chunk_length(2, 384) == 192  # two chunks of the sequence: the scan really loops
    grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))  # noqa: E731
    (loss, (d_h, d_head)), (want, (want_h, want_head)) = grad(head_cross_entropy)(hidden, head, targets), grad(
        plain_cross_entropy
    )(hidden, head, targets)
    np.testing.assert_allclose(loss, want, rtol=1e-6)  # the loss is f32 either way
    assert d_h.dtype == hidden.dtype and d_head.dtype == head.dtype
    for got, ref in ((d_h, want_h), (d_head, want_head)):
        scale = float(jnp.max(jnp.abs(ref.astype(jnp.float32))))
        assert float(jnp.max(jnp.abs(got.astype(jnp.float32) - ref.astype(jnp.float32)))) <= tol * scale
    # undifferentiated (a validation loss): the same value, the loss alone
    np.testing.assert_allclose(jax.jit(head_cross_entropy)(hidden, head, targets), want, rtol=1e-6)


def test_chunks_take_every_row_and_at_most_chunk_tokens():
    assert head_loss._chunk_length(8, 128) == 64  # 8 rows x 64 = 512 tokens
    assert head_loss._chunk_length(1, 2048) == 512
    assert head_loss._chunk_length(1024, 128) == 1  # more rows than CHUNK_TOKENS: one position at a time
    assert head_loss._chunk_length(8, 127) == 127  # a prime length: one chunk, not 127 tiny ones
    assert head_loss._chunk_length(8, 100) == 50
    x = jnp.arange(2 * 6 * 3).reshape(2, 6, 3)
    np.testing.assert_array_equal(head_loss._unchunk(head_loss._chunks(x, 2)), x)


def test_training_loss_is_the_cross_entropy_of_the_models_logits():
    config = ModelConfig(vocab_size=97, max_seq_len=16, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
                         d_ff=64, n_experts=4, top_k=2, d_expert=32)  # fmt: skip
    model = MoETransformer(config, rngs=nnx.Rngs(0))
    batch = jax.random.randint(jax.random.key(1), (4, 17), 0, 97, dtype=jnp.int32)
    _, metrics = nnx.jit(loss_and_aux)(model, batch)
    logits, _ = model(batch[:, :-1])
    target = jnp.take_along_axis(logits, batch[:, 1:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(metrics["ce_loss"], jnp.mean(jax.nn.logsumexp(logits, axis=-1) - target), rtol=1e-6)
