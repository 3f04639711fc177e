"""The tpu executor's placement and command lines as strings, the gcloud driver
against a fake `gcloud` on PATH (written by the test: no cloud is ever called), the
process group that runs pod processes, and the pod variables marin jobs read."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from snakemake_interface_common.exceptions import WorkflowError

from executor_helpers.fake_cloud import gcloud_calls, install_fake_cloud
from marin_rules.artifacts.errors import MarinError
from marin_rules.cluster import pod
from marin_rules.cluster.pod import pod_process_from_env, refuse_unreachable_prefix
from snakemake_executor_plugin_tpu import gcloud, placement, transfer
from snakemake_executor_plugin_tpu.gcloud import TpuNode
from snakemake_executor_plugin_tpu import local_pod
from snakemake_executor_plugin_tpu.local_pod import LocalPodSpec, ProcessGroup, command_status, job_env, process_env

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


def test_worker_command_unpacks_sets_up_learns_its_place_runs_the_job_then_worker_0_packs_its_files():
    cmd = gcloud.worker_command(
        "python3 -m snakemake --mode remote", "wf", "pip install -e .", archives=["src.tar.gz", "in.tar.gz"],
        outputs=["out/a b.txt"], logs=["logs/x.log"], outputs_archive="back.tar.gz",
    )  # fmt: skip
    exports = gcloud.pod_env_exports()  # its place in the slice: the test below runs these lines
    assert exports.startswith("export SNAKEMAKE_TPU_COORDINATOR=auto && { SNAKEMAKE_TPU_PROCESS_ID=$(curl -sSf ")
    head = "mkdir -p wf && tar -xzf src.tar.gz -C wf && tar -xzf in.tar.gz -C wf && cd wf && ( pip install -e . ) && "
    assert cmd.startswith(head + exports + " && ")
    parts = cmd[len(head + exports + " && "):].split(" && ")
    pack = 'tar -czf "$HOME"/back.tar.gz --ignore-failed-read -- '
    assert parts[0] == (  # worker 0 packs outputs and logs after a success, the logs alone after a failure
        '{ ( python3 -m snakemake --mode remote ); code=$?; if [ "$SNAKEMAKE_TPU_PROCESS_ID" = 0 ]; then '
        "if [ \"$code\" = 0 ]; then [ -e 'out/a b.txt' ] || { echo 'tpu executor: the job ended without its output "
        "out/a b.txt' >&2; code=1; }; fi; "
        f"if [ \"$code\" = 0 ]; then {pack}'out/a b.txt' logs/x.log || code=$?; else {pack}logs/x.log; fi; fi; "
        "exit $code; }"
    )


@pytest.mark.parametrize("job_status", [0, 3])
def test_worker_command_exits_with_the_jobs_status_after_packing(tmp_path, job_status):
    (tmp_path / "wf" / "logs").mkdir(parents=True)
    job = f"echo out > o.txt; echo log > logs/x.log; exit {job_status}"
    cmd = gcloud.worker_command(job, "wf", outputs=["o.txt"], logs=["logs/x.log"], outputs_archive="back.tar.gz")
    cmd = cmd.replace(gcloud.pod_env_exports(), "export SNAKEMAKE_TPU_PROCESS_ID=0")  # no metadata server here
    proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)}, timeout=30)
    assert proc.returncode == job_status
    listed = subprocess.run(["tar", "-tzf", str(tmp_path / "back.tar.gz")], capture_output=True, text=True, check=True)
    assert sorted(listed.stdout.split()) == (["logs/x.log", "o.txt"] if job_status == 0 else ["logs/x.log"])


def test_worker_command_fails_a_job_that_ended_well_without_its_output(tmp_path):
    """A wildcard value the job command mangled: the job built another file and exited 0."""
    (tmp_path / "wf" / "logs").mkdir(parents=True)
    cmd = gcloud.worker_command("echo log > logs/x.log; echo out > other.txt", "wf", outputs=["o.txt"],
                                logs=["logs/x.log"], outputs_archive="back.tar.gz")  # fmt: skip
    cmd = cmd.replace(gcloud.pod_env_exports(), "export SNAKEMAKE_TPU_PROCESS_ID=0")  # no metadata server here
    proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)}, timeout=30,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr == "tpu executor: the job ended without its output o.txt\n"
    listed = subprocess.run(["tar", "-tzf", str(tmp_path / "back.tar.gz")], capture_output=True, text=True, check=True)
    assert listed.stdout.split() == ["logs/x.log"]  # its log comes back, as after any failure


def test_worker_command_of_a_job_with_logs_and_no_local_output_is_valid_shell(tmp_path):
    (tmp_path / "wf" / "logs").mkdir(parents=True)
    cmd = gcloud.worker_command("echo log > logs/x.log", "wf", logs=["logs/x.log"], outputs_archive="back.tar.gz")
    cmd = cmd.replace(gcloud.pod_env_exports(), "export SNAKEMAKE_TPU_PROCESS_ID=0")  # no metadata server here
    proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)}, timeout=30,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    listed = subprocess.run(["tar", "-tzf", str(tmp_path / "back.tar.gz")], capture_output=True, text=True, check=True)
    assert listed.stdout.split() == ["logs/x.log"]


def test_worker_command_exports_the_jobs_submission_quoted_before_the_job():
    cmd = gcloud.worker_command("run", "w", exports={"SNAKEMAKE_TPU_JOBID": "4", "SNAKEMAKE_TPU_SUBMITTER": "h 1 pid:[2]"})
    assert cmd.endswith(" && export SNAKEMAKE_TPU_JOBID=4 && export SNAKEMAKE_TPU_SUBMITTER='h 1 pid:[2]' && run")


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

    def name(rule, wildcards, workdir="/w"):
        return placement.node_name(rule, wildcards, workdir)

    a = name("train", {"artifact": "checkpoints/Nano_MoE/v1"})
    b = name("train", {"artifact": "checkpoints/nano-moe/v1"})
    c = name("eval", {"artifact": "checkpoints/nano-moe/v1"})
    long = name("train", {"a": "sweeps/" + "x" * 80, "b": "v1"})
    for n in (a, b, c, long):
        assert re.fullmatch(gcloud.NAME_PATTERN, n) and len(n) <= 50, n
    assert len({a, b, c}) == 3
    assert a.startswith("snakemake-train-checkpoints-nano-moe-v1-")
    # values that clean up to the same slug, or one job run from two checkouts, get their own nodes
    assert name("pod", {"s": "b c"}) != name("pod", {"s": "b_c"})
    assert name("pod", {"s": "b c"}, "/home/a/wf") != name("pod", {"s": "b c"}, "/home/b/wf")
    assert name("pod", {"s": "b c"}) == name("pod", {"s": "b c"})  # a retry reuses its node
    # one checkout, two runs into other places (the same wildcards: another prefix) get their own
    outputs = lambda prefix: [f".snakemake/marin-mirror/gs/bucket/{prefix}/ck/a/v1/.artifact.json"]  # noqa: E731
    assert placement.node_name("train", {"artifact": "ck/a/v1"}, "/w", outputs=outputs("p")) != placement.node_name(
        "train", {"artifact": "ck/a/v1"}, "/w", outputs=outputs("q"))
    assert placement.node_name("train", {}, "/w", fixed="my-tpu") == "my-tpu"


def test_wildcard_values_that_target_jobs_cannot_carry_are_refused_with_the_reason():
    placement.check_target_wildcards("r", {"n": "it's fine", "m": "a=b"})
    for value in ("a,b", '"hi"', "say 'x'", '"x', "k\\l"):
        with pytest.raises(WorkflowError, match=r"wildcard n=.*cannot be passed .*--target-jobs"):
            placement.check_target_wildcards("r", {"n": value})


@pytest.mark.parametrize(
    "field, value",
    [("accelerator_type", "v5p-8\ntouch /tmp/pwned #"), ("zone", "us-east5-a$(touch /tmp/pwned)"),
     ("zone", "tpu"), ("project", "/home/me/profiles/tpu"), ("name", "Bad Name"), ("runtime_version", "x;y")],
)  # fmt: skip
def test_tpu_node_refuses_values_that_are_not_gcloud_names(field, value):
    fields = {"name": "n", "accelerator_type": "v5p-8", field: value}
    with pytest.raises(ValueError, match=r"tpu executor: .* is not valid \(like '[^']+'\)") as e:
        TpuNode(**fields)
    # a path is what Snakemake makes of an empty profile setting: only then that hint
    assert ("leave the key out" in str(e.value)) == ("/" in value)


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


def test_an_input_that_links_outside_the_working_directory_travels_as_the_file_it_links_to(tmp_path):
    import tarfile

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "data.txt").write_text("the data")
    (tmp_path / "wf" / "data").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere" / "data.txt", tmp_path / "wf" / "data" / "link.txt")
    names = transfer.local_paths(["data/link.txt"], "input", str(tmp_path / "wf"))
    archive = transfer.files_archive(str(tmp_path / "wf"), names, tmp_path / "inputs.tar.gz")
    with tarfile.open(archive) as tar:
        (member,) = tar.getmembers()
        assert member.name == "data/link.txt" and member.isfile()  # not a link the worker cannot follow
        assert tar.extractfile(member).read() == b"the data"


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


FAILED_SHELL = """RuleException:
CalledProcessError in file "/w/Snakefile", line 3:
Command 'set -euo pipefail;  echo 'status 9.'
exit {code}' returned non-zero exit status {code}.
[Sat Dec  5 04:07:54 2026]
Error in rule a:
"""


def test_the_job_commands_status_is_read_from_snakemakes_first_report_of_it():
    assert command_status(FAILED_SHELL.format(code=7)) == "exited with 7"  # a command of two lines
    killed = "CalledProcessError in file x, line 1:\nCommand 'kill -9 $$' died with <Signals.SIGKILL: 9>.\n"
    assert command_status(killed) == "was killed by SIGKILL"
    # a gcloud driver's log holds every worker's report: the first to fail is the cause
    assert command_status(FAILED_SHELL.format(code=7) + FAILED_SHELL.format(code=4)) == "exited with 7"
    # a step's own subprocess error, not Snakemake's report of the job's command: nothing said
    assert command_status("subprocess.CalledProcessError: Command '['x']' returned non-zero exit status 2.\n") is None
    assert command_status("MissingOutputException in rule a\n") is None


def test_a_failed_process_is_described_by_its_own_status_without_a_report_in_its_log(tmp_path):
    logs = [tmp_path / "0.log", tmp_path / "1.log"]
    group = ProcessGroup.start(["echo no report here; exit 3"], [os.environ], logs[:1])
    assert group.wait(timeout=30) == 3
    assert group.failure() == "process 0 exited with 3"  # an old job's log, or another failure: as before
    group = ProcessGroup.start([f"printf %s {shlex.quote(FAILED_SHELL.format(code=7))}; exit 1"], [os.environ], logs[:1])
    assert group.wait(timeout=30) == 1
    assert group.failure() == "process 0 exited with 1: the job's command exited with 7"
    group = ProcessGroup.start(["true", "kill -9 $$"], [os.environ] * 2, logs)
    assert group.wait(timeout=30) == -9
    assert group.failure() == "process 1 was killed by SIGKILL"
    logs[1].unlink()
    assert group.failure() == "process 1 was killed by SIGKILL"  # a log gone: still one line


def test_every_job_is_told_its_job_id_and_submitter_as_marin_jobs_read_them():
    env = job_env({"KEEP": "1", "SNAKEMAKE_TPU_JOBID": "99"}, 4)
    assert env["KEEP"] == "1" and pod.submitted_jobid(env) == "4"
    assert pod.submitted_by(env) == local_pod.submitter() == pod.this_submitter()  # one format on both sides
    group_env = job_env({"SNAKEMAKE_TPU_JOBID": "99"}, None)  # a group job: its members have their own ids
    assert pod.submitted_jobid(group_env) is None and pod.submitted_by(group_env) == pod.this_submitter()
    assert (pod.ENV_JOBID, pod.ENV_SUBMITTER) == (local_pod.ENV_JOBID, local_pod.ENV_SUBMITTER)


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


def test_driver_brings_a_failed_jobs_log_back_and_exits_with_its_status(tmp_path):
    worker = gcloud.worker_command(
        "mkdir -p logs && echo BAD-LOG-LINE > logs/x.log && exit 3", ".", outputs=["out.txt"], logs=["logs/x.log"],
        outputs_archive="back.tar.gz",
    )  # fmt: skip
    here = tmp_path / "here"
    here.mkdir()
    code, calls = _run_driver(tmp_path, VM, worker, download=("back.tar.gz", str(tmp_path / "back.tar.gz"), str(here)))
    assert code == 3
    assert (here / "logs" / "x.log").read_text() == "BAD-LOG-LINE\n"  # for --show-failed-logs
    assert not (here / "out.txt").exists()
    assert calls[-1][2:4] == ["tpu-vm", "delete"]


@pytest.mark.parametrize("logs", [[], ["logs/x.log"]])
def test_a_failed_job_whose_logs_never_came_back_says_so_in_one_line_or_fetches_nothing(tmp_path, logs):
    """A job that fails before worker 0 packs (here: at once) has nothing to fetch: a
    rule without `log:` fetches nothing after a failure; one with logs says in one line
    that they did not come back, not with scp's error beside the cause."""
    here = tmp_path / "here"
    here.mkdir()
    download = ("back.tar.gz", str(tmp_path / "back.tar.gz"), str(here))
    code, calls = _run_driver(tmp_path, VM, "exit 3", download=download, logs_back=bool(logs))
    assert code == 3
    scp_back = [c for c in calls if c[2:4] == ["tpu-vm", "scp"]]
    log = (tmp_path / "job" / "driver.log").read_text()
    line = "tpu executor: the job's log files did not come back from worker 0"
    assert (len(scp_back), line in log) == ((1, True) if logs else (0, False))
    assert "scp" not in log.replace(line, "")  # no copy error of its own


