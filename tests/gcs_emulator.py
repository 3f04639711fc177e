"""A local GCS emulator for gs:// tests (gcp-storage-emulator, 127.0.0.1 only).

Model: one in-memory emulator process per test session; `emulator_env(port)` is the
environment that points gcsfs and tensorstore (orbax) at it and keeps every client
away from cloud metadata servers. Nothing here reaches the network.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from snakemake_executor_plugin_tpu.local_pod import free_port

BUCKET = "marin-test"


def emulator_env(port: int) -> dict[str, str]:
    url = f"http://127.0.0.1:{port}"
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # else gcsfs probes a gRPC API for 60 s
        "FSSPEC_GCS_TOKEN": "anon",
        "GCE_METADATA_HOST": "127.0.0.1:9",  # a dead port: never probe a metadata server
        "GCE_METADATA_IP": "127.0.0.1:9",
        "GCE_METADATA_ROOT": "127.0.0.1:9",
        "NO_GCE_CHECK": "True",
    }


# the emulator serves one request at a time from a listen queue of socketserver's default 5:
# a bucket move of a checkpoint (many concurrent copies) overflowed it and connections hung
# for the kernel's retries; `request_queue_size` is socketserver's documented setting for it
SERVE = ("import socketserver, sys; socketserver.TCPServer.request_queue_size = 256; "
         "from gcp_storage_emulator.__main__ import main; main(sys.argv[1:])")  # fmt: skip


def start_emulator(timeout_s: float = 30.0) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "start", "--host", "127.0.0.1",
         "--port", str(port), "--in-memory", "--default-bucket", BUCKET],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"GCS emulator exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)  # polling for the port, bounded by the deadline
    proc.kill()
    raise RuntimeError(f"GCS emulator did not listen on 127.0.0.1:{port} within {timeout_s} s")


def apply_env(env: dict[str, str]) -> None:
    os.environ.update(env)
