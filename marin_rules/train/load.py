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

What the artifact's success record says is checked first, so a file edited or
damaged in place is refused in one line of that form, never served:
- the fields of `config.model` (and `config.seq_len`) the record's recipe gives must
  be those `model.json` holds (`check_model_json`): the record is what was built;
- the files of the checkpoint loaded must have the digests the record's
  `result.final_checkpoint_digests` gives (`checkpoint.model_digests`: orbax keeps
  no checksum, so bytes garbled in place may restore as other weights); a record
  written before digests were recorded is loaded as before;
- the tokenizer `model.json` names (in another artifact) must have the sizes its own
  record gives and parse (`check_tokenizer`), so export and evaluation never copy or
  use a cut-off one.
After the restore every weight must be finite (`check_finite`: a damaged or diverged run).

`dropless=True` (the default) swaps a `capacity` MoE backend for `ragged` (same
weights, same math, no capacity limit; `ModelConfig.dropless`): with capacity drops, the
tokens sharing a batch decide which of them are dropped, so a later token could
change an earlier token's output, which scoring and generation must not see.
`dropless=False` keeps the layer exactly as trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import ConfigError, MarinError, StepError
from marin_rules.artifacts.files import content_problems, recorded_digests, size_problems
from marin_rules.artifacts.records import Record, read_record, unreadable_file
from marin_rules.data.relative import resolve_location
from marin_rules.data.tokenizer import SPECIAL_TOKENS_FILE, TOKENIZER_ARTIFACT_FILES, load_special_tokens
from marin_rules.model.config import ModelConfig
from marin_rules.model.sharding import path_names
from marin_rules.model.transformer import MoETransformer
from marin_rules.train import checkpoint
from marin_rules.validation import check_fields

