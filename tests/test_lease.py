"""Leases with real processes, on a local prefix and on gs:// (the GCS emulator).

Each worker process runs the protocol a build runs: acquire the lease (None: the
artifact was finished meanwhile, serve it), start the heartbeat, note its build in a
shared log, "build" until told to finish (or until on_lost fires), and write the
done marker only if `still_held()`. Heartbeat 0.2 s and staleness 1 s keep it fast.

The emulator (gcp-storage-emulator) ignores every GCS precondition (it never reads
`ifGenerationMatch`: `test_the_emulator_alone_ignores_generation_preconditions`).
For gs:// the workers therefore talk to it through `precondition_proxy`, a small HTTP
proxy that adds GCS's documented precondition check (412 when the object's current
generation is not the one given; 0 = must not exist), atomically with the write. It
stands in for what real GCS does and the emulator cannot.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse

import pytest

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.lease import LeaseHeld, acquire, pid_namespace, read_lease
from marin_rules.artifacts.provenance import iso, utc_now

WORKER = r'''
import os, sys, threading, time
from marin_rules.artifacts import storage
from marin_rules.artifacts.lease import acquire
location, log, go = sys.argv[1:4]
done = location + "/done"


def exists(p):
    fs, path = storage.filesystem(p)
    fs.invalidate_cache()  # gcsfs caches listings; another process writes these
    return fs.exists(path)


exists(done)  # warm up gcsfs (seconds on a loaded machine) before the race, not inside it
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)  # start together: wait for the go file (bounded)
lease = acquire(location, is_done=lambda: exists(done), heartbeat_s=0.2, stale_s=1.0, poll_s=0.05,
                deadline_s=30, on_wait=lambda h: open(log + ".waits", "a").write(f"{h.describe()}\n"))
if lease is None:
    print("served", flush=True)
    sys.exit(0)
lost = threading.Event()
lease.start_heartbeat(lambda reason: (print(f"on_lost: {reason}", flush=True), lost.set()))
with open(log, "a") as f:
    f.write(f"{os.getpid()} {time.time()}\n")
print(f"building as {lease.holder.describe()}", flush=True)
finish = location + "/finish"
while not lost.is_set() and not exists(finish) and time.monotonic() < deadline:
    lost.wait(0.05)  # the step: runs until told to finish, or until the lease is lost
held = lease.still_held()
print(f"still_held: {held}", flush=True)
if not held:
    sys.exit(3)
storage.write_bytes_atomic(done, b"built")
lease.release()
print("built", flush=True)
'''


class _Precondition(BaseHTTPRequestHandler):
    """Forward to the emulator one request at a time; enforce ifGenerationMatch
    atomically with the request it conditions."""

    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    lock = threading.Lock()

    def log_message(self, *args):  # quiet
        pass

    def _forward(self, method, body):
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(method, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheaders(), resp.read()

    def _generation(self, bucket, name):
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        conn.request("GET", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}")
        resp = conn.getresponse()
        data = resp.read()
        return "0" if resp.status == 404 else str(json.loads(data)["generation"])

    def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        url = urlparse(self.path)
        wanted = parse_qs(url.query).get("ifGenerationMatch", [None])[0]
        with self.lock:  # one request at a time, as the emulator serves them anyway
            status = None
            if wanted is not None:
                m = re.search(r"/b/([^/]+)/o/([^/?]+)", url.path)
                if m:
                    bucket, name = m.group(1), unquote(m.group(2))
                else:  # an upload: the name is in the query or the JSON metadata part
                    bucket = re.search(r"/b/([^/]+)/o", url.path).group(1)
                    name = parse_qs(url.query).get("name", [None])[0]
                    name = name or json.loads(re.search(rb"\{.*?\}", body, re.S).group(0))["name"]
                if self._generation(bucket, name) != str(wanted):
                    status, headers = 412, [("Content-Type", "application/json")]
                    data = json.dumps({"error": {"code": 412, "message": "conditionNotMet"}}).encode()
            if status is None:
                status, headers, data = self._forward(self.command, body)
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a worker that exits mid-reply: fine
        pass


@pytest.fixture(scope="module")
def precondition_proxy(gcs_env):
    """Environment for subprocesses: gs:// through the precondition-enforcing proxy."""
    emulator = urlparse(gcs_env["STORAGE_EMULATOR_HOST"])
    handler = type("Handler", (_Precondition,), {"upstream": (emulator.hostname, emulator.port)})
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield {**gcs_env, "STORAGE_EMULATOR_HOST": url, "FSSPEC_GCS": json.dumps({"batch_size": 4})}
    server.shutdown()


