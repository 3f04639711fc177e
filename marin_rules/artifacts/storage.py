"""Reading and writing artifact locations through fsspec.

Model: a location is a string, either a local path (relative or absolute) or an
fsspec URL (`gs://bucket/path`, `file:///abs/path`, `memory://x`). Every helper takes
and returns such strings, so steps never care where their prefix lives. Small files
(records, manifests) are written atomically: to a temporary sibling, then moved
into place (a rename locally; on object stores a single PUT is already atomic).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import socket
import time
import urllib.parse
import uuid
from typing import Any, Iterator

import fsspec
from fsspec.core import url_to_fs

from marin_rules.artifacts.errors import decode_json

# gcsfs logs each failed request with its traceback through Python's last-resort
# handler when nothing is configured; what fails reaches the caller as an exception,
# which says it in one line (`storage_problem`). An application configuring logging
# still gets these records.
logging.getLogger("gcsfs").addHandler(logging.NullHandler())


def is_remote(location: str) -> bool:
    """True for URLs of a non-local filesystem (`gs://`, `memory://`, ...)."""
    if "://" not in location:
        return False
    return not location.startswith("file://")


def local_path(location: str) -> str:
    """The local filesystem path of a local location (`file://` stripped)."""
    return location[len("file://") :] if location.startswith("file://") else location


def join(base: str, *parts: str) -> str:
    """Join path parts onto a location, keeping its URL scheme."""
    if is_remote(base) or base.startswith("file://"):
        return posixpath.join(base.rstrip("/"), *parts)
    return os.path.join(base, *parts)


def filesystem(location: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem for a location and the path within it."""
    return url_to_fs(location)


def exists(location: str) -> bool:
    fs, path = filesystem(location)
    return fs.exists(path)


def makedirs(location: str) -> None:
    """Create a directory (a no-op on object stores, where directories are implied)."""
    if not is_remote(location):
        os.makedirs(local_path(location), exist_ok=True)


def move(source: str, target: str) -> None:
    """Move a file or folder: `os.replace` locally; on a bucket a copy, then a delete
    (gcsfs's mv retries a move API buckets lack)."""
    if is_remote(source):
        fs, path = filesystem(source)
        fs.copy(path, filesystem(target)[1], recursive=True)
        fs.rm(path, recursive=True)
    else:
        os.replace(local_path(source), local_path(target))


def open_file(location: str, mode: str = "rb", **kwargs: Any):
    """Open a file for reading or writing; parent directories are created locally."""
    if "w" in mode or "a" in mode:
        makedirs(parent(location))
    return fsspec.open(location, mode, **kwargs).open()


def parent(location: str) -> str:
    """The folder holding `location`, spelled as it is (a relative path stays relative:
    a rebuild command naming an artifact must match Snakemake's pattern for its prefix)."""
    if is_remote(location) or location.startswith("file://"):
        return posixpath.dirname(location.rstrip("/"))
    path = os.path.normpath(location)
    if os.path.basename(path) in (os.curdir, os.pardir):  # "." or "..": the folder above it
        return os.path.normpath(os.path.join(path, os.pardir))
    return os.path.dirname(path) or os.curdir


def read_bytes(location: str) -> bytes:
    if not is_remote(location):  # the common case on a laptop: skip fsspec's resolution
        with open(local_path(location), "rb") as f:
            return f.read()
    fs, path = filesystem(location)
    return fs.cat_file(path)


def read_text(location: str) -> str:
    return read_bytes(location).decode("utf-8")


def read_json(location: str) -> Any:
    """The JSON in a file; ValueError when it holds none (`errors.decode_json`)."""
    return decode_json(read_bytes(location))


# the temporary file an atomic local write renames into place (`temporary_sibling`): one
# left behind was written by a process killed before its rename
INTERRUPTED_WRITE = re.compile(r".+\.tmp-[0-9a-f]{8}")


def temporary_sibling(path: str) -> str:
    """A new name beside the local file `path` for writing it before a rename
    (`<path>.tmp-<8 hex>`, which `INTERRUPTED_WRITE` matches)."""
    return f"{path}.tmp-{uuid.uuid4().hex[:8]}"


def write_bytes_atomic(location: str, data: bytes, durable: bool = True) -> None:
    """Write `data` so that readers see either nothing or all of it. `durable=False`
    skips the fsync, for caches rebuilt from elsewhere (the gs:// record mirror)."""
    if is_remote(location):
        fs, path = filesystem(location)
        fs.pipe_file(path, data)  # one PUT: atomic on object stores
        return
    path = local_path(location)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = temporary_sibling(path)
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text_atomic(location: str, text: str) -> None:
    write_bytes_atomic(location, text.encode("utf-8"))


