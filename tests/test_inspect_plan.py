"""The priced plan, against figures computed by hand in the comments below.

The train artifact of test_inspect_status.EXPERIMENT: vocabulary 512 (its tokenizer),
d_model 64, 2 layers, 4 heads of 16, 2 kv heads, 4 experts of 32, top-2, tied
embeddings, 100 steps x batch 8 x seq 64.

  attention  = 64*64*2 + 64*32*2          = 12,288 per layer
  norms      = 2*64                        =    128 per layer
  moe (top2) = 64*4 + 2*3*64*32            = 12,544 per layer
  active     = 2*(12,288+128+12,544) + 64 + 512*64        =  82,752
  total      = 82,752 + 2 layers * 2 idle experts * 3*64*32 = 107,328
  FLOPs/tok  = 6*82,752 + 12*2*4*16*64 (the tied table counts once, as the head)
                                                            = 594,816
  tokens     = 100*8*64                                     =  51,200
  FLOPs      = 51,200 * 594,816                             = 30,454,579,200
  v5p-8      = 4 chips * 459e12 * 0.4 MFU = 7.344e14 FLOP/s -> 4.147e-05 s
"""

from __future__ import annotations

import json

import socket
import sys

import pytest

from marin_rules.cli import main
from marin_rules.experiment import load_experiment
from marin_rules.inspect.plan import cpu_speed, parse_accelerator, plan_lines, price_job
from test_inspect_status import build, experiment_file  # noqa: F401 (fixture)

FLOPS = 51_200 * 594_816


def test_price_matches_the_hand_computed_figures(experiment_file):  # noqa: F811
    experiment = load_experiment(experiment_file)
    price = price_job(experiment, "checkpoints/nano@v1")
    assert (price.active_params, price.total_params) == (82_752, 107_328)
    assert price.tokens == 51_200
    assert price.flops == FLOPS == 30_454_579_200
    assert price.accelerator.chips == 4
    assert price.accelerator_s == pytest.approx(FLOPS / (4 * 459e12 * 0.4))
    assert price.cpu_s is None


def test_an_untied_head_prices_the_matmul_params_its_flops_count_and_says_so(experiment_file):  # noqa: F811
    """With its own head matrix the input table is a lookup: `active` counts it, the 6N
    of the FLOPs does not; the plan shows both, so C = 6ND can be checked by hand."""
    with open(experiment_file) as f:
        text = f.read().replace("max_seq_len: 64}", "max_seq_len: 64, tie_embeddings: false}")
    with open(experiment_file, "w") as f:
        f.write(text)
    experiment = load_experiment(experiment_file)
    price = price_job(experiment, "checkpoints/nano@v1")
    assert (price.active_params, price.matmul_params) == (82_752 + 512 * 64, 82_752)  # + the head; the table left out
    assert price.flops == FLOPS  # the same matmuls as tied
    line = plan_lines(experiment, "nowhere", mfu=0.4)[1]
    assert line.startswith("  checkpoints/nano@v1: params 140.10k total, 115.52k active (82.75k in the FLOPs); tokens 51.20k;")


def test_a_built_train_artifact_named_to_plan_is_priced_as_a_rebuild_and_says_so(experiment_file, tmp_path):  # noqa: F811
    """Named, a built artifact no run would build is priced as its rebuild, saying so;
    one a run would build (not built, or forced) is not."""
    from marin_rules.inspect.plan import BUILT_NOTE

    experiment, prefix = load_experiment(experiment_file), str(tmp_path / "artifacts")
    key = "checkpoints/nano@v1"
    assert BUILT_NOTE not in plan_lines(experiment, prefix, [key], named=True)[1]
    build(prefix, experiment, key, result={"final_val_loss": 3.0})
    line = plan_lines(experiment, prefix, [key], named=True)[1]
    assert line.endswith(f"({BUILT_NOTE})") and "FLOPs 3.05e+10" in line
    assert BUILT_NOTE not in plan_lines(experiment, prefix, [key], forced=[key], named=True)[1]  # forced: a rebuild indeed
    assert BUILT_NOTE not in plan_lines(experiment, prefix, [key])[1]  # planning's own keys: the jobs it will run


def test_price_takes_the_vocabulary_the_built_tokenized_data_recorded_over_the_one_asked(experiment_file, tmp_path):  # noqa: F811
    """A trained tokenizer may end below the vocab_size asked (the corpus ran out of
    merges); once built, the plan prices the model the run will train."""
    experiment, prefix = load_experiment(experiment_file), str(tmp_path / "artifacts")
    for key in ("raw/s@v1", "tokenizers/bpe@v1"):
        build(prefix, experiment, key)
    build(prefix, experiment, "tokenized/s@v1", result={"vocab_size": 300})
    price = price_job(experiment, "checkpoints/nano@v1", prefix=prefix)
    assert price.active_params == 82_752 - (512 - 300) * 64
    assert price_job(experiment, "checkpoints/nano@v1").active_params == 82_752  # no prefix: the recipe's