@pytest.fixture(params=["local", "gs"])
def place(request, tmp_path):
    """(artifact location, environment for workers) on a local prefix or on gs://."""
    if request.param == "local":
        return str(tmp_path / "prefix" / "tok" / "x" / "v1"), dict(os.environ)
    env = request.getfixturevalue("precondition_proxy")
    prefix = request.getfixturevalue("gcs_prefix")
    return f"{prefix}/tok/x/v1", {**os.environ, **env}


def start(location: str, env: dict, tmp_path: Path, go: Path | None = None) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    if go is None:
        go = tmp_path / "go"
        go.touch()
    return subprocess.Popen([sys.executable, str(script), location, str(tmp_path / "builds.log"), str(go)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def wait_for(predicate, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds.log"
    return log.read_text().splitlines() if log.exists() else []


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


@pytest.mark.parametrize("before", ["no lease", "a stale lease"])
def test_two_processes_contending_build_once_and_the_other_serves_it(place, tmp_path, before):
    location, env = place
    if before == "a stale lease":  # both race to take over the same dead holder
        dead = {"user": "gone", "host": "old-host", "pid": 1, "since": "2026-01-01T00:00:00.000Z",
                "renewed": "2026-01-01T00:00:00.000Z", "token": "dead"}  # fmt: skip
        storage.write_bytes_atomic(location + "/.lease.json", json.dumps(dead).encode())
    go = tmp_path / "go-later"
    procs = [start(location, env, tmp_path, go=go) for _ in range(2)]
    go.touch()  # both race for the lease now
    wait_for(lambda: len(builds(tmp_path)) == 1, what="one build to start")
    waits = tmp_path / "builds.log.waits"
    wait_for(lambda: waits.exists() and waits.read_text().endswith("\n"), what="the other one to wait")
    storage.write_bytes_atomic(location + "/finish", b"")
    results = [finish(p) for p in procs]
    assert [rc for rc, _ in results] == [0, 0], results
    outs = sorted(out for _, out in results)
    assert sum("built" in o.splitlines() for o in outs) == 1 and sum("served" in o.splitlines() for o in outs) == 1, outs
    assert f"pid {builds(tmp_path)[0].split()[0]} " in waits.read_text()  # on_wait named the holder, once
    assert len(waits.read_text().splitlines()) == 1
    assert len(builds(tmp_path)) == 1 and read_lease(location) is None


def test_a_holder_on_another_host_killed_by_sigkill_is_taken_over_after_staleness(place, tmp_path):
    location, env = place
    first = start(location, env, tmp_path)
    wait_for(lambda: len(builds(tmp_path)) == 1, what="the first build")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    dead = read_lease(location)
    assert dead is not None and dead.pid == first.pid
    # as if it ran on another machine: its pid cannot be checked from here, only its age
    moved = json.loads(storage.read_bytes(location + "/.lease.json"))
    storage.write_bytes_atomic(location + "/.lease.json", json.dumps({**moved, "host": "another-host"}).encode())
    second = start(location, env, tmp_path)
    wait_for(lambda: len(builds(tmp_path)) == 2, what="the takeover")
    took_over_at = float(builds(tmp_path)[1].split()[1])
    storage.write_bytes_atomic(location + "/finish", b"")
    rc, out = finish(second)
    assert rc == 0 and "built" in out.splitlines(), out
    # not before the dead lease went stale: 1 s after its last renewal (by the same clock)
    renewed = dt.datetime.fromisoformat(dead.renewed.replace("Z", "+00:00")).timestamp()
    assert took_over_at >= renewed + 1.0, (took_over_at, renewed)



@pytest.mark.parametrize("steal", ["taken over", "deleted"])
def test_a_holder_whose_lease_is_stolen_learns_it_and_writes_no_result(place, tmp_path, steal):
    location, env = place
    proc = start(location, env, tmp_path)
    wait_for(lambda: len(builds(tmp_path)) == 1, what="the build")
    lease_file = location + "/.lease.json"
    if steal == "deleted":
        storage.filesystem(lease_file)[0].rm_file(lease_file)
    else:
        holder = json.loads(storage.read_bytes(lease_file))
        storage.write_bytes_atomic(lease_file, json.dumps({**holder, "host": "thief", "token": "stolen"}).encode())
    rc, out = finish(proc)
    assert rc == 3, out
    assert f"lease lost: {steal}" in out and "still_held: False" in out, out
    if steal == "taken over":
        assert "taken over by" in out and "@thief pid" in out
    fs, path = storage.filesystem(location + "/done")
    fs.invalidate_cache()
    assert not fs.exists(path)


def test_without_waiting_a_live_holder_is_reported_by_name(tmp_path):
    location = str(tmp_path / "a" / "v1")
    lease = acquire(location, is_done=lambda: False)
    try:
        with pytest.raises(LeaseHeld) as e:
            acquire(location, is_done=lambda: False, wait=False)
        assert lease.holder.describe() in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(LeaseHeld, match="still after waiting 0.2 s"):
            acquire(location, is_done=lambda: False, poll_s=0.05, deadline_s=0.2)
    finally:
        lease.release()
    assert read_lease(location) is None
    lease.release()  # idempotent


def write_lease(location: str, **fields) -> None:
    now = iso(utc_now())
    holder = {"user": "someone", "host": "another-host", "pid": os.getpid(), "since": now, "renewed": now,
              "token": "f" * 32, **fields}  # fmt: skip
    storage.makedirs(location)
    storage.write_bytes_atomic(location + "/.lease.json", json.dumps(holder).encode())


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)  # reaped: the pid no longer exists
    return proc.pid


def test_a_dead_holder_on_this_host_is_taken_over_at_once_saying_so(tmp_path, capsys):
    location = str(tmp_path / "a" / "v1")
    pid = dead_pid()
    here = pid_namespace()
    write_lease(location, host=socket.gethostname(), pid=pid, pid_namespace=here)  # renewed just now: not stale
    since = read_lease(location).since
    lease = acquire(location, is_done=lambda: False, wait=False, stale_s=3600)
    try:
        assert lease.holder.pid == os.getpid()
        err = capsys.readouterr().err
        assert err == (f"{location}/.lease.json: holder someone@{socket.gethostname()} pid {pid} since "
                       f"{since} is no longer running "
                       "on this host; taking the lease over\n")  # fmt: skip
    finally:
        lease.release()


@pytest.mark.parametrize(
    "host, pid, namespace",
    [("this host", "this process", "this one"), ("another-host", "dead", "this one"),
     ("this host", "dead", "another container's"), ("this host", "dead", "none (an older lease)")],
)  # fmt: skip
def test_a_live_holder_or_a_dead_pid_elsewhere_still_holds_the_lease(tmp_path, host, pid, namespace):
    """Elsewhere: another host, or this host's name in another pid namespace (containers
    sharing a host name, e.g. docker --network host), or a lease that does not say."""
    location = str(tmp_path / "a" / "v1")
    ns = {"this one": pid_namespace(), "another container's": "pid:[1]"}.get(namespace)
    write_lease(location, host=socket.gethostname() if host == "this host" else host,
                pid=os.getpid() if pid == "this process" else dead_pid(),
                **({"pid_namespace": ns} if ns is not None else {}))  # fmt: skip
    with pytest.raises(LeaseHeld, match=r"\(lease renewed 0 s ago\)"):
        acquire(location, is_done=lambda: False, wait=False, stale_s=3600)


def test_a_lease_says_who_submitted_its_job_and_an_older_lease_that_does_not_reads_as_no_one(tmp_path):
    from marin_rules.artifacts.lease import held_for

    location = str(tmp_path / "a" / "v1")
    lease = acquire(location, is_done=lambda: False, submitted_by="submitting-host 7 pid:[1]")
    try:
        holder = read_lease(location)
        assert holder.submitted_by == "submitting-host 7 pid:[1]" and holder.token == lease.holder.token
        assert held_for(holder, "submitting-host 7 pid:[1]") and not held_for(holder, "submitting-host 8 pid:[1]")
    finally:
        lease.release()
    write_lease(location)  # written before leases named a submitter
    holder = read_lease(location)
    assert holder is not None and holder.submitted_by == "" and not held_for(holder, "")


@pytest.mark.parametrize("fields, why", [
    ({"renewed": "2099-01-01T00:00:00.000Z"}, "renewed 2099-01-01T00:00:00.000Z, more than 300 s in the future"),
    ({"since": "x"}, "since 'x' is not an ISO time with a zone"),
    ({"renewed": "2026-01-01T00:00:00"}, "renewed '2026-01-01T00:00:00' is not an ISO time with a zone"),
    ({"pid": "12"}, "pid or host is not a number or a name"),
    ({"pid": 10**30}, f"pid {10**30} is not a process id (1 to 2147483647)"),  # os.kill overflowed
    ({"pid": 0}, "pid 0 is not a process id (1 to 2147483647)"),  # os.kill(0, 0) probes a group
])  # fmt: skip
def test_a_lease_with_impossible_times_is_unreadable_and_taken_over_once_unchanged_for_stale_s(
    tmp_path, capsys, fields, why
):
    location = str(tmp_path / "a" / "v1")
    write_lease(location, **fields)
    assert read_lease(location) is None
    with pytest.raises(LeaseHeld) as held:  # just written: a run may be building under it
        acquire(location, is_done=lambda: False, wait=False, stale_s=3600)
    assert str(held.value).startswith(f"{location}: its lease is unreadable ({why}) and was written 0 s ago: ")
    assert held.value.holder is None and "unknown run" in held.value.who
    old = time.time() - 7200
    os.utime(f"{location}/.lease.json", (old, old))
    lease = acquire(location, is_done=lambda: False, wait=False, stale_s=3600)
    try:
        assert capsys.readouterr().err == (
            f"{location}/.lease.json: unreadable lease ({why}), unchanged for 7200 s; taking it over\n"
        )
        assert read_lease(location) == lease.holder
    finally:
        lease.release()


def test_a_waiting_run_takes_a_garbled_lease_over_only_once_it_is_unchanged_for_stale_s(tmp_path, capsys):
    # a live builder cannot renew a garbled lease and stops at its next heartbeat; until
    # stale_s has passed it may still be writing, so the lease is not taken at once
    location = str(tmp_path / "a" / "v1")
    storage.makedirs(location)
    storage.write_bytes_atomic(location + "/.lease.json", b"garbage")
    started = time.monotonic()
    lease = acquire(location, is_done=lambda: False, stale_s=1.0, poll_s=0.05)
    try:
        assert time.monotonic() - started >= 0.9  # the file's age, not this process's patience
        err = capsys.readouterr().err
        assert err.startswith(f"{location}/.lease.json: unreadable lease (not a lease (JSONDecodeError)), written 0 s ago: "
                              "waiting until no run has renewed it for 1 s")  # fmt: skip
        assert err.splitlines()[-1].startswith(f"{location}/.lease.json: unreadable lease (not a lease "
                                               "(JSONDecodeError)), unchanged for 1 s; taking it over")  # fmt: skip
        assert len(err.splitlines()) == 2 and read_lease(location) == lease.holder
    finally:
        lease.release()


def test_a_lease_renewed_slightly_ahead_by_a_skewed_clock_is_live_and_never_shows_a_negative_age(tmp_path):
    import datetime as _dt

    location = str(tmp_path / "a" / "v1")
    write_lease(location, renewed=iso(utc_now() + _dt.timedelta(seconds=120)))
    with pytest.raises(LeaseHeld, match=r"\(lease renewed 0 s ago\)"):
        acquire(location, is_done=lambda: False, wait=False, stale_s=3600)


def test_a_finished_artifact_is_served_without_taking_the_lease(tmp_path):
    location = str(tmp_path / "a" / "v1")
    assert acquire(location, is_done=lambda: True) is None
    assert read_lease(location) is None


def test_leases_refuse_a_scheme_without_conditional_writes():
    with pytest.raises(MarinError, match="memory:// has no conditional writes"):
        acquire("memory://bucket/a/v1", is_done=lambda: False)


def test_the_emulator_alone_ignores_generation_preconditions(gcs_env):
    """Why the proxy exists; when this fails, the emulator enforces them itself."""
    from google.cloud import storage as gcs

    blob = gcs.Client().bucket("marin-test").blob(f"precondition-check-{os.getpid()}")
    blob.upload_from_string(b"first", if_generation_match=0)
    blob.upload_from_string(b"second", if_generation_match=0)  # real GCS: 412 PreconditionFailed
    assert blob.download_as_bytes() == b"second"


def test_a_lease_taken_is_released_when_is_done_refuses_what_it_found(tmp_path):
    # a shard job's is_done raises on a shard record of another recipe: the lease it just
    # took must not stay behind (marin status would show the dead job "building")
    def refuses() -> bool:
        raise MarinError("shard 00001-of-00004: built from another recipe")

    with pytest.raises(MarinError, match="another recipe"):
        acquire(str(tmp_path), is_done=refuses)
    assert read_lease(str(tmp_path)) is None and not (tmp_path / ".lease.json").exists()


@pytest.mark.parametrize("broken", [".lease.json.lock", ".lease.json"])
def test_a_lease_file_that_cannot_be_opened_is_one_line_naming_it_and_no_lease_is_left(tmp_path, broken):
    from marin_rules.artifacts.lease_stores import LeaseFileUnusable

    location = tmp_path / "a" / "v1"
    (location / broken).mkdir(parents=True)  # a folder in its place (as root, permissions stop nobody)
    with pytest.raises(LeaseFileUnusable) as e:
        acquire(str(location), is_done=lambda: False)
    what = "lock file" if broken.endswith(".lock") else "file"
    assert str(e.value) == (f"{location / broken}: the lease's {what} cannot be opened (IsADirectoryError: Is a "
                            f"directory); a folder is in its place: remove it (the lease's {what} is a plain file, "
                            "made again when absent)")  # fmt: skip
    assert sorted(p.name for p in location.iterdir()) == [broken]  # no lease nobody could release


@pytest.mark.parametrize("code", ["EIO", "ESTALE"])
def test_a_storage_error_reading_a_lease_passes_on_as_the_storages_not_as_a_file_to_fix(tmp_path, monkeypatch, code):
    # an NFS server's EIO or ESTALE is no file this user can fix: the job names it as the prefix's storage error
    import errno

    from marin_rules.artifacts import lease_stores

    def failing_open(path, *args, **kwargs):  # the edge: the network filesystem
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), path)

    monkeypatch.setattr(lease_stores, "open", failing_open, raising=False)
    with pytest.raises(OSError) as e:
        lease_stores.LocalStore(str(tmp_path / ".lease.json")).read()
    assert not isinstance(e.value, lease_stores.LeaseFileUnusable) and e.value.errno == getattr(errno, code)


