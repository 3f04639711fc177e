"""Adopted data: existing files declared as a managed `name@version` of a known kind.

Model: an experiment entry `adopt: {source: <folder or gs:// path>, kind: <kind>}`
(optionally `copy: true`) instead of `step:` declares data that already exists. The
loader turns it into the built-in step `adopt` with that config (fingerprinted like
any recipe; relative local sources are taken from the working directory). The kind
says which built-in step's output it stands for, so consumers accept it where they
accept that step (`KINDS`): `corpus` (the `download` layout), `tokenizer`,
`tokenized`, `train` (a trained model). Its layout is checked against the kind
(`check_layout`): while planning, before anything runs, and again when the step
runs; a bad layout or a missing source is refused in one line naming the artifact,
the field and what is missing. The step writes the usual success record at
`{prefix}/{name}/{version}`; its result holds the source, the listing of the source's
files with their sizes and a digest of that listing (names and sizes; the bytes are
not read). Nothing is copied unless `copy: true`; consumers get the source itself as
their `ctx.deps` location (`data_location`), and before each consumer runs the
source's listing is compared with the adopted one (`source_problems`), so data that
changed under a version is refused, not read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import ConfigError, json_problem
from marin_rules.artifacts.files import file_problems, list_data_files
from marin_rules.artifacts.identity import artifact_location
from marin_rules.data import dolma
from marin_rules.data.relative import resolve_location
from marin_rules.validation import Bool, OneOf, Text, check_fields

STEP = "adopt"


@dataclass(frozen=True)
class Kind:
    step: str  # the built-in step whose output this kind has
    layout: str  # what the layout is, for error messages
    check: Callable[[str, Mapping[str, int]], str | None]  # (source, listing) -> what is wrong, or None


class _LayoutProblem(Exception):
    """What is wrong with an adopted source's layout, as a phrase ("missing x.json")."""


def _json(source: str, name: str, listing: Mapping[str, int], wants: str | None) -> dict:
    """The JSON object `name` of the source; _LayoutProblem when it is missing, cannot
    be read or parsed, or is not an object (with the object `wants`, where given)."""
    what = f"a JSON object with {wants!r}" if wants else "a JSON object"
    if name not in listing:
        raise _LayoutProblem(f"missing {name} ({what})")
    try:
        value = storage.read_json(storage.join(source, name))
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise _LayoutProblem(f"{name} is {json_problem(e)}") from None
    except OSError as e:
        raise _LayoutProblem(f"{name} cannot be read ({e.strerror or e})") from None
    if not isinstance(value, dict) or (wants and not isinstance(value.get(wants), dict)):
        raise _LayoutProblem(f"{name} is not {what}")
    return value


def _corpus(source: str, listing: Mapping[str, int]) -> str | None:
    manifest = _json(source, "manifest.json", listing, "shards")
    if "train_documents" not in manifest:
        return "missing train_documents in manifest.json"
    problem = dolma.manifest_problem(manifest)  # what every reader of a corpus checks
    if problem:
        return f"manifest.json: {problem}"
    if "train" not in manifest["shards"]:
        return "manifest.json lists no train shards (shards.train)"
    for split, names in manifest["shards"].items():
        for name in names:
            if f"{split}/{name}" not in listing:
                return f"missing {split}/{name} (listed in manifest.json)"
    return None


def _reachable_tokenizer(source: str, name: str, info: Mapping[str, Any]) -> str | None:
    """What is wrong with the `tokenizer` that the JSON file `name` of the source names
    (a location relative to the source, as our steps write it, or absolute): missing,
    or nowhere to be found from where the source is now (a folder copied out of its
    prefix leaves `../../../tokenizers/...` behind), else None."""
    reference = info.get("tokenizer")
    if not isinstance(reference, str) or not reference:
        return f"missing tokenizer in {name} (the location of the tokenizer.json its tokens come from)"
    found = resolve_location(source, reference)
    if not storage.exists(found):
        return (f"tokenizer in {name} is {reference!r}, which is {found} from this source and does not exist "
                "(copied out of its prefix?); put the tokenizer's tokenizer.json and special_tokens.json where "
                f"it points, or set tokenizer in {name} to their location")
    return None


