"""Which upstream builds a piece of data was made from.

Model: a consumer names each upstream build it used as `{fingerprint, built}` (the
recipe and the time its success record was written), by upstream key `name@version`:
a record's `deps` carry them per role, a shard record and an attempt file
(`marin_rules.job.attempt`) as one mapping. Data made from other builds than the
upstreams' now (an upstream rebuilt since) cannot be resumed or gathered with data
made from these; a finished consumer is served, with an advisory saying which upstream
was rebuilt since (`rebuilt_upstreams`: the planning glue and `marin status` alike).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from marin_rules.artifacts.drift import printable


def build_of(record: Any) -> dict[str, Any]:
    """How a consumer names the build of an upstream `Record` it used (or of a record
    read as a plain mapping, as `marin status` reads them)."""
    if isinstance(record, Mapping):
        ended = (record.get("provenance") or {}).get("ended")
        return {"fingerprint": record.get("fingerprint"), "built": ended if isinstance(ended, str) else None}
    return {"fingerprint": record.fingerprint, "built": record.built}


def upstream_builds(keys: Iterable[str], recorded: Callable[[str], Any]) -> dict[str, dict[str, Any]] | None:
    """Each upstream's build now (`build_of` of `recorded(key)`, its record or None),
    by key; None when one of them has no record (it is built first)."""
    builds = {}
    for key in keys:
        record = recorded(key)
        if record is None:
            return None
        builds[key] = build_of(record)
    return builds


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
        how = build_change(then.get(key), now.get(key))
        if how is not None:
            return printable(f"upstream {key}: {how}")  # values read from records: shown printable
    return None


def build_change(seen: Any, current: Any) -> str | None:
    """How one upstream's build `current` differs from `seen` (`build_of` forms, or None
    for no build): "fingerprint A then, B now", "built A then, B now" or "built then,
    none now"; None when the same."""
    if seen == current:
        return None
    if not isinstance(seen, Mapping) or not isinstance(current, Mapping):
        return f"{'none' if seen is None else 'built'} then, {'none' if current is None else 'built'} now"
    if seen.get("fingerprint") != current.get("fingerprint"):
        return f"fingerprint {seen.get('fingerprint')} then, {current.get('fingerprint')} now"
    return f"built {seen.get('built')} then, {current.get('built')} now"


def rebuilt_upstreams(deps: Mapping[str, Any], now: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(upstream key, how: `build_change`, after "same recipe, " when only the build time
    differs) for each upstream whose build now (`now`: key -> `build_of` its record, None
    when unbuilt: left out) is not the one a record's `deps` name: rebuilt since that
    record was built. An upstream the deps do not name (the
    recipe changed: drift says so) is left out; a field missing on either side (a record
    of before builds were kept, an upstream record without an end time) is unknown,
    taken as the same."""
    then = builds_in_deps(deps)
    out = []
    for key, build in now.items():
        seen = then.get(key)
        if build is None or seen is None:
            continue
        fields = [f for f in ("fingerprint", "built") if seen.get(f) is not None and build.get(f) is not None]
        how = build_change({f: seen[f] for f in fields}, {f: build[f] for f in fields})
        if how is not None:
            same = "fingerprint" in fields and seen["fingerprint"] == build["fingerprint"]  # forced alone
            out.append((key, printable(f"same recipe, {how}" if same else how)))
    return out