def write_json_atomic(location: str, obj: Any) -> None:
    write_text_atomic(location, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def list_files(location: str, pattern: str = "*") -> list[str]:
    """Sorted locations of files directly under `location` matching a glob pattern."""
    fs, path = filesystem(location)
    protocol = location.split("://", 1)[0] + "://" if is_remote(location) else ""
    found = sorted(fs.glob(posixpath.join(path.rstrip("/"), pattern)))
    return [protocol + p if protocol and not p.startswith(protocol) else p for p in found]


def glob(pattern: str) -> list[str]:
    """Sorted locations matching a glob over any filesystem (`gs://b/raw/*.txt`)."""
    fs, path = filesystem(pattern)
    protocol = pattern.split("://", 1)[0] + "://" if is_remote(pattern) else ""
    return [protocol + p if protocol else p for p in sorted(fs.glob(path))]


def walk_files(location: str) -> Iterator[str]:
    fs, path = filesystem(location)
    protocol = location.split("://", 1)[0] + "://" if is_remote(location) else ""
    for p in sorted(fs.find(path)):
        yield protocol + p if protocol else p


def check_bucket(prefix: str) -> None:
    """A gs:// prefix's bucket exists (one request); else one line naming it. Without
    this a missing bucket reads like a prefix where nothing was built yet. First, the
    endpoint is probed (`probe_gcs_endpoint`)."""
    if not is_remote(prefix):
        return
    probe_gcs_endpoint(prefix)
    fs, path = filesystem(prefix)
    bucket = path.split("/", 1)[0]
    if not fs.exists(bucket):
        from marin_rules.artifacts.errors import MarinError

        raise MarinError(
            f"{prefix}: there is no bucket {bucket} (or these credentials cannot see it); check the name, "
            f"or create it: gcloud storage buckets create gs://{bucket}"
        )


GCS_ENDPOINT = "https://storage.googleapis.com"
# settings with which gcsfs reaches another endpoint (a universe domain, fsspec's own)
OTHER_ENDPOINT_VARIABLES = ("GOOGLE_CLOUD_UNIVERSE_DOMAIN", "FSSPEC_GCS_ENDPOINT_URL", "FSSPEC_GCS")
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def probe_gcs_endpoint(prefix: str, attempts: int = 2, timeout_s: float = 5.0) -> None:
    """Raise ConnectionError within a few seconds when a gs:// prefix's endpoint
    (`STORAGE_EMULATOR_HOST` as gcsfs reads it, else storage.googleapis.com) refuses
    connections or its host name does not resolve, `attempts` times one second apart:
    gcsfs retries each request for about 34 s, so an unreachable endpoint took over a
    minute to report. Anything less certain (a connection that times out, a proxy set
    in the environment, which gcsfs may go through) is left to gcsfs and its retries."""
    if not prefix.startswith(("gs://", "gcs://")) or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return
    if any(os.environ.get(v) for v in OTHER_ENDPOINT_VARIABLES) or fsspec.config.conf.get("gcs", {}).get("endpoint_url"):
        return  # gcsfs goes elsewhere than this function would probe
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    endpoint = emulator if emulator and emulator != "default" else GCS_ENDPOINT  # gcsfs reads "default" as unset
    url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    except ValueError:  # a port that is not a number: gcsfs says so itself
        return
    if not host:
        return
    for attempt in range(attempts):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except ConnectionRefusedError as e:
            problem = e
        except socket.gaierror as e:
            if e.errno not in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return  # a temporary failure (EAI_AGAIN): gcsfs's retries decide
            problem = e
        except OSError:  # a timeout, an unreachable network: gcsfs's retries decide
            return
        if attempt + 1 < attempts:
            time.sleep(1.0)  # a moment for a server that is just starting
    refused = isinstance(problem, ConnectionRefusedError)
    raise ConnectionError(
        f"{host}:{port} " + ("refused the connection" if refused else f"does not resolve ({problem})")
    )


def storage_problem(prefix: str | None, error: BaseException) -> str:
    """One line for a prefix that cannot be read or written (no network, no bucket, no
    credentials, a full disk), naming it and what to check."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    where = f"{prefix}: " if prefix else ""
    return (
        f"{where}cannot reach the storage ({type(error).__name__}: {first}); check the path, the network, "
        "and for gs:// the bucket name and credentials (gcloud auth application-default login)"
    )
