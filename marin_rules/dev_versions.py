"""Dev versions: mutable `name@dev` / `name@*-dev` artifacts, one copy per user.

Model: a dev version is rebuilt on every run (the glue forces it, marin_rules/workflow/
session.py), never drift-checked, and stored at `{prefix}/{name}/{version}-{owner}`
(`ArtifactId.owner`): the owner is `--config dev_user=NAME`, else the login name
(`getpass.getuser()`), made one path-safe segment by `path_safe_user` (lowercase,
runs of other characters -> `-`). A job process finds the owner again in the path
it was given (`dev_user_in_path`), so a remote worker's login name never matters.
A fixed version may not depend on a dev version (`refuse_fixed_on_dev`): its
recipe would change under it with every run. A dev version keeps no history
(`keeps_history`): each run builds it from scratch, so what its earlier builds and
failed or stopped attempts left is deleted, not kept under `.history/` (its failure
records stay in `.failures/`). Every reader finds a dev version's folder the same way:
`owned` (the experiment's entries through `owned_by`, a key typed to `marin` directly);
`folder_identities` reads a folder found on a prefix back (`marin status --all`). A dev
version's folder with no `-user` (`name/dev`: the layout before dev versions were kept
per user) reads back as that dev version with no owner (`is_unowned`): no run reads or
rebuilds it any more, and `marin status --all` shows it once, as such.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError
from marin_rules.artifacts.identity import ArtifactId, is_dev_version, parse_key, path_safe_user


def default_dev_user() -> str:
    from marin_rules.artifacts.provenance import user

    return path_safe_user(user())


def owned(artifact_id: ArtifactId, dev_user: str) -> ArtifactId:
    """The identity as stored: a dev version owned by `dev_user` (made path-safe), so
    kept at `name/version-user`; a fixed version as it is."""
    return replace(artifact_id, owner=path_safe_user(dev_user)) if artifact_id.is_dev else artifact_id


def folder_identities(name: str, folder: str) -> list[ArtifactId]:
    """Every artifact a version folder `folder` of `name` may hold, the fixed version
    `name@folder` first, then each dev version `v` of an owner `u` with folder `v-u`
    (`x-dev-bob-dev-ann` may be `x-dev` of bob-dev-ann or `x-dev-bob-dev` of ann: only
    the record there tells which). A dev version's folder of the old layout, `dev` or
    `x-dev` with no owner, is that dev version with no owner (`is_unowned`)."""
    found = [ArtifactId(name, folder)]
    for i, char in enumerate(folder):
        version, owner = folder[:i], folder[i + 1 :]
        if char == "-" and is_dev_version(version) and owner and path_safe_user(owner) == owner:
            found.append(ArtifactId(name, version, owner))
    return found


def is_unowned(artifact_id: ArtifactId) -> bool:
    """A dev version read back from a folder with no owner (`name/dev`, the layout before
    per-user dev folders): kept only until someone deletes or moves it."""
    return artifact_id.is_dev and not artifact_id.owner


def owned_by(experiment: Any, dev_user: str) -> Any:
    """The same experiment with its dev versions owned by `dev_user` (path-safe)."""
    artifacts = {
        key: replace(a, id=owned(a.id, dev_user)) if a.id.is_dev else a for key, a in experiment.artifacts.items()
    }
    owner = path_safe_user(dev_user)
    by_path: dict[str, Any] = {}
    for a in artifacts.values():
        other = by_path.setdefault(a.id.path, a)
        if other is not a:
            dev, fixed = (a, other) if a.id.is_dev else (other, a)
            raise ConfigError(
                f"{fixed.key}: version",
                f"{dev.key} of user {owner!r} is stored at {a.id.path}, where this fixed version lives; rename one",
            )
    return replace(experiment, artifacts=artifacts, by_path=by_path)


def dev_user_in_path(experiment: Any, path: str) -> str | None:
    """The owner a stored dev path `name/version-owner` names (the longest matching
    dev version of that name wins); None when no dev artifact matches."""
    best: tuple[int, str] | None = None
    for a in experiment.artifacts.values():
        start = f"{a.id.name}/{a.id.version}-"
        if a.id.is_dev and path.startswith(start) and len(path) > len(start):
            if best is None or len(start) > best[0]:
                best = (len(start), path[len(start) :])
    return None if best is None else best[1]


DISCARDED = "discarded (a dev version keeps no history)"  # said where what is set aside is deleted instead


def keeps_history(artifact_id: Any) -> bool:
    """Is what the artifact's earlier builds and attempts left kept under `.history/`?
    Not for a dev version: rebuilt from scratch on every run, its copies would only pile up."""
    return not artifact_id.is_dev


def refuse_fixed_on_dev(deps_of: Mapping[str, Mapping[str, Any]]) -> None:
    """Marin's rule: a fixed version may not depend on a dev version (`deps_of`: key -> deps)."""
    for key, deps in deps_of.items():
        if parse_key(key).is_dev:
            continue
        for role, dep in deps.items():
            for upstream in [dep] if isinstance(dep, str) else dep:
                if parse_key(upstream).is_dev:
                    name = key.rpartition("@")[0]
                    raise ConfigError(
                        f"{key}: deps.{role}",
                        f"{upstream} is a dev version (mutable, rebuilt every run) and a fixed version cannot "
                        f"depend on it; make this one a dev version too ({name}@dev) or depend on a fixed version",
                    )