@pytest.mark.parametrize(
    "name, chips, peak, devices",
    [("v5p-8", 4, 459e12, 4), ("v4-32", 16, 275e12, 16), ("v3-8", 4, 123e12, 8), ("v5litepod-16", 16, 197e12, 16),
     ("v6e-8", 8, 918e12, 8), ("h100-8", 8, 989e12, 8), ("a100", 1, 312e12, 1), ("v9z-8", None, None, None),
     ("", None, None, None)],
)  # fmt: skip
def test_accelerator_names_count_chips_as_their_vendors_do_and_devices_as_jax_does(name, chips, peak, devices):
    """JAX counts TensorCores on v2/v3 (two per chip), chips from v4 on (megacore)."""
    accelerator = parse_accelerator(name)
    if chips is None:
        assert accelerator is None
    else:
        assert (accelerator.chips, accelerator.peak_per_chip, accelerator.devices) == (chips, peak, devices)


@pytest.mark.parametrize(
    "runtime, extra, warning",
    [
        ("tpu: v5p-8", "", None),  # batch 8 over 4 devices
        ("tpu: v5p-64", "", "config.batch_size: 8 must be divisible by grad_accum_steps (1) x batch shards "
                            "(32 = mesh data x expert); try 32"),
        ("tpu: v3-32", "", "config.batch_size: 8 must be divisible by grad_accum_steps (1) x batch shards "
                           "(32 = mesh data x expert); try 32"),  # 32 TensorCores
        ("tpu: v5p-8", "mesh: {data: 2, expert: 4}", "config.mesh: data=2 x expert=4 needs 8 devices, v5p-8 has 4; "
                                                     "lower config.mesh.data or config.mesh.expert"),
    ],
)  # fmt: skip
def test_plan_warns_of_a_train_job_that_would_stop_at_its_start_on_its_pod(experiment_file, tmp_path, runtime, extra, warning):  # noqa: F811
    """What the run checks on its devices (batch split, mesh size), checked in the plan
    (`snakemake -n`, `marin plan`) against the devices the runtime's pod type has, before
    a pod is paid for."""
    text = open(experiment_file).read().replace("tpu: v5p-8", runtime)
    if extra:
        text = text.replace("num_train_steps: 100", f"num_train_steps: 100\n      {extra}")
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    lines = plan_lines(load_experiment(str(path)), str(tmp_path / "artifacts"))
    warnings = [line for line in lines if line.startswith("  warning: ")]
    name = runtime.split()[1]
    assert warnings == ([] if warning is None else [f"  warning: checkpoints/nano@v1 would stop at its start on {name}: {warning}"])


def test_cpu_time_comes_from_past_runs_on_this_host(experiment_file, tmp_path):  # noqa: F811
    """Past run on this host: 1,000 tokens/s at 398,208 FLOPs/token = 3.98208e8 FLOP/s,
    100 s for 51,200 tokens -> 48.8 s beyond the timed steps. The new job: 51.2 s of
    steps + 48.8 s = 100 s. A faster run on another host is ignored."""
    here = {"result": {"tokens_per_s": 1000.0, "flops_per_token": 594_816, "tokens_seen": 51_200},
            "provenance": {"host": socket.gethostname(), "duration_s": 100.0}, "runtime": {}}  # fmt: skip
    elsewhere = {"result": {"tokens_per_s": 9e9, "flops_per_token": 1, "tokens_seen": 1},
                 "provenance": {"host": "other", "duration_s": 1.0}, "runtime": {}}  # fmt: skip
    speed = cpu_speed([here, elsewhere])
    assert speed.flops_per_s == pytest.approx(5.94816e8) and speed.overhead_s == pytest.approx(48.8)
    assert speed.runs == 1 and speed.this_host
    price = price_job(load_experiment(experiment_file), "checkpoints/nano@v1", cpu=speed)
    assert price.cpu_s == pytest.approx(100.0)


