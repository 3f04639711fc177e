"""A fake `gcloud` CLI for tests: no cloud, the TPU slice is folders on this machine.

Tests put a `gcloud` script on PATH that runs this file. It understands only the
`gcloud compute tpus {tpu-vm,queued-resources} ...` calls the tpu executor makes,
logs every call (one JSON list per line) to `$FAKE_GCLOUD_ROOT/calls.jsonl`, keeps node
states as files, and plays each of `$FAKE_GCLOUD_WORKERS` workers as a folder
`$FAKE_GCLOUD_ROOT/<node>/worker-<i>` (its home): `scp LOCAL NODE:PATH --worker=all`
copies there, `scp NODE:PATH LOCAL --worker=0` copies back from worker 0, and
`ssh --worker=all --command C` runs `bash -c C` in each, with a fake `curl` answering
the TPU metadata server's `agent-worker-number` and `worker-network-endpoints`.
A worker shares nothing with the submitting process but what a TPU VM would have:
its environment is PATH (the fake tools and the software installed on the image),
HOME, and the variables named in `$FAKE_GCLOUD_WORKER_ENV` (e.g. the GCS emulator's,
standing in for the VM's service account). `$FAKE_GCLOUD_SSH_EXIT` makes ssh fail
with that status instead of running anything. With `$FAKE_GCLOUD_WORKERS_DETACHED` set,
each worker's command runs in a session of its own, as on a machine of its own: a
signal to the driver's process group (a cancel) does not reach it, and it runs on
after ssh is gone. With `$FAKE_GCLOUD_DELETE_WAITS_FOR` set
to a path, a delete first waits (at most a minute) until that file exists: a real
delete takes minutes, and a test decides when this one ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(os.environ["FAKE_GCLOUD_ROOT"])
WORKERS = int(os.environ.get("FAKE_GCLOUD_WORKERS", "1"))


def _positional(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("--"):
            skip = "=" not in a and a not in ("--quiet", "--force", "--spot", "--worker=all")
        else:
            out.append(a)
    return out


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def main(argv: list[str]) -> int:
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / "calls.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\n")
    if argv[:2] != ["compute", "tpus"] or len(argv) < 5:
        print(f"fake gcloud: unsupported call {argv}", file=sys.stderr)
        return 2
    kind, verb = argv[2], argv[3]
    rest = argv[4:]
    pos = _positional(rest)
    nodes = ROOT / "nodes"
    nodes.mkdir(exist_ok=True)
    if verb == "describe":
        state = nodes / pos[0]
        if not state.exists():
            print(f"ERROR: (gcloud) NOT_FOUND: {pos[0]}", file=sys.stderr)
            return 1
        print(state.read_text())
        return 0
    if verb == "create":
        (nodes / pos[0]).write_text("ACTIVE" if kind == "queued-resources" else "READY")
        return 0
    if verb == "delete":
        gate = os.environ.get("FAKE_GCLOUD_DELETE_WAITS_FOR")
        deadline = time.monotonic() + 60
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)  # the fake cloud's own pace, not a test's wait
        (nodes / pos[0]).unlink(missing_ok=True)
        return 0
    if verb == "scp":
        source, dest = pos[0], pos[1]
        if ":" in source:  # back from one worker
            node, _, path = source.partition(":")
            worker = _flag(rest, "--worker")
            shutil.copy(ROOT / node / f"worker-{worker}" / path, dest)
            return 0
        node, _, path = dest.partition(":")
        for i in range(WORKERS):
            home = ROOT / node / f"worker-{i}"
            home.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, home / path)
        return 0
    if verb == "ssh":
        if os.environ.get("FAKE_GCLOUD_SSH_EXIT"):
            return int(os.environ["FAKE_GCLOUD_SSH_EXIT"])
        command = _flag(rest, "--command")
        procs = []
        for i in range(WORKERS):
            home = ROOT / pos[0] / f"worker-{i}"
            home.mkdir(parents=True, exist_ok=True)
            kept = os.environ.get("FAKE_GCLOUD_WORKER_ENV", "").split()
            env = {k: os.environ[k] for k in ("PATH", "FAKE_GCLOUD_WORKERS", *kept) if k in os.environ}
            env.update(HOME=str(home), FAKE_WORKER_ID=str(i))
            detached = bool(os.environ.get("FAKE_GCLOUD_WORKERS_DETACHED"))
            procs.append(subprocess.Popen(["bash", "-c", command], cwd=home, env=env, start_new_session=detached))
        codes = [p.wait(timeout=300) for p in procs]
        return max(codes)
    print(f"fake gcloud: unsupported verb {verb}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
