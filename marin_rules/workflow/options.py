"""What the user typed: `--config` keys, the experiment file, the prefix, the targets.

Model: every `--config KEY=VALUE` is checked before anything is planned or written.
Keys are the glue's own (`GLUE_KEYS`) or an experiment file's top-level keys with the
file's own values (an experiment given as `--configfile` lands in the config; an
`artifacts=` or `sweeps=` typed on the command line is refused, never ignored);
anything else is refused in one line with the nearest known key, so `prefx=` never
quietly builds into `./artifacts`. The text keys (`STRING_KEYS`) must be non-empty
strings (`prefix=` is YAML null, not `./None`). The prefix is read in one place,
`parse_prefix` (the `marin` command's too): a local folder, `file://` or `gs://`.
Lease timings are from 0.01 s to a day, and `lease_stale_s` > 2 x `lease_heartbeat_s`.
Values that travel to job processes (prefix, experiment, target) are
refused when they hold a quote, `$`, a backtick, a backslash or a control character:
Snakemake re-quotes config values with `repr()` on the command lines of spawned and
remote jobs, where a shell would expand them. Spaces and `;` work literally (every
value reaches the job command through Snakemake's `:q` quoting). The command line kept
in provenance redacts the values of `--config` keys and options named like secrets.
`--config dev_user=NAME` names the owner of dev versions (their per-user folders).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Any, Iterable

import yaml

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.drift import printable
from marin_rules.artifacts.identity import RECORD_FILE
from marin_rules.artifacts.records import snakemake_path
from marin_rules.experiment import DEFAULT_EXPERIMENT, TOP_FIELDS, Experiment
from marin_rules.steps import BUILTIN_STEPS, SHARDED_STEPS
from marin_rules.validation import is_number
from marin_rules.validation import suggest_key as suggestion
from marin_rules.yaml_file import load_yaml_file

DEFAULT_PREFIX = "artifacts"
CUSTOM_RULE = "custom"
SHARD_RULE = "{step}_shard"  # the rule of one shard of a sharded step (rules/data.smk, rules/dedup.smk)
LEASE_KEYS = {"lease_wait", "lease_heartbeat_s", "lease_stale_s", "lease_poll_s"}
MIN_LEASE_S = 0.01  # below it, lease timings only hammer the storage
STRING_KEYS = {  # the text-valued keys, and what each expects
    "experiment": "an experiment file such as experiments/other.yaml",
    "prefix": "a local folder, file:///path or gs://bucket/path",
    "target": "name@version or a step kind such as train (comma-separate several)",
    "dev_user": "a user name such as alice",
}
GLUE_KEYS = set(STRING_KEYS) | LEASE_KEYS
GCS_URL = re.compile(r"gs://[a-z0-9][a-z0-9._-]*(/.*)?")
UNSAFE = re.compile(r"['\"$`\\{}\x00-\x1f\x7f]")
SECRET = re.compile(r"token|secret|password|passwd|key", re.IGNORECASE)
REDACTED = "<redacted>"


def rule_of(step: str) -> str:
    """The Snakemake rule that runs a step kind (user steps share `custom`)."""
    return step if step in BUILTIN_STEPS else CUSTOM_RULE


def check_config(
    config: dict, configfiles: list[str], directive_files: list[str] = (), users_workflow: bool = False
) -> None:
    """Refuse unknown keys, experiment sections given as `--config` (or read by a
    Snakefile's `configfile:` directive, `directive_files`), and bad or unsafe values
    (one line each, before anything runs). Keys from a `--configfile` are left to the
    experiment loader, which names the file. `users_workflow`: our Snakefile is a
    module or an include of the user's, whose rules have config keys of their own:
    keys that are not ours are theirs, not refused (one near ours gets a warning line).
    Two experiment files are `experiment_configfiles`' line, asked before this."""
    files = [_top_level(f) for f in configfiles]
    for key in config:
        if key in GLUE_KEYS:
            continue
        directive = next((f for f in directive_files if key in _top_level(f, strict=False)), None)
        if key in TOP_FIELDS and directive is not None and not any(key in data for data in files):
            raise MarinError(
                f"configfile: {directive}: an experiment's '{key}:' came from a Snakefile's configfile: directive, "
                f"which marin-rules does not read experiments from; give the file with --configfile {directive}"
            )
        if key in TOP_FIELDS and not any(key in data and data[key] == config[key] for data in files):
            raise MarinError(
                f"--config {key}=...: an experiment's '{key}:' is read from its file only; write it in "
                "the experiment file (the one given by --configfile or --config experiment=)"
            )
        if not any(key in data for data in files) and users_workflow:
            near = suggestion(key, GLUE_KEYS)  # a typo of ours would pass to the user's workflow unsaid
            if near:
                print(f"marin-rules: warning: --config {key}=...: not a marin-rules key{near}; left to your workflow",
                      file=sys.stderr)  # fmt: skip
        elif not any(key in data for data in files):
            raise MarinError(
                f"--config {key}=...: unknown key{suggestion(key, GLUE_KEYS | TOP_FIELDS)}; "
                f"marin-rules reads {', '.join(sorted(GLUE_KEYS))}"
            )
    for key, what in STRING_KEYS.items():
        if key not in config:
            continue
        value = config[key]
        if not isinstance(value, str) or not value.strip():
            raise MarinError(f"--config {key}={_shown(value)}: expected {what}, got {_kind(value)}")
        found = UNSAFE.search(value)
        if found:
            raise MarinError(
                f"--config {key}={value!r}: holds {found.group()!r}; quotes, $, backticks, backslashes, braces and "
                "line breaks are refused in paths and names (Snakemake passes them on to job command lines, "
                "and reads braces as wildcards)"
            )
    check_lease_settings(config)


def check_lease_settings(config: dict) -> None:
    """The lease timings: numbers of seconds from `MIN_LEASE_S` to a day, and a lease that
    stays fresh through one late renewal: `lease_stale_s` > 2 x `lease_heartbeat_s`
    (the holder loses a lease not renewed for `lease_stale_s`, and renews it every
    `lease_heartbeat_s`); each side defaults to the lease module's value."""
    from marin_rules.artifacts import lease

    for key in ("lease_heartbeat_s", "lease_stale_s", "lease_poll_s"):
        if key in config and not (is_number(config[key]) and MIN_LEASE_S <= config[key] <= lease.MAX_LEASE_S):
            raise MarinError(f"--config {key}={_shown(config[key])}: expected a finite number of seconds from "
                             f"{MIN_LEASE_S} to {lease.MAX_LEASE_S:.0f}")  # fmt: skip
    beat = config.get("lease_heartbeat_s", lease.HEARTBEAT_S)
    stale = config.get("lease_stale_s", lease.STALE_S)
    if stale <= 2 * beat:
        given = " ".join(f"{k}={config[k]}" for k in ("lease_heartbeat_s", "lease_stale_s") if k in config)
        raise MarinError(
            f"--config {given}: lease_stale_s ({stale:g} s) must be more than twice lease_heartbeat_s ({beat:g} s), "
            "or a lease is lost whenever one renewal is late; raise lease_stale_s or lower lease_heartbeat_s"
        )
    if "lease_wait" in config and _flag(config["lease_wait"]) is None:
        raise MarinError(f"--config lease_wait={_shown(config['lease_wait'])}: expected true or false")


def _shown(value: Any) -> str:
    """A `--config` value as the user typed it (`prefix=` for nothing)."""
    return "" if value is None else str(value) if isinstance(value, (str, int, float)) else repr(value)


def _kind(value: Any) -> str:
    """What Snakemake made of a value that is not text."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "nothing (leave the key out for the default)"
    if isinstance(value, bool):
        return f"the yes/no value {value}"
    if isinstance(value, (int, float)):
        return f"the number {value} (Snakemake reads digits as a number)"
    return f"a {'list' if isinstance(value, list) else 'mapping' if isinstance(value, dict) else type(value).__name__}"


def dev_user(config: dict) -> str | None:
    """`--config dev_user=NAME`: who owns the dev versions (default: the login name);
    stored as one path-safe segment (`path_safe_user`)."""
    value = config.get("dev_user")
    return None if value in (None, "") else str(value)


def _flag(value: Any) -> bool | None:
    """A yes/no config value (Snakemake passes `false` through as text)."""
    if isinstance(value, bool):
        return value
    return {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(str(value).lower())


def _top_level(path: str, strict: bool = True) -> dict:
    """A config file's top-level mapping. `strict` (a `--configfile`): read as the
    experiment loader reads it, its problems that loader's one line (a value holding
    itself, say, which comparing would recurse without end); else (a Snakefile's own
    `configfile:`, not ours to judge) {} when unreadable."""
    if strict:
        data = load_yaml_file(path, "config file")
        return data if isinstance(data, dict) else {}
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def refuse_remote_targets(arguments: Iterable[str]) -> None:
    """A gs:// record on the command line (a target, or given to `-f`/`-R`): Snakemake
    would find no rule for it (our rules make the records' local mirror), so one line
    names the mirror path to give instead (`records.snakemake_path`, which `marin path
    KEY` prints too)."""
    for name in arguments:
        url = re.sub(r"^gs:/+", "gs://", str(name))
        if url.startswith("gs://") and url.endswith("/" + RECORD_FILE):
            raise MarinError(
                f"{printable(str(name))}: Snakemake reaches records on gs:// through their local mirror; "
                f"give {snakemake_path(url)} instead (`marin path KEY` prints it)"
            )


def lease_options(config: dict) -> str:
    """The lease settings for the job command, as `wait=1,heartbeat_s=30,...`."""
    from marin_rules.artifacts import lease

    wait = _flag(config.get("lease_wait", True))
    beat = config.get("lease_heartbeat_s", lease.HEARTBEAT_S)
    stale = config.get("lease_stale_s", lease.STALE_S)
    poll = config.get("lease_poll_s", lease.POLL_S)
    return f"wait={int(wait)},heartbeat_s={beat},stale_s={stale},poll_s={poll}"


def refuse_braced_paths(experiment_path: str, prefix: str, workflow_dir: str) -> None:
    """The paths Snakemake's patterns and job parameters hold (the experiment file, a
    local prefix, the workflow's folder), made absolute, hold no brace: Snakemake reads
    `{...}` in them as a wildcard and fails with a WildcardError about a rule (a folder
    such as `w{d}` in the working directory, or a --configfile under one)."""
    local_prefix = prefix if storage.is_remote(prefix) else os.path.abspath(prefix)
    for what, path in (("the experiment file", os.path.abspath(experiment_path)), ("the prefix", local_prefix),
                       ("the workflow's folder", os.path.abspath(workflow_dir))):  # fmt: skip
        if "{" in path or "}" in path:
            raise MarinError(
                f"{what} {path} holds a brace, which Snakemake reads as a wildcard; use a path without braces "
                "(a relative prefix or experiment lies under the working directory)"
            )


def checked_prefix(config: dict) -> str:
    """The prefix of `--config prefix=` (default `artifacts`): see `parse_prefix`."""
    return parse_prefix(config.get("prefix", DEFAULT_PREFIX), "--config prefix=")


def parse_prefix(text: Any, option: str) -> str:
    """The one reading of a prefix, for snakemake (`option` = "--config prefix=") and
    `marin` ("--prefix "): a local folder (a `file://` URL is read as its path) or
    `gs://bucket[/path]`, without a trailing `/` or empty path segments. Anything else is refused in one line:
    other URL schemes (leases need conditional writes, which only these have), a local
    path that is or lies under a file, nothing at all."""
    if not isinstance(text, str) or not text.strip():
        raise MarinError(f"{option}{_shown(text)}: expected {STRING_KEYS['prefix']}, got {_kind(text)}")
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if scheme not in ("", "file", "gs"):
        raise MarinError(
            f"{option}{text}: {scheme}:// is not supported; give {STRING_KEYS['prefix']} "
            "(leases need the conditional writes of a local filesystem or Google Cloud Storage)"
        )
    if scheme == "gs":
        if not GCS_URL.fullmatch(text):
            raise MarinError(f"{option}{text}: expected gs://bucket or gs://bucket/path (a bucket name of a-z, 0-9, ., _, -)")
        bucket, _, path = text[len("gs://") :].partition("/")
        parts = [p for p in path.split("/") if p]  # gs://b//p is gs://b/p, as a local a//b is a/b
        return "/".join([f"gs://{bucket}", *parts])
    path = storage.local_path(text)
    if not path:
        raise MarinError(f"{option}{text}: expected {STRING_KEYS['prefix']}, got nothing after file://")
    prefix = path.rstrip("/") or path
    probe = os.path.abspath(prefix)
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if os.path.exists(probe) and not os.path.isdir(probe):
        raise MarinError(f"{option}{text}: {probe} is a file, not a folder; give a folder for the artifacts")
    return prefix


# this project's Snakefile (a source checkout, as the README installs it)
PROJECT_SNAKEFILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "Snakefile")


def workflow_profile(argv: list[str]) -> str:
    """The `--workflow-profile` a Snakemake command line names ("" when none; a path
    made absolute when it names a folder or file here, else a profile name as given)."""
    value = next((v for v in typed_option_values(argv, ("--workflow-profile",)) if v), "")
    return os.path.abspath(value) if value and os.path.exists(value) else value


def rerun_flags(
    experiment_path: str, prefix: str, workflow_dir: str, snakefile: str = "", workdir: str = "", profile: str = ""
) -> str:
    """What a command a message suggests (`snakemake -f RECORD`) needs besides its target
    to plan this experiment on this prefix, shell-quoted (`shlex`: a path may hold
    spaces, quotes or `$(...)`): `-s SNAKEFILE -d WORKDIR` (absolute) whenever both are
    known, so that the command runs as printed from any folder, its target and a
    relative prefix read in WORKDIR, as in the run (a target stays as Snakemake saw it:
    an absolute one would not match its relative output pattern); `--configfile
    EXPERIMENT` (absolute) unless it is the default one; `--config prefix=PREFIX` unless
    it is the default; `--workflow-profile PROFILE` when the run named one (a user's
    Snakefile using ours gets our settings, `cores: all` among them, only from it)."""
    flags = []
    if snakefile and workdir:
        flags += ["-s", os.path.abspath(snakefile), "-d", os.path.abspath(workdir)]
    if profile:
        flags += ["--workflow-profile", profile]
    if os.path.abspath(experiment_path) != os.path.abspath(os.path.join(workflow_dir, DEFAULT_EXPERIMENT)):
        flags += ["--configfile", os.path.abspath(experiment_path)]
    if prefix != DEFAULT_PREFIX:
        flags += ["--config", f"prefix={prefix}"]
    return shlex.join(flags)


def select_experiment(
    config: dict, experiment_files: list[str], workdir: str, workflow_dir: str, users_workflow: bool = False
) -> str:
    """The experiment file: `--config experiment=`, else the experiment `--configfile`
    (`experiment_files`: `experiment_configfiles`' answer), else the default.
    `users_workflow` (`check_config`): the default is the one beside the user's Snakefile."""
    chosen = config.get("experiment")
    if chosen and experiment_files and not _same_file(str(chosen), experiment_files[0], workdir):
        raise MarinError(
            f"--config experiment={chosen} and --configfile {experiment_files[0]} name different experiments; give one"
        )
    if chosen and not os.path.exists(os.path.join(workdir, str(chosen))):  # (an absolute path joins as itself)
        named = printable(str(chosen))
        if "://" in str(chosen):
            raise MarinError(f"--config experiment={named}: an experiment file is read from this machine; copy it here")
        if os.path.isabs(str(chosen)):
            raise MarinError(f"--config experiment={named}: no such file")
        raise MarinError(
            f"--config experiment={named}: no such file in the working directory {printable(workdir)} (a relative "
            "path is read there, in the folder -d names; --configfile reads one where snakemake was started): give "
            "its path from that folder, or an absolute one"
        )
    if chosen:
        return str(chosen)
    if experiment_files:
        return experiment_files[0]
    default = os.path.join(workflow_dir, DEFAULT_EXPERIMENT)
    if users_workflow and not os.path.exists(default):  # ours is beside our Snakefile, not the user's
        raise MarinError(
            f"no experiment named, and none at {default} beside your Snakefile: give one with "
            f"--configfile FILE (or --config experiment=FILE), or write {DEFAULT_EXPERIMENT} there"
        )
    return default


def experiment_configfiles(configfiles: Iterable[str], users_workflow: bool = False) -> list[str]:
    """The experiment files among `configfiles` (`_is_experiment_file`); more than one is
    the one-line error: Snakemake would merge them, and a run has one experiment."""
    distinct = {os.path.realpath(f): f for f in reversed(list(configfiles))}  # one file, typed or as Snakemake keeps it
    found = [f for f in reversed(distinct.values()) if _is_experiment_file(f, users_workflow)]
    if len(found) > 1:
        raise MarinError(f"more than one experiment --configfile given ({', '.join(found)}); pick one")
    return found


def typed_configfiles(arguments: Iterable[str]) -> list[str]:
    """Every file given to `--configfile`/`--configfiles` on the command line, as typed:
    Snakemake keeps only the last of a repeated option, which would run one of two
    experiments and say nothing of the other."""
    return typed_option_values(arguments, ("--configfile", "--configfiles"))


def typed_option_values(arguments: Iterable[str], names: tuple[str, ...]) -> list[str]:
    """Every value given to the options `names` on a command line, as typed: `--opt=V`,
    or the words after `--opt` up to the next option (for a one-value option, its value
    comes first; targets may follow it)."""
    values: list[str] = []
    taking = False
    for argument in arguments:
        name, equals, value = str(argument).partition("=")
        if name in names:
            taking = not equals
            values += [value] if equals else []
        elif argument.startswith("-"):
            taking = False
        elif taking:
            values.append(argument)
    return values


def _is_experiment_file(path: str, users_workflow: bool = False) -> bool:
    """A --configfile is an experiment unless it only sets the glue's own keys: one
    with a misspelled `artifacts:` must fail validation, not run the default. In the
    user's own workflow (`users_workflow`) only a file with an experiment's fields
    (`TOP_FIELDS`) is one: the others hold that workflow's settings."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError:
        return False
    except yaml.YAMLError:
        return True  # load_experiment reports the YAML error
    if users_workflow:  # (a near miss of `artifacts:`/`sweeps:` is a misspelled experiment, for the loader to name)
        return not isinstance(data, dict) or any(
            k in TOP_FIELDS or suggestion(str(k), ("artifacts", "sweeps")) for k in data
        )
    return not (isinstance(data, dict) and set(data) <= GLUE_KEYS)


def _same_file(a: str, b: str, workdir: str) -> bool:
    return os.path.realpath(os.path.join(workdir, a)) == os.path.realpath(os.path.join(workdir, b))


def target_keys(experiment: Experiment, targets_config: Any) -> list[str]:
    """The artifact keys `--config target=KEY|STEP[,...]` names (all when unset)."""
    if not targets_config:
        return list(experiment.artifacts)
    keys = []
    for item in str(targets_config).split(","):
        item = item.strip()
        if item in experiment.artifacts:
            keys.append(item)
        elif any(rule_of(a.step) == item for a in experiment.artifacts.values()):
            keys.extend(k for k, a in experiment.artifacts.items() if rule_of(a.step) == item)
        else:
            raise MarinError(_unknown_target(experiment, item, str(targets_config)))
    return keys


def _unknown_target(experiment: Experiment, item: str, typed: str) -> str:
    """One line on why `item` of `--config target=` names nothing to build, and the fix."""
    kinds = ", ".join(dict.fromkeys(rule_of(a.step) for a in experiment.artifacts.values()))
    shard_of = {SHARD_RULE.format(step=step): step for step in SHARDED_STEPS}
    if not item:
        return (
            f"--config target={typed}: the list has an empty item; separate name@version "
            "or step kinds such as train by single commas"
        )
    if item in BUILTIN_STEPS:
        return (
            f"--config target={item}: the step kind {item} has no artifact in {experiment.path}; kinds that do: {kinds}"
        )
    if item in shard_of:
        step = shard_of[item]
        return (
            f"--config target={item}: {item} is a rule (one shard of a {step} artifact), not a step kind; "
            f"target={step} builds every {step} artifact (all shards)"
        )
    return (
        f"--config target={item}: not an artifact of {experiment.path}{_target_hint(experiment, item)} "
        "(use name@version, or a step kind such as train)"
    )


def _target_hint(experiment: Experiment, item: str) -> str:
    if "@" not in item:
        versions = [k for k in experiment.artifacts if k.split("@")[0] == item]
        if versions:
            return f" (did you mean {versions[-1]}?)"
        named = suggestion(item, [k.split("@")[0] for k in experiment.artifacts]).replace("?)", "@<version>?)")
        return named or suggestion(item, dict.fromkeys(rule_of(a.step) for a in experiment.artifacts.values()))
    return suggestion(item, experiment.artifacts)


def redact_command(argv: list[str]) -> list[str]:
    """The command line with values of secret-looking `--config` (`-C`) keys and options hidden."""
    out: list[str] = []
    in_config = False
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-C") and len(arg) > 2 and arg[2] != "=":  # Snakemake's short --config, a pair attached
            in_config = True
            out.append(f"-C{_redact_pair(arg[2:])}")
            continue
        if arg.startswith("-"):
            name, eq, _ = arg.partition("=")
            in_config = name in ("--config", "-C")
            if in_config and eq:
                out.append(f"{name}={_redact_pair(arg[len(name) + 1:])}")
                continue
            if SECRET.search(name.lstrip("-")) and not in_config:
                out.append(f"{name}={REDACTED}" if eq else arg)
                hide_next = not eq
                continue
            out.append(arg)
            continue
        out.append(_redact_pair(arg) if in_config else arg)
    return out


def _redact_pair(pair: str) -> str:
    key, eq, _ = pair.partition("=")
    return f"{key}={REDACTED}" if eq and SECRET.search(key) else pair