def _tokenized(source: str, listing: Mapping[str, int]) -> str | None:
    index = _json(source, "index.json", listing, "splits")
    for key in ("vocab_size", "dtype", "bos_id", "eos_id", "pad_id", "tokenizer_digest"):  # what the loader reads
        if key not in index:
            return f"missing {key} in index.json"
    for name, split in index["splits"].items():
        if not isinstance(split, dict) or not isinstance(split.get("shards"), list):
            return f"splits.{name} in index.json is not an object with a list of 'shards'"
        for i, shard in enumerate(split["shards"]):
            path = shard.get("path") if isinstance(shard, dict) else None
            if not isinstance(path, str):
                return f"splits.{name}.shards[{i}] in index.json is not an object with a 'path' (a file name)"
            if not isinstance(shard.get("tokens"), int):
                return f"splits.{name}.shards[{i}] in index.json has no 'tokens' (its token count)"
            if path not in listing:
                return f"missing {path} (listed in index.json)"
    return _reachable_tokenizer(source, "index.json", index)


def _tokenizer(source: str, listing: Mapping[str, int]) -> str | None:
    for name in ("tokenizer.json", "special_tokens.json"):
        if name not in listing:
            return f"missing {name}"
    return None


def _train(source: str, listing: Mapping[str, int]) -> str | None:
    if "model.json" not in listing:
        return "missing model.json"
    if not any(path.startswith("checkpoints/") for path in listing):
        return "missing checkpoints/ (no checkpoint files)"
    return _reachable_tokenizer(source, "model.json", _json(source, "model.json", listing, None))


KINDS: dict[str, Kind] = {
    "corpus": Kind("download", "Dolma shards {split}/shard-*.jsonl.gz listed by manifest.json", _corpus),
    "tokenizer": Kind("train_tokenizer", "tokenizer.json and special_tokens.json", _tokenizer),
    "tokenized": Kind("tokenize", "token shards {split}/tokens-*.npy listed by index.json", _tokenized),
    "train": Kind("train", "model.json and checkpoints/", _train),
}


@dataclass(frozen=True)
class AdoptConfig:
    source: Annotated[str, Text("a folder or gs:// path"), "the existing data (local paths relative to the working directory)"]
    kind: Annotated[str, OneOf(tuple(KINDS)), "what the data is: the layout it must have"]
    copy: Annotated[bool, Bool(), "copy the data under the artifact's own folder (default: read it in place)"] = False


def check_adopt(config: Mapping[str, Any], deps: Mapping[str, Any]) -> None:
    """`adopt`: `source`, `kind` (one of KINDS), `copy`; no dependencies. Fields are
    reported as `adopt.<field>`."""
    try:
        check_fields(AdoptConfig, config, "adopt")
    except ConfigError as e:
        raise ConfigError(e.field.replace("config.", "adopt.", 1), e.message) from None
    if deps:
        raise ConfigError("deps", f"adopted data takes no dependencies, got {sorted(deps)}")


def source_location(config: Mapping[str, Any]) -> str:
    """The source as a location: a URL as given, a local path made absolute."""
    source = str(config["source"])
    return source if storage.is_remote(source) else os.path.abspath(storage.local_path(source))


def check_layout(key: str, config: Mapping[str, Any]) -> dict[str, int]:
    """The source's listing (relative path -> size); ConfigError (field `adopt.source`)
    when nothing is there or the layout lacks what its kind needs."""
    source = source_location(config)
    kind = KINDS[config["kind"]]
    listing = list_data_files(source)
    if not listing:
        there = "an empty folder" if storage.exists(source) else "nothing"
        raise ConfigError(
            f"{key}: adopt.source",
            f"{there} at {source}; adopt declares data that exists (check the path, or build it with a step)",
        )
    try:
        problem = kind.check(source, listing)
    except _LayoutProblem as e:
        problem = str(e)
    if problem is not None:
        raise ConfigError(
            f"{key}: adopt.source",
            f"{source} is not a {config['kind']!r} layout: {problem}; {config['kind']!r} data has {kind.layout}",
        )
    return listing


