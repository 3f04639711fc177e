"""What an unfinished build left is resumed only when it was made from the same upstream builds.

Model: before a job builds an artifact with upstreams (process 0 of a pod, under the
lease, after a forced build's old one moved away) it writes `{location}/.attempt.json`: the recipe's
fingerprint and each upstream's build (`{key: {fingerprint, built}}`, as the record's
deps name them). A later job that finds data an earlier attempt left but no success
record (a stopped or failed run, or records deleted by `snakemake
--delete-all-output`) resumes from it (checkpoints, partial files) only when that
attempt saw the same upstream builds. When an upstream was rebuilt since, what is
there was made from other data: it moves whole to `.history/<UTC time>-stale/` and
the build starts from scratch, so nothing inconsistent is resumed and nothing is
lost. Leftovers without an attempt file (made before it existed) are resumed as
before. A recipe changed without a version bump is the step's to refuse (training
names the field). Shards carry the same check in their shard records
(`marin_rules.artifacts.shards`).
"""

from __future__ import annotations

from typing import Any, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.builds import upstream_change
from marin_rules.artifacts.files import ATTEMPT_FILE, list_data_files


def begin(location: str, fingerprint: str, upstreams: Mapping[str, Any]) -> tuple[str, str] | None:
    """Record this attempt; first set aside leftovers made from other upstream builds.
    Returns (where they went, how an upstream differs) when it set them aside."""
    from marin_rules.workflow.forcing import set_aside

    path = storage.join(location, ATTEMPT_FILE)
    previous = _read(path)
    moved = None
    if previous is not None:
        how = "its .attempt.json is unreadable" if previous is UNREADABLE else upstream_change(previous.get("upstreams"), upstreams)
        if how is not None and list_data_files(location):
            moved = (set_aside(location, "stale"), how)
    storage.write_json_atomic(path, {"fingerprint": fingerprint, "upstreams": dict(upstreams)})
    return moved


UNREADABLE: dict[str, Any] = {}  # an attempt file that cannot be read: its leftovers are never trusted


def _read(path: str) -> dict[str, Any] | None:
    try:
        data = storage.read_json(path)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return UNREADABLE
    return data if isinstance(data, dict) and isinstance(data.get("upstreams"), dict) else UNREADABLE
