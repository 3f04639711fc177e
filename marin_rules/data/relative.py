"""Locations written inside an artifact, relative to it, so a prefix can move.

Model: an artifact that names another one (a tokenized artifact its tokenizer, a
train artifact its tokenizer and the data its checkpoints were trained on) stores
the other's location RELATIVE to its own folder, e.g. `../../../tokenizers/bpe/v1/
tokenizer.json`. Artifacts of one experiment live under one prefix, so moving or
copying the whole prefix (to another folder, or from a folder to a bucket) keeps
every such reference valid. A location on another filesystem or bucket than the
artifact cannot be made relative and is stored as it is; so are references written
by older code (absolute paths), which `resolve_location` returns unchanged.
"""

from __future__ import annotations

import os
import posixpath

from marin_rules.artifacts import storage


def _root_and_path(location: str) -> tuple[str, str]:
    """('gs://bucket', '/a/b') for a remote location; ('', absolute path) for a local one."""
    if storage.is_remote(location):
        scheme, rest = location.split("://", 1)
        bucket, _, path = rest.partition("/")
        return f"{scheme}://{bucket}", posixpath.normpath("/" + path)
    return "", os.path.abspath(storage.local_path(location))


def relative_location(base: str, target: str) -> str:
    """`target` as seen from the folder `base` (relative when both share a filesystem root)."""
    base_root, base_path = _root_and_path(base)
    target_root, target_path = _root_and_path(target)
    if base_root != target_root:
        return target
    if base_root:
        return posixpath.relpath(target_path, base_path)
    return os.path.relpath(target_path, base_path)


def resolve_location(base: str, reference: str) -> str:
    """The location a reference stored in the artifact at `base` points to, spelled as
    `base` is: relative to the working folder when `base` is (a relative prefix), so a
    rebuild command naming it matches Snakemake's output pattern for that prefix."""
    if storage.is_remote(reference) or reference.startswith("file://") or os.path.isabs(reference):
        return reference
    root, path = _root_and_path(base)
    if root:
        return root + posixpath.normpath(posixpath.join(path, reference))
    return os.path.normpath(os.path.join(storage.local_path(base), reference))
