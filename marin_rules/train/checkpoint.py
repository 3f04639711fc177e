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

A checkpoint that does not restore (a damaged file, a cut-off copy) must not block
the run forever: `restore_latest` tries the steps newest first, says in one line which
one failed and why (the innermost cause: orbax wraps tensorstore's error in a dump of
its spec), and resumes from the newest that restores. Only then are the failed ones
set aside: moved to `.history/<UTC time>-damaged/checkpoints/<step>/` of the artifact,
where everything an artifact keeps but does not serve goes (old builds, stale
leftovers): kept for a look, not among the data files its success record lists, out of
orbax's sight and out of the way of the next save of that step (orbax refuses to save
onto an existing step, even with `force=True`). A run that keeps no history (a dev
version, `dev_versions.keeps_history`: its caller says so) deletes them instead, and
says so in the same line. When none
restores, the cause may as well be the code or the storage as the files, so nothing is
moved and the run stops with one line naming the folder and the fix (train from
scratch) instead of silently throwing the training away. On a multi-process run the
processes agree on every attempt, so all resume from the same step.

A checkpoint garbled in place may still restore: orbax stores zstd frames without a
checksum, so changed bytes can decode to other numbers (weights of 1e33). So process 0
notes the digests of every file of each checkpoint (orbax's commit notes aside, which
`neutral_commit_notes` rewrites) once it is committed, in `checkpoints/<step>.digests.json`
beside it (`record_step_digests`: when the next save begins, which waits for it, and
when the run's saves end, a stop's too; a listing's crc32c on gs://, one read of each
file locally), and `restore_latest` compares a checkpoint with them before restoring it:
one that differs does not restore, as a damaged one (a checkpoint saved before these
notes, or by a run killed before its note, is restored unchecked). The run's
result also records `final_checkpoint_digests` (`model_digests`: every file of the
final checkpoint's `model` item and its step metadata, `files.file_digests`), written by
process 0 once the last save is committed and its commit notes rewritten; `load_trained`
compares them before restoring.

Orbax understands local paths and `gs://` but not `file://`: `checkpoint_dir`
strips it and makes local paths absolute. Arrays are stored as plain zarr
(`use_ocdbt=False`): OCDBT's manifest needs conditional writes (object
generations) that GCS-compatible test servers such as gcp-storage-emulator do not
implement; for models of this size the per-array files cost nothing noticeable.
Orbax still tries to merge OCDBT files after every save and warns twice per
checkpoint that it found none ("Skipping merge of OCDBT checkpoints"); that one
message, expected with plain zarr, is dropped by a filter on the `absl` logger
(`QuietOcdbtMerge`), so job logs carry only warnings that mean something.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from typing import Any, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import FINAL_CHECKPOINT_DIGESTS, discard, file_digests, move_into_history
from marin_rules.artifacts.records import rebuild_hint
from marin_rules.dev_versions import DISCARDED
from marin_rules.train.recipe import COMMIT_NOTE, DIGESTS_SUFFIX  # orbax's mark of a finished checkpoint; the notes


OCDBT_MERGE_SKIPPED = "Skipping merge of OCDBT checkpoints"


