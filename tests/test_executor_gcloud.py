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
from executor_helpers.snakemake_log import outer_jobid
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
    # each job's id in this run (a TPU worker's and a host job's own snakemake calls it 0)
    assert record["provenance"]["jobid"] == outer_jobid(proc.stderr, "pods/where/v1") != 0
    upstream = storage.read_json(f"{gcs_prefix}/raw/numbers/v1/.artifact.json")
    assert upstream["provenance"]["jobid"] == outer_jobid(proc.stderr, "raw/numbers/v1") != 0
    assert record["result"]["cwd"] == str(cloud / node / "worker-0" / "marin-rules")
    mirrored = list((wf / ".snakemake" / "marin-mirror").rglob("pods/where/v1/.artifact.json"))
    assert len(mirrored) == 1 and json.loads(mirrored[0].read_text()) == record
    driver_log = next((wf / ".snakemake" / "tpu" / "custom" / "pods" / "where" / "v1").glob("*/driver.log")).read_text()
    assert "setup ran" in driver_log and f"tpu executor: deleting queued resource {node}" in driver_log


def test_a_pod_job_that_fails_before_its_step_leaves_no_earlier_runs_job_log_in_place(tmp_path, gcs_env, gcs_prefix):
    """The worker's setup fails, so no log comes back: an earlier run's job.log of the
    artifact must not pass for this attempt's (Snakemake shows it as the failed job's log)."""
    wf = _workflow_checkout(tmp_path / "wf")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **gcs_env, **install_fake_cloud(tmp_path / "bin", cloud, workers=1), "PYTHONPATH": HELPERS,
           "FAKE_GCLOUD_WORKER_ENV": " ".join([*gcs_env, "PYTHONPATH"])}  # fmt: skip
    stale = wf / ".snakemake/marin-logs/pods/where/v1/job.log"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier run's log\n")
    command = [SNAKEMAKE, "--profile", "tpu", "--tpu-setup", "false", "--configfile", "exp.yaml",
               "--config", f"prefix={gcs_prefix}"]  # fmt: skip
    proc = subprocess.run(command, cwd=wf, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode != 0
    assert any(c[2:4] == ["tpu-vm", "ssh"] for c in gcloud_calls(cloud))  # it did reach the worker
    assert not stale.exists() and "an earlier run's log" not in proc.stderr


@pytest.mark.slow
def test_a_pod_job_holding_its_lease_on_a_worker_after_its_run_stopped_is_not_named_as_another_runs(
    tmp_path, gcs_env, gcs_prefix
):  # fmt: skip
    # a TPU worker's processes are out of reach of the cancel of the driver: the pod job
    # holds the artifact's lease after this run ended; at its exit, this run names what
    # another run holds (taken_by_another_run), and this is its own job, not another run's
    import signal
    import time

    from marin_rules.artifacts.lease import read_lease

    wf = _workflow_checkout(tmp_path / "wf")
    release = tmp_path / "release"
    (wf / "exp.yaml").write_text(
        "artifacts:\n  pods/hold@v1:\n    step: executor_helpers.pod_steps:hold_until_released\n"
        f"    config: {{release: {json.dumps(str(release))}}}\n    runtime: {{tpu: v5p-8}}\n"
    )
    env = {
        **os.environ, **gcs_env, **install_fake_cloud(tmp_path / "bin", tmp_path / "cloud", workers=1),
        "PYTHONPATH": HELPERS, "FAKE_GCLOUD_WORKER_ENV": " ".join([*gcs_env, "PYTHONPATH"]),
        "FAKE_GCLOUD_WORKERS_DETACHED": "1",
    }  # fmt: skip
    command = [SNAKEMAKE, "--profile", "tpu", "--tpu-zone", "us-east5-a", "--tpu-setup", "true",
               "--configfile", "exp.yaml", "--config", f"prefix={gcs_prefix}"]  # fmt: skip
    location = f"{gcs_prefix}/pods/hold/v1"
    proc = subprocess.Popen(command, cwd=wf, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while read_lease(location) is None:  # the worker's job has begun
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-6000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # the user stops the run
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode != 0, out[-6000:]
        assert read_lease(location) is not None, out[-6000:]  # the pod job still holds the lease
        assert "another run is building it" not in out, out[-6000:]
        assert "pods/hold@v1: this run's pod job still holds its lease from a TPU worker" in out, out[-6000:]
    finally:
        release.write_text("")  # the worker's job ends, releasing its lease
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        deadline = time.monotonic() + 120
        while read_lease(location) is not None and time.monotonic() < deadline:
            time.sleep(0.2)


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


def test_gcloud_backend_refuses_an_experiment_file_the_workers_would_not_get(tmp_path, gcs_prefix, gcs_env):
    """The workers get the working directory's git files: an experiment outside it, or
    one git ignores, is refused before any job (it failed on the worker, node made)."""
    wf = _workflow_checkout(tmp_path / "wf")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **gcs_env, **install_fake_cloud(tmp_path / "bin", cloud), "PYTHONPATH": HELPERS}
    outside = tmp_path / "elsewhere.yaml"
    shutil.copy(wf / "exp.yaml", outside)
    (wf / "scratch").mkdir()
    shutil.copy(wf / "exp.yaml", wf / "scratch" / "exp.yaml")
    (wf / ".gitignore").write_text(".snakemake/\nscratch/\n")
    for experiment, problem in ((str(outside), f"lies outside the working directory {wf}"),
                                ("scratch/exp.yaml", "is ignored by git")):  # fmt: skip
        proc = subprocess.run(
            [SNAKEMAKE, "--profile", "tpu", "--configfile", experiment, "--config", f"prefix={gcs_prefix}"],
            cwd=wf, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode != 0
        (line,) = [line for line in proc.stderr.splitlines() if problem in line]
        shown = wf / experiment  # made absolute (an absolute `experiment` stays as it is)
        assert line.startswith(f"marin-rules: pods/where@v1: its job goes to TPU workers: the experiment file {shown} ")
        assert gcloud_calls(cloud) == [] and not storage.exists(f"{gcs_prefix}/raw/numbers/v1/.artifact.json")


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


def test_a_bad_tpu_setting_on_the_command_line_is_refused_before_any_job(tmp_path):
    wf = _workflow_checkout(tmp_path / "wf")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **install_fake_cloud(tmp_path / "bin", cloud), "PYTHONPATH": HELPERS}
    proc = subprocess.run(
        [SNAKEMAKE, "--profile", "tpu", "--tpu-zone", "us-east5-a'x", "--configfile", "exp.yaml",
         "--config", "target=raw/numbers@v1"],
        cwd=wf, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "tpu executor: zone (resource tpu_zone / --tpu-zone) \"us-east5-a'x\" is not valid" in proc.stderr
    assert not (wf / "artifacts").exists() and gcloud_calls(cloud) == []  # the local job did not run either