def listing_digest(listing: Mapping[str, int]) -> str:
    text = json.dumps(dict(sorted(listing.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def adopt(ctx: Any) -> dict[str, Any]:
    """The step: check the layout, copy if asked, return what the record keeps."""
    listing = check_layout(ctx.key, ctx.config)
    source = source_location(ctx.config)
    if ctx.config.get("copy"):
        for rel in listing:
            target = storage.join(ctx.output, rel)
            storage.makedirs(storage.parent(target))
            with storage.open_file(storage.join(source, rel), "rb") as src, storage.open_file(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 2**20)
    return {
        "kind": ctx.config["kind"], "source": source, "copied": bool(ctx.config.get("copy")),
        "file_count": len(listing), "bytes": sum(listing.values()),
        "listing_digest": listing_digest(listing), "listing": listing,
    }  # fmt: skip


def is_adopted_in_place(artifact: Any) -> bool:
    return artifact.step == STEP and not artifact.config.get("copy")


def data_location(prefix: str, artifact: Any) -> str:
    """Where a consumer reads an artifact: the source of data adopted in place
    (`served_source`), else `{prefix}/{name}/{version}`."""
    if is_adopted_in_place(artifact):
        from marin_rules.artifacts.errors import MarinError
        from marin_rules.artifacts.records import read_record

        try:
            record = read_record(artifact_location(prefix, artifact.id), artifact.id)
        except (MarinError, OSError):  # corrupt or unreachable: the consumer's own check of it names it
            record = None
        return served_source(artifact, record)
    return artifact_location(prefix, artifact.id)


def served_source(artifact: Any, record: Any) -> str:
    """The source that consumers of data adopted in place read: the one its success
    `record` adopted where the experiment's `source:` was written otherwise since (a
    change without a version bump is drift: the build served is the recorded one; the
    new source is adopted under a new version), else the experiment's (so a relative
    path is read from where this run is, as it was written)."""
    now = source_location(artifact.config)
    if record is None or record.config.get("source") == artifact.config.get("source"):
        return now
    return recorded_source(record.step, record.result) or now


def source_problems(artifact: Any, record: Any) -> list[str]:
    """For data adopted in place: how its served source (`served_source`) differs from
    the listing its success `record` adopted."""
    if not is_adopted_in_place(artifact) or record is None or not isinstance(record.result, dict):
        return []
    return file_problems(served_source(artifact, record), record.result.get("listing") or {})


def recorded_source(step: Any, result: Any) -> str | None:
    """From a success record alone: the source of data adopted in place, else None."""
    if step != STEP or not isinstance(result, dict) or result.get("copied") or not result.get("source"):
        return None
    return str(result["source"])


def recorded_source_problems(step: Any, result: Any) -> list[str]:
    """From a success record alone (`marin verify`, `marin status`): how the source of
    data adopted in place differs from the listing it records ([] for any other)."""
    source = recorded_source(step, result)
    return [] if source is None else file_problems(source, result.get("listing") or {})


def recorded_source_content_problems(step: Any, result: Any) -> list[str]:
    """From a success record alone (`marin verify`): for tokens adopted in place, the token
    files whose content is not the digest the source's own index.json gives them (a file
    edited in place keeps its size, which is all the listing holds); [] for any other."""
    from marin_rules.artifacts.files import content_problems

    source = recorded_source(step, result)
    if source is None or result.get("kind") != "tokenized":
        return []
    try:
        index = storage.read_json(storage.join(source, "index.json"))
        digests = {shard["path"]: shard["digest"] for split in index["splits"].values() for shard in split["shards"]
                   if isinstance(shard.get("digest"), str)}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []  # changed or unreadable: the listing's size check names index.json
    return list(content_problems(source, digests).values())


def source_changed(source: Any, problems: list[str], consumer: bool = False) -> str:
    """The one phrase for an adopted source that changed since it was adopted (as the
    consumer refusing it says it, with `consumer`). Rebuilding the adopt artifact would
    take the changed data under the same version, so the fix is never a rebuild."""
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    refused = "" if consumer else "consumers will refuse it: "
    return (
        f"the adopted source {source} changed since it was adopted ({problems[0]}{more}); "
        f"{refused}restore it, or adopt it under a new version"
    )
