"""The train step end to end, on real Shakespeare tokens, in real processes.

One uninterrupted run of a tiny MoE (1 device, 2 accumulated micro-batches) is the
reference. A run killed with SIGKILL after a checkpoint and started again ends
BITWISE identical to it (the same float losses at every logged step and at the
end), and so does a run whose artifact lives on gs:// (a local emulator). A run
split over 2 processes x 4 CPU devices joined by `jax.distributed`, on a (data=4,
expert=2) mesh with the same 2 global micro-batches, is not bitwise (reductions over 8
devices add in another order): its losses match to 1e-6 relative through step 10, to
1e-4 at the end (a near-tie in top-k routing amplifies the rounding). A copy of the reference cut
back to checkpoint 10 stands in for a killed run where only the rerun matters: one
with a changed recipe must refuse to resume and touch nothing, one that only logs
and checkpoints more often must resume. All runs share a JAX compilation cache so
each program is compiled about once.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from marin_rules.artifacts import storage
from snakemake_executor_plugin_tpu.local_pod import free_port
from marin_rules.model.config import ModelConfig
from marin_rules.model.flops import flops_per_token
from train_helpers import runs
from train_helpers.tokens import make_tokens

pytestmark = pytest.mark.slow
STEPS = 20
SAVE_LOOKS_S = 1000.0  # the baseline's checkpoint saves look this long to its clocks (run_train.py)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    return make_tokens(str(tmp_path_factory.mktemp("train-tokens")))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("jax-cache"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, tokens, cache) -> tuple[dict, Path]:
    work = tmp_path_factory.mktemp("baseline")
    output = work / "artifact"
    spec = runs.write_spec(work / "spec.json", output=str(output), config=runs.tiny_config(), data=tokens,
                           compile_cache=cache, save_looks_s=SAVE_LOOKS_S)  # fmt: skip
    return runs.run(spec, runs.train_env(1), work / "log"), output


def read_metrics(location: str) -> list[dict]:
    return [json.loads(line) for line in storage.read_text(location).splitlines()]


def losses(output) -> list[tuple[str, int, float]]:
    """(split, step, loss) of every record of a run's metrics log."""
    return [(r["split"], r["step"], r["loss"]) for r in read_metrics(str(output) + "/metrics.jsonl")]


def assert_same_run(run: dict, output, reference: dict, reference_output, rel: float = 0.0,
                    early: tuple[int, float] | None = None) -> None:  # fmt: skip
    """The same losses at every logged step and at the end: bitwise (== on floats)
    with rel=0, else within `rel`; with `early` = (step, tolerance), the losses logged
    up to that step within that tighter tolerance."""
    got, want = losses(output), losses(reference_output)
    assert [r[:2] for r in got] == [r[:2] for r in want]
    ends = [(run["final_train_loss"], reference["final_train_loss"]), (run["final_val_loss"], reference["final_val_loss"])]
    for step, a, b in [(g[1], g[2], w[2]) for g, w in zip(got, want)] + [(None, *end) for end in ends]:
        tolerance = early[1] if early is not None and step is not None and step <= early[0] else rel
        assert a == b if tolerance == 0 else a == pytest.approx(b, rel=tolerance), (step, a, b)


