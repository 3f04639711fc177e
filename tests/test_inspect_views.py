"""`marin diff`, `marin history` and `marin dag` on records written by the records
module (local prefix; the gs:// read path is the one `marin status` tests use)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from marin_rules.artifacts import storage
from marin_rules.artifacts.identity import artifact_location
from marin_rules.cli import main
from marin_rules.experiment import load_experiment
from test_inspect_status import build, experiment_file, fail, populate  # noqa: F401 (fixture)

V2 = """
  checkpoints/nano@v2:
    step: train
    deps: {data: tokenized/s@v1}
    config:
      model: {d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, n_experts: 8, top_k: 2, d_expert: 32, max_seq_len: 64}
      optimizer: {name: adamw, learning_rate: 0.001}
      num_train_steps: 100
      batch_size: 8
      seq_len: 64
"""


@pytest.fixture
def two_versions(experiment_file, tmp_path):  # noqa: F811
    with open(experiment_file, "a") as f:
        f.write(V2)
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    digests = {"final_checkpoint_digests": {"checkpoints/100/model/a": "xxh3:01", "checkpoints/100/model/b": "xxh3:02"},
               "file_digests": {"loss.png": "xxh3:03"}}  # as a train result gives them
    build(prefix, experiment, "checkpoints/nano@v1",
          result={"final_val_loss": 3.5, "steps": 100, "mesh": {"data": 1}, **digests})  # fmt: skip
    build(prefix, experiment, "checkpoints/nano@v2",
          result={"final_val_loss": 3.25, "steps": 100, "mesh": {"data": 2}, **digests, "file_digests": {"loss.png": "xxh3:04"}})  # fmt: skip
    return experiment_file, prefix


def test_diff_shows_recipe_fields_and_result_deltas_side_by_side(two_versions, capsys):
    experiment_file, prefix = two_versions
    assert main(["diff", "checkpoints/nano@v1", "checkpoints/nano@v2", "--prefix", prefix]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "recipe: checkpoints/nano@v1 -> checkpoints/nano@v2: 2 field(s) differ"
    assert out[1:3] == ["  model.n_experts: 4 -> 8", "  optimizer.learning_rate: 0.003 -> 0.001"]
    rows = {line.split()[0]: line.split()[1:] for line in out[3:]}
    assert rows["RESULT"] == ["checkpoints/nano@v1", "checkpoints/nano@v2", "DELTA", "(B", "-", "A)"]
    assert rows["final_val_loss"] == ["3.5", "3.25", "-0.25"]
    assert rows["mesh.data"] == ["1", "2", "+1"]
    assert rows["steps"] == ["100", "100", "+0"]
    # digests: one row per field, the number of files and a short digest of them all
    assert rows["final_checkpoint_digests"][:3] == rows["final_checkpoint_digests"][3:6] and rows["final_checkpoint_digests"][:2] == ["2", "files"]
    assert rows["file_digests"][:2] == ["1", "files"] and rows["file_digests"][2] != rows["file_digests"][5]

    assert main(["diff", "checkpoints/nano@v1", "checkpoints/nano@v2", "--prefix", prefix, "--only-changed"]) == 0
    out = capsys.readouterr().out
    assert "final_val_loss" in out and "steps" not in out


V3 = """
  checkpoints/nano@v3:
    step: train
    deps: {data: tokenized/s@v1}
    config:
      model: {d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, n_experts: 8, top_k: 2, d_expert: 32, max_seq_len: 64, router_gate: sigmoid}
      optimizer: {name: adamw}
      num_train_steps: 100
      batch_size: 8
      seq_len: 64
