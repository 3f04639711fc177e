"""The `marin` command: look at an experiment's artifacts without running anything.

  marin status [EXPERIMENT] [--prefix P]   table: name@version, step, state, fingerprint, built, took
  marin show KEY [EXPERIMENT] [--prefix P] the success record (and the last failure) as JSON
  marin path KEY [EXPERIMENT] [--prefix P] the record path to give Snakemake as a target or --forcerun

States: `built` (record matches the recipe), `drifted` (record from another recipe:
served with a warning), `missing` (never built), `failed` (the last attempt failed and
no success record is there), `built, last retry failed` (a newer failure than the record).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.identity import RECORD_FILE, artifact_location
from marin_rules.artifacts.records import read_failures, read_record
from marin_rules.experiment import Artifact, Experiment, load_experiment
from marin_rules.mirror import mirror_root
from marin_rules.workflow.options import DEFAULT_PREFIX

DEFAULT_EXPERIMENT = "experiments/default.yaml"


@dataclass(frozen=True)
class Status:
    key: str
    step: str
    state: str
    fingerprint: str
    built: str
    took: str


def artifact_status(artifact: Artifact, prefix: str) -> Status:
    location = artifact_location(prefix, artifact.id)
    record = read_record(location)
    failures = read_failures(location)
    last_failure = failures[-1]["provenance"].get("ended", "") if failures else ""
    if record is None:
        state = "failed" if failures else "missing"
        return Status(artifact.key, artifact.step, state, artifact.fingerprint, "-", "-")
    provenance = record.get("provenance", {})
    built = str(provenance.get("ended", "?"))
    state = "built" if record.get("fingerprint") == artifact.fingerprint else "drifted"
    if last_failure and last_failure > built:
        state += ", last retry failed"
    took = provenance.get("duration_s")
    return Status(
        artifact.key,
        artifact.step,
        state,
        str(record.get("fingerprint")),
        built.replace("T", " ")[:19],
        "-" if took is None else f"{took:.1f}s",
    )


def format_table(rows: list[Status]) -> str:
    header = Status("ARTIFACT", "STEP", "STATE", "FINGERPRINT", "BUILT (UTC)", "TOOK")
    cols = list(zip(*[(r.key, r.step, r.state, r.fingerprint, r.built, r.took) for r in [header, *rows]]))
    widths = [max(len(v) for v in col) for col in cols]
    lines = []
    for r in [header, *rows]:
        values = (r.key, r.step, r.state, r.fingerprint, r.built, r.took)
        lines.append("  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip())
    return "\n".join(lines)


def _load(args) -> Experiment:
    if args.configfile and args.experiment not in (None, args.configfile):
        raise MarinError(f"two experiments given ({args.experiment} and --configfile {args.configfile}); give one")
    return load_experiment(args.configfile or args.experiment or DEFAULT_EXPERIMENT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marin", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("status", "table of the experiment's artifacts and their state"),
        ("show", "print an artifact's success record (and last failure)"),
        ("path", "print an artifact's record path (a Snakemake target)"),
    ):
        p = sub.add_parser(name, help=helptext)
        if name != "status":
            p.add_argument("key", help="name@version")
        p.add_argument("experiment", nargs="?", default=None, help=f"experiment YAML file (default {DEFAULT_EXPERIMENT})")
        p.add_argument("--configfile", help="the same, spelled as for snakemake")
        p.add_argument("--prefix", default=DEFAULT_PREFIX, help="artifact prefix (local path or gs:// URL)")
    args = parser.parse_args(argv)
    try:
        experiment = _load(args)
        prefix = args.prefix.rstrip("/")
        if args.command == "status":
            print(format_table([artifact_status(a, prefix) for a in experiment.artifacts.values()]))
            return 0
        if args.key not in experiment.artifacts:
            raise MarinError(
                f"{args.key}: not an artifact of {experiment.path} (name the experiment file: "
                f"marin {args.command} {args.key} --configfile experiments/X.yaml)"
            )
        artifact = experiment[args.key]
        location = artifact_location(prefix, artifact.id)
        if args.command == "path":
            root = mirror_root(prefix) if storage.is_remote(prefix) else prefix
            print(f"{root}/{artifact.id.path}/{RECORD_FILE}")
            return 0
        failures = read_failures(location)
        shown = {"record": read_record(location), "last_failure": failures[-1] if failures else None}
        print(json.dumps(shown, indent=2, sort_keys=True))
        return 0
    except MarinError as e:
        print(f"marin: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
