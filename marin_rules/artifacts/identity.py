"""Artifact identity: `name@version`, nothing else.

Model: an artifact is addressed by an explicit name (one or more `/`-separated
segments of `[a-z0-9][a-z0-9._-]*`) and a free-form version (`[A-Za-z0-9][A-Za-z0-9._-]*`).
Its data lives at `{prefix}/{name}/{version}`; no content hash enters the path, so the
same recipe under the same name and version is the same artifact on every machine.

Dev versions (`dev`, or any version ending `-dev`) are mutable: rebuilt on every
run, never drift-checked, and stored per user at `{prefix}/{name}/{version}-{user}`
(`ArtifactId.owner`, set by the experiment loader), so colleagues sharing a prefix
do not overwrite each other. The user name is made path-safe by `path_safe_user`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from marin_rules.artifacts.errors import ConfigError

NAME_SEGMENT = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

RECORD_FILE = ".artifact.json"
FAILURES_DIR = ".failures"
DEV_VERSION = "dev"
DEV_SUFFIX = "-dev"


@dataclass(frozen=True, order=True)
class ArtifactId:
    name: str
    version: str
    owner: str = field(default="", compare=False)  # dev versions: the path-safe user they belong to

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def is_dev(self) -> bool:
        return is_dev_version(self.version)

    @property
    def path(self) -> str:
        """The artifact's place below the prefix: `name/version`, or for a dev version
        of an owner `name/version-owner` (e.g. `tokenized/x/dev-alice`)."""
        if self.owner and self.is_dev:
            return f"{self.name}/{self.version}-{self.owner}"
        return f"{self.name}/{self.version}"

    def __str__(self) -> str:
        return self.key


def parse_key(key: object, field: str = "") -> ArtifactId:
    """Parse `name@version`, refusing anything that could escape the prefix."""
    if not isinstance(key, str):
        raise ConfigError(field, f"expected 'name@version', got {key!r}")
    name, sep, version = key.rpartition("@")
    if not sep:
        raise ConfigError(field, f"expected 'name@version', got {key!r} (add a version, e.g. {key}@v1)")
    segments = name.split("/")
    for segment in segments:
        if segment in ("", ".", "..") or not NAME_SEGMENT.match(segment):
            raise ConfigError(
                field,
                f"bad artifact name {name!r} in {key!r}: use '/'-separated segments of "
                "lowercase letters, digits, '.', '_', '-', each starting with a letter or digit",
            )
    if not VERSION.match(version) or version in (".", ".."):
        raise ConfigError(
            field,
            f"bad version {version!r} in {key!r}: use letters, digits, '.', '_', '-', "
            "starting with a letter or digit",
        )
    return ArtifactId(name, version)


def is_dev_version(version: str) -> bool:
    """`dev` or `*-dev`: a mutable version (rebuilt every run, stored per user)."""
    return version == DEV_VERSION or version.endswith(DEV_SUFFIX)


def path_safe_user(user: str | None) -> str:
    """A user name as one path segment: lowercased, every run of characters outside
    `[a-z0-9._-]` replaced by `-`, leading/trailing `.`, `_`, `-` stripped; `unknown`
    when nothing is left (no user name, or one of symbols only)."""
    safe = re.sub(r"[^a-z0-9._-]+", "-", (user or "").lower()).strip("._-")
    return safe or "unknown"


def artifact_location(prefix: str, artifact: ArtifactId) -> str:
    """`{prefix}/{name}/{version}` for a local or URL prefix."""
    return f"{prefix.rstrip('/')}/{artifact.path}"
