"""The local mirror of a gs:// prefix's records (real gsfs against the GCS emulator)."""

from __future__ import annotations

import os

from marin_rules.artifacts import storage
from marin_rules.artifacts.records import mirror_root
from marin_rules.mirror import refresh_mirror


def mirrored(mirror: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(mirror):
        for f in files:
            if f == ".artifact.json":
                path = os.path.join(dirpath, f)
                out[os.path.relpath(path, mirror)] = open(path, "rb").read()
    return out


def test_mirror_root_is_under_snakemake_folder_by_scheme_and_path():
    assert mirror_root("gs://bucket/a/b/") == ".snakemake/marin-mirror/gs/bucket/a/b"


def test_mirror_holds_exactly_the_prefix_records_after_adds_changes_and_deletes(gcs_prefix, tmp_path):
    mirror = str(tmp_path / "mirror")
    for name in ("raw/a/v1", "raw/b/v1", "tok/c/v2"):
        storage.write_bytes_atomic(f"{gcs_prefix}/{name}/.artifact.json", name.encode())
    storage.write_bytes_atomic(f"{gcs_prefix}/raw/a/v1/data.bin", b"not a record")
    storage.write_bytes_atomic(f"{gcs_prefix}/raw/a/v1/.history/2026/.artifact.json", b"old build")
    refresh_mirror(gcs_prefix, mirror)
    assert mirrored(mirror) == {"raw/a/v1/.artifact.json": b"raw/a/v1", "raw/b/v1/.artifact.json": b"raw/b/v1",
                                "tok/c/v2/.artifact.json": b"tok/c/v2"}  # fmt: skip
    storage.write_bytes_atomic(f"{gcs_prefix}/raw/b/v1/.artifact.json", b"rebuilt")
    storage.filesystem(gcs_prefix)[0].rm_file(f"{gcs_prefix}/tok/c/v2/.artifact.json")
    storage.write_bytes_atomic(f"{gcs_prefix}/new/d/v1/.artifact.json", b"new")
    refresh_mirror(gcs_prefix, mirror)
    assert mirrored(mirror) == {"raw/a/v1/.artifact.json": b"raw/a/v1", "raw/b/v1/.artifact.json": b"rebuilt",
                                "new/d/v1/.artifact.json": b"new"}  # fmt: skip


def test_refreshing_an_unchanged_prefix_rewrites_no_mirrored_record(gcs_prefix, tmp_path):
    mirror = str(tmp_path / "mirror")
    for i in range(5):
        storage.write_bytes_atomic(f"{gcs_prefix}/sweep/i{i}/v1/.artifact.json", b"{}")
    refresh_mirror(gcs_prefix, mirror)
    before = {p: os.stat(os.path.join(mirror, p)).st_mtime_ns for p in mirrored(mirror)}
    refresh_mirror(gcs_prefix, mirror)
    assert {p: os.stat(os.path.join(mirror, p)).st_mtime_ns for p in mirrored(mirror)} == before
    assert len(before) == 5


def test_a_mirrored_record_deleted_locally_is_fetched_again(gcs_prefix, tmp_path):
    mirror = str(tmp_path / "mirror")
    storage.write_bytes_atomic(f"{gcs_prefix}/raw/a/v1/.artifact.json", b"a")
    refresh_mirror(gcs_prefix, mirror)
    os.remove(os.path.join(mirror, "raw/a/v1/.artifact.json"))
    refresh_mirror(gcs_prefix, mirror)
    assert mirrored(mirror) == {"raw/a/v1/.artifact.json": b"a"}


def test_an_empty_or_missing_prefix_empties_the_mirror(gcs_prefix, tmp_path):
    mirror = str(tmp_path / "mirror")
    storage.write_bytes_atomic(os.path.join(mirror, "gone/x/v1/.artifact.json"), b"stale")
    refresh_mirror(gcs_prefix + "/nothing-here", mirror)
    assert mirrored(mirror) == {}


def test_the_pointer_of_a_forced_rebuild_under_way_is_mirrored_until_it_goes(gcs_prefix, tmp_path):
    # planning reads it (session._rebuild_unended): the record beside it may be a backup over partial data
    mirror = tmp_path / "mirror"
    storage.write_bytes_atomic(f"{gcs_prefix}/ck/t/v1/.artifact.json", b"old")
    storage.write_bytes_atomic(f"{gcs_prefix}/ck/t/v1/.history/.rebuilding", b'{"moved": "2026"}')
    refresh_mirror(gcs_prefix, str(mirror))
    assert (mirror / "ck/t/v1/.history/.rebuilding").read_bytes() == b'{"moved": "2026"}'
    storage.filesystem(gcs_prefix)[0].rm_file(f"{gcs_prefix}/ck/t/v1/.history/.rebuilding")
    refresh_mirror(gcs_prefix, str(mirror))
    assert not (mirror / "ck/t/v1/.history/.rebuilding").exists()
