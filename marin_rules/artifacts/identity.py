"""Artifact identity: `name@version`, nothing else.

Model: an artifact is addressed by an explicit name (one or more `/`-separated
segments of `[a-z0-9][a-z0-9._-]*`) and a free-form version (`[A-Za-z0-9][A-Za-z0-9._-]*`).
Its data lives at `{prefix}/{name}/{version}`; no content hash enters the path, so the
same recipe under the same name and version is the same artifact on every machine.

Dev versions (`dev`, or any version ending `-dev`) are mutable: rebuilt on every
run, never drift-checked, and stored per user at `{prefix}/{name}/{version}-{user}`
(`ArtifactId.owner`, set by the experiment loader), so colleagues sharing a prefix
do not overwrite each other. The user name is made path-safe by `path_safe_user`.

Every name segment and the version becomes a folder name, which filesystems cap at
255 bytes: each may be at most `MAX_SEGMENT_BYTES` (200) long, leaving room for a
dev version's `-user` (`path_safe_user` keeps at most `MAX_OWNER_BYTES`, 54). The whole
`name/version` may be at most `MAX_PATH_BYTES` (512) long: below the prefix and above
the artifact's own files, it must fit a local path (4096 bytes) and a GCS object name
(1024 bytes).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from marin_rules.artifacts.errors import ConfigError

NAME_SEGMENT = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

MAX_SEGMENT_BYTES = 200  # a name segment or version; filesystems allow 255 per folder name
MAX_OWNER_BYTES = 255 - MAX_SEGMENT_BYTES - 1  # the `-user` of a dev version's folder
# the whole `name/version`: GCS object names are at most 1024 bytes and local paths 4096
# (PATH_MAX), and each must also hold the prefix and the files inside the artifact
MAX_PATH_BYTES = 512
SNAKEMAKE_REPEATS = 20  # Snakemake refuses a wildcard value ending in a piece repeated this often

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
        if segment in ("", ".", "..") or not NAME_SEGMENT.fullmatch(segment):
            raise ConfigError(
                field,
                f"bad artifact name {name!r} in {key!r}: use '/'-separated segments of "
                "lowercase letters, digits, '.', '_', '-', each starting with a letter or digit",
            )
    if not VERSION.fullmatch(version) or version in (".", ".."):
        raise ConfigError(
            field,
            f"bad version {version!r} in {key!r}: use letters, digits, '.', '_', '-', "
            "starting with a letter or digit",
        )
    for what, part in [*(("name segment", s) for s in segments), ("version", version)]:
        size = len(part.encode("utf-8"))
        if size > MAX_SEGMENT_BYTES:
            raise ConfigError(
                field,
                f"{what} {part[:24] + '...'!r} of {key[:48] + '...'!r} is {size} bytes long; each name segment "
                f"and the version may be at most {MAX_SEGMENT_BYTES} bytes in UTF-8 (each becomes a folder name: "
                "filesystems allow 255, and a dev version's folder adds -<user>)",
            )
    size = len(f"{name}/{version}".encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise ConfigError(
            field,
            f"{key[:48] + '...'!r} is {size} bytes long as a folder path (name/version); it may be at most "
            f"{MAX_PATH_BYTES} bytes in UTF-8 (it lies below the prefix and above the artifact's files, within a "
            "local path's 4096 bytes and a GCS object name's 1024): shorten the name or version",
        )
    return ArtifactId(name, version)


def periodic_suffix(value: str, repeats: int = SNAKEMAKE_REPEATS) -> str | None:
    """The shortest piece that `value` ends in `repeats` or more times over, else None:
    exactly the values Snakemake's `PeriodicityDetector` refuses as wildcard values
    (its regex `((?P<value>.+)(?P=value){19,99})$`, searched: a suffix of 20 to 100
    copies of one piece, so any suffix of 20 or more copies)."""
    for size in range(1, len(value) // repeats + 1):
        piece = value[-size:]
        if value.endswith(piece * repeats):
            return piece
    return None


def is_dev_version(version: str) -> bool:
    """`dev` or `*-dev`: a mutable version (rebuilt every run, stored per user)."""
    return version == DEV_VERSION or version.endswith(DEV_SUFFIX)


def path_safe_user(user: str | None) -> str:
    """A user name as one path segment: lowercased, every run of characters outside
    `[a-z0-9._-]` replaced by `-`, leading/trailing `.`, `_`, `-` stripped, cut to
    `MAX_OWNER_BYTES` (a dev version's folder `version-user` stays a valid folder
    name). A name with characters beyond ASCII ends in `-` and 8 hex digits of its
    SHA-1 (`Jörg` and `Jürg` are `j-rg-...`, each their own), and one with nothing left
    (`..`) is `u` and those digits, so such users still get folders of their own;
    `unknown` only when there is no name."""
    if not user:
        return "unknown"
    digest = hashlib.sha1(user.encode("utf-8", "replace")).hexdigest()[:8]
    safe = re.sub(r"[^a-z0-9._-]+", "-", user.lower()).strip("._-")
    if not user.isascii() and safe:
        return f"{safe[: MAX_OWNER_BYTES - 9].rstrip('._-')}-{digest}"
    return safe[:MAX_OWNER_BYTES].rstrip("._-") or f"u{digest}"


def artifact_location(prefix: str, artifact: ArtifactId) -> str:
    """`{prefix}/{name}/{version}` for a local or URL prefix."""
    return f"{prefix.rstrip('/')}/{artifact.path}"