def test_a_stopped_run_is_priced_for_the_steps_left_after_its_newest_checkpoint(experiment_file, tmp_path):  # noqa: F811
    """100 steps; checkpoint 40 committed (60 is orbax's unfinished temporary): 60 steps
    left, unless forced (it starts over), or its checkpoints hold another recipe (its job
    refuses them: planning says so)."""
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    for key in ("raw/s@v1", "tokenizers/bpe@v1", "tokenized/s@v1"):
        build(prefix, experiment, key)
    checkpoints = tmp_path / "artifacts" / "checkpoints" / "nano" / "v1" / "checkpoints"
    (checkpoints / "20").mkdir(parents=True)
    (checkpoints / "40").mkdir()
    (checkpoints / "60.orbax-checkpoint-tmp-1").mkdir()
    price = price_job(experiment, "checkpoints/nano@v1", prefix=prefix)
    assert price.tokens == 60 * 8 * 64 and price.flops == pytest.approx(FLOPS * 0.6)
    assert price.note == "resumes from step 40 of 100"
    from marin_rules.artifacts.lease import acquire

    held = acquire(str(tmp_path / "artifacts/checkpoints/nano/v1"), is_done=lambda: False, wait=False)
    try:  # another run builds it now (this process holds the lease: alive)
        assert price_job(experiment, "checkpoints/nano@v1", prefix=prefix).note.startswith("building now (")
        assert "a run waits for that build; resumes from step 40 of 100" in price_job(
            experiment, "checkpoints/nano@v1", prefix=prefix).note
    finally:
        held.release()
    assert price_job(experiment, "checkpoints/nano@v1", prefix=prefix, fresh=True).tokens == 51_200
    assert "(resumes from step 40 of 100)" in plan_lines(experiment, prefix)[1]

    # those checkpoints are a killed forced rebuild's, the finished build it replaced kept aside:
    # the next run puts that build back and serves it (unless forced again)
    from marin_rules.workflow.forcing import begin_rebuild, end_rebuild

    output = tmp_path / "artifacts" / "checkpoints" / "nano" / "v1"
    kept = output / ".history" / "20261205T010203Z"
    kept.mkdir(parents=True)
    begin_rebuild(str(output), str(kept), owed=False)
    assert price_job(experiment, "checkpoints/nano@v1", prefix=prefix).note == "resumes from step 40 of 100"  # kept no build
    (kept / ".artifact.json").write_text("{}")
    price = price_job(experiment, "checkpoints/nano@v1", prefix=prefix)
    assert (price.tokens, price.flops) == (0, 0.0) and price.note == (
        "a forced rebuild of it was killed: the next run puts the previous build back from .history/20261205T010203Z "
        "and serves it, training nothing")  # fmt: skip
    assert price_job(experiment, "checkpoints/nano@v1", prefix=prefix, fresh=True).tokens == 51_200
    begin_rebuild(str(output), str(kept), owed=True)  # a cascade's: put back, then rebuilt
    assert price_job(experiment, "checkpoints/nano@v1", prefix=prefix).note == "resumes from step 40 of 100"
    begin_rebuild(str(output), str(kept), owed=False)
    (kept / ".artifact.json").write_text(json.dumps({"deps": {"data": {"name": "tokenized/s", "version": "v1", "fingerprint": "0" * 16,
                                                               "built": "2020-01-01T00:00:00+00:00"}}}))
    assert price_job(experiment, "checkpoints/nano@v1", prefix=prefix).note == "resumes from step 40 of 100"  # made from another build
    end_rebuild(str(output))
    assert "resumes" not in plan_lines(experiment, prefix, forced=["checkpoints/nano@v1"])[1]
    from marin_rules.train.recipe import make_recipe, record_recipe

    output = str(tmp_path / "artifacts" / "checkpoints" / "nano" / "v1")
    record_recipe(output, make_recipe({**experiment["checkpoints/nano@v1"].config, "seed": 7}, {}, output))
    assert price_job(experiment, "checkpoints/nano@v1", prefix=prefix).tokens == 51_200  # refused: starts over


def test_the_cpu_overhead_of_a_resumed_record_counts_the_tokens_of_its_last_attempt():
    """Resumed from step 50 of 100: its 100 s trained 25,600 of the 51,200 tokens at
    1,000 tokens/s, so 74.4 s were overhead (not 100 - 51.2)."""
    record = {"result": {"tokens_per_s": 1000.0, "flops_per_token": 594_816, "tokens_seen": 51_200,
                         "resumed_from_step": 50}, "config": {"num_train_steps": 100},
              "provenance": {"host": socket.gethostname(), "duration_s": 100.0}, "runtime": {}}  # fmt: skip
    assert cpu_speed([record]).overhead_s == pytest.approx(74.4)