def test_a_lease_file_below_a_file_is_one_line_naming_it(tmp_path):
    from marin_rules.artifacts.lease_stores import LeaseFileUnusable, LocalStore

    (tmp_path / "v1").write_text("")  # a file where the artifact folder belongs
    path = tmp_path / "v1" / ".lease.json"
    with pytest.raises(LeaseFileUnusable) as e:
        LocalStore(str(path)).read()
    assert str(e.value) == (f"{path}: the lease's file cannot be opened (NotADirectoryError: Not a directory); "
                            "a file is in place of a folder above it: move it away")  # fmt: skip


def test_a_lease_that_cannot_be_staged_in_its_folder_is_one_line_and_leaves_nothing(tmp_path):
    # the lock opens, the new lease's temporary file does not: its path is over the
    # system's limit (PATH_MAX 4096), as real as a read-only folder and reachable as root
    from marin_rules.artifacts.lease_stores import LeaseFileUnusable

    tmp = "/.lease.json.tmp-12345678"
    location = str(tmp_path)
    while len(location) + 101 + len(tmp) + 50 < 4096:
        location = os.path.join(location, "d" * 100)
    location = os.path.join(location, "e" * (4096 - len(tmp) - len(location) - 1))  # 50 to 150 characters
    os.makedirs(location)
    assert len(f"{location}/.lease.json.lock") < 4096 == len(location + tmp)  # PATH_MAX counts the NUL: too long
    with pytest.raises(LeaseFileUnusable) as e:
        acquire(location, is_done=lambda: False)
    assert str(e.value) == (f"{location}/.lease.json.tmp-*: the lease's temporary file cannot be opened (OSError: "
                            "File name too long); its folder must take a new file (writable, with free space, the "
                            "path within the system's limit)")  # fmt: skip
    assert os.listdir(location) == [".lease.json.lock"]  # no lease nobody could release, no temporary file


