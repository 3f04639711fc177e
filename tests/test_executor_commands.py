"""The tpu executor's command lines as strings, the gcloud driver against a fake
`gcloud` on PATH (written by the test: no cloud is ever called), and the process
group that runs pod processes."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from executor_helpers.fake_cloud import gcloud_calls, install_fake_cloud
from marin_rules.cluster import gcloud
from marin_rules.cluster.gcloud import TpuNode
from marin_rules.cluster.local_pod import LocalPodSpec, ProcessGroup, pod_processes, process_env
from snakemake_executor_plugin_tpu import commands

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


def test_worker_command_unpacks_sets_up_learns_its_place_then_runs_the_job():
    cmd = gcloud.worker_command(
        "python3 -m snakemake --mode remote", "marin-rules", "pip install -e .", archive="wf.tar.gz", before="echo pre"
    )
    parts = cmd.split(" && ")
    assert parts[0] == "mkdir -p marin-rules" and parts[1] == "tar -xzf wf.tar.gz -C marin-rules"
    assert parts[2:4] == ["cd marin-rules", "( pip install -e . )"]
    assert parts[4] == "export MARIN_POD_COORDINATOR=auto"
    assert parts[5].startswith("export MARIN_POD_PROCESS_ID=$(curl -sf -H 'Metadata-Flavor: Google' ")
    assert parts[5].endswith("/instance/attributes/agent-worker-number)")
    assert "worker-network-endpoints" in parts[6] and parts[6].startswith("export MARIN_POD_NUM_PROCESSES=")
    assert parts[-2:] == ["echo pre", "python3 -m snakemake --mode remote"]


def test_worker_command_without_copy_or_setup_only_changes_directory():
    cmd = gcloud.worker_command("run", "w")
    assert cmd.startswith("cd w && export MARIN_POD_COORDINATOR=auto") and cmd.endswith(" && run")


def test_pod_placement_resource_wins_then_runtime_then_train_default():
    assert commands.pod_tpu_type("train", "v5p-64", {"tpu": "v5p-8"}, "v4-8") == "v5p-64"
    assert commands.pod_tpu_type("train", None, {"tpu": "v5p-8"}, "v4-8") == "v5p-8"
    assert commands.pod_tpu_type("train", None, {}, "v4-8") == "v4-8"
    assert commands.pod_tpu_type("custom", None, {"tpu": "v6e-4"}, "v4-8") == "v6e-4"
    assert commands.pod_tpu_type("custom", None, {}, "v4-8") is None


def test_node_names_are_valid_gcloud_names_and_distinct_per_artifact():
    import re

    a = commands.node_name("checkpoints/Nano_MoE/v1")
    b = commands.node_name("checkpoints/nano-moe/v1")
    long = commands.node_name("sweeps/" + "x" * 80 + "/v1")
    for name in (a, b, long):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 50, name
    assert a != b
    assert commands.node_name("anything/v1", fixed="my-tpu") == "my-tpu"


def test_tpu_node_takes_zone_from_the_artifact_runtime_over_the_profile():
    settings = SimpleNamespace(node="", zone="us-central2-b", project="p", runtime_version="", queued=True, spot=False)
    node = commands.tpu_node(settings, "checkpoints/m/v1", {"tpu": "v4-32", "zone": "europe-west4-a"}, "v4-32")
    assert (node.zone, node.project, node.accelerator_type, node.queued) == ("europe-west4-a", "p", "v4-32", True)


def test_mirror_refresh_command_passes_the_prefix_as_an_argument():
    argv = shlex.split(commands.mirror_refresh_command("gs://b/p q"))
    assert argv[0] == "python3" and argv[1] == "-c" and argv[3] == "gs://b/p q"
    assert "refresh_mirror(sys.argv[1], mirror_root(sys.argv[1]))" in argv[2]


def test_local_pod_environment_places_each_process_and_fakes_its_devices():
    procs = pod_processes(LocalPodSpec(2, 4), 5555)
    env = process_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=1 --other", "KEEP": "1"}, procs[1], 4)
    assert env["MARIN_POD_COORDINATOR"] == "127.0.0.1:5555"
    assert (env["MARIN_POD_NUM_PROCESSES"], env["MARIN_POD_PROCESS_ID"]) == ("2", "1")
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


def test_driver_creates_the_node_copies_the_workflow_runs_every_worker_and_deletes_it(tmp_path):
    archive = tmp_path / "wf.tar.gz"
    subprocess.run(["tar", "-czf", str(archive), "-C", str(Path(__file__).parent), "executor_helpers"], check=True)
    worker = gcloud.worker_command(
        'echo "$MARIN_POD_PROCESS_ID/$MARIN_POD_NUM_PROCESSES/$MARIN_POD_COORDINATOR" > place.txt',
        "wf", archive="remote.tar.gz",
    )  # fmt: skip
    code, calls = _run_driver(tmp_path, QUEUED, worker, archive=str(archive), remote_archive="remote.tar.gz")
    assert code == 0, (tmp_path / "job" / "driver.log").read_text()
    verbs = [c[2:4] for c in calls]
    assert verbs == [
        ["queued-resources", "describe"], ["queued-resources", "create"], ["queued-resources", "describe"],
        ["tpu-vm", "scp"], ["tpu-vm", "ssh"], ["queued-resources", "delete"],
    ]  # fmt: skip
    homes = tmp_path / "cloud" / "marin-x"
    assert [(homes / f"worker-{i}" / "wf" / "place.txt").read_text().strip() for i in range(2)] == ["0/2/auto", "1/2/auto"]
    assert (homes / "worker-1" / "wf" / "executor_helpers" / "fake_gcloud.py").exists()
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