def test_plan_prices_what_would_run_and_uses_records_on_the_prefix(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    lines = plan_lines(experiment, prefix)
    assert lines[1].startswith("  checkpoints/nano@v1: params 107.33k total, 82.75k active; tokens 51.20k; FLOPs 3.05e+10;")
    assert "v5p-8 (4 chip(s)): 1.15e-08 h (4.15e-05 s)" in lines[1]
    assert "this CPU: unknown" in lines[1]
    assert lines[-1].startswith("  total: 1 job(s), tokens 51.20k, FLOPs 3.05e+10")

    # a past version trained here: its measured speed prices the CPU
    past = {"tokens_per_s": 1000.0, "flops_per_token": 594_816, "tokens_seen": 51_200, "final_val_loss": 3.0}
    record = build(prefix, experiment, "checkpoints/nano@v1", result=past, host=socket.gethostname(), duration=100.0)
    assert plan_lines(experiment, prefix) == ["plan: no training job to run"]
    lines = plan_lines(experiment, prefix, keys=["checkpoints/nano@v1"])
    assert "this CPU: 0.0278 h (1.7 min)" in lines[1], lines
    assert "0.6 GFLOP/s measured by 1 past run(s) (records built on this host)" in lines[0]
    assert record["result"]["tokens_per_s"] == 1000.0

    assert main(["plan", "checkpoints/nano@v1", "--configfile", experiment_file, "--prefix", prefix, "--mfu", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "at 50% MFU" in out and "(3.32e-05 s)" in out  # 4 * 459e12 * 0.5


def test_plan_names_an_unknown_accelerator(experiment_file, tmp_path):  # noqa: F811
    text = open(experiment_file).read().replace("tpu: v5p-8", "tpu: v9z-8")
    path = tmp_path / "other.yaml"
    path.write_text(text)
    line = plan_lines(load_experiment(str(path)), str(tmp_path / "artifacts"))[1]
    assert "; accelerator 'v9z-8' unknown: no peak FLOP/s known (known: v2, v3, " in line  # one statement of it
    assert ", v100), time unknown; this CPU: unknown" in line and "no accelerator named" not in line


@pytest.mark.parametrize("mfu", ["nan", "-1", "0", "5", "inf", "lots"])
def test_plan_refuses_an_mfu_that_is_not_a_fraction(mfu, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--mfu", mfu])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"marin plan: error: argument --mfu: expected a fraction in (0, 1] such as 0.4, got '{mfu}'"
    )


def test_counts_read_in_units_up_to_trillions_then_in_powers_of_ten():
    from marin_rules.inspect.plan import count

    assert [count(n) for n in (999, 1234, 5.5e9, 2.5e14, 3.00003078e22)] == ["999", "1.23k", "5.50B", "250.00T", "3.00e22"]


def test_a_corrupt_train_record_stops_the_plan_with_the_line_snakemake_n_stops_with(experiment_file, tmp_path, capsys):  # noqa: F811
    import subprocess

    from conftest import run_snakemake
    from marin_rules.artifacts.identity import artifact_location

    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    for key in experiment.artifacts:
        build(prefix, experiment, key)
    record = artifact_location(prefix, experiment["checkpoints/nano@v1"].id) + "/.artifact.json"
    with open(record, "w") as f:
        f.write("{not json")
    dry = run_snakemake("-n", "--configfile", experiment_file, "--config", f"prefix={prefix}", cwd=tmp_path, check=False)
    line = next(ln for ln in dry.stderr.splitlines() if ln.startswith("marin-rules: "))[len("marin-rules: "):]
    assert dry.returncode != 0 and line.startswith(f"{record}: not valid JSON")
    planned = subprocess.run([sys.executable, "-m", "marin_rules.cli", "plan", "--configfile", experiment_file,
                              "--prefix", prefix], cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert planned.returncode == 1 and planned.stdout == "" and planned.stderr == f"marin: {line}\n"
    assert main(["status", "checkpoints/nano@v1", "--configfile", experiment_file, "--prefix", prefix, "--json"]) == 0
    assert f"{record}: not valid JSON" in capsys.readouterr().out  # status: state corrupt, the same line as its reason


def test_a_built_dev_version_is_priced_as_every_run_retrains_it(experiment_file, tmp_path):  # noqa: F811
    from pathlib import Path

    from marin_rules.inspect.plan import jobs_to_run

    text = Path(experiment_file).read_text().replace("checkpoints/nano@v1", "checkpoints/nano@dev")
    text = text.replace("evals/nano@v1", "evals/nano@dev")
    Path(experiment_file).write_text(text)
    experiment = load_experiment(experiment_file, dev_user="alice")
    prefix = str(tmp_path / "artifacts")
    build(prefix, experiment, "checkpoints/nano@dev")
    assert jobs_to_run(experiment, prefix) == ["checkpoints/nano@dev"]  # a dev version rebuilds on every run