def test_a_job_whose_lease_lock_cannot_be_opened_fails_in_one_line_with_a_failure_record(tmp_path, snakemake_cmd):
    (tmp_path / "exp.yaml").write_text('artifacts:\n  raw/a@v1: {step: "json:dumps"}\n')
    lock = tmp_path / "art/raw/a/v1/.lease.json.lock"
    lock.mkdir(parents=True)
    proc = snakemake_cmd("--configfile", "exp.yaml", "--cores", "1", "--config", f"prefix={tmp_path / 'art'}",
                         cwd=tmp_path, check=False)  # fmt: skip
    assert proc.returncode != 0
    (failure,) = (tmp_path / "art/raw/a/v1/.failures").glob("*.json")
    line = (f"marin-rules: raw/a@v1: {lock}: the lease's lock file cannot be opened (IsADirectoryError: Is a "
            "directory); a folder is in its place: remove it (the lease's lock file is a plain file, made again "
            f"when absent) (failure record {failure})")  # fmt: skip
    assert {x for x in proc.stderr.splitlines() if x.startswith("marin-rules:")} == {line}  # (Snakemake shows the log too)
    log = (tmp_path / ".snakemake/marin-logs/raw/a/v1/job.log").read_text()
    assert "Traceback" not in log and line in log
    error = json.loads(failure.read_text())["error"]
    assert error["type"] == "LeaseFileUnusable" and error["message"] == line.split(" (failure record")[0][13:]


