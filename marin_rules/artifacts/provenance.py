"""Provenance: where and how a job ran (code version, who, where, when, how long).

Model: `Provenance` holds what the caller knows (workflow folder, the user's command,
already redacted by the caller, rule, job id); `as_dict` adds git state, user, host,
package versions and the times. Nothing here reads environment variables, so no
credential can reach a record.
"""

from __future__ import annotations

import datetime as dt
import getpass
import socket
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from typing import Any

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


def user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return None


@dataclass(frozen=True)
class Provenance:
    """Where and how a job ran; times are filled in by the wrapper. `extra` holds optional
    fields a caller adds (e.g. the job id as the main process showed it)."""

    workflow_dir: str
    command: list[str]
    rule: str | None
    jobid: int | str | None
    extra: tuple[tuple[str, Any], ...] = ()

    def as_dict(self, started: dt.datetime, ended: dt.datetime) -> dict[str, Any]:
        return {
            "git": git_state(self.workflow_dir),
            "user": user(),
            "host": socket.gethostname(),
            "command": list(self.command),
            "packages": package_versions(),
            "rule": self.rule,
            "jobid": self.jobid,
            "started": iso(started),
            "ended": iso(ended),
            "duration_s": round((ended - started).total_seconds(), 3),
            **dict(self.extra),
        }