def test_driver_exports_envvars_quoted_at_run_time_and_runs_no_text_of_a_title(tmp_path):
    pwned = tmp_path / "pwned"
    hostile = f"it's $(touch {pwned}) `touch {pwned}` \"q\" $HOME\nline2"
    title = f"rule r (n=x\ntouch {pwned}\n$(touch {pwned}))"
    script = gcloud.driver_script(VM, "true", title=title, env_names=["SECRET_TOKEN"])
    assert "\ntouch" not in script and "it's" not in script  # the value is never written into driver.sh
    worker = gcloud.worker_command('printenv SECRET_TOKEN > "$HOME"/got.txt', ".")
    code, _ = _run_driver(
        tmp_path, VM, worker, extra_env={"SECRET_TOKEN": hostile}, title=title, env_names=["SECRET_TOKEN"]
    )  # fmt: skip
    assert code == 0, (tmp_path / "job" / "driver.log").read_text()
    got = [(tmp_path / "cloud" / "marin-x" / f"worker-{i}" / "got.txt").read_text() for i in range(2)]
    assert got == [hostile + "\n"] * 2 and not pwned.exists()
    assert oct((tmp_path / "job" / "driver.sh").stat().st_mode & 0o777) == "0o700"


def test_a_cancelled_driver_still_deletes_its_node_when_the_delete_outlasts_the_grace(tmp_path):
    root, gate = tmp_path / "cloud", tmp_path / "delete-may-finish"
    env = {**os.environ, **install_fake_cloud(tmp_path / "bin", root, workers=1), "FAKE_GCLOUD_DELETE_WAITS_FOR": str(gate)}
    running = tmp_path / "running"
    group = gcloud.start_driver(gcloud.driver_script(VM, f"touch {running}; exec sleep 60"), tmp_path / "job", env=env)
    deadline = time.monotonic() + 60
    while not running.exists():  # the job runs on the node
        assert time.monotonic() < deadline and group.poll() is None
        time.sleep(0.05)
    group.grace = 0.5
    group.terminate()  # Ctrl-C: TERM, then SIGKILL after the grace, while the delete is still going
    assert group.procs[0].returncode == -9
    assert (root / "nodes" / "marin-x").exists()
    gate.touch()  # now the cloud finishes the delete
    deadline = time.monotonic() + 60
    while (root / "nodes" / "marin-x").exists():
        assert time.monotonic() < deadline, "the delete died with the driver"
        time.sleep(0.05)
    deadline = time.monotonic() + 10
    while "deleted TPU VM marin-x" not in (tmp_path / "job" / "driver.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_the_tpu_profile_sets_no_empty_value_that_snakemake_would_turn_into_its_folder():
    import yaml

    from conftest import REPO

    config = yaml.safe_load((REPO / "profiles" / "tpu" / "config.yaml").read_text())
    assert [key for key, value in config.items() if value == ""] == []


def test_jobs_can_be_checked_before_post_init_as_the_polling_thread_may(monkeypatch):
    """RemoteExecutor.__init__ starts the polling thread, which may call check_active_jobs
    before __post_init__ runs (seen in CI: the thread died and snakemake hung). Stand-in:
    an __init__ that polls at once, as that thread's first round does."""
    import asyncio

    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    from snakemake_executor_plugin_tpu.executor import Executor

    rounds = []

    def polls_at_once(self, workflow, logger):
        async def first_round():
            return [info async for info in self.check_active_jobs([])]

        rounds.append(asyncio.run(first_round()))

    monkeypatch.setattr(RemoteExecutor, "__init__", polls_at_once)
    executor = Executor(SimpleNamespace(resource_settings=SimpleNamespace(local_cores=3)), None)
    assert rounds == [[]] and executor.host_cores == 3


def test_host_jobs_count_the_cores_this_process_may_run_on_not_the_machines():
    """Under `taskset -c 0` (a Slurm allocation, a container's cpuset) host jobs share one
    core, as `snakemake --cores all` would; `--local-cores` still decides when given."""
    code = (
        "import os, types; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from snakemake_executor_plugin_tpu.placement import host_cores;"
        "print(host_cores(types.SimpleNamespace(resource_settings=types.SimpleNamespace(local_cores=None))),"
        " host_cores(types.SimpleNamespace(resource_settings=types.SimpleNamespace(local_cores=4))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == ["1", "4"]


@pytest.mark.parametrize("answer, place", [
    ("0", "SNAKEMAKE_TPU_PROCESS_ID=0 SNAKEMAKE_TPU_NUM_PROCESSES=2"),
    ("exit 7", "agent-worker-number"),  # the metadata server does not answer (curl's status 7)
    ("echo oops", "agent-worker-number"),  # an answer that is no worker number
])  # fmt: skip
def test_a_worker_that_cannot_learn_its_place_stops_at_once_naming_the_lookup(tmp_path, answer, place):
    """The metadata lookups run by bash as a worker runs them, with a stand-in `curl`
    (no metadata server here): the job runs with its place, or never, the worker
    exiting 1 with one line naming the lookup (the job would otherwise run with an empty
    process id, no process 0, and fail on a missing outputs archive)."""
    curl = tmp_path / "curl"
    reply = answer if answer.startswith("exit") else f"echo {answer.split()[-1]}"
    curl.write_text(f'#!/usr/bin/env bash\ncase "$*" in *agent-worker-number*) {reply} ;; *) echo 10.0.0.1,10.0.0.2 ;; esac\n')
    curl.chmod(0o755)
    job = 'echo "SNAKEMAKE_TPU_PROCESS_ID=$SNAKEMAKE_TPU_PROCESS_ID SNAKEMAKE_TPU_NUM_PROCESSES=$SNAKEMAKE_TPU_NUM_PROCESSES"'
    (tmp_path / "wf").mkdir()
    cmd = gcloud.worker_command(job, str(tmp_path / "wf"))
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    if place.startswith("SNAKEMAKE"):
        assert done.returncode == 0 and done.stdout.strip() == place
    else:
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.splitlines()[-1].startswith(f"tpu executor: cannot read {place} from the TPU metadata server")


def test_the_workflow_files_are_its_snakefiles_and_every_config_file_it_loaded_once_each():
    """`--configfile` files and those of `configfile:` directives (Snakemake's `configfiles`
    holds both); an included Snakefile fetched from a URL is fetched on the worker too."""
    from snakemake_executor_plugin_tpu import transfer

    class Source:
        def __init__(self, where):
            self.where = where

        def get_path_or_uri(self, secret_free):
            return self.where

    workflow = SimpleNamespace(
        main_snakefile="/w/Snakefile", included=[Source("/w/Snakefile"), Source("/w/rules/a.smk"),
                                                 Source("https://github.com/x/y/raw/main/b.smk")],
        overwrite_configfiles=["/w/exp.yaml"], configfiles=["/w/exp.yaml", "/w/directive.yaml"],
    )  # fmt: skip
    assert transfer.workflow_files(workflow) == [
        "/w/Snakefile", "/w/rules/a.smk", "/w/exp.yaml", "/w/directive.yaml",
    ]  # fmt: skip
