"""Checkpoints of a training run with orbax: save every N steps, resume from the last.

Model: `{output}/checkpoints/<step>/` holds one orbax checkpoint of the whole
training state in two items written by an `ocp.CheckpointManager`: `model`, the
pytree `{"params", "state"}` (weights and non-trained model variables such as the
quantile router bias: all evaluation needs), and `optimizer` (the optimizer state). The step number is the number of optimizer updates done,
which is also all the data loader needs (its batches are a pure function of the
step), so restoring a checkpoint and continuing gives the same run as never
stopping. Saves are asynchronous; `close()` waits for the last one. Every process
of a multi-process run calls the same methods: orbax coordinates who writes what.
Beside the step folders, `checkpoints/recipe.json` names the recipe they belong to
(`recipe.py`); orbax ignores plain files there.

Orbax ends every checkpoint (and each item) with a `commit_success.txt` whose text
names the absolute location it committed to; orbax only checks that the file
exists. `neutral_commit_notes` rewrites that text without the location once saves
have finished, so a finished artifact names no folder of the machine that built it
and reads the same after its prefix moved (`data/relative.py`).

Orbax understands local paths and `gs://` but not `file://`: `checkpoint_dir`
strips it and makes local paths absolute. Arrays are stored as plain zarr
(`use_ocdbt=False`): OCDBT's manifest needs conditional writes (object
generations) that GCS-compatible test servers such as gcp-storage-emulator do not
implement; for models of this size the per-array files cost nothing noticeable.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from marin_rules.artifacts import storage


def checkpoint_dir(output: str) -> str:
    """Where the run at `output` keeps its checkpoints, in a form orbax accepts."""
    location = storage.join(output, "checkpoints")
    if storage.is_remote(location):
        return location
    return os.path.abspath(storage.local_path(location))


def open_manager(output: str, *, max_to_keep: int | None = 2, read_only: bool = False) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        create=not read_only,  # read_only=True would warn on every load; we just never save
        enable_async_checkpointing=not read_only,
    )
    handler = ocp.StandardCheckpointHandler(use_ocdbt=False)
    return ocp.CheckpointManager(
        checkpoint_dir(output), options=options, item_handlers={"model": handler, "optimizer": handler}
    )


def abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of a pytree of arrays: the target of a restore."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def save(manager: ocp.CheckpointManager, step: int, model: Any, optimizer: Any) -> None:
    """Start saving checkpoint `step` (asynchronous; replaces an existing one)."""
    manager.save(
        step,
        args=ocp.args.Composite(model=ocp.args.StandardSave(model), optimizer=ocp.args.StandardSave(optimizer)),
        force=True,
    )


def latest_step(manager: ocp.CheckpointManager) -> int | None:
    return manager.latest_step()


def restore(manager: ocp.CheckpointManager, step: int, model: Any, optimizer: Any = None) -> tuple[Any, Any]:
    """Checkpoint `step` laid out like the pytrees `model` and `optimizer` (arrays or
    ShapeDtypeStructs with shardings); without `optimizer`, only the model item."""
    items = {"model": ocp.args.StandardRestore(abstract(model))}
    if optimizer is not None:
        items["optimizer"] = ocp.args.StandardRestore(abstract(optimizer))
    restored = manager.restore(step, args=ocp.args.Composite(**items))
    return restored["model"], restored["optimizer"] if optimizer is not None else None


COMMIT_NOTE = "commit_success.txt"
NEUTRAL_NOTE = "Checkpoint commit was successful"


def neutral_commit_notes(output: str) -> None:
    """Rewrite orbax's commit notes under `{output}/checkpoints` without their location
    (call after `wait_until_finished`, on one process)."""
    root = storage.join(output, "checkpoints")
    if not storage.exists(root):
        return
    for location in storage.walk_files(root):
        if location.rsplit("/", 1)[-1] == COMMIT_NOTE and storage.read_text(location) != NEUTRAL_NOTE:
            storage.write_text_atomic(location, NEUTRAL_NOTE)
