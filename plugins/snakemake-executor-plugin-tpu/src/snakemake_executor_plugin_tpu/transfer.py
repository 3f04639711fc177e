"""Files a pod job needs on TPU workers that share no disk with this host, as archives.

Model: the workers see nothing of this host's disk, so the gcloud backend moves three
things, all relative to the working directory Snakemake runs in (the job command's
paths are relative to it):

  - the workflow's sources: the git-tracked and untracked-but-not-ignored files, so
    uncommitted edits travel (those of a git repository inside it too: a submodule, a
    clone used as a module); ignored files (data, venvs) and Snakemake's own
    `.snakemake/` do not (skipped with `--tpu-expect-workflow`). Every file the workers'
    Snakemake reads (`workflow_files`: Snakefiles, included ones, config files) must lie
    inside the working directory: one outside is refused before a pod is made;
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
from typing import Any, Iterable

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


def workflow_files(workflow: Any) -> list[str]:
    """The files the workers' Snakemake reads besides the job's inputs: the main
    Snakefile, every local Snakefile it includes or uses as a module (`include:`,
    `module ... snakefile:`; one fetched from a URL is fetched there too), and the
    `--configfile` files. Read from Snakemake's Workflow (`included`,
    `overwrite_configfiles`), which the plugin interface does not list."""
    files = [str(workflow.main_snakefile)]
    for source in getattr(workflow, "included", ()):
        where = str(source.get_path_or_uri(secret_free=True)) if hasattr(source, "get_path_or_uri") else str(source)
        if "://" not in where or where.startswith("file://"):
            files.append(where.removeprefix("file://"))
    # the --configfile files, then those `configfile:` directives loaded (Snakemake's `configfiles`
    # holds both); a directive's file missing on a worker is skipped there without a word
    files += [str(f) for f in [*(getattr(workflow, "overwrite_configfiles", None) or ()),
                               *(getattr(workflow, "configfiles", None) or ())]]  # fmt: skip
    return list(dict.fromkeys(files))  # each once


def refuse_untravelled(files: Iterable[str], workdir: str, archived: Iterable[str] | None) -> None:
    """WorkflowError in one line for the first of `files` (`workflow_files`) that the
    workers would not get: outside `workdir`, or (with `archived`, the names
    `workflow_archive` packs) left out of the archive, as a file git ignores is."""
    packed = None if archived is None else set(archived)
    for f in map(os.path.normpath, files):
        rel = os.path.relpath(os.path.abspath(f), workdir)
        if rel == ".." or rel.startswith(".." + os.sep):
            raise WorkflowError(
                f"tpu executor: the workflow file {f!r} lies outside the working directory {workdir}, which is all a "
                "TPU worker gets; put it inside (a git submodule or clone there travels with its files), or put the "
                "workflow on the workers yourself and pass --tpu-expect-workflow"
            )
        if packed is not None and rel not in packed:
            raise WorkflowError(
                f"tpu executor: the workflow file {f!r} is not among the files sent to TPU workers (git ignores it, "
                "or it is not a plain file); stop ignoring it (.gitignore), or put the workflow on the workers "
                "yourself and pass --tpu-expect-workflow"
            )


def _nested_repository(path: str) -> bool:
    """Is `path` a git repository's folder of its own (a submodule's or a clone's, with its
    `.git`), not a link to a folder (elsewhere, or inside this tree: its files once)?"""
    return os.path.isdir(path) and not os.path.islink(path) and os.path.exists(os.path.join(path, ".git"))


MAX_NESTED_DEPTH = 8  # repositories inside repositories: as deep as the archive follows them


def workflow_archive(workdir: str, dest: Path, must_hold: Iterable[str] = ()) -> Path:
    """A tarball of the workflow's sources in `workdir` (see the module docstring); a
    git repository inside it (a submodule, or a clone such as marin-rules used as a
    module) contributes its own files by the same rule. `must_hold`: files it must
    pack (`refuse_untravelled`), checked before anything is written."""
    names = _git_files(workdir, "")
    refuse_untravelled(must_hold, workdir, names)
    return files_archive(workdir, names, dest)


def _git_files(workdir: str, under: str, depth: int = 0) -> list[str]:
    """The tracked and untracked-but-not-ignored files of the repository at
    `workdir/under`, relative to `workdir`, nested repositories followed."""
    folder = os.path.join(workdir, under) if under else workdir
    try:
        listed = subprocess.run(
            ["git", "-C", folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise WorkflowError(
            f"tpu executor: cannot list the workflow's files with git in {folder} ({e}); copying the workflow "
            "to TPU workers needs a git checkout. Or put it there yourself and pass --tpu-expect-workflow"
        ) from None
    names = []
    for name in listed.decode().split("\0"):
        rel = os.path.join(under, name.rstrip("/")) if under else name.rstrip("/")
        if not name or rel.startswith(".snakemake/"):
            continue
        path = os.path.join(workdir, rel)
        if os.path.isfile(path):
            names.append(rel)
        elif _nested_repository(path) and depth < MAX_NESTED_DEPTH:  # a submodule or a clone: git lists its folder
            names += _git_files(workdir, rel, depth + 1)
    return sorted(names)


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
