"""Resuming from checkpoints that do not restore, with real orbax checkpoints of small
pytrees: a damaged newest checkpoint is named in one line, set aside (kept under the
artifact's `.history/`, not among its data files) and the one before it is resumed
from; saving that step again then works (a dev version's is deleted instead). When no
checkpoint restores the run stops with one line naming the folder and the fix, and
nothing is moved. Saving logs none of orbax's warnings about OCDBT, which we do not use."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from marin_rules.artifacts.errors import StepError
from marin_rules.artifacts.files import list_data_files
from marin_rules.train import checkpoint

GARBAGE = b"not a zstd frame " * 8
# orbax leaves the reads of the other arrays of a failed restore unawaited; Python reports
# them when they are collected, after the failure was handled
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def weights(scale: float) -> tuple[dict, dict]:
    model = {"params": {"w": jnp.arange(64.0) * scale}, "state": {"b": jnp.full(3, scale)}}
    return model, {"mu": jnp.full(64, -scale)}


def saved_run(output: Path, steps: tuple[int, ...]) -> None:
    manager = checkpoint.open_manager(str(output))
    for step in steps:
        checkpoint.save(manager, step, *weights(float(step)))
    manager.close()


def damage(output: Path, step: int) -> Path:
    target = output / "checkpoints" / str(step) / "model" / "params.w" / "0"
    assert target.is_file()
    target.write_bytes(GARBAGE)
    return target


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_one_before_resumed(tmp_path, capsys):
    output = tmp_path / "run"
    saved_run(output, (1, 2))
    damage(output, 2)
    manager = checkpoint.open_manager(str(output))
    try:
        step, model, optimizer = checkpoint.restore_latest(manager, str(output), *weights(0.0))
        assert step == 1
        np.testing.assert_array_equal(model["params"]["w"], np.arange(64.0))
        np.testing.assert_array_equal(optimizer["mu"], np.full(64, -1.0))
        err = capsys.readouterr().err.splitlines()
        folder = output / "checkpoints"
        unchecked = [line for line in err if ": no such note (" in line]  # saved here without digests notes
        assert [line.rsplit(" ", 2)[-2] for line in unchecked] == ["2", "1"]  # "restoring checkpoint N unchecked"
        err = [line for line in err if line not in unchecked]
        assert err[0].startswith(f"{folder / '2'}: checkpoint 2 does not restore (ValueError: ")
        assert "ZSTD" in err[0] and err[0].endswith("; trying the one before")
        assert "TensorStore(" not in "\n".join(err) and len(err) == 2
        (aside,) = (output / ".history").glob("*-damaged/checkpoints/2")
        assert err[1] == f"{folder / '2'}: set aside as {aside}; resuming from checkpoint 1"
        assert (aside / "model" / "params.w" / "0").read_bytes() == GARBAGE  # kept as it was
        files = list_data_files(str(output))  # what a success record would list
        assert files and all(f.startswith("checkpoints/1/") for f in files), files
        assert manager.all_steps() == [1]
        checkpoint.save(manager, 2, *weights(2.0))  # the resumed run reaches step 2 again: no collision
        manager.wait_until_finished()
        step, model, _ = checkpoint.restore_latest(manager, str(output), *weights(0.0))
        assert step == 2 and float(model["state"]["b"][0]) == 2.0
    finally:
        manager.close()


def test_a_dev_versions_damaged_checkpoint_is_discarded_not_kept_in_history(tmp_path, capsys):
    # a dev version keeps no history (`dev_versions.keeps_history`): what it sets aside would pile up
    output = tmp_path / "run"
    saved_run(output, (1, 2))
    damage(output, 2)
    manager = checkpoint.open_manager(str(output))
    try:
        step, _, _ = checkpoint.restore_latest(manager, str(output), *weights(0.0), keep_history=False)
        assert step == 1 and manager.all_steps() == [1]
    finally:
        manager.close()
    folder = output / "checkpoints"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{folder / '2'}: discarded (a dev version keeps no history); resuming from checkpoint 1"
    )
    assert not (folder / "2").exists() and not (output / ".history").exists()


def test_when_no_checkpoint_restores_the_run_stops_in_one_line_and_moves_nothing(tmp_path):
    output = tmp_path / "run"
    saved_run(output, (1, 2))
    damage(output, 1)
    damage(output, 2)
    before = sorted(p.name for p in (output / "checkpoints").iterdir())
    manager = checkpoint.open_manager(str(output))
    try:
        with pytest.raises(StepError) as e:
            checkpoint.restore_latest(manager, str(output), *weights(0.0))
    finally:
        manager.close()
    message = str(e.value)
    folder = output / "checkpoints"
    assert "\n" not in message and len(message) < 700
    assert message.startswith(f"{folder / '2'}: checkpoint 2 does not restore (ValueError: ")
    assert ", nor does any of the 1 before it; " in message
    assert message.endswith(f"delete {folder} to train from scratch, or rebuild it with: "
                            f"snakemake -f {output / '.artifact.json'}")  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == before
    # the job completes the command with the run's flags (`run.hint_flags`), as for a corrupt record
    flags = "-s /w/Snakefile --configfile /w/exp.yaml --config prefix=/p"
    assert str(e.value.with_flags(flags)) == f"{message} {flags}"
    assert str(pickle.loads(pickle.dumps(e.value.with_flags(flags)))) == f"{message} {flags}"  # (a pod's processes)


def test_a_run_without_checkpoints_starts_at_step_zero(tmp_path):
    manager = checkpoint.open_manager(str(tmp_path / "run"))
    try:
        assert checkpoint.restore_latest(manager, str(tmp_path / "run"), *weights(0.0)) == (0, None, None)
    finally:
        manager.close()


def test_saving_a_checkpoint_logs_no_ocdbt_merge_warning_and_other_absl_warnings_still_show(tmp_path, caplog):
    # without OCDBT (use_ocdbt=False, on purpose) orbax warned twice per save that it had nothing to merge
    with caplog.at_level(logging.INFO):
        saved_run(tmp_path / "run", (1,))
        logging.getLogger("absl").warning("another absl warning")
    messages = [record.getMessage() for record in caplog.records]
    assert (tmp_path / "run" / "checkpoints" / "1").is_dir()
    assert not [m for m in messages if checkpoint.OCDBT_MERGE_SKIPPED in m], messages
    assert "another absl warning" in messages


def test_a_checkpoint_of_optax_muons_state_resumes_under_the_trainers_muon(tmp_path):
    # the trainer used optax.contrib.muon until train/muon.py replaced its update; a run
    # stopped before that must resume after it: the same state layout, restored by orbax
    import jax
    import optax
    from optax.contrib import MuonDimensionNumbers

    from marin_rules.train.muon import muon_transform

    params = {"w_gate": jnp.ones((2, 8, 12)), "w_o": jnp.ones((8, 8)), "w_down": jnp.ones((12, 8))}
    lr = optax.constant_schedule(0.02)
    dims = lambda tree: jax.tree.map(lambda x: MuonDimensionNumbers(x.ndim - 2, x.ndim - 1), tree)  # noqa: E731
    before = optax.contrib.muon(lr, beta=0.95, weight_decay=0.1, muon_weight_dimension_numbers=dims)
    now = muon_transform(0.95, 0.1, lr)
    grads = jax.tree.map(lambda x: x * 0.5, params)
    _, old_state = before.update(grads, before.init(params), params)  # one update: momentum not zero
    assert jax.tree_util.tree_structure(now.init(params)) == jax.tree_util.tree_structure(old_state)
    manager = checkpoint.open_manager(str(tmp_path / "run"))
    checkpoint.save(manager, 1, {"params": params}, old_state)
    manager.close()
    manager = checkpoint.open_manager(str(tmp_path / "run"))
    step, _, restored = checkpoint.restore_latest(manager, str(tmp_path / "run"), {"params": params}, now.init(params))
    manager.close()
    assert step == 1
    for got, saved in zip(jax.tree.leaves(restored), jax.tree.leaves(old_state)):
        np.testing.assert_array_equal(got, saved)  # the momentum and counts, as saved
    expected, _ = before.update(grads, old_state, params)
    got, _ = now.update(grads, restored, params)  # the next update continues the same run
    for name in params:
        assert float(jnp.abs(got[name] - expected[name]).max()) <= 1e-5 * float(jnp.abs(expected[name]).max())


def test_the_digests_of_a_checkpoint_cover_what_consumers_restore_and_see_bytes_garbled_in_place(tmp_path):
    from marin_rules.artifacts.files import content_problems

    output = tmp_path / "run"
    saved_run(output, (1, 2))
    checkpoint.neutral_commit_notes(str(output))
    digests = checkpoint.model_digests(str(output), 2)
    assert "checkpoints/2/model/params.w/0" in digests and "checkpoints/2/_CHECKPOINT_METADATA" in digests
    assert all(rel.startswith("checkpoints/2/") and "/optimizer/" not in rel for rel in digests)
    assert all(d.startswith("xxh3:") for d in digests.values())
    assert content_problems(str(output), digests) == {}
    chunk = output / "checkpoints/2/model/params.w/0"
    data = bytearray(chunk.read_bytes())
    data[10:14] = b"XXXX"  # same size: the record's size check cannot see it
    chunk.write_bytes(bytes(data))
    (output / "checkpoints/2/model/_METADATA").unlink()
    garbled = digests["checkpoints/2/model/params.w/0"]
    assert list(content_problems(str(output), digests).values()) == [  # in the order of the digests: by path
        "missing checkpoints/2/model/_METADATA",
        f"changed checkpoints/2/model/params.w/0: its content is not what was recorded ({garbled})",
    ]


def test_on_gcs_the_digests_are_the_stores_own_crc32c_and_still_see_bytes_garbled_in_place(gcs_prefix):
    import xxhash

    from marin_rules.artifacts import storage
    from marin_rules.artifacts.files import content_problems, file_digests

    for rel, data in {"checkpoints/3/model/a/0": b"a" * 40, "checkpoints/3/_CHECKPOINT_METADATA": b"{}",
                      "checkpoints/3/optimizer/mu/0": b"m" * 40}.items():  # fmt: skip
        storage.write_bytes_atomic(f"{gcs_prefix}/{rel}", data)
    digests = file_digests(gcs_prefix, "checkpoints/3", leave_out=("optimizer",))
    assert sorted(digests) == ["checkpoints/3/_CHECKPOINT_METADATA", "checkpoints/3/model/a/0"]
    assert all(d.startswith("crc32c:") for d in digests.values())  # from the listing: nothing downloaded
    local = {"checkpoints/3/model/a/0": "xxh3:" + xxhash.xxh3_64_hexdigest(b"a" * 40)}  # a prefix copied from disk
    assert content_problems(gcs_prefix, digests) == {} and content_problems(gcs_prefix, local) == {}
    storage.write_bytes_atomic(f"{gcs_prefix}/checkpoints/3/model/a/0", b"a" * 20 + b"X" * 4 + b"a" * 16)
    for expected in (digests, local):
        (line,) = content_problems(gcs_prefix, expected).values()
        assert line.startswith("changed checkpoints/3/model/a/0: its content is not what was recorded")