def test_uninterrupted_run_writes_metrics_plot_model_and_checkpoints(baseline, tokens):
    result, output = baseline
    records = read_metrics(str(output / "metrics.jsonl"))
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    assert [r["step"] for r in train] == list(range(5, STEPS + 1, 5))
    assert [r["step"] for r in val] == [10, 20]
    for key in ("loss", "balance_loss", "z_loss", "dropped_fraction", "lr", "grad_norm", "tokens"):
        assert all(math.isfinite(r[key]) for r in train), key
    assert np.asarray(train[-1]["expert_load"]).shape == (2, 4)  # [MoE layers, experts]
    assert np.allclose(np.sum(train[-1]["expert_load"], axis=1), 1.0, atol=1e-3)
    fpt = flops_per_token(ModelConfig.from_dict(runs.TINY_MODEL, vocab_size=512), 32)
    assert result["flops_per_token"] == fpt
    for r in train[1:]:  # MFU: tokens/s x FLOPs per token over the injected run-wide peak
        assert r["tokens_per_s"] > 0 and r["mfu"] == pytest.approx(r["tokens_per_s"] * fpt / runs.PEAK_FLOPS, rel=1e-9)
        # the window after the save at step 10 times its updates, not the save (which looks 1000 s long)
        assert 5 * 16 * 32 / r["tokens_per_s"] < SAVE_LOOKS_S / 10, r
    assert train[-1]["loss"] < train[0]["loss"] - 0.3  # it learns
    assert (output / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    info = json.loads((output / "model.json").read_text())
    assert info["final_step"] == STEPS and info["vocab_size"] == 512 and info["seq_len"] == 32
    assert info["model"]["d_model"] == 32 and info["model"]["vocab_size"] == 512
    assert info["tokenizer"].endswith("tokenizer.json") and (output / info["tokenizer"]).exists()
    assert not os.path.isabs(info["tokenizer"])  # relative to the artifact: the prefix may move
    assert str(STEPS) in {p.name for p in (output / "checkpoints").iterdir()}
    recipe = json.loads((output / "checkpoints" / "recipe.json").read_text())
    assert recipe == {"config": runs.tiny_config(), "deps": {"data": os.path.relpath(tokens, output)}}


def test_result_reports_losses_baseline_throughput_and_mfu(baseline):
    result, _ = baseline
    assert result["steps"] == STEPS and result["tokens_seen"] == STEPS * 16 * 32
    assert result["final_val_loss"] < math.log(512)  # better than uniform
    assert 4.0 < result["unigram_val_loss"] < math.log(512)
    assert result["params"] > result["active_params"] > 0
    assert result["peak_flops"] == runs.PEAK_FLOPS and result["tokens_per_s"] > 0
    assert result["mfu"] == pytest.approx(result["tokens_per_s"] * result["flops_per_token"] / runs.PEAK_FLOPS, rel=1e-9)
    assert result["resumed_from_step"] == 0


def test_result_gives_the_digests_of_the_files_beside_the_checkpoints(baseline):
    """metrics.jsonl, loss.png and model.json by content (`marin verify`, the report)."""
    from marin_rules.artifacts.files import content_problems, named_digests

    result, output = baseline
    names = ("metrics.jsonl", "loss.png", "model.json")
    assert result["file_digests"] == named_digests(str(output), names) and set(result["file_digests"]) == set(names)
    assert content_problems(str(output), result["file_digests"]) == {}


def test_load_trained_gives_the_final_validation_loss(baseline, tokens):
    import jax

    from marin_rules.data.loader import make_loader
    from marin_rules.model.transformer import loss_and_aux
    from marin_rules.train.load import load_trained

    result, output = baseline
    trained = load_trained(str(output))
    assert trained.step == STEPS and trained.config.d_model == 32 and trained.seq_len == 32
    assert Path(trained.tokenizer).is_file() and trained.tokenizer.endswith("tokenizer.json")
    val = make_loader(tokens, split="validation", seq_len=32, batch_size=16, seed=0)  # batch_size rows
    loss = jax.jit(lambda tokens: loss_and_aux(trained.model, tokens)[1]["ce_loss"])
    mean = float(np.mean([loss(val.batch(s)) for s in range(2)]))
    assert mean == pytest.approx(result["final_val_loss"], abs=1e-5)


def test_validation_sees_the_same_sequences_whatever_the_accumulation(baseline, tokens, cache, tmp_path):
    # validation batches are batch_size rows, run as micro-batches: with accumulation
    # they once were micro-batches, so fewer sequences (and another unigram baseline)
    result, _ = baseline  # grad_accum_steps 2
    spec = runs.write_spec(tmp_path / "spec.json", output=str(tmp_path / "artifact"),
                           config=runs.tiny_config(grad_accum_steps=1), data=tokens, compile_cache=cache)  # fmt: skip
    single = runs.run(spec, runs.train_env(1), tmp_path / "log")
    # the very same validation tokens (the final losses differ: the MoE's routing
    # statistics are per micro-batch, so the two runs train differently)
    assert single["unigram_val_loss"] == result["unigram_val_loss"]


def test_resume_after_kill_ends_bitwise_identical_to_the_uninterrupted_run(baseline, tokens, cache, tmp_path):
    result, _ = baseline
    output = tmp_path / "artifact"
    spec = runs.write_spec(tmp_path / "spec.json", output=str(output), config=runs.tiny_config(), data=tokens,
                           compile_cache=cache)  # fmt: skip
    env = runs.train_env(1)
    proc = runs.start(spec, env, tmp_path / "killed")
    runs.wait_for(lambda: (output / "checkpoints" / "10").is_dir(), proc, 120, "checkpoint 10")
    # checkpoint 10 is complete (orbax renames its temporary folder last): kill now
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (output / "model.json").exists()  # it really died before the end
    resumed = runs.run(spec, env, tmp_path / "resumed")
    assert 10 <= resumed["resumed_from_step"] < STEPS
    assert_same_run(resumed, output, result, baseline[1])  # bitwise; one log, as if never interrupted


def test_a_stop_while_a_checkpoint_is_written_finishes_it_and_the_run_resumes_from_it(baseline, tokens, cache, tmp_path):
    """SIGTERM right after checkpoint 10's save began (asynchronous: still being written)
    stops the step as a job's stop does; the save is finished before the process ends,
    and the next run resumes from it, bitwise the uninterrupted run."""
    result, _ = baseline
    output = tmp_path / "artifact"
    spec = runs.write_spec(tmp_path / "spec.json", output=str(output), config=runs.tiny_config(), data=tokens,
                           compile_cache=cache, stop_after_save=10)  # fmt: skip
    env = runs.train_env(1)
    proc = runs.start(spec, env, tmp_path / "stopped")
    assert proc.wait(timeout=300) != 0
    assert "JobTerminated: terminated by signal SIGTERM" in runs.tail(tmp_path / "stopped")
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == ["10", "10.digests.json", "recipe.json"]  # committed, no tmp
    again = runs.write_spec(tmp_path / "again.json", output=str(output), config=runs.tiny_config(), data=tokens,
                            compile_cache=cache)  # fmt: skip
    resumed = runs.run(again, env, tmp_path / "resumed")
    assert resumed["resumed_from_step"] == 10
    assert_same_run(resumed, output, result, baseline[1])


def killed_at_10(baseline_output: Path, dest: Path) -> Path:
    """A copy of the reference run as a run killed after checkpoint 10 leaves it."""
    shutil.copytree(baseline_output, dest)
    shutil.rmtree(dest / "checkpoints" / str(STEPS))
    for name in ("model.json", "loss.png", f"checkpoints/{STEPS}.digests.json"):
        (dest / name).unlink()
    assert sorted(p.name for p in (dest / "checkpoints").iterdir()) == ["10", "10.digests.json", "recipe.json"]
    return dest


def stopped_after_the_last_save(baseline_output: Path, output: Path) -> Path:
    """A copy of the reference run as a stop right after saving its last checkpoint leaves
    it at `output`; returns the first weights chunk of that checkpoint (to damage)."""
    shutil.copytree(baseline_output, output)
    for name in ("model.json", "loss.png"):
        (output / name).unlink()
    return sorted((output / "checkpoints" / str(STEPS) / "model").glob("params.*/0*"))[0]


def resumed_from_10_as_never_damaged(baseline, output: Path, tokens, cache, tmp_path: Path) -> str:
    """Resume the run at `output`: from checkpoint 10, ending bitwise as the reference run;
    returns its log."""
    result, baseline_output = baseline
    spec = runs.write_spec(tmp_path / "spec.json", output=str(output), config=runs.tiny_config(), data=tokens,
                           compile_cache=cache)  # fmt: skip
    resumed = runs.run(spec, runs.train_env(1), tmp_path / "log")
    assert resumed["resumed_from_step"] == 10
    assert_same_run(resumed, output, result, baseline_output)
    return runs.tail(tmp_path / "log")


def test_a_damaged_last_checkpoint_is_set_aside_and_the_run_resumes_bitwise_from_the_one_before(baseline, tokens, cache, tmp_path):
    output = tmp_path / "artifact"
    chunk = stopped_after_the_last_save(baseline[1], output)
    chunk.write_bytes(os.urandom(chunk.stat().st_size))
    (output / "checkpoints" / f"{STEPS}.digests.json").unlink()  # no note of its digests: orbax's own failure
    err = resumed_from_10_as_never_damaged(baseline, output, tokens, cache, tmp_path)
    baseline_output = baseline[1]
    bad = output / "checkpoints" / str(STEPS)
    assert f"{bad}: checkpoint {STEPS} does not restore (ValueError: " in err and "TensorStore(" not in err
    (aside,) = (output / ".history").glob(f"*-damaged/checkpoints/{STEPS}")
    assert f"{bad}: set aside as {aside}; resuming from checkpoint 10\n" in err
    assert f"train: resuming from checkpoint 10 of {STEPS} ({output / 'checkpoints' / '10'})\n" in err
    assert (aside / chunk.relative_to(bad)).read_bytes() != (baseline_output / chunk.relative_to(output)).read_bytes()
    assert (bad / "commit_success.txt").exists()  # saved again by the resumed run


def test_a_checkpoint_garbled_in_place_that_would_restore_is_refused_by_its_digests_and_the_run_resumes_before_it(
    baseline, tokens, cache, tmp_path
):
    # one byte flipped inside a zstd frame (no checksum) can decode to other weights with
    # no error: a resume trained on from them and recorded another model as built. Each
    # checkpoint's digests are noted once it is committed, and checked before a restore
    output = tmp_path / "artifact"
    chunk = stopped_after_the_last_save(baseline[1], output)
    assert sorted(p.name for p in (output / "checkpoints").iterdir() if p.name.endswith(".digests.json")) == [
        "10.digests.json", f"{STEPS}.digests.json"
    ]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    err = resumed_from_10_as_never_damaged(baseline, output, tokens, cache, tmp_path)
    rel = chunk.relative_to(output)
    assert f"checkpoint {STEPS} does not restore (changed {rel}: its content is not what was recorded (xxh3:" in err
    assert f", since it was saved ({output / 'checkpoints' / f'{STEPS}.digests.json'})); trying the one before" in err


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_with_a_changed_learning_rate_is_refused_and_touches_nothing(baseline, tokens, cache, tmp_path):
    output = killed_at_10(baseline[1], tmp_path / "artifact")
    before = snapshot(output)
    optimizer = {"name": "adamw", "learning_rate": 0.002, "warmup_steps": 2}  # was 0.01
    config = runs.tiny_config(num_train_steps=12, optimizer=optimizer)
    spec = runs.write_spec(tmp_path / "spec.json", output=str(output), config=config, data=tokens,
                           compile_cache=cache)  # fmt: skip
    proc = runs.start(spec, runs.train_env(1), tmp_path / "log")
    proc.wait(timeout=180)
    err = runs.tail(tmp_path / "log")
    assert proc.returncode == 1, err
    assert (
        f"StepError: config: the checkpoints in {output} were written by another recipe "
        "(num_train_steps: 20 -> 12; optimizer.learning_rate: 0.01 -> 0.002); bump the version to train "
        "the new recipe, force this artifact (snakemake -f on its record, as marin path prints it) to set them "
        f"aside and train afresh, or delete {output / 'checkpoints'} to start over\n"
    ) in err
    assert snapshot(output) == before  # checkpoints, recipe and metrics untouched, nothing new


def test_resume_may_log_evaluate_and_checkpoint_more_often(baseline, tokens, cache, tmp_path):
    result, baseline_output = baseline
    output = killed_at_10(baseline_output, tmp_path / "artifact")
    recipe = (output / "checkpoints" / "recipe.json").read_bytes()
    config = runs.tiny_config(log_every=2, eval_every=5, checkpoint_every=5)
    spec = runs.write_spec(tmp_path / "spec.json", output=str(output), config=config, data=tokens,
                           compile_cache=cache)  # fmt: skip
    resumed = runs.run(spec, runs.train_env(1), tmp_path / "log")
    assert resumed["resumed_from_step"] == 10
    assert resumed["final_train_loss"] == pytest.approx(result["final_train_loss"], abs=1e-5)
    assert resumed["final_val_loss"] == pytest.approx(result["final_val_loss"], abs=1e-5)
    records = read_metrics(str(output / "metrics.jsonl"))
    assert [r["step"] for r in records if r["split"] == "train"] == [5, 10, 12, 14, 16, 18, 20]
    assert [r["step"] for r in records if r["split"] == "val"] == [10, 15, 20]
    assert (output / "checkpoints" / "recipe.json").read_bytes() == recipe  # still the recipe of the weights


def test_a_retry_with_no_checkpoint_moves_the_failed_attempts_log_into_history(baseline, tokens, cache, tmp_path):
    result, baseline_output = baseline
    output = killed_at_10(baseline_output, tmp_path / "artifact")
    shutil.rmtree(output / "checkpoints" / "10")  # as if it died before its first checkpoint
    failed_log = (output / "metrics.jsonl").read_bytes()
    spec = runs.write_spec(tmp_path / "spec.json", output=str(output), config=runs.tiny_config(), data=tokens,
                           compile_cache=cache)  # fmt: skip
    again = runs.run(spec, runs.train_env(1), tmp_path / "log")
    assert again["resumed_from_step"] == 0
    assert_same_run(again, output, result, baseline_output)  # a fresh log, not appended to the old one
    (kept,) = (output / ".history").glob("*-restarted/metrics.jsonl")
    assert kept.read_bytes() == failed_log
    assert (f"train: no checkpoint to resume from; metrics.jsonl of an earlier attempt: moved to "
            f"{kept.parent}; training from scratch\n") in runs.tail(tmp_path / "log")  # fmt: skip


def test_two_processes_of_four_devices_with_an_expert_axis_train_on_one_devices_micro_batches(baseline, tokens, cache, tmp_path):
    result, _ = baseline
    output = tmp_path / "artifact"
    port = free_port()
    procs = []
    config = runs.tiny_config(mesh={"expert": 2})  # experts split over 2 devices, batch over all 8
    for i in range(2):
        runtime = {"distributed": {"coordinator": f"127.0.0.1:{port}", "num_processes": 2, "process_id": i}}
        spec = runs.write_spec(tmp_path / f"spec{i}.json", output=str(output), config=config,
                               data=tokens, runtime=runtime, compile_cache=cache)  # fmt: skip
        procs.append((runs.start(spec, runs.train_env(4), tmp_path / f"p{i}"), tmp_path / f"p{i}"))
    try:
        results = [runs.finish(proc, log, timeout=240) for proc, log in procs]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    for r in results:
        assert r["processes"] == 2 and r["devices"] == 8 and r["mesh"] == {"data": 4, "expert": 2}
        # Not bitwise: the batch and the experts split over 8 devices sum some gradients
        # and the validation loss in another order. Through step 10 the train losses are
        # bitwise one device's here and the validation loss within 4e-7, so 1e-6 there:
        # each process cutting its own rows into micro-batches (the same rows per step, in
        # other micro-batches) moved step 5 by 9.4e-5. Later a near-tie in top-k routing may flip and amplify
        # the rounding (2.9e-5 at step 20, as on 8 devices in one process).
        assert_same_run(r, output, result, baseline[1], rel=1e-4, early=(10, 1e-6))


def test_training_on_gcs_writes_the_artifact_and_loads_back(baseline, tokens, cache, tmp_path, gcs_prefix, gcs_env):
    from marin_rules.train.load import load_trained

    result, _ = baseline
    output = f"{gcs_prefix}/checkpoints/tiny/v1"
    # one checkpoint, at the end: each save is slow on the emulator (one request per file)
    config = runs.tiny_config(checkpoint_every=STEPS)
    spec = runs.write_spec(tmp_path / "spec.json", output=output, config=config, data=tokens,
                           compile_cache=cache)  # fmt: skip
    remote = runs.run(spec, runs.train_env(1, gcs_env), tmp_path / "log")
    assert (remote["final_train_loss"], remote["final_val_loss"]) == (result["final_train_loss"], result["final_val_loss"])
    for name in ("model.json", "metrics.jsonl", "loss.png", "checkpoints/recipe.json"):
        assert storage.exists(f"{output}/{name}"), name
    assert storage.read_json(f"{output}/checkpoints/recipe.json")["config"] == config
    trained = load_trained(output)
    assert trained.step == STEPS


def test_nan_loss_stops_the_run_naming_the_step(tokens, cache, tmp_path):
    config = runs.tiny_config(
        model={**runs.TINY_MODEL, "n_layers": 1},
        optimizer={"name": "adamw", "learning_rate": 1e9, "grad_clip": 0, "warmup_steps": 0},
    )
    spec = runs.write_spec(tmp_path / "spec.json", output=str(tmp_path / "a"), config=config, data=tokens,
                           compile_cache=cache)  # fmt: skip
    proc = runs.start(spec, runs.train_env(1), tmp_path / "log")
    proc.wait(timeout=180)
    assert proc.returncode == 1
    err = runs.tail(tmp_path / "log")
    assert "StepError: loss became nan at step" in err or "StepError: loss became inf at step" in err
    assert "config.optimizer.learning_rate" in err


@pytest.mark.parametrize(
    "step,optimizer,advice",
    [
        (1, {}, "loss is nan at step 1, before any update: the initialised model's forward pass is not finite; "
                "check config.model (rope_theta, init_std, norm_eps) and run again"),
        (7, {"name": "adamw", "learning_rate": 0.5, "grad_clip": 0},
         "loss became nan at step 7; lower config.optimizer.learning_rate (now 0.5), or set "
         "config.optimizer.grad_clip (now 0: off), and run again"),
        (7, {"name": "muon", "learning_rate": 0.5, "muon_lr": 0.02, "grad_clip": 1.0},
         "loss became nan at step 7; lower config.optimizer.learning_rate (now 0.5) or config.optimizer.muon_lr "
         "(now 0.02), or lower config.optimizer.grad_clip (now 1.0), and run again"),
    ],
    ids=["first-step", "adamw-unclipped", "muon-clipped"],
)
def test_a_non_finite_loss_gets_advice_that_fits_when_and_how_it_trained(step, optimizer, advice):
    from marin_rules.artifacts.errors import StepError
    from marin_rules.train.config import parse_train_config
    from marin_rules.train.loop import check_finite

    config = parse_train_config(runs.tiny_config(optimizer=optimizer))
    check_finite(2.5, step, config)  # a finite loss passes
    with pytest.raises(StepError) as e:
        check_finite(float("nan"), step, config)
    assert str(e.value) == advice


def test_a_run_that_beats_its_measured_ceiling_measures_it_again_and_keeps_the_higher(capsys):
    """MFU > 1 means the ceiling was measured while the machine was busier: it is measured
    again (the higher kept, said in one line); a ceiling the user gave stays as given."""
    from marin_rules.train.config import parse_train_config
    from dataclasses import replace

    from marin_rules.model.sharding import make_mesh
    from marin_rules.train.loop import Plan, raised_ceiling
    from marin_rules.train.steps import batch_sharding

    config = parse_train_config(runs.tiny_config())
    fpt = flops_per_token(config.model, config.seq_len)
    tokens_per_s = 1e6
    achieved = tokens_per_s * fpt

    mesh = make_mesh(1, 1)

    def plan(peak: float, dtype: str | None) -> Plan:
        return Plan(config, None, "out", batch_sharding(mesh), None, None, peak, True, dtype)

    measured = []
    measure = lambda dtype, mesh: measured.append((dtype, mesh)) or 4 * achieved  # noqa: E731 - the quiet machine's rate
    raised = raised_ceiling(plan(achieved / 2, "float32"), tokens_per_s, measure)
    assert measured == [("float32", mesh)] and raised.peak_flops == 4 * achieved and raised.mfu(tokens_per_s) == 0.25
    assert "train: MFU 2.00 against the matmul ceiling measured at the start" in capsys.readouterr().err
    again = raised_ceiling(replace(raised, peak_flops=achieved / 2), tokens_per_s, measure)
    assert again.peak_flops == achieved / 2 and len(measured) == 1  # measured once per run, not every log step
    lower = raised_ceiling(plan(achieved / 2, "float32"), tokens_per_s, lambda dtype, mesh: achieved / 4)
    assert lower.peak_flops == achieved / 2  # a lower second measure never lowers the ceiling
    kept = plan(achieved * 2, "float32")
    assert raised_ceiling(kept, tokens_per_s, measure) is kept and len(measured) == 1  # MFU 0.5: not measured again
    given = plan(achieved / 2, None)
    assert raised_ceiling(given, tokens_per_s, measure) is given and len(measured) == 1  # runtime.peak_flops stays


def earlier_attempt(output: Path) -> None:
    output.mkdir()
    (output / "metrics.jsonl").write_text('{"split": "train", "step": 5, "loss": 9.0}\n')
    (output / "loss.png").write_bytes(b"earlier png")


def test_starting_from_scratch_moves_an_earlier_attempts_logs_into_one_history_entry(tmp_path, capsys):
    from marin_rules.train.config import parse_train_config
    from marin_rules.train.loop import say_where_it_starts

    output = tmp_path / "artifact"
    earlier_attempt(output)
    say_where_it_starts(parse_train_config(runs.tiny_config()), str(output), 0)
    (entry,) = (output / ".history").glob("*-restarted")
    assert sorted(p.name for p in entry.iterdir()) == ["loss.png", "metrics.jsonl"]
    assert (entry / "loss.png").read_bytes() == b"earlier png" and not (output / "metrics.jsonl").exists()
    assert capsys.readouterr().err == (
        f"train: no checkpoint to resume from; metrics.jsonl and loss.png of an earlier attempt: moved to "
        f"{entry}; training from scratch\n"
    )
    say_where_it_starts(parse_train_config(runs.tiny_config()), str(output), 0)  # nothing left: nothing said
    assert capsys.readouterr().err == "" and len(list((output / ".history").iterdir())) == 1


def test_a_dev_version_starting_from_scratch_deletes_an_earlier_attempts_logs(tmp_path, capsys):
    from marin_rules.train.config import parse_train_config
    from marin_rules.train.loop import say_where_it_starts

    output = tmp_path / "artifact"
    earlier_attempt(output)
    say_where_it_starts(parse_train_config(runs.tiny_config()), str(output), 0, keep_history=False)
    assert sorted(p.name for p in output.iterdir()) == []
    assert capsys.readouterr().err == (
        "train: no checkpoint to resume from; metrics.jsonl and loss.png of an earlier attempt: discarded "
        "(a dev version keeps no history); training from scratch\n"
    )


def test_resuming_says_which_checkpoint_and_keeps_the_log(tmp_path, capsys):
    from marin_rules.train.config import parse_train_config
    from marin_rules.train.loop import say_where_it_starts

    output = tmp_path / "artifact"
    earlier_attempt(output)
    say_where_it_starts(parse_train_config(runs.tiny_config()), str(output), 10)
    assert capsys.readouterr().err == f"train: resuming from checkpoint 10 of 20 ({output / 'checkpoints' / '10'})\n"
    assert (output / "metrics.jsonl").exists() and not (output / ".history").exists()


def test_the_loss_plot_title_says_which_layers_are_moe():
    from marin_rules.train.report import plot_title

    assert plot_title(ModelConfig(n_layers=2, moe_every=0)) == "2-layer dense"
    assert plot_title(ModelConfig(n_layers=2, moe_every=1)) == "2-layer MoE, 4 experts, top-2"
    assert plot_title(ModelConfig(n_layers=4, moe_every=2, shared_expert=True, top_k=1)) == (
        "4-layer, MoE every 2 layers, 4 experts + shared, top-1"
    )


def test_a_train_curve_of_a_single_logged_point_is_drawn_with_a_marker(tmp_path, monkeypatch):
    # num_train_steps <= log_every logs one train point: a line of one point alone draws nothing
    from matplotlib.figure import Figure

    from marin_rules.train.metrics import MetricsLog, plot_losses

    drawn, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig) or save(fig, *a, **k))
    records = [{"split": "train", "step": 3, "loss": 4.0}, {"split": "val", "step": 3, "loss": 4.2}]
    plot_losses(MetricsLog(str(tmp_path / "metrics.jsonl"), records), str(tmp_path / "loss.png"))
    (train,) = [line for line in drawn[0].axes[0].lines if line.get_label() == "train"]
    assert train.get_marker() not in (None, "", " ", "None")
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_the_mfu_ceiling_counts_the_devices_the_mesh_computes_on(monkeypatch):
    """A mesh on some of the devices (`mesh: {data: 2}` on a host of 8) is measured on
    this process's devices of the mesh, per device times the mesh's size; devices it
    leaves idle are not in the ceiling. (Device objects stand in: this process has one
    device, and timings are not asserted.)"""
    from types import SimpleNamespace

    from marin_rules.model import peak

    measured = []
    monkeypatch.setattr(peak, "local_peak_flops", lambda dtype, n, repeats, devices: measured.append(devices) or 1e9 * len(devices))
    host = [SimpleNamespace(id=i, process_index=i // 4) for i in range(8)]  # 2 processes of 4 devices; this is process 0
    two_of_eight = SimpleNamespace(devices=np.array(host[:2]).reshape(2, 1))
    assert peak.run_peak_flops("bfloat16", mesh=two_of_eight) == 2e9 and measured == [host[:2]]
    spanning = SimpleNamespace(devices=np.array(host[2:6]).reshape(4, 1))  # 2 of mine, 2 of the other process
    assert peak.run_peak_flops("bfloat16", mesh=spanning) == 4e9 and measured[-1] == host[2:4]


def test_a_damaged_digests_note_restores_its_checkpoint_unchecked_and_says_so(tmp_path, capsys):
    # the note, not the checkpoint, is damaged: no reason to set a good checkpoint aside
    from marin_rules.train.checkpoint import changed_since_saved, digests_file, record_step_digests

    output = str(tmp_path / "artifact")
    (tmp_path / "artifact/checkpoints/5/model").mkdir(parents=True)
    (tmp_path / "artifact/checkpoints/5/model/w").write_bytes(b"weights")
    record_step_digests(output, 5)
    assert changed_since_saved(output, 5) is None  # as saved
    (tmp_path / "artifact/checkpoints/5/model/w").write_bytes(b"weighTs")
    assert changed_since_saved(output, 5).startswith("changed checkpoints/5/model/w: its content is not what was recorded")
    for garbage in ('{"checkpoints/5/model/w": ', "[1, 2]"):
        with open(digests_file(output, 5), "w") as f:
            f.write(garbage)
        assert changed_since_saved(output, 5) is None
        err = capsys.readouterr().err
        assert err.startswith(f"{digests_file(output, 5)}: ") and err.endswith("; restoring checkpoint 5 unchecked\n")
