"""A lab's own plain Snakefile (not ours) run with `--executor tpu`: what works with
Snakemake's local executor works the same here. Host jobs share the machine's cores
(`--local-cores`), `envvars:` values reach jobs unchanged, a job the executor cannot
run fails alone under `--keep-going`, and a pod job on the gcloud backend (against
the FAKE `gcloud` of tests/executor_helpers: no cloud is called) brings back its
`benchmark:` file, and its `log:` when it fails."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from conftest import SNAKEMAKE
from executor_helpers.fake_cloud import gcloud_calls, install_fake_cloud


def _snakemake(workdir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [SNAKEMAKE, "--executor", "tpu", "--jobs", "4", *args]
    return subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300, env=env or dict(os.environ))


def test_host_jobs_take_their_threads_of_the_local_cores_one_after_another(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: expand("t/{i}.txt", i=range(3))\n'
        "rule busy:\n    output: 't/{i}.txt'\n    threads: 64\n"
        "    shell: 'python3 -c \"import time; print(time.time())\" > {output}; "
        "python3 -c \"import time; print(time.time())\" >> {output}'\n"
    )
    proc = _snakemake(tmp_path, "--local-cores", "1")
    assert proc.returncode == 0, proc.stderr
    spans = sorted(tuple(map(float, (tmp_path / "t" / f"{i}.txt").read_text().split())) for i in range(3))
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end  # never two at once on one core
    assert "(1 of 1 cores)" in proc.stderr


def test_host_jobs_share_the_mem_mb_of_resources_as_in_local_mode(tmp_path):
    # Snakemake's cluster mode leaves mem_mb to each job: without the executor's own
    # count these three would run at once (checked by hand: they overlapped)
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: expand("t/{i}.txt", i=range(3))\n'
        "rule big:\n    output: 't/{i}.txt'\n    resources: mem_mb=800\n"
        "    shell: 'python3 -c \"import time; print(time.time())\" > {output}; "
        "python3 -c \"import time; print(time.time())\" >> {output}'\n"
    )
    proc = _snakemake(tmp_path, "--local-cores", "4", "--resources", "mem_mb=1000")
    assert proc.returncode == 0, proc.stderr
    spans = sorted(tuple(map(float, (tmp_path / "t" / f"{i}.txt").read_text().split())) for i in range(3))
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end  # 800 + 800 > 1000: never two at once
    assert "(1 of 4 cores, 800 of 1000 MB)" in proc.stderr


def test_envvars_reach_host_jobs_unchanged(tmp_path):
    value = "it's $(echo INJECTED) `echo X` \"q\" $HOME"
    (tmp_path / "Snakefile").write_text(
        'envvars: "MYVAR"\nrule all:\n    input: "v.txt"\nrule v:\n    output: "v.txt"\n    shell: "printenv MYVAR > {output}"\n'
    )
    proc = _snakemake(tmp_path, env={**os.environ, "MYVAR": value})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "v.txt").read_text() == value + "\n"


def test_a_job_the_executor_refuses_fails_alone_under_keep_going(tmp_path):
    (tmp_path / "Snakefile").write_text(
        "rule w:\n    output: 'out/{n}.txt'\n    shell: 'echo {wildcards.n:q} > {output:q}'\n"
    )
    proc = _snakemake(tmp_path, "--keep-going", "out/a,b.txt", "out/k\\l.txt", "out/ok.txt")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "wildcard n='a,b' cannot be passed to a job run by an executor plugin" in proc.stderr
    assert "wildcard n='k\\\\l' cannot be passed to a job run by an executor plugin" in proc.stderr  # as repr() shows it
    assert (tmp_path / "out" / "ok.txt").read_text() == "ok\n"
    assert not (tmp_path / "out" / "a,b.txt").exists() and not list((tmp_path / "out").glob("k*"))


def test_a_gcloud_pod_job_brings_back_its_benchmark_and_a_failed_ones_log(tmp_path):
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    input: 'out/good.txt'\n"
        "rule good:\n    output: 'out/good.txt'\n    benchmark: 'bench/good.tsv'\n    resources: tpu='v5p-8'\n"
        "    shell: 'echo done > {output}'\n"
        "rule bad:\n    output: 'out/bad.txt'\n    log: 'logs/bad.log'\n    resources: tpu='v5p-8'\n"
        "    shell: 'echo BAD-LOG-LINE > {log}; exit 3'\n"
    )
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    (tmp_path / ".gitignore").write_text(".snakemake/\nbin/\ncloud/\n")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **install_fake_cloud(tmp_path / "bin", cloud, workers=2)}
    zone = ["--tpu-zone", "us-east5-a", "--tpu-workdir", "wf"]
    proc = _snakemake(tmp_path, *zone, "--keep-going", "--show-failed-logs", "all", "out/bad.txt", env=env)
    assert proc.returncode != 0
    assert (tmp_path / "out" / "good.txt").read_text() == "done\n"
    assert (tmp_path / "bench" / "good.tsv").read_text().startswith("s\th:m:s")  # Snakemake's benchmark table
    assert "BAD-LOG-LINE" in (tmp_path / "logs" / "bad.log").read_text()
    assert "BAD-LOG-LINE" in proc.stdout + proc.stderr  # --show-failed-logs found it
    # the driver's status is the worker's snakemake's (1); the job's own is in its output
    assert "tpu executor: process 0 exited with 1: the job's command exited with 3; log .snakemake/tpu/bad/" in proc.stderr
    nodes = {c[4] for c in gcloud_calls(cloud) if c[2:4] == ["tpu-vm", "ssh"]}
    assert len(nodes) == 2 and not any((cloud / "nodes" / n).exists() for n in nodes)


def test_a_failed_host_job_is_reported_with_its_commands_own_exit_status_or_signal(tmp_path):
    # the process the executor runs is the job's `snakemake --mode remote`, which exits 1
    # whatever its command did: the command's own status is read from what it printed
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    input: 'seven.txt', 'killed.txt'\n"
        "rule seven:\n    output: 'seven.txt'\n    shell: 'echo \"returned non-zero exit status 2.\"; exit 7'\n"
        "rule killed:\n    output: 'killed.txt'\n    shell: 'kill -9 $$'\n"
    )
    proc = _snakemake(tmp_path, "--keep-going")
    assert proc.returncode != 0
    assert "tpu executor: process 0 exited with 1: the job's command exited with 7; log .snakemake/tpu/seven/" in proc.stderr
    assert (
        "tpu executor: process 0 exited with 1: the job's command was killed by SIGKILL; log .snakemake/tpu/killed/"
    ) in proc.stderr


def test_after_a_failed_host_job_the_waiting_ones_do_not_start_without_keep_going(tmp_path):
    # as Snakemake's local mode: nothing new starts after a failure (one core: jobs run
    # one at a time, in the order Snakemake hands them over)
    stamp = "python3 -c 'import time; print(time.time())'"
    (tmp_path / "Snakefile").write_text(
        "rule fails:\n    output: 't/a.txt'\n    threads: 64\n"
        f"    shell: \"{stamp} > failed-at; exit 3\"\n"
        "rule one:\n    output: 't/{i}.txt'\n    threads: 64\n"
        f"    shell: \"{stamp} > {{output}}\"\n"
        "ruleorder: fails > one\n"
    )
    proc = _snakemake(tmp_path, "--local-cores", "1", "t/a.txt", "t/b.txt", "t/c.txt", "t/d.txt")
    assert proc.returncode != 0
    failed_at = float((tmp_path / "failed-at").read_text())
    started = [float(p.read_text()) for p in (tmp_path / "t").glob("*.txt")]
    assert all(t < failed_at for t in started)  # none started after the failure
    assert len(started) == 3 or "failed (no --keep-going)" in proc.stderr  # the rest were dropped, saying why


def test_after_sigterm_the_running_job_stops_and_the_waiting_ones_do_not_start(tmp_path):
    # each job runs in its own session, out of reach of the group signal `timeout` sends,
    # and Snakemake's graceful stop would wait for it: the executor passes SIGTERM on.
    # Host jobs still waiting for a core never start (one core: one runs at a time)
    import signal
    import time

    (tmp_path / "hold.py").write_text(  # holds until the test releases it (at most 120 s)
        "import os, time\nfor _ in range(2400):\n    if os.path.exists('release'):\n        break\n    time.sleep(0.05)\n"
    )
    (tmp_path / "Snakefile").write_text(
        "rule one:\n    output: 't/{i}.txt'\n    threads: 64\n"
        "    shell: 'touch started-{wildcards.i}; python3 hold.py; touch {output}'\n"
    )
    command = [SNAKEMAKE, "--executor", "tpu", "--jobs", "4", "--local-cores", "1", "t/a.txt", "t/b.txt", "t/c.txt"]
    log = tmp_path / "snakemake.err"
    with open(log, "w") as err:
        proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("started-*")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # to snakemake alone
        proc.wait(timeout=60)  # nothing releases the running job: it was stopped
    finally:
        (tmp_path / "release").write_text("")
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode != 0 and not list(tmp_path.glob("t/*.txt")), log.read_text()
    assert len(list(tmp_path.glob("started-*"))) == 1, log.read_text()  # the two waiting jobs never started
    assert log.read_text().count("not started: snakemake received SIGTERM") == 2, log.read_text()


def test_a_local_pod_of_no_processes_is_refused_in_one_message(tmp_path):
    (tmp_path / "Snakefile").write_text('rule a:\n    output: "x"\n    shell: "touch x"\n')
    proc = _snakemake(tmp_path, "--tpu-backend", "local-pod", "--tpu-local-processes", "0")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "tpu executor: local pod: num_processes must be >= 1, got 0 (--tpu-local-processes" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_jobs_run_in_the_directory_of_a_relative_or_absolute_directory_flag(tmp_path):
    # Snakemake hands its jobs `--directory` as given: relative, jobs entered it a second
    # time (`-d sub` wrote sub/sub/...); absolute, a TPU worker ran in a path it lacks
    rules = (
        "rule all:\n    input: 'host.txt', 'pod.txt'\n"
        "rule host:\n    output: 'host.txt'\n    shell: 'pwd > {output}'\n"
        "rule pod:\n    output: 'pod.txt'\n    resources: tpu='v5p-8'\n"
        "    shell: 'pwd > {output}; test \"$SNAKEMAKE_TPU_PROCESS_ID\" = 0 || pwd > other-{output}'\n"
    )
    (tmp_path / "Snakefile").write_text(rules)
    (tmp_path / "sub").mkdir()
    proc = _snakemake(tmp_path, "-d", "sub", "--tpu-backend", "local-pod", "--tpu-local-processes", "2")
    assert proc.returncode == 0, proc.stderr
    sub = (tmp_path / "sub").resolve()
    assert (sub / "host.txt").read_text() == f"{sub}\n" and (sub / "pod.txt").read_text() == f"{sub}\n"
    assert (sub / "other-pod.txt").read_text() == f"{sub}\n"  # the pod's process 1 ran there too
    assert not (sub / "sub").exists()

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    (tmp_path / ".gitignore").write_text(".snakemake/\nbin/\ncloud/\nsub/\n")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **install_fake_cloud(tmp_path / "bin", cloud, workers=2)}
    workdir = tmp_path / "wd"
    workdir.mkdir()
    subprocess.run(["git", "init", "-q", str(workdir)], check=True, timeout=30)
    (workdir / "Snakefile").write_text(rules)
    zone = ["--tpu-zone", "us-east5-a", "--tpu-workdir", "wf"]
    proc = _snakemake(tmp_path, "-s", str(workdir / "Snakefile"), "-d", str(workdir), *zone, env=env)
    assert proc.returncode == 0, proc.stderr
    (node,) = {c[4] for c in gcloud_calls(cloud) if c[2:4] == ["tpu-vm", "ssh"]}
    for worker in ("worker-0", "worker-1"):  # each ran the job in its own copy of the workdir
        home = cloud / node / worker / "wf"
        assert (home / "pod.txt").read_text() == f"{home}\n"
    assert (workdir / "pod.txt").read_text() == f"{cloud / node / 'worker-0' / 'wf'}\n"  # worker 0's, copied back
    assert not (workdir / "other-pod.txt").exists()


def test_the_local_pod_refuses_the_tpu_types_and_zones_the_gcloud_backend_refuses(tmp_path):
    """A local rehearsal must not pass a job the cloud run fails: each fails alone."""
    rules = (
        "rule all:\n    input: 'ok.txt', 'semi.txt', 'gen.txt', 'zone.txt'\n"
        "rule ok:\n    output: 'ok.txt'\n    resources: tpu='v5p-8'\n    shell: 'touch {output}'\n"
        "rule semi:\n    output: 'semi.txt'\n    resources: tpu='v5p-8; touch HACK'\n    shell: 'touch {output}'\n"
        "rule gen:\n    output: 'gen.txt'\n    resources: tpu='v99-8'\n    shell: 'touch {output}'\n"
        "rule zone:\n    output: 'zone.txt'\n    resources: tpu='v5p-8', tpu_zone='us-east5-a$(touch HACK)'\n"
        "    shell: 'touch {output}'\n"
    )
    (tmp_path / "Snakefile").write_text(rules)
    proc = _snakemake(tmp_path, "--keep-going", "--tpu-backend", "local-pod", "--tpu-local-processes", "1")
    assert proc.returncode != 0
    assert (tmp_path / "ok.txt").exists()
    assert not any((tmp_path / f).exists() for f in ("semi.txt", "gen.txt", "zone.txt", "HACK"))
    assert "TPU type (resource tpu / --tpu-type) 'v5p-8; touch HACK' is not valid" in proc.stderr
    assert "no default TPU runtime version for 'v99-8'" in proc.stderr
    assert "zone (resource tpu_zone / --tpu-zone) 'us-east5-a$(touch HACK)' is not valid" in proc.stderr


def test_a_pod_job_gets_snakefiles_of_a_nested_clone_and_refuses_what_workers_would_not_get(tmp_path):
    """What the workers' Snakemake reads travels in the workflow archive: an included
    Snakefile inside a git clone nested in the working directory (marin-rules used as a
    module lives so) travels with its files; an include or a --configfile outside the
    working directory, or one git ignores, is refused before any gcloud call (the pod
    was made, then every worker failed on the missing file)."""
    wf = tmp_path / "wf"
    shared = wf / "vendor" / "shared"  # a clone of its own inside the workflow's checkout
    shared.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(shared)], check=True, timeout=30)
    rule = "rule pod:\n    output: 'out/pod.txt'\n    resources: tpu='v5p-8'\n    shell: 'echo {config[word]} > {output}'\n"
    (shared / "common.smk").write_text(rule)
    (tmp_path / "outside.smk").write_text(rule.replace("pod", "far"))
    subprocess.run(["git", "init", "-q", str(wf)], check=True, timeout=30)
    (wf / ".gitignore").write_text(".snakemake/\nbin/\ncloud/\nscratch/\n")
    (wf / "config.yaml").write_text("word: hello\n")
    (wf / "scratch").mkdir()
    (wf / "scratch" / "config.yaml").write_text("word: ignored\n")
    (tmp_path / "outside.yaml").write_text("word: far\n")
    (wf / "Snakefile").write_text("include: 'vendor/shared/common.smk'\nrule all:\n    input: 'out/pod.txt'\n")
    (wf / "far.smk").write_text("include: '../outside.smk'\nrule all:\n    input: 'out/far.txt'\n")
    cloud = tmp_path / "cloud"
    env = {**os.environ, **install_fake_cloud(wf / "bin", cloud, workers=2)}
    zone = ["--tpu-zone", "us-east5-a", "--tpu-workdir", "wfd"]

    for args, refused in [
        (["-s", "far.smk", "--configfile", "config.yaml"], f"the workflow file '{tmp_path / 'outside.smk'}' lies outside"),
        (["--configfile", str(tmp_path / "outside.yaml")], f"the workflow file '{tmp_path / 'outside.yaml'}' lies outside"),
        (["--configfile", "scratch/config.yaml"], f"the workflow file '{wf / 'scratch' / 'config.yaml'}' is not among the files sent"),
    ]:
        proc = _snakemake(wf, *zone, *args, env=env)
        assert proc.returncode != 0 and refused in proc.stderr, proc.stderr[-2000:]
        assert gcloud_calls(cloud) == []

    (wf / "elsewhere").symlink_to(tmp_path)  # a link to a folder (no repository there): not followed
    proc = _snakemake(wf, *zone, "--configfile", "config.yaml", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (wf / "out" / "pod.txt").read_text() == "hello\n"
    with tarfile.open(wf / ".snakemake" / "tpu" / "workflow.tar.gz") as archive:
        names = archive.getnames()
    assert "vendor/shared/common.smk" in names and not any(n.startswith("elsewhere") for n in names)
