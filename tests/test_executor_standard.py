"""Snakemake's standard executor-plugin tests (`snakemake.common.tests`), the cases every
executor plugin runs in its CI, run against the `tpu` executor three ways:

  - default settings (`--tpu-backend gcloud`): no job asks for a TPU, so every job
    runs on this host (a job group as one process);
  - `--tpu-backend local-pod`, with `--set-resources c:tpu=default d:tpu=default`:
    rules c and d run as pods of 2 local processes, the others (and the groups
    workflow's a/b group) on this host, side by side in one run;
  - `--tpu-backend gcloud` with the same pods, against a FAKE `gcloud` on PATH
    (tests/executor_helpers/fake_gcloud.py; no cloud is called): the workers are
    folders sharing no disk with the run, so c and d only succeed if the executor
    copies their inputs to the workers and their outputs and logs back.

Plus: a job group whose member asks for a TPU is refused (a pod runs one job).

Not run: `TestWorkflowsMinioPlayStorageBase` needs an S3 server (MinIO on port 9000) and
the S3 storage plugin; nothing like it is installed here. With a storage the executor
moves no files (see transfer.py), which the gcloud case below shows for local files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import snakemake.common.tests
from snakemake.settings import types as settings
from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from executor_helpers.fake_cloud import gcloud_calls, install_fake_cloud
from snakemake_executor_plugin_tpu import ExecutorSettings

POD_RULES = {"c": {"tpu": "default"}, "d": {"tpu": "default"}}  # c and d exist in both standard workflows


class TestWorkflowsDefaultSettings(snakemake.common.tests.TestWorkflowsLocalStorageBase):
    __test__ = True

    def get_executor(self) -> str:
        return "tpu"

    def get_executor_settings(self) -> Optional[ExecutorSettingsBase]:
        return ExecutorSettings()


class TestWorkflowsLocalPod(TestWorkflowsDefaultSettings):
    __test__ = True

    def get_executor_settings(self) -> Optional[ExecutorSettingsBase]:
        return ExecutorSettings(backend="local-pod", local_processes=2, local_devices=1)

    def get_resource_settings(self) -> settings.ResourceSettings:
        return settings.ResourceSettings(overwrite_resources=POD_RULES)

    def run_workflow(self, test_name, tmp_path, deployment_method=frozenset()):
        super().run_workflow(test_name, tmp_path, deployment_method)
        logs = sorted(p.name for p in (Path(tmp_path) / test_name / ".snakemake" / "tpu" / "c").glob("*/*.log"))
        assert logs == ["process-0.log", "process-1.log"]  # c ran as a pod of two processes


class TestWorkflowsFakeGcloud(TestWorkflowsDefaultSettings):
    __test__ = True

    def get_executor_settings(self) -> Optional[ExecutorSettingsBase]:
        return ExecutorSettings(backend="gcloud", type="v5p-8", zone="us-east5-a")

    def get_resource_settings(self) -> settings.ResourceSettings:
        return settings.ResourceSettings(overwrite_resources=POD_RULES)

    def _copy_test_files(self, test_path, tmp_path):
        super()._copy_test_files(test_path, tmp_path)
        # the executor sends the workflow's sources as git lists them
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)

    def run_workflow(self, test_name, tmp_path, deployment_method=frozenset()):
        cloud = Path(tmp_path) / "cloud"
        saved = dict(os.environ)
        os.environ.update(install_fake_cloud(Path(tmp_path) / "bin", cloud, workers=2))
        try:
            super().run_workflow(test_name, tmp_path, deployment_method)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        ssh_nodes = [c[4] for c in gcloud_calls(cloud) if c[2:4] == ["tpu-vm", "ssh"]]
        assert sorted(n.split("-")[1] for n in ssh_nodes) == (["c", "d", "d"] if test_name == "simple" else ["c"])
        for node in ssh_nodes:  # every pod job's node was deleted
            assert not (cloud / "nodes" / node).exists()
        c_node = cloud / next(n for n in ssh_nodes if n.split("-")[1] == "c")
        assert (c_node / "worker-1" / "snakemake-workflow" / "Snakefile").exists()  # the sources reached every worker
        # each worker ran the job in its own copy of the workdir, not in this host's (the
        # API passes the workdir as --directory; both workers once wrote into it at once)
        for worker in ("worker-0", "worker-1"):
            assert (c_node / worker / "snakemake-workflow" / "test3.out").exists()


def test_a_group_member_that_asks_for_a_tpu_is_refused_with_the_fix(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: "b.txt"\n'
        'rule a:\n    output: "a.txt"\n    group: "g"\n    resources: tpu="default"\n    shell: "touch {output}"\n'
        'rule b:\n    input: "a.txt"\n    output: "b.txt"\n    group: "g"\n    shell: "cp {input} {output}"\n'
    )
    snakemake = str(Path(sys.executable).parent / "snakemake")
    command = [snakemake, "--executor", "tpu", "--jobs", "2", "--tpu-backend", "local-pod"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "tpu executor: rule(s) a ask for a tpu inside group" in proc.stderr
    assert "remove `group:` (or --groups) for them" in proc.stderr
    assert not (tmp_path / "a.txt").exists()