class QuietOcdbtMerge(logging.Filter):
    """Drops orbax's warning that it found no OCDBT files to merge after a save: we
    store without OCDBT on purpose (`use_ocdbt=False`). Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return OCDBT_MERGE_SKIPPED not in str(record.msg)


_ABSL = logging.getLogger("absl")  # where absl.logging, which orbax logs with, sends its records
if not any(isinstance(f, QuietOcdbtMerge) for f in _ABSL.filters):
    _ABSL.addFilter(QuietOcdbtMerge())


def checkpoint_dir(output: str) -> str:
    """Where the run at `output` keeps its checkpoints, in a form orbax accepts."""
    return storage.join(_absolute(output), "checkpoints")


def _absolute(output: str) -> str:
    """`output` in a form orbax accepts: a URL as it is, a local path (or file://) absolute."""
    return output if storage.is_remote(output) else os.path.abspath(storage.local_path(output))


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
    """Start saving checkpoint `step` (asynchronous; the step must not exist yet)."""
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


DAMAGED = "damaged"
MAX_REASON_CHARS = 300


def failure_reason(error: BaseException) -> str:
    """One line on why a restore failed: the first line of the innermost cause."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    inner = seen[-1]
    lines = str(inner).strip().splitlines()
    text = f"{type(inner).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


# what orbax leaves behind when one array of a restore fails: the reads of the other
# arrays are abandoned, and each reports its own copy of the tensorstore dump (and its
# event loop's closing) as "Exception ignored" when it is collected
_ABANDONED_READS = ("Encountered error while reading array index", "Event loop is closed")


@contextlib.contextmanager
def quiet_abandoned_reads() -> Iterator[None]:
    """Drop orbax's reports of abandoned reads while a restore is tried and cleaned up;
    every other unraisable exception still reaches the previous hook. After a restore
    that failed the filter stays for the rest of the process: TensorStore finishes the
    abandoned reads on its own threads, and may report them after the collection here."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not str(unraisable.exc_value).startswith(_ABANDONED_READS):
            previous(unraisable)

    sys.unraisablehook = hook
    failed = True
    try:
        yield
        failed = False
    finally:
        gc.collect()  # the abandoned reads are reported now, while the hook drops them
        if not failed:
            sys.unraisablehook = previous


def _everywhere(ok: bool) -> bool:
    """True when `ok` holds on every process of the run (a collective on a multi-process run)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.array([ok]))))


def set_aside(output: str, step: int, keep_history: bool = True) -> str:
    """Move checkpoint `step` of the run at `output` under the artifact's `.history/`
    (`<UTC time>-damaged/checkpoints/<step>`), out of orbax's sight and out of the data
    files; returns where it went. Without `keep_history` (a dev version) it is deleted
    instead; returns DISCARDED."""
    if storage.exists(digests_file(output, step)):  # (its digests go with it: no orbax step names them now)
        discard(digests_file(output, step))
    if not keep_history:
        discard(storage.join(checkpoint_dir(output), str(step)))
        return DISCARDED
    return move_into_history(_absolute(output), f"checkpoints/{step}", DAMAGED)


def digests_file(output: str, step: int) -> str:
    """Where `record_step_digests` notes checkpoint `step`'s digests (beside its folder:
    a plain file, which orbax ignores)."""
    return storage.join(output, "checkpoints", f"{step}{DIGESTS_SUFFIX}")


def record_step_digests(output: str, step: int) -> None:
    """On process 0, once checkpoint `step` is committed: note the digest of each of its
    files but orbax's commit notes (rewritten later: `neutral_commit_notes`), and drop
    the notes of checkpoints orbax has deleted since (`max_to_keep`)."""
    digests = file_digests(output, f"checkpoints/{step}")
    storage.write_json_atomic(digests_file(output, step), {k: v for k, v in digests.items() if not _commit_note(k)})
    for path in storage.list_files(storage.join(output, "checkpoints"), f"*{DIGESTS_SUFFIX}"):
        name = path.rstrip("/").rsplit("/", 1)[-1].removesuffix(DIGESTS_SUFFIX)
        if name.isdigit() and not storage.exists(storage.join(output, "checkpoints", name)):
            discard(path)


def _commit_note(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] == COMMIT_NOTE


def changed_since_saved(output: str, step: int) -> str | None:
    """How checkpoint `step` differs from the digests noted when it was saved (its first
    changed or missing file); None when it matches or no note was made, or the note
    itself is damaged (said on stderr: the checkpoint is restored unchecked)."""
    from marin_rules.artifacts.files import content_problems

    path = digests_file(output, step)
    try:
        expected = storage.read_json(path)
    except FileNotFoundError:  # killed before its note was written, or saved by older code
        if jax.process_index() == 0:
            print(f"{path}: no such note (the run was killed before it, or older code saved it): restoring "
                  f"checkpoint {step} unchecked", file=sys.stderr, flush=True)  # fmt: skip
        return None
    except ValueError as e:  # the note, not the checkpoint, is damaged: no reason to drop the checkpoint
        expected = f"unreadable ({type(e).__name__})"
    if not isinstance(expected, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items()):
        why = expected if isinstance(expected, str) else "not a mapping of file digests"
        print(f"{path}: {why}; restoring checkpoint {step} unchecked", file=sys.stderr, flush=True)
        return None
    problems = list(content_problems(output, expected).values())
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}, since it was saved ({path})"


def restore_latest(
    manager: ocp.CheckpointManager, output: str, model: Any, optimizer: Any, keep_history: bool = True
) -> tuple[int, Any, Any]:
    """(step, model, optimizer) of the newest checkpoint of the run at `output` that
    restores, laid out like `model` and `optimizer`; (0, None, None) when there is none.
    Checkpoints newer than it are named on stderr and set aside (deleted without
    `keep_history`: `set_aside`); StepError when some exist but none restores."""
    folder = checkpoint_dir(output)
    failed: list[tuple[int, str]] = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:  # garbled in place, it may restore as other numbers: its digests first
            reason = changed_since_saved(output, step) or ""
        except Exception as error:  # noqa: BLE001 - its files cannot be read: try the one before
            reason = failure_reason(error)
        if _everywhere(not reason):  # every process restores, or none (orbax's restore ends in a barrier)
            try:
                with quiet_abandoned_reads():
                    weights, opt_state = restore(manager, step, model, optimizer)
            except Exception as error:  # noqa: BLE001 - any failure to read it: try the one before
                reason = failure_reason(error)
        else:
            reason = reason or "its files differ from its digests on another process of the run"
        if not _everywhere(not reason):
            reason = reason or "it did not restore on another process of the run"
            print(f"{storage.join(folder, str(step))}: checkpoint {step} does not restore ({reason}); "
                  "trying the one before", file=sys.stderr, flush=True)  # fmt: skip
            failed.append((step, reason))
            continue
        if failed:
            if jax.process_index() == 0:
                for bad, _ in failed:
                    left = set_aside(output, bad, keep_history)
                    where = left if left == DISCARDED else f"set aside as {left}"
                    print(f"{storage.join(folder, str(bad))}: {where}; resuming from checkpoint {step}",
                          file=sys.stderr, flush=True)  # fmt: skip
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                multihost_utils.sync_global_devices("marin_rules checkpoints set aside")
            manager.reload()
        return step, weights, opt_state
    if not failed:
        return 0, None, None
    step, reason = failed[0]
    earlier = f", nor does any of the {len(failed) - 1} before it" if len(failed) > 1 else ""
    raise NoCheckpointRestores(f"{storage.join(folder, str(step))}: checkpoint {step} does not restore ({reason}){earlier}", output)


class NoCheckpointRestores(StepError):
    """`restore_latest` found checkpoints and none restores: `what` (the newest, its
    cause), then the two fixes; the job completes the rebuild command with `with_flags`
    (as `records.CorruptRecord`'s), so that it runs as printed."""

    def __init__(self, what: str, output: str, flags: str = ""):
        self.what, self.output, self.flags = what, output, flags
        folder = checkpoint_dir(output)
        super().__init__(f"{what}; delete {folder} to train from scratch, or {rebuild_hint(output, flags)}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (NoCheckpointRestores, (self.what, self.output, self.flags))

    def with_flags(self, flags: str | None) -> NoCheckpointRestores:
        return NoCheckpointRestores(self.what, self.output, flags)


DIGESTS_KEY = FINAL_CHECKPOINT_DIGESTS  # in a train record's result


def model_digests(output: str, step: int) -> dict[str, str]:
    """The digests of the files of checkpoint `step` that a consumer restores (all but
    the `optimizer` item), by path relative to `output`. Call once saves have finished
    and `neutral_commit_notes` has run, on one process."""
    return file_digests(output, f"checkpoints/{step}", leave_out=("optimizer",))


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
