"""Files a pod job needs on TPU workers that share no disk with this host, as archives.

Model: the workers see nothing of this host's disk, so the gcloud backend moves three
things, all relative to the working directory Snakemake runs in (the job command's
paths are relative to it):

  - the workflow's sources: the git-tracked and untracked-but-not-ignored files, so
    uncommitted edits travel; ignored files (data, venvs) and Snakemake's own
    `.snakemake/` do not (skipped with `--tpu-expect-workflow`);
  - the job's declared local input files (or directories), before the job;
  - the job's declared output and log files, from worker 0 back here, after it.

Inputs and outputs in a Snakemake storage (`--default-storage-provider`, `storage:`)
are not moved: the job itself reads and writes them there. A local path outside the
working directory cannot be mirrored onto a worker and is refused. Archives are named
by their content on the workers, so jobs never mix versions.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Iterable

from snakemake_interface_common.exceptions import WorkflowError


def local_paths(files: Iterable, what: str, workdir: str) -> list[str]:
    """The job's files (Snakemake IO files or strings) that travel as local files:
    paths relative to `workdir`; storage files are left to the job."""
    paths = []
    for f in files:
        if getattr(f, "is_storage", False):
            continue
        path = os.path.normpath(str(f))
        rel = os.path.relpath(os.path.join(workdir, path), workdir)
        if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
            raise WorkflowError(
                f"tpu executor: the {what} {str(f)!r} lies outside the working directory {workdir}, which is all a "
                "TPU worker gets; use a path inside it or a Snakemake storage (--default-storage-provider)"
            )
        paths.append(rel)
    return sorted(set(paths))


def workflow_archive(workdir: str, dest: Path) -> Path:
    """A tarball of the workflow's sources in `workdir` (see the module docstring)."""
    try:
        listed = subprocess.run(
            ["git", "-C", workdir, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise WorkflowError(
            f"tpu executor: cannot list the workflow's files with git in {workdir} ({e}); copying the workflow "
            "to TPU workers needs a git checkout. Or put it there yourself and pass --tpu-expect-workflow"
        ) from None
    names = sorted(
        n for n in listed.decode().split("\0")
        if n and not n.startswith(".snakemake/") and os.path.isfile(os.path.join(workdir, n))
    )  # fmt: skip
    return files_archive(workdir, names, dest)


def files_archive(workdir: str, names: Iterable[str], dest: Path) -> Path:
    """A tarball of `names` (files or directories, relative to `workdir`), symbolic links
    followed: a worker gets the file a link points to (an input is often a link into a
    data folder elsewhere, which the worker does not have)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz", dereference=True) as tar:
        for name in names:
            tar.add(os.path.join(workdir, name), arcname=name)
    return dest


def archive_name(archive: Path, kind: str) -> str:
    """The archive's file name on the workers: `snakemake-<kind>-<content hash>.tar.gz`."""
    digest = hashlib.sha1(archive.read_bytes()).hexdigest()[:12]
    return f"snakemake-{kind}-{digest}.tar.gz"