def test_a_run_is_known_to_be_running_only_by_its_own_process_on_this_host():
    import dataclasses

    from marin_rules.artifacts.lease import new_holder, running_here

    me = new_holder()
    assert running_here(me)
    assert not running_here(dataclasses.replace(me, since="2020-01-01T00:00:00+00:00"))  # the pid taken over later
    assert not running_here(dataclasses.replace(me, host=me.host + "-elsewhere"))  # nobody can tell: not known
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           timeout=60, check=True)  # fmt: skip
    assert not running_here(dataclasses.replace(me, pid=int(ended.stdout)))


def test_an_unreadable_lease_on_gs_is_aged_by_its_objects_update_time(gcs_prefix):
    from marin_rules.artifacts.lease_stores import store_for

    location = f"{gcs_prefix}/a/v1"
    storage.write_bytes_atomic(location + "/.lease.json", b"garbage")
    age = store_for(location, ".lease.json").age_s()
    assert age is not None and 0 <= age < 60  # just written (a clock skew to the emulator would show here)
    with pytest.raises(LeaseHeld, match="its lease is unreadable"):
        acquire(location, is_done=lambda: False, wait=False, stale_s=3600)
    lease = acquire(location, is_done=lambda: False, wait=False, stale_s=0)
    try:
        assert read_lease(location) == lease.holder
    finally:
        lease.release()
    assert store_for(location + "/none", ".lease.json").age_s() is None


