"""The tpu executor's placement and command lines as strings, the gcloud driver
against a fake `gcloud` on PATH (written by the test: no cloud is ever called), the
process group that runs pod processes, and the pod variables marin jobs read."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from snakemake_interface_common.exceptions import WorkflowError

from executor_helpers.fake_cloud import gcloud_calls, install_fake_cloud
from marin_rules.artifacts.errors import MarinError
from marin_rules.cluster.pod import pod_process_from_env, refuse_unreachable_prefix
from snakemake_executor_plugin_tpu import gcloud, placement, transfer
from snakemake_executor_plugin_tpu.gcloud import TpuNode
from snakemake_executor_plugin_tpu.local_pod import LocalPodSpec, ProcessGroup, process_env

VM = TpuNode("marin-x", "v5p-8", zone="us-east5-a", project="proj")
QUEUED = TpuNode("marin-x", "v5p-32", zone="us-east5-a", queued=True, spot=True)


def test_create_commands_for_a_tpu_vm_and_a_queued_resource():
    assert gcloud.create_command(VM) == (
        "gcloud compute tpus tpu-vm create marin-x --accelerator-type v5p-8 --version v2-alpha-tpuv5 "
        "--zone us-east5-a --project proj"
    )
    assert gcloud.create_command(QUEUED) == (
        "gcloud compute tpus queued-resources create marin-x --node-id marin-x --accelerator-type v5p-32 "
        "--runtime-version v2-alpha-tpuv5 --zone us-east5-a --spot"
    )


def test_state_and_delete_commands_match_the_node_kind():
    assert gcloud.state_command(VM).endswith("tpu-vm describe marin-x --zone us-east5-a --project proj '--format=value(state)'")
    assert "queued-resources describe marin-x" in gcloud.state_command(QUEUED)
    assert "'--format=value(state.state)'" in gcloud.state_command(QUEUED)
    assert gcloud.delete_command(VM) == "gcloud compute tpus tpu-vm delete marin-x --zone us-east5-a --project proj --quiet"
    assert gcloud.delete_command(QUEUED) == (
        "gcloud compute tpus queued-resources delete marin-x --zone us-east5-a --force --quiet"
    )


def test_zone_and_project_are_left_to_gcloud_config_when_empty():
    node = TpuNode("n", "v4-8")
    assert gcloud.create_command(node) == "gcloud compute tpus tpu-vm create n --accelerator-type v4-8 --version tpu-ubuntu2204-base"


def test_runtime_version_defaults_by_generation_and_unknown_types_say_what_to_pass():
    assert gcloud.default_runtime_version("v5litepod-16") == "v2-alpha-tpuv5-lite"
    assert gcloud.default_runtime_version("v6e-8") == "v2-alpha-tpuv6e"
    assert TpuNode("n", "v5p-8", runtime_version="custom").version == "custom"
    with pytest.raises(ValueError, match="--tpu-runtime-version"):
        gcloud.default_runtime_version("v9x-8")


def test_ssh_runs_the_command_on_all_workers_as_one_quoted_argument():
    inner = "cd 'my dir' && echo \"$HOME\""
    argv = shlex.split(gcloud.ssh_command(VM, inner))
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "marin-x"]
    assert "--worker=all" in argv
    assert argv[argv.index("--command") + 1] == inner


def test_worker_command_unpacks_sets_up_learns_its_place_runs_the_job_then_worker_0_packs_outputs():
    cmd = gcloud.worker_command(
        "python3 -m snakemake --mode remote", "wf", "pip install -e .", archives=["src.tar.gz", "in.tar.gz"],
        outputs=["out/a b.txt", "logs/x.log"], outputs_archive="back.tar.gz",
    )  # fmt: skip
    parts = cmd.split(" && ")
    assert parts[:3] == ["mkdir -p wf", "tar -xzf src.tar.gz -C wf", "tar -xzf in.tar.gz -C wf"]
    assert parts[3:5] == ["cd wf", "( pip install -e . )"]
    assert parts[5] == "export SNAKEMAKE_TPU_COORDINATOR=auto"
    assert parts[6].startswith("export SNAKEMAKE_TPU_PROCESS_ID=$(curl -sf -H 'Metadata-Flavor: Google' ")
    assert parts[6].endswith("/instance/attributes/agent-worker-number)")
    assert "worker-network-endpoints" in parts[7] and parts[7].startswith("export SNAKEMAKE_TPU_NUM_PROCESSES=")
    assert parts[8] == "python3 -m snakemake --mode remote"
    assert parts[9] == (
        '{ [ "$SNAKEMAKE_TPU_PROCESS_ID" != 0 ] || tar -czf "$HOME"/back.tar.gz --ignore-failed-read -- '
        "'out/a b.txt' logs/x.log; }"
    )


def test_worker_command_without_copies_setup_or_outputs_only_changes_directory():
    cmd = gcloud.worker_command("run", "w")
    assert cmd.startswith("cd w && export SNAKEMAKE_TPU_COORDINATOR=auto") and cmd.endswith(" && run")


def test_a_job_goes_to_a_pod_only_when_its_tpu_resource_asks_for_one():
    assert placement.pod_tpu_type("v5p-64", "v4-8") == "v5p-64"
    assert placement.pod_tpu_type("default", "v4-8") == "v4-8"
    for nothing in (None, "", 0, "none", " "):
        assert placement.pod_tpu_type(nothing, "v4-8") is None


def test_node_names_are_valid_gcloud_names_and_distinct_per_job():
    import re

    a = placement.node_name("train", {"artifact": "checkpoints/Nano_MoE/v1"})
    b = placement.node_name("train", {"artifact": "checkpoints/nano-moe/v1"})
    c = placement.node_name("eval", {"artifact": "checkpoints/nano-moe/v1"})
    long = placement.node_name("train", {"a": "sweeps/" + "x" * 80, "b": "v1"})
    for name in (a, b, c, long):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 50, name
    assert len({a, b, c}) == 3
    assert a.startswith("snakemake-train-checkpoints-nano-moe-v1-")
    assert placement.node_name("train", {}, fixed="my-tpu") == "my-tpu"


def test_job_log_folders_are_safe_path_parts_of_rule_and_wildcards():
    assert placement.job_parts("train", {"artifact": "checkpoints/x/v1", "n": 3}) == ["train", "checkpoints", "x", "v1", "3"]
    assert placement.job_parts("r", {"w": "../a b/./c"}) == ["r", "_", "a_b", "_", "c"]
    assert placement.job_description("r", {"w": "a/b"}) == "rule r (w=a/b)" and placement.job_description("r", {}) == "rule r"


def test_tpu_node_takes_the_zone_resource_over_the_setting():
    settings = SimpleNamespace(node="", zone="us-central2-b", project="p", runtime_version="", queued=True, spot=False)
    node = placement.tpu_node(settings, "n", "v4-32", zone="europe-west4-a")
    assert (node.zone, node.project, node.accelerator_type, node.queued) == ("europe-west4-a", "p", "v4-32", True)
    assert placement.tpu_node(settings, "n", "v4-32", zone="").zone == "us-central2-b"


def test_transferred_files_are_relative_to_the_workdir_and_storage_files_stay_with_the_job(tmp_path):
    class StorageFile(str):  # as Snakemake's IO files in a storage say of themselves
        is_storage = True

    files = ["b.txt", str(tmp_path / "a" / "x.txt"), "b.txt", StorageFile(".snakemake/storage/gcs/b/x")]
    assert transfer.local_paths(files, "input", str(tmp_path)) == [os.path.join("a", "x.txt"), "b.txt"]
    with pytest.raises(WorkflowError, match=r"the input '/etc/hosts' lies outside the working directory"):
        transfer.local_paths(["/etc/hosts"], "input", str(tmp_path))


def test_marin_jobs_read_the_place_the_local_pod_gives_them():
    env = process_env({}, LocalPodSpec(3, 2), 5555, 2)
    pod = pod_process_from_env(env)
    assert (pod.coordinator, pod.num_processes, pod.process_id) == ("127.0.0.1:5555", 3, 2)
    assert pod.runtime_distributed() == {"coordinator": "127.0.0.1:5555", "num_processes": 3, "process_id": 2}


def test_only_cloud_tpu_workers_with_a_local_prefix_are_refused():
    gcloud_settings, local_settings = SimpleNamespace(backend="gcloud"), SimpleNamespace(backend="local-pod")
    with pytest.raises(MarinError, match="TPU workers cannot see the local prefix 'artifacts'"):
        refuse_unreachable_prefix("tpu", gcloud_settings, "artifacts")
    refuse_unreachable_prefix("tpu", gcloud_settings, "gs://b/p")  # a bucket: fine
    refuse_unreachable_prefix("tpu", local_settings, "artifacts")  # a local pod shares this disk
    refuse_unreachable_prefix("local", None, "artifacts")  # another executor


def test_local_pod_environment_places_each_process_and_fakes_its_devices():
    env = process_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=1 --other", "KEEP": "1"}, LocalPodSpec(2, 4), 5555, 1)
    assert env["SNAKEMAKE_TPU_COORDINATOR"] == "127.0.0.1:5555"
    assert (env["SNAKEMAKE_TPU_NUM_PROCESSES"], env["SNAKEMAKE_TPU_PROCESS_ID"]) == ("2", "1")
    assert env["XLA_FLAGS"] == "--other --xla_force_host_platform_device_count=4"
    assert env["JAX_PLATFORMS"] == "cpu" and env["KEEP"] == "1"
    with pytest.raises(ValueError, match="num_processes"):
        LocalPodSpec(0, 4)


def test_one_failed_pod_process_terminates_the_others_within_the_grace(tmp_path):
    armed = tmp_path / "armed"  # the TERM-ignoring process is ready: only then fail
    stubborn = f"trap '' TERM; touch {armed}; exec sleep 60"
    failing = f"until [ -e {armed} ]; do sleep 0.01; done; exit 3"
    group = ProcessGroup.start([failing, "sleep 60", stubborn], [os.environ] * 3, [tmp_path / f"{i}.log" for i in range(3)])
    group.grace = 1.0
    started = time.monotonic()
    assert group.wait(timeout=30) == 3
    assert 1.0 <= time.monotonic() - started < 10  # the TERM-ignoring one got SIGKILL after the grace
    assert group.first_failure == (0, 3)
    assert [p.returncode for p in group.procs] == [3, -15, -9]


# ---- the driver script against the fake gcloud -------------------------------------------


def _run_driver(tmp_path: Path, node: TpuNode, worker_cmd: str, extra_env: dict | None = None, **kw) -> tuple[int, list]:
    root = tmp_path / "cloud"
    env = {**os.environ, **install_fake_cloud(tmp_path / "bin", root, workers=2), **(extra_env or {})}
    group = gcloud.start_driver(gcloud.driver_script(node, worker_cmd, **kw), tmp_path / "job", env=env)
    code = group.wait(timeout=60)
    return code, gcloud_calls(root)


def test_driver_creates_the_node_copies_files_runs_every_worker_fetches_outputs_and_deletes_it(tmp_path):
    archive = tmp_path / "wf.tar.gz"
    subprocess.run(["tar", "-czf", str(archive), "-C", str(Path(__file__).parent), "executor_helpers"], check=True)
    worker = gcloud.worker_command(
        'echo "$SNAKEMAKE_TPU_PROCESS_ID/$SNAKEMAKE_TPU_NUM_PROCESSES/$SNAKEMAKE_TPU_COORDINATOR" > out/place.txt',
        "wf", archives=["remote.tar.gz"], outputs=["out/place.txt"], outputs_archive="back.tar.gz",
    )  # fmt: skip
    worker = worker.replace("cd wf && ", "cd wf && mkdir -p out && ", 1)
    here = tmp_path / "here"
    here.mkdir()
    code, calls = _run_driver(
        tmp_path, QUEUED, worker, uploads=[(str(archive), "remote.tar.gz")],
        download=("back.tar.gz", str(tmp_path / "back.tar.gz"), str(here)),
    )  # fmt: skip
    assert code == 0, (tmp_path / "job" / "driver.log").read_text()
    verbs = [c[2:4] for c in calls]
    assert verbs == [
        ["queued-resources", "describe"], ["queued-resources", "create"], ["queued-resources", "describe"],
        ["tpu-vm", "scp"], ["tpu-vm", "ssh"], ["tpu-vm", "scp"], ["queued-resources", "delete"],
    ]  # fmt: skip
    assert calls[5][4:6] == ["marin-x:back.tar.gz", str(tmp_path / "back.tar.gz")] and "--worker=0" in calls[5]
    homes = tmp_path / "cloud" / "marin-x"
    assert [(homes / f"worker-{i}" / "wf" / "out" / "place.txt").read_text().strip() for i in range(2)] == [
        "0/2/auto", "1/2/auto",
    ]  # fmt: skip
    assert (homes / "worker-1" / "wf" / "executor_helpers" / "fake_gcloud.py").exists()
    assert (here / "out" / "place.txt").read_text().strip() == "0/2/auto"  # worker 0's output came back
    assert not (homes / "worker-1" / "back.tar.gz").exists()  # only worker 0 packs
    assert not (tmp_path / "cloud" / "nodes" / "marin-x").exists()


def test_driver_deletes_the_node_when_the_job_fails(tmp_path):
    code, calls = _run_driver(tmp_path, VM, "true", extra_env={"FAKE_GCLOUD_SSH_EXIT": "3"})
    assert code == 3
    assert calls[-1][2:4] == ["tpu-vm", "delete"]


def test_driver_reuses_an_existing_node_and_keeps_it_when_asked(tmp_path):
    (tmp_path / "cloud" / "nodes").mkdir(parents=True)
    (tmp_path / "cloud" / "nodes" / "marin-x").write_text("READY")
    code, calls = _run_driver(tmp_path, VM, "true", delete=False)
    assert code == 0
    assert [c[3] for c in calls] == ["describe", "describe", "ssh"]
    assert "reusing TPU VM marin-x" in (tmp_path / "job" / "driver.log").read_text()