FIELD = "deps.model"


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
        raise unreadable_file(FIELD, info_location, location, e) from None
    record = read_record(location)  # None: a model not built by this workflow (nothing to check against)
    check_model_json(record, info, config, location)
    tokenizer = resolve_location(location, info.get("tokenizer", ""))
    check_tokenizer(tokenizer, location)
    if dropless:
        config = config.dropless()
    manager = checkpoint.open_manager(location, max_to_keep=None, read_only=True)
    try:
        step = step if step is not None else checkpoint.latest_step(manager)
        if step is None or step not in manager.all_steps():
            which = "no checkpoint" if step is None else f"no checkpoint {step}"
            raise StepError(f"{which} under {checkpoint.checkpoint_dir(location)}")
        check_digests(record, location, step)
        abstract = nnx.eval_shape(lambda: MoETransformer(config, rngs=nnx.Rngs(0)))
        graphdef, params, state = nnx.split(abstract, nnx.Param, ...)
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), {"params": params, "state": state}
        )
        weights = _restore(manager, location, step, target)
    finally:
        manager.close()
    check_finite(weights, location, step)
    model = nnx.merge(graphdef, weights["params"], weights["state"])
    return TrainedModel(
        model=model,
        config=config,
        tokenizer=tokenizer,
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
        raise unreadable_file(FIELD, folder, location, reason)
    return weights


def check_model_json(record: Record | None, info: dict, config: ModelConfig, location: str) -> None:
    """`model.json` against the train record at `location`: each field of `config.model`
    the recipe gives (compared as parsed, so `1e4` is `10000.0`), and `config.seq_len`,
    must hold in `model.json` (`config`: its model, as parsed); else the one-line
    `unreadable_file` naming the file and the field. No record: nothing to compare."""
    if record is None or record.step != "train":  # a user step's config means what it means to that step
        return
    recipe = record.config
    written = recipe.get("model") if isinstance(recipe.get("model"), dict) else {}
    try:  # the fields the recipe writes out, as parsed; a default the recipe leaves out may have changed since
        given = {k: v for k, v in check_fields(ModelConfig, written).items() if k in written}
    except ConfigError:  # a recipe of another marin-rules version: its values as written
        given = written
    stored = config.to_dict()
    where = storage.join(location, "model.json")
    for name, value in given.items():
        if name in stored and stored[name] != value:
            raise unreadable_file(FIELD, where, location, f"model.{name} is {stored[name]!r}, but the record of "
                                  f"{record.key} gives config.model.{name} = {value!r}")  # fmt: skip
    if "seq_len" in recipe and "seq_len" in info and info["seq_len"] != recipe["seq_len"]:
        raise unreadable_file(FIELD, where, location, f"seq_len is {info['seq_len']!r}, but the record of "
                              f"{record.key} gives config.seq_len = {recipe['seq_len']!r}")  # fmt: skip


def check_digests(record: Record | None, location: str, step: int) -> None:
    """The files of checkpoint `step` against the digests the train record at `location`
    holds for them (`checkpoint.model_digests`), before they are restored: the first that
    differs (or is missing) is the one-line `unreadable_file`. A record without digests
    (built before they were recorded), or a checkpoint they do not cover, is not checked."""
    result = record.result if record is not None and isinstance(record.result, dict) else {}
    digests = result.get(checkpoint.DIGESTS_KEY)
    if not isinstance(digests, dict):
        return
    mine = {rel: d for rel, d in digests.items() if isinstance(rel, str) and rel.startswith(f"checkpoints/{step}/")}
    problems = content_problems(location, mine)
    if problems:
        rel, line = next(iter(problems.items()))
        holds = f"the record of {record.key} holds in result.{checkpoint.DIGESTS_KEY}"
        reason = f"its bytes are not those whose digest {holds}"
        if line.startswith("missing "):
            reason = f"missing, though {holds} its digest"
        if len(problems) > 1:
            reason += f"; {len(problems) - 1} more file(s) of checkpoint {step} differ too"
        raise unreadable_file(FIELD, storage.join(location, rel), location, reason)


def check_finite(weights: Any, location: str, step: int) -> None:
    """Every floating weight restored from checkpoint `step` is finite (counted on its device);
    else the one-line `unreadable_file` naming the first parameter that is not."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(weights):
        if not jnp.issubdtype(getattr(leaf, "dtype", np.int32), jnp.floating):
            continue
        bad = int(jnp.size(leaf) - jnp.count_nonzero(jnp.isfinite(leaf)))  # on the device: no host copy
        if bad:
            name = ".".join(path_names(path))
            folder = storage.join(checkpoint.checkpoint_dir(location), str(step))
            raise unreadable_file(FIELD, folder, location, f"parameter {name} holds {bad} non-finite value(s) "
                                  "(nan or inf): a damaged checkpoint, or a run that diverged")  # fmt: skip


def check_special_ids(record: Record, folder: str) -> None:
    """The special-token ids of `special_tokens.json` in the tokenizer artifact at `folder`
    against those its record's result gives (`special_tokens`: {role: id}), for records
    without digests; a difference is the one-line `unreadable_file`."""
    recorded = record.result.get("special_tokens") if isinstance(record.result, dict) else None
    path = storage.join(folder, SPECIAL_TOKENS_FILE)
    if not isinstance(recorded, dict) or not storage.exists(path):
        return
    stored = {role: entry["id"] for role, entry in load_special_tokens(folder, FIELD).items()}
    for role, id_ in recorded.items():
        if stored.get(role) != id_:
            raise unreadable_file(FIELD, path, folder, f"the model's tokenizer {record.key}: {role} is "
                                  f"{stored.get(role)!r} there, but its record gives result.special_tokens.{role} = {id_!r}")  # fmt: skip


def check_tokenizer(tokenizer: str, model_location: str) -> None:
    """The tokenizer.json `model.json` names (`tokenizer`: in its own artifact, reached
    through deps.model) and the files beside it that consumers read: missing, or of
    another size than that artifact's record lists (`files.size_problems`), or a
    tokenizer.json that does not parse, is the one-line `unreadable_file` naming it
    with that artifact's rebuild command (the model's, at `model_location`, when the file
    model.json names is one the tokenizer's record does not list)."""
    from tokenizers import Tokenizer

    folder = storage.parent(tokenizer)
    record = read_record(folder)
    if record is not None:
        recorded = {name: record.files[name] for name in TOKENIZER_ARTIFACT_FILES if name in record.files}
        digests = {n: d for n, d in recorded_digests(record.result).items() if n in TOKENIZER_ARTIFACT_FILES}
        problems = [*size_problems(folder, recorded).items(), *content_problems(folder, digests).items()]
        for name, problem in problems:  # the first will do
            reason = f"the model's tokenizer {record.key}: {problem}"
            raise unreadable_file(FIELD, storage.join(folder, name), folder, reason)
        check_special_ids(record, folder)
    try:
        text = storage.read_text(tokenizer)
    except FileNotFoundError:
        # a name its tokenizer's record does not list: model.json is what is wrong (rebuild the model)
        owner = folder if record is not None and tokenizer.rstrip("/").rsplit("/", 1)[-1] in record.files else model_location
        raise unreadable_file(FIELD, tokenizer, owner, "missing, though the model's model.json names it") from None
    except UnicodeDecodeError as e:
        raise unreadable_file(FIELD, tokenizer, folder, e) from None
    try:
        Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on bad JSON
        raise unreadable_file(FIELD, tokenizer, folder, e) from None
