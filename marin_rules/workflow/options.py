"""What the user typed: `--config` keys, the experiment file, the prefix, the targets.

Model: every `--config KEY=VALUE` is checked before anything is planned or written.
Keys are the glue's own (`GLUE_KEYS`) or an experiment file's top-level keys (an
experiment given as `--configfile` lands in the config); anything else is refused in
one line with the nearest known key, so `prefx=` never quietly builds into
`./artifacts`. Values that travel to job processes (prefix, experiment, target) are
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
from typing import Any, Iterable

import yaml

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.experiment import DEFAULT_EXPERIMENT, TOP_FIELDS, Experiment
from marin_rules.steps import BUILTIN_STEPS
from marin_rules.validation import suggest_key as suggestion

DEFAULT_PREFIX = "artifacts"
CUSTOM_RULE = "custom"
LEASE_KEYS = {"lease_wait", "lease_heartbeat_s", "lease_stale_s", "lease_poll_s"}
GLUE_KEYS = {"experiment", "prefix", "target", "dev_user"} | LEASE_KEYS
UNSAFE = re.compile(r"['\"$`\\\x00-\x1f\x7f]")
SECRET = re.compile(r"token|secret|password|passwd|key", re.IGNORECASE)
REDACTED = "<redacted>"


def rule_of(step: str) -> str:
    """The Snakemake rule that runs a step kind (user steps share `custom`)."""
    return step if step in BUILTIN_STEPS else CUSTOM_RULE


def check_config(config: dict, configfiles: list[str]) -> None:
    """Refuse unknown keys and unsafe values (one line each, before anything runs). Keys
    from a `--configfile` are left to the experiment loader, which names the file."""
    known = GLUE_KEYS | TOP_FIELDS
    from_files = set().union(*(_top_keys(f) for f in configfiles))
    for key in config:
        if key not in known and key not in from_files:
            raise MarinError(
                f"--config {key}=...: unknown key{suggestion(key, known)}; "
                f"marin-rules reads {', '.join(sorted(GLUE_KEYS))}"
            )
    for key in ("experiment", "prefix", "target", "dev_user"):
        value = config.get(key)
        if value is None:
            continue
        found = UNSAFE.search(str(value))
        if found:
            raise MarinError(
                f"--config {key}=: holds {found.group()!r}; quotes, $, backticks, backslashes and "
                "line breaks are refused in paths and names (Snakemake passes them on to job command lines)"
            )
    for key in ("lease_heartbeat_s", "lease_stale_s", "lease_poll_s"):
        if key in config and not _positive(config[key]):
            raise MarinError(f"--config {key}={config[key]}: expected a number of seconds > 0")
    if "lease_wait" in config and _flag(config["lease_wait"]) is None:
        raise MarinError(f"--config lease_wait={config['lease_wait']}: expected true or false")


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


def _top_keys(path: str) -> set[str]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def lease_options(config: dict) -> str:
    """The lease settings for the job command, as `wait=1,heartbeat_s=30,...`."""
    from marin_rules.artifacts import lease

    wait = _flag(config.get("lease_wait", True))
    beat = config.get("lease_heartbeat_s", lease.HEARTBEAT_S)
    stale = config.get("lease_stale_s", lease.STALE_S)
    poll = config.get("lease_poll_s", lease.POLL_S)
    return f"wait={int(wait)},heartbeat_s={beat},stale_s={stale},poll_s={poll}"


def checked_prefix(config: dict) -> str:
    """The prefix (`--config prefix=`, default `artifacts`); refused when it is a file."""
    prefix = str(config.get("prefix", DEFAULT_PREFIX)).rstrip("/") or DEFAULT_PREFIX
    if prefix.startswith("file://"):
        prefix = storage.local_path(prefix)
    if not storage.is_remote(prefix):
        probe = os.path.abspath(prefix)
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if os.path.exists(probe) and not os.path.isdir(probe):
            raise MarinError(
                f"--config prefix={prefix}: {probe} is a file, not a folder; give a folder for the artifacts"
            )
    return prefix


def select_experiment(config: dict, configfiles: list[str], workdir: str, workflow_dir: str) -> str:
    """The experiment file: `--config experiment=`, else an experiment `--configfile`, else the default."""
    experiment_files = [f for f in configfiles if _is_experiment_file(f)]
    chosen = config.get("experiment")
    if len(experiment_files) > 1:
        raise MarinError(f"more than one experiment --configfile given ({', '.join(experiment_files)}); pick one")
    if chosen and experiment_files and not _same_file(str(chosen), experiment_files[0], workdir):
        raise MarinError(
            f"--config experiment={chosen} and --configfile {experiment_files[0]} name different experiments; give one"
        )
    if chosen:
        return str(chosen)
    if experiment_files:
        return experiment_files[0]
    return os.path.join(workflow_dir, DEFAULT_EXPERIMENT)


def _is_experiment_file(path: str) -> bool:
    """A --configfile is an experiment unless it only sets the glue's own keys: one
    with a misspelled `artifacts:` must fail validation, not run the default."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError:
        return False
    except yaml.YAMLError:
        return True  # load_experiment reports the YAML error
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
            raise MarinError(
                f"--config target={item}: not an artifact of {experiment.path}{_target_hint(experiment, item)} "
                "(use name@version, or a step kind such as train)"
            )
    return keys


def _target_hint(experiment: Experiment, item: str) -> str:
    if "@" not in item:
        versions = [k for k in experiment.artifacts if k.split("@")[0] == item]
        if versions:
            return f" (did you mean {versions[-1]}?)"
        return suggestion(item, [k.split("@")[0] for k in experiment.artifacts]).replace("?)", "@<version>?)")
    return suggestion(item, experiment.artifacts)


def redact_command(argv: list[str]) -> list[str]:
    """The command line with values of secret-looking `--config` keys and options hidden."""
    out: list[str] = []
    in_config = False
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-"):
            name, eq, _ = arg.partition("=")
            in_config = name == "--config"
            if in_config and eq:
                out.append(f"--config={_redact_pair(arg[len('--config='):])}")
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
