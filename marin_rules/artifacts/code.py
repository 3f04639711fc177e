"""The code a step runs, as a hash and a version string, for the step-code advisory.

Model: a step's code is a set of Python files:
  - a user step `pkg.module:function`: that module's source file, found as the job
    imports it (sys.path, then the working folder: `steps.find_user_module`) without
    importing it;
  - a built-in: every `.py` file of the packages it runs, `BUILTIN_PACKAGES` below
    (data steps: marin_rules/data; train: model + train; evaluate: eval + model, since
    scoring runs the model; export_hf: export + model; scaling: scaling).
The hash is sha256 over each file's path (relative to its package folder) and bytes,
in sorted order, cut to 16 hex digits; the version string is the distribution's
version when installed, plus the git commit of the code's folder (`+dirty` for
uncommitted changes) when it is a checkout. Each success record keeps both under
`provenance.code`; planning and `marin status` compare the hash with the code now
and print one advisory line (never a rebuild). Hashes are cached per process: code
is read once per invocation. Knows no JAX and no Snakemake.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from importlib import metadata
from typing import Any

from marin_rules.artifacts.provenance import git_state

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # marin_rules/
DATA = ("data",)
BUILTIN_PACKAGES: dict[str, tuple[str, ...]] = {
    "download": DATA, "dedup": DATA, "train_tokenizer": DATA, "tokenize": DATA,
    "train": ("model", "train"), "evaluate": ("eval", "model"), "export_hf": ("export", "model"),
    "scaling_fit": ("scaling",), "scaling_check": ("scaling",),
}  # fmt: skip


def code_files(step: str) -> list[tuple[str, str]]:
    """(name shown in the hash, absolute path) of every file of a step's code; empty
    when a user step's module cannot be found as a source file."""
    packages = BUILTIN_PACKAGES.get(step)
    if packages is not None:
        out = []
        for package in packages:
            root = os.path.join(PACKAGE_ROOT, package)
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(f for f in files if f.endswith(".py")):
                    path = os.path.join(folder, name)
                    out.append((f"marin_rules/{os.path.relpath(path, PACKAGE_ROOT)}", path))
        return out
    origin = user_module_file(step.partition(":")[0])
    return [(os.path.basename(origin), origin)] if origin else []


def user_module_file(module_name: str) -> str | None:
    """The source file of a user step's module, found as the job imports it
    (`steps.find_user_module`); None when it cannot be found or is refused (the loader
    says why)."""
    from marin_rules.steps import find_user_module  # the loader's and the job's search, reused

    try:
        spec = find_user_module(module_name)
    except Exception:  # noqa: BLE001 - the loader reports unfindable and shadowed modules
        return None
    origin = getattr(spec, "origin", None)
    return origin if isinstance(origin, str) and origin.endswith(".py") and os.path.isfile(origin) else None


@lru_cache(maxsize=None)
def code_hash(step: str) -> str | None:
    """16 hex digits over the step's code files, or None when none could be read."""
    files = code_files(step)
    if not files:
        return None
    digest = hashlib.sha256()
    for name, path in files:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        digest.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:16]


def code_version(step: str) -> str:
    """`marin-rules 0.1.0, git 1a2b3c4d5e6f+dirty` for a built-in; for a user step its
    distribution's version when installed (site-packages), else its folder's commit
    when in git; "unversioned" when neither is known."""
    parts = []
    files = code_files(step)
    installed = bool(files) and _installed(files[0][1])
    if step in BUILTIN_PACKAGES:
        parts.append(_distribution_version("marin-rules"))
    elif installed:
        parts.append(_distribution_of(step.partition(":")[0]))
    if files and not installed:  # an installed package's folder is no checkout of it
        git = git_state(os.path.dirname(files[0][1]))
        if git.get("commit"):
            parts.append(f"git {git['commit'][:12]}{'+dirty' if git.get('dirty') else ''}")
    return ", ".join(p for p in parts if p) or "unversioned"


def _distribution_version(name: str) -> str:
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return ""


def _installed(path: str) -> bool:
    """Is this file inside an installed package folder (site-packages)?"""
    import sysconfig

    roots = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    return any(os.path.realpath(path).startswith(root + os.sep) for root in roots)


def _distribution_of(module_name: str) -> str:
    top = module_name.split(".")[0]
    for dist in metadata.packages_distributions().get(top, [])[:1]:
        return _distribution_version(dist)
    return ""


def step_code(step: str) -> dict[str, Any]:
    """What a success record keeps under `provenance.code`."""
    return {"hash": code_hash(step), "version": code_version(step)}


def code_change(step: str, provenance: Any) -> tuple[str, str, str] | None:
    """(hash then, hash now, version then) when the step's code changed since a record
    with this `provenance` was built; None when unchanged or unknown (older records)."""
    recorded = provenance.get("code") if isinstance(provenance, dict) else None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("hash"), str):
        return None
    now = code_hash(step)
    if now is None or now == recorded["hash"]:
        return None
    return recorded["hash"], now, str(recorded.get("version") or "unversioned")


def built_with(version: str) -> str:
    """How the code a build ran is named beside a code change: `built with marin-rules
    0.1.0, git ...`, or, for a user module neither installed nor in git, that no version
    is known."""
    return "built by code of no known version (not installed, not in git)" if version == "unversioned" \
        else f"built with {version}"  # fmt: skip


def change_message(key: str, change: tuple[str, str, str], rebuild_hint: str) -> str:
    then, now, version = change
    return (
        f"{key}: step code changed since this artifact was built (code {then} then, {now} now; "
        f"{built_with(version)}); serving the cached output (--forcerun {rebuild_hint} rebuilds it)."
    )