def test_a_waiter_with_shorter_timings_waits_out_the_holders_own_stale_s(tmp_path):
    """Two machines with other lease settings: the lease gives its holder's stale_s, and
    a waiter takes it over only after the longer of that and its own."""
    from dataclasses import replace

    from marin_rules.artifacts.lease import _holder, _takeover_reason, decode_holder, encode_holder, new_holder

    location = str(tmp_path / "a")
    ago = lambda s: iso(utc_now() - dt.timedelta(seconds=s))  # noqa: E731
    holder = replace(new_holder("", stale_s=90.0), host="machine-a", renewed=ago(10))  # renewed every 30 s
    data = encode_holder(holder)
    assert decode_holder(data) == holder
    assert _takeover_reason(location, data, decode_holder(data), stale_s=3.0) is None  # a waiter with stale_s=3
    late = encode_holder(replace(holder, renewed=ago(91)))
    assert "not renewed for 91 s; taking it over" in _takeover_reason(location, late, decode_holder(late), stale_s=3.0)
    old = json.loads(data)  # a lease written before holders gave their stale_s: the waiter's own counts
    del old["stale_s"]
    assert _holder(old).stale_s == 0.0 and _takeover_reason(location, data, _holder(old), stale_s=3.0) is not None
    for bad in (-1, "soon", True, 1e9):
        assert decode_holder(json.dumps({**old, "stale_s": bad}).encode()) is None  # unreadable: never live forever