"""


def test_diff_shows_the_value_of_a_field_added_or_removed(two_versions, capsys):
    experiment_file, prefix = two_versions
    with open(experiment_file, "a") as f:
        f.write(V3)
    build(prefix, load_experiment(experiment_file), "checkpoints/nano@v3", result={"final_val_loss": 3.0})
    assert main(["diff", "checkpoints/nano@v2", "checkpoints/nano@v3", "--prefix", prefix, "--only-changed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "recipe: checkpoints/nano@v2 -> checkpoints/nano@v3: 2 field(s) differ",
        "  model.router_gate (added: sigmoid; its default now: softmax)",  # what v2, without it, used (today)
        "  optimizer.learning_rate (removed: 0.001; its default now: 0.003)",
    ]


def test_diff_against_a_version_not_built_yet_compares_with_its_recipe_in_the_experiment(two_versions, capsys):
    """What bumping to v3 would change, before building it: the recipe lines a built v3
    would give (the test above), results of v3 all "-", and one stderr line saying so."""
    experiment_file, prefix = two_versions
    with open(experiment_file, "a") as f:
        f.write(V3)
    assert main(["diff", "checkpoints/nano@v2", "checkpoints/nano@v3", "--prefix", prefix, "--configfile", experiment_file]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[:3] == [
        "recipe: checkpoints/nano@v2 -> checkpoints/nano@v3: 2 field(s) differ",
        "  model.router_gate (added: sigmoid; its default now: softmax)",  # what v2, without it, used (today)
        "  optimizer.learning_rate (removed: 0.001; its default now: 0.003)",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
    assert rows["final_val_loss"] == ["3.25", "-"]
    assert err == (f"marin: checkpoints/nano@v3: not built yet (missing: never built): its recipe in {experiment_file}, "
                   "no results\n")  # fmt: skip
    assert main(["diff", "checkpoints/nano@v2", "checkpoints/nano@v3", "--prefix", prefix, "--configfile", experiment_file,
                 "--only-changed"]) == 0  # fmt: skip
    assert capsys.readouterr().out.splitlines()[3:] == ["results: checkpoints/nano@v3 has none"]


def test_diff_shows_control_and_bidi_characters_of_records_escaped(experiment_file, tmp_path, capsys):  # noqa: F811
    with open(experiment_file, "a") as f:
        f.write(V2)
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    evil = "1\x1b[2J\n  n: 1 -> 1\u202eé中"
    escaped = "1\\x1b[2J\\n  n: 1 -> 1\\u202eé中"
    build(prefix, experiment, "checkpoints/nano@v1", config={"seq_len": evil}, result={"note": evil, f"k{evil}": 1})
    build(prefix, experiment, "checkpoints/nano@v2", result={"note": "plain"})
    assert main(["diff", "checkpoints/nano@v1", "checkpoints/nano@v2", "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    lines = out.splitlines()
    assert f"  seq_len: {escaped} -> 64" in lines and not any(line.startswith("  n: 1 -> 1") for line in lines)
    assert any(line.split()[:2] == ["note", escaped.split()[0]] for line in lines)
    assert any(line.startswith(f"k{escaped}") for line in lines)


def test_diff_and_history_give_one_line_for_a_bad_name(two_versions, capsys):
    experiment_file, prefix = two_versions
    assert main(["diff", "checkpoints/nano@v7", "checkpoints/nano@v2", "--prefix", prefix]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"marin: checkpoints/nano@v7: no success record under {prefix} (did you mean checkpoints/nano@v")
    assert err.count("\n") == 1
    args = ["--prefix", prefix, "--configfile", experiment_file]
    assert main(["diff", "checkpoints/nano@v1", "checkpoints/nnao@v1", *args]) == 1
    assert capsys.readouterr().err.endswith("(did you mean checkpoints/nano@v1?)\n")
    # the experiment file may come first, as for status and plan
    assert main(["diff", experiment_file, "checkpoints/nano@v1", "checkpoints/nnao@v1", "--prefix", prefix]) == 1
    assert capsys.readouterr().err.endswith("(did you mean checkpoints/nano@v1?)\n")
    assert main(["diff", experiment_file, "checkpoints/nano@v1", "--prefix", prefix]) == 1
    assert capsys.readouterr().err == ("marin: marin diff takes two keys (name@version), after an optional "
                                       "experiment file; got 1: checkpoints/nano@v1\n")  # fmt: skip
    assert main(["history", "checkpoints/nano", "--prefix", prefix, "--configfile", experiment_file]) == 1
    assert capsys.readouterr().err == (
        "marin: checkpoints/nano: expected name@version (did you mean checkpoints/nano@v1 or checkpoints/nano@v2?)\n"
    )
    assert main(["history", "checkpoints/nan@v2", "--prefix", prefix]) == 1
    assert capsys.readouterr().err.startswith("marin: checkpoints/nan@v2: nothing recorded under")


def test_history_lists_attempts_and_forced_rebuilds_with_time_host_duration_and_error(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    location = artifact_location(prefix, experiment[key].id)
    first = build(prefix, experiment, key, ended="2026-12-01T10:00:00.000Z", duration=61.5, host="tpu-vm-1")
    storage.write_json_atomic(f"{location}/.history/20261201T100000Z/.artifact.json", first)  # kept by a forced rebuild
    fail(prefix, experiment, key, "terminated by signal SIGTERM\nmore", "2026-12-02T09:00:00.000Z")
    build(prefix, experiment, key, ended="2026-12-03T10:00:00.000Z", duration=70.0, host="tpu-vm-2")
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{key}: 3 attempts"
    assert lines[1].startswith("  2026-12-01 09:00:00  built (replaced by a forced rebuild)")
    assert "host tpu-vm-1  took 61.5s" in lines[1]
    assert lines[2].startswith("  2026-12-02 09:00:00  failed") and "host host-b" in lines[2]
    assert lines[3] == "      error: RuntimeError: terminated by signal SIGTERM"
    assert lines[4].startswith("  2026-12-03 09:00:00  built (current)") and "host tpu-vm-2  took 70.0s" in lines[4]

    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file, "--json"]) == 0
    import json

    events = json.loads(capsys.readouterr().out)
    assert [e["outcome"] for e in events] == ["built (replaced by a forced rebuild)", "failed", "built (current)"]


def test_history_shows_the_failure_records_of_one_pod_attempt_as_one_attempt(experiment_file, tmp_path, capsys):  # noqa: F811
    """Each process of a pod writes its own failure record, naming the attempt: one
    attempt in history (the earliest record's error: the cause), not one per process."""
    from marin_rules.artifacts.records import write_failure

    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    artifact = experiment[key]
    location = artifact_location(prefix, artifact.id)
    entry = {"name": artifact.id.name, "version": artifact.id.version, "step": artifact.step, "fingerprint": artifact.fingerprint,
             "config": dict(artifact.config), "deps": {}, "runtime": {}, "path": artifact.id.path}  # fmt: skip

    def failed(process: int, attempt: str, started: str, ended: str, message: str) -> None:
        provenance = {"host": f"worker-{process}", "started": started, "ended": ended, "duration_s": 30.0 + process,
                      "pod_attempt": attempt}  # fmt: skip
        write_failure(location, entry, RuntimeError(message), provenance, "SIGINT", process)

    failed(0, "a" * 16, "2026-12-02T09:00:00.000Z", "2026-12-02T09:00:35.000Z", "stopped with the pod")
    failed(1, "a" * 16, "2026-12-02T09:00:04.000Z", "2026-12-02T09:00:34.000Z", "process 1 lost its TPU")
    failed(0, "b" * 16, "2026-12-02T10:00:00.000Z", "2026-12-02T10:00:09.000Z", "a later attempt")
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{key}: 2 attempts"
    assert lines[1].startswith("  2026-12-02 09:00:00  failed (2 pod processes)") and "took 31.0s" in lines[1]
    assert lines[2] == "      error: RuntimeError (exit status SIGINT): process 1 lost its TPU"
    assert lines[3].startswith("  2026-12-02 10:00:00  failed ")


def test_every_state_marin_status_gives_has_a_colour_and_a_legend_entry_in_the_dag():
    """A state without one was drawn white and left out of the legend (`source changed`)."""
    import re
    from pathlib import Path

    from marin_rules.inspect import status
    from marin_rules.inspect.dag import COLORS

    source = Path(status.__file__).read_text()
    states = set(re.findall(r'(?:state(?:, reason)? = |Status\(\w+, \w+, )"([a-z? ]+)"', source))
    assert "source changed" in states and "built" in states  # the scan finds what it should
    assert states <= set(COLORS), states - set(COLORS)


def test_the_dag_of_one_artifact_is_wide_enough_for_its_whole_legend(tmp_path):
    from marin_rules.inspect.dag import COLORS, MARGIN, _legend_step, render_svg

    (tmp_path / "exp.yaml").write_text("artifacts:\n  raw/a@v1: {step: download}\n")
    svg = render_svg(load_experiment(str(tmp_path / "exp.yaml")), {})
    width = float(ET.fromstring(svg).get("width"))
    assert width >= MARGIN * 2 + sum(_legend_step(state) for state in COLORS) > 400  # one node is 240 wide


def test_dag_draws_every_artifact_labelled_and_coloured_by_state(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    populate(prefix, experiment)
    out = tmp_path / "dag.svg"
    assert main(["dag", "--configfile", experiment_file, "--prefix", prefix, "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out} (5 artifacts)\n"
    svg = ET.parse(out).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    nodes = {g.get("data-key"): g for g in svg.iterfind(".//s:g[@class='node']", ns)}
    assert set(nodes) == set(experiment.artifacts)
    assert nodes["tokenized/s@v1"].get("data-state") == "drifted"
    assert nodes["raw/s@v1"].get("data-state") == "built"
    labels = {g.get("data-key"): g.find("s:text", ns).text for g in nodes.values()}
    assert labels == {k: k for k in experiment.artifacts}
    fills = {g.get("data-state"): g.find("s:rect", ns).get("fill") for g in nodes.values()}
    assert len(set(fills.values())) == len(fills) - 1  # drifted and upstream rebuilt share yellow
    edges = {(p.get("data-from"), p.get("data-to")) for p in svg.iterfind(".//s:path[@class='edge']", ns)}
    assert edges == {(u, k) for k, a in experiment.artifacts.items() for u in a.upstream_keys()}
    assert main(["dag", "--configfile", experiment_file, "--prefix", prefix, "-o", "-"]) == 0
    assert capsys.readouterr().out == out.read_text()
    assert main(["dag", "--configfile", experiment_file, "-o", str(tmp_path / "dag.png")]) == 1
    assert "ending in .svg" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    for folder in (tmp_path / "afile", tmp_path / "nowhere"):  # the output's fault, not the prefix's
        assert main(["dag", "--configfile", experiment_file, "--prefix", prefix, "-o", str(folder / "d.svg")]) == 1
        assert capsys.readouterr().err == f"marin: -o {folder / 'd.svg'}: {folder} is not a folder; give an SVG file in an existing folder\n"
    assert not (tmp_path / "nowhere").exists()


def test_diff_and_history_read_a_gcs_prefix(experiment_file, gcs_prefix, capsys):  # noqa: F811
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    first = build(gcs_prefix, experiment, key, result={"final_val_loss": 3.5}, ended="2026-12-01T10:00:00.000Z")
    storage.write_json_atomic(f"{gcs_prefix}/checkpoints/nano/v1/.history/20261201T100000Z/.artifact.json", first)
    storage.write_json_atomic(
        f"{gcs_prefix}/checkpoints/nano/v0/.artifact.json", {**first, "version": "v0", "path": "checkpoints/nano/v0",
                                                           "result": {"final_val_loss": 4.0}})  # fmt: skip
    build(gcs_prefix, experiment, key, result={"final_val_loss": 3.0}, ended="2026-12-03T10:00:00.000Z")
    assert main(["history", key, "--prefix", gcs_prefix, "--configfile", experiment_file]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{key}: 2 attempts"
    assert main(["diff", "checkpoints/nano@v0", key, "--prefix", gcs_prefix, "--only-changed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("same recipe") and out[-1].split() == ["final_val_loss", "4", "3", "-1"]


def test_history_lists_unreadable_failure_and_history_records_naming_each_file(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    location = artifact_location(prefix, experiment[key].id)
    first = build(prefix, experiment, key, ended="2026-12-01T10:00:00.000Z")
    storage.write_json_atomic(f"{location}/.history/20261201T100000Z/.artifact.json", first)
    fail(prefix, experiment, key, "out of memory", "2026-12-02T09:00:00.000Z")
    build(prefix, experiment, key, ended="2026-12-03T10:00:00.000Z")
    empty = f"{location}/.failures/20261204T000000Z.json"
    garbled = f"{location}/.failures/20261205T000000Z.json"
    old_build = f"{location}/.history/20261202T100000Z/.artifact.json"
    storage.write_bytes_atomic(empty, b"")
    storage.write_bytes_atomic(garbled, b'{"error": ')
    storage.write_bytes_atomic(old_build, b"[1, 2]")
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{key}: 6 attempts (2 with an unreadable record, 1 replaced build whose record is unreadable, listed last)"
    assert [line.split()[2] for line in lines[1:5] if not line.startswith("      error")] == ["built", "failed", "built"]
    assert sorted(lines[-3:]) == sorted([
        f"  unreadable: {empty}: unreadable record (empty file); repair or delete the file",
        f"  unreadable: {garbled}: unreadable record (not valid JSON (Expecting value at line 1, column 11)); "
        "repair or delete the file",
        # a record a forced rebuild kept: history nothing reads, not a file to repair
        f"  replaced, its record unreadable: {old_build} (expected a JSON object, got [1, 2]): kept as found when a "
        "forced rebuild replaced that build (likely because this record was corrupt); nothing reads it, nothing to repair",
    ])  # fmt: skip
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file, "--json"]) == 0
    import json

    events = json.loads(capsys.readouterr().out)
    assert [e["outcome"] for e in events].count("unreadable") == 2
    assert [e["outcome"] for e in events].count("replaced, its record unreadable") == 1


def test_history_calls_a_pending_forced_rebuilds_saved_record_pending_not_replaced(experiment_file, tmp_path, capsys):  # noqa: F811
    # `.history/.forced-record` is a forced rebuild that has not run: no build was replaced,
    # and a rebuild that fails puts this content back as the current record
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    location = artifact_location(prefix, experiment[key].id)
    record = build(prefix, experiment, key, ended="2026-12-01T10:00:00.000Z")
    marker = f"{location}/.history/.forced-record"
    storage.write_bytes_atomic(marker, b'{"schema": ')
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{key}: 2 attempts (a pending forced rebuild whose saved record is unreadable, listed last)"
    assert lines[-1].startswith(
        f"  pending forced rebuild, its saved record unreadable: {marker} (not valid JSON (Expecting value at line 1, "
        "column 12)): saved by a forced rebuild that has not run yet, and put back as the current record if that "
        f"rebuild fails; rebuild it with: snakemake -f {location}/.artifact.json "
    ) and "--configfile" in lines[-1] and "replaced" not in lines[-1]  # the command runs as printed  # fmt: skip
    storage.write_json_atomic(marker, {**record, "result": {"final_val_loss": 9.0}})  # not the current record
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file, "--json"]) == 0
    import json

    outcomes = sorted(e["outcome"] for e in json.loads(capsys.readouterr().out))
    assert outcomes == ["built (current)", "built (pending forced rebuild)"]


@pytest.mark.parametrize("data,problem", [
    ({"error": "RuntimeError: boom"}, 'field error should be a mapping, got "RuntimeError: boom"'),
    ({"error": 5}, "field error should be a mapping, got 5"),
    ({"provenance": "x"}, 'field provenance should be a mapping, got "x"'),
])  # fmt: skip
def test_history_names_a_failure_record_of_the_wrong_shape_as_unreadable(experiment_file, tmp_path, capsys, data, problem):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    location = artifact_location(prefix, experiment[key].id)
    fail(prefix, experiment, key, "out of memory", "2026-12-02T09:00:00.000Z")
    odd = f"{location}/.failures/20261203T000000Z.json"
    storage.write_json_atomic(odd, data)
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{key}: 2 attempts (1 with an unreadable record, listed last)"
    assert lines[-1] == f"  unreadable: {odd}: unreadable record ({problem}); repair or delete the file"


def test_history_with_a_corrupt_current_record_still_lists_the_earlier_attempts(experiment_file, tmp_path, capsys):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    location = artifact_location(prefix, experiment[key].id)
    fail(prefix, experiment, key, "out of memory", "2026-12-02T09:00:00.000Z")
    storage.write_bytes_atomic(f"{location}/.artifact.json", b"{")
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{key}: 2 attempts (1 with an unreadable record, listed last)"
    assert lines[1].split()[2] == "failed"
    assert lines[-1].startswith(f"  unreadable: {location}/.artifact.json: not valid JSON (")


def test_history_lists_the_attempt_a_lease_names_killed_or_building(experiment_file, tmp_path, capsys):  # noqa: F811
    """An attempt killed by SIGKILL leaves a lease and no record: history lists it, as
    `marin status` reports it (its builder gone); a live lease is an attempt building now."""
    from marin_rules.artifacts.lease import acquire
    from test_inspect_status import leave_a_dead_holders_lease

    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    key = "checkpoints/nano@v1"
    location = artifact_location(prefix, experiment[key].id)
    fail(prefix, experiment, key, "out of memory", "2026-12-02T09:00:00.000Z")
    killed = leave_a_dead_holders_lease(location)
    assert main(["history", key, "--prefix", prefix, "--configfile", experiment_file]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{key}: 2 attempts"
    assert lines[1].split()[2] == "failed" and "killed (no record)" in lines[3]
    pid = killed.split(" pid ")[1].split()[0]
    assert lines[4] == f"      error: its builder (pid {pid}) is gone: killed? (no failure record)"

    other = artifact_location(prefix, experiment["raw/s@v1"].id)
    lease = acquire(other, is_done=lambda: False, wait=False)
    try:
        assert main(["history", "raw/s@v1", "--prefix", prefix, "--configfile", experiment_file]) == 0
    finally:
        lease.release()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "raw/s@v1: 1 attempt" and "building now (lease held)" in lines[1]
