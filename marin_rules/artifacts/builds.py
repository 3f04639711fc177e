"""Which upstream builds a piece of data was made from.

Model: a consumer names each upstream build it used as `{fingerprint, built}` (the
recipe and the time its success record was written), by upstream key `name@version`:
a record's `deps` carry them per role, a shard record and an attempt file
(`marin_rules.job.attempt`) as one mapping. Data made from other builds than the
upstreams' now (an upstream rebuilt since) cannot be resumed or gathered with data
made from these.
"""

from __future__ import annotations

from typing import Any, Mapping

from marin_rules.artifacts.drift import printable


def build_of(record: Any) -> dict[str, Any]:
    """How a consumer names the build of an upstream `Record` it used."""
    return {"fingerprint": record.fingerprint, "built": record.built}


def builds_in_deps(deps: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The upstream builds a record's (or entry's) `deps` name, by key."""
    out = {}
    for dep in deps.values():
        for d in dep if isinstance(dep, list) else [dep]:
            if isinstance(d, Mapping):
                out[f"{d.get('name')}@{d.get('version')}"] = {"fingerprint": d.get("fingerprint"), "built": d.get("built")}
    return out


def upstream_change(then: Any, now: Mapping[str, Any]) -> str | None:
    """How the upstream builds `now` differ from those some data was made from (`then`):
    one phrase for the first that differs; None when the same, or when `then` is not a
    mapping (made before builds were kept: unknown, taken as the same)."""
    if not isinstance(then, Mapping):
        return None
    for key in sorted(set(then) | set(now)):
        seen, current = then.get(key), now.get(key)
        if seen == current:
            continue
        if not isinstance(seen, Mapping) or not isinstance(current, Mapping):
            return f"upstream {key}: {'none' if seen is None else 'built'} then, {'none' if current is None else 'built'} now"
        if seen.get("fingerprint") != current.get("fingerprint"):  # values read from records: shown printable
            return printable(f"upstream {key}: fingerprint {seen.get('fingerprint')} then, {current.get('fingerprint')} now")
        return printable(f"upstream {key}: built {seen.get('built')} then, {current.get('built')} now")
    return None
