"""Success and failure records, written next to the data.

Model: `{location}/.artifact.json` is the success record. It is written last, in
one atomic write, after the step returned; its existence means "built". It holds
identity (name, version, step, fingerprint), the recipe (`config`, `deps` with the
upstream fingerprints seen at build time), `runtime`, the step's `result`, and
`provenance` (code version, who, where, when, how long). A failed attempt writes
`{location}/.failures/<UTC time>.json` with the same identity and recipe plus the
error and its traceback; failures are history and are never deleted. Nothing here
copies environment variables, so no credential can reach a record.
"""

from __future__ import annotations

import datetime as dt
import getpass
import socket
import subprocess
import traceback as tb
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.identity import FAILURES_DIR, RECORD_FILE

RECORD_SCHEMA = 1
TRACKED_PACKAGES = (
    "marin-rules", "snakemake", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint",
    "tokenizers", "lm-eval", "numpy", "xxhash", "fsspec", "gcsfs",
)  # fmt: skip


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@lru_cache(maxsize=None)
def package_versions() -> dict[str, str]:
    versions = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


@lru_cache(maxsize=None)
def git_state(directory: str) -> dict[str, Any]:
    """Commit, dirty flag and branch of the workflow's source tree (if it is a checkout)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", directory, *args], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None}
    # untracked (not ignored) files count: a user step or experiment file not yet in git
    status = git("status", "--porcelain")
    return {"commit": commit, "dirty": bool(status), "branch": git("rev-parse", "--abbrev-ref", "HEAD")}


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return None


@dataclass(frozen=True)
class Provenance:
    """Where and how a job ran; times are filled in by the wrapper."""

    workflow_dir: str
    command: list[str]
    rule: str | None
    jobid: int | None

    def as_dict(self, started: dt.datetime, ended: dt.datetime) -> dict[str, Any]:
        return {
            "git": git_state(self.workflow_dir),
            "user": _user(),
            "host": socket.gethostname(),
            "command": list(self.command),
            "packages": package_versions(),
            "rule": self.rule,
            "jobid": self.jobid,
            "started": iso(started),
            "ended": iso(ended),
            "duration_s": round((ended - started).total_seconds(), 3),
        }


def record_location(artifact_location: str) -> str:
    return storage.join(artifact_location, RECORD_FILE)


def failures_location(artifact_location: str) -> str:
    return storage.join(artifact_location, FAILURES_DIR)


def identity_fields(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a record shared by success and failure: identity and recipe."""
    return {
        "schema": RECORD_SCHEMA,
        "name": entry["name"],
        "version": entry["version"],
        "step": entry["step"],
        "fingerprint": entry["fingerprint"],
        "config": entry["config"],
        "deps": entry["deps"],
        "runtime": entry["runtime"],
        "path": entry["path"],
    }


def success_record(entry: Mapping[str, Any], result: Any, provenance: dict[str, Any]) -> dict:
    return {**identity_fields(entry), "status": "success", "result": result, "provenance": provenance}


def write_success(location: str, record: Mapping[str, Any]) -> None:
    """Write a success record (from `success_record`): one atomic write, the last one."""
    storage.write_json_atomic(record_location(location), record)


def write_failure(
    location: str,
    entry: Mapping[str, Any],
    error: BaseException,
    provenance: dict[str, Any],
    exit_status: int | str | None = None,
    process: int | None = None,
) -> str:
    """Write one failure record; returns its location. On a pod every process that
    fails writes its own (`process` is its index; the file name ends `-p<index>`
    except for process 0), so the cause is recorded even where it was not process 0."""
    when = provenance.get("ended") or iso(utc_now())
    stamp = when.replace(":", "").replace("-", "")
    record = {
        **identity_fields(entry),
        **({} if process is None else {"process": process}),
        "status": "failed",
        "error": {
            "type": type(error).__name__,
            "message": str(error),
            "traceback": "".join(tb.format_exception(type(error), error, error.__traceback__)),
            "exit_status": exit_status,
        },
        "provenance": provenance,
    }
    suffix = f"-p{process}" if process else ""
    target = storage.join(failures_location(location), f"{stamp}{suffix}.json")
    storage.write_json_atomic(target, record)
    return target


def read_record(location: str) -> dict[str, Any] | None:
    """The success record of an artifact location, or None when it was never built."""
    try:
        return storage.read_json(record_location(location))
    except FileNotFoundError:
        return None


def read_failures(location: str) -> list[dict[str, Any]]:
    """All failure records, oldest first."""
    folder = failures_location(location)
    try:
        files = storage.list_files(folder, "*.json")
    except FileNotFoundError:
        return []
    out = []
    for f in files:
        try:
            out.append(storage.read_json(f))
        except (FileNotFoundError, ValueError):
            continue
    return out


def workflow_dir_of(path: str) -> str:
    return str(Path(path).resolve().parent)
