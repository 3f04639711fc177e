"""A trained model back from its artifact: `load_trained(location)`.

Model: a `train` artifact holds `model.json` (the model config, the tokenizer's
location, the final step) and `checkpoints/<step>/model` (weights and router
bias). `load_trained` rebuilds the module from the config and fills it with the
weights of the latest (or a given) checkpoint, on this process's first device,
whatever mesh or process count trained it. Works on local paths and gs://, and
after the artifact's prefix moved (the tokenizer's location in `model.json` is
relative to the artifact). A checkpoint that does not restore (a damaged file of
the right size, which `marin verify` cannot see) is one line naming `deps.model`,
the checkpoint, the innermost cause and the rebuild command (`records.unreadable_file`).

`dropless=True` (the default) swaps a `capacity` MoE backend for `ragged` (same
weights, same math, no capacity limit; `moe.dropless`): with capacity drops, the
tokens sharing a batch decide which of them are dropped, so a later token could
change an earlier token's output, which scoring and generation must not see.
`dropless=False` keeps the layer exactly as trained.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError, StepError
from marin_rules.artifacts.records import unreadable_file
from marin_rules.data.relative import resolve_location
from marin_rules.model.config import ModelConfig
from marin_rules.model.moe import dropless as dropless_impl
from marin_rules.model.transformer import MoETransformer
from marin_rules.train import checkpoint


@dataclass(frozen=True)
class TrainedModel:
    model: MoETransformer  # ready to call: model(tokens [B, T]) -> (logits, aux)
    config: ModelConfig
    tokenizer: str  # location of tokenizer.json (tokenizers.Tokenizer.from_file)
    step: int = 0  # the checkpoint the weights come from
    seq_len: int = 0  # the context length it was trained on
    eos_id: int | None = None


def load_trained(location: str, step: int | None = None, *, dropless: bool = True) -> TrainedModel:
    """The model trained at `location` (a train artifact), with its latest weights
    (or those of checkpoint `step`); see the module docstring for `dropless`."""
    info_location = storage.join(location, "model.json")
    if not storage.exists(info_location):
        raise StepError(f"{info_location} not found: is {location} a finished train artifact?")
    try:
        info = storage.read_json(info_location)
        config = ModelConfig.from_dict(info["model"])
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, MarinError) as e:
        raise unreadable_file("deps.model", info_location, location, e) from None
    if dropless:
        config = dataclasses.replace(config, moe_impl=dropless_impl(config.moe_impl))
    manager = checkpoint.open_manager(location, max_to_keep=None, read_only=True)
    try:
        step = step if step is not None else checkpoint.latest_step(manager)
        if step is None or step not in manager.all_steps():
            which = "no checkpoint" if step is None else f"no checkpoint {step}"
            raise StepError(f"{which} under {checkpoint.checkpoint_dir(location)}")
        abstract = nnx.eval_shape(lambda: MoETransformer(config, rngs=nnx.Rngs(0)))
        graphdef, params, state = nnx.split(abstract, nnx.Param, ...)
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), {"params": params, "state": state}
        )
        weights = _restore(manager, location, step, target)
    finally:
        manager.close()
    model = nnx.merge(graphdef, weights["params"], weights["state"])
    return TrainedModel(
        model=model,
        config=config,
        tokenizer=resolve_location(location, info.get("tokenizer", "")),
        step=step,
        seq_len=info.get("seq_len", config.max_seq_len),
        eos_id=info.get("eos_id"),
    )


def _restore(manager: Any, location: str, step: int, target: Any) -> Any:
    """The model item of checkpoint `step`, or the one-line `unreadable_file` error when
    it does not restore, named as training's resume names it (`checkpoint.failure_reason`:
    the innermost cause, not orbax's dump of the tensorstore spec). A consumer never
    sets an upstream's checkpoint aside: rebuilding the artifact is the fix."""
    reason = ""
    try:  # the failure leaves the quiet raising, so its filter stays for reads TensorStore reports later
        with checkpoint.quiet_abandoned_reads():  # orbax's abandoned reads of the other arrays, each a spec dump
            weights, _ = checkpoint.restore(manager, step, target)
    except Exception as e:  # noqa: BLE001 - any failure to read it, as training's resume (restore_latest)
        reason = checkpoint.failure_reason(e)
    if reason:
        folder = storage.join(checkpoint.checkpoint_dir(location), str(step))
        raise unreadable_file("deps.model", folder, location, reason)
    return weights
