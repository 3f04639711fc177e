"""`snakemake --profile tpu` with the gcloud backend, end to end, against a FAKE
`gcloud` that this test writes onto PATH (tests/executor_helpers/fake_gcloud.py): its
"TPU workers" are folders here and its ssh runs the worker command locally. No
cloud is called. The prefix is gs:// on the local GCS emulator (conftest). The workers
share no disk and no environment with this run: they get the workflow's sources and
the job's declared inputs (the upstream's mirrored record) from the executor, the
emulator's variables stand in for a TPU VM's service account, and PYTHONPATH for the
user's package installed by --tpu-setup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SNAKEMAKE
from executor_helpers.fake_cloud import gcloud_calls, install_fake_cloud
from marin_rules.artifacts import storage

HELPERS = str(Path(__file__).resolve().parent)


def _workflow_checkout(dest: Path) -> Path:
    """A git checkout of the workflow (what the executor tars up for the workers)."""
    dest.mkdir()
    shutil.copy(REPO / "Snakefile", dest / "Snakefile")
    shutil.copytree(REPO / "rules", dest / "rules")
    shutil.copytree(REPO / "profiles", dest / "profiles", ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink("profiles/tpu", dest / "tpu")
    subprocess.run(["git", "init", "-q", str(dest)], check=True, timeout=30)
    (dest / ".gitignore").write_text(".snakemake/\n")
    (dest / "exp.yaml").write_text(
        """
artifacts:
  raw/numbers@v1:
    step: executor_helpers.pod_steps:write_numbers
  pods/where@v1:
    step: executor_helpers.pod_steps:where_am_i
    deps: {numbers: raw/numbers@v1}
    runtime: {tpu: v5p-8, zone: us-east5-b}
"""
    )
    return dest


@pytest.mark.slow
def test_gcloud_backend_runs_the_pod_job_on_the_slice_and_brings_its_record_back(tmp_path, gcs_env, gcs_prefix):
    wf = _workflow_checkout(tmp_path / "wf")
    cloud = tmp_path / "cloud"
    env = {
        **os.environ, **gcs_env, **install_fake_cloud(tmp_path / "bin", cloud, workers=1), "PYTHONPATH": HELPERS,
        "FAKE_GCLOUD_WORKER_ENV": " ".join([*gcs_env, "PYTHONPATH"]),
    }  # fmt: skip
    command = [
        SNAKEMAKE, "--profile", "tpu", "--tpu-zone", "us-east5-a", "--tpu-setup", "echo setup ran",
        "--configfile", "exp.yaml", "--config", f"prefix={gcs_prefix}",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=wf, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-6000:]

    calls = gcloud_calls(cloud)
    assert [c[2:4] for c in calls] == [
        ["queued-resources", "describe"], ["queued-resources", "create"], ["queued-resources", "describe"],
        ["tpu-vm", "scp"], ["tpu-vm", "scp"], ["tpu-vm", "ssh"], ["tpu-vm", "scp"], ["queued-resources", "delete"],
    ]  # fmt: skip  (queued resources, sources + inputs out, outputs back, node deleted)
    create = calls[1]
    node = create[4]
    assert node.startswith("snakemake-custom-pods-where-v1-")
    assert create[create.index("--accelerator-type") + 1] == "v5p-8"
    assert create[create.index("--zone") + 1] == "us-east5-b"  # runtime.zone (the tpu_zone resource) beats --tpu-zone
    assert all(node in " ".join(c) for c in calls)  # one node: raw/numbers ran here, not on a TPU
    assert "tpu executor: rule custom (artifact=raw/numbers/v1): on this host" in proc.stderr

    record = storage.read_json(f"{gcs_prefix}/pods/where/v1/.artifact.json")
    assert record["result"]["distributed"] == "auto"  # MARIN_POD_COORDINATOR=auto on TPU VMs
    assert record["result"]["total"] == 36  # read the upstream's data from the prefix
    assert record["result"]["cwd"] == str(cloud / node / "worker-0" / "marin-rules")
    mirrored = list((wf / ".snakemake" / "marin-mirror").rglob("pods/where/v1/.artifact.json"))
    assert len(mirrored) == 1 and json.loads(mirrored[0].read_text()) == record
    driver_log = next((wf / ".snakemake" / "tpu" / "custom" / "pods" / "where" / "v1").glob("*/driver.log")).read_text()
    assert "setup ran" in driver_log and f"tpu executor: deleting queued resource {node}" in driver_log


def test_gcloud_backend_refuses_a_local_prefix_before_running_anything(tmp_path):
    wf = _workflow_checkout(tmp_path / "wf")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **install_fake_cloud(tmp_path / "bin", cloud), "PYTHONPATH": HELPERS}
    proc = subprocess.run(
        [SNAKEMAKE, "--profile", "tpu", "--configfile", "exp.yaml"], cwd=wf, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    (line,) = [line for line in proc.stderr.splitlines() if "TPU workers cannot see the local prefix 'artifacts'" in line]
    assert line.startswith("marin-rules: pods/where@v1: its job goes to TPU workers: ")  # one line, no frames
    assert "--config prefix=gs://BUCKET/PATH" in line
    assert "MarinError" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (wf / "artifacts").exists() and gcloud_calls(cloud) == []


def test_gcloud_backend_runs_a_plan_without_pod_jobs_on_a_local_prefix(tmp_path):
    # no planned job asks for a TPU: every job runs on this host, which sees the local prefix
    wf = _workflow_checkout(tmp_path / "wf")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **install_fake_cloud(tmp_path / "bin", cloud), "PYTHONPATH": HELPERS}
    proc = subprocess.run(
        [SNAKEMAKE, "--profile", "tpu", "--configfile", "exp.yaml", "--config", "target=raw/numbers@v1"],
        cwd=wf, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "cannot see the local prefix" not in proc.stderr
    assert storage.exists(str(wf / "artifacts/raw/numbers/v1/.artifact.json")) and gcloud_calls(cloud) == []
