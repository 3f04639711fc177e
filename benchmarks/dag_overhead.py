"""Dry-run overhead of marin-rules against plain Snakemake on the same job graph.

Model: a sweep of N artifacts (default 2,000) that all depend on one upstream, every
record already present on a local prefix. We time `snakemake -n` of our Snakefile
(experiment loading, validation, fingerprints, drift checks, ancient edges) against a
plain Snakefile with one wildcard rule producing the same files from the same
inputs and no hook, alternating the two, and report the ratio of medians
(ours / baseline; target <= 1.5).

    .venv/bin/python benchmarks/dag_overhead.py [--artifacts 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

BASELINE_SNAKEFILE = """
N = {n}
PREFIX = "{prefix}"

rule all:
    input:
        PREFIX + "/raw/base/v1/.artifact.json",
        expand(PREFIX + "/sweep/item{{i}}/v1/.artifact.json", i=range(N)),

def upstream(wildcards):
    return [] if wildcards.artifact == "raw/base/v1" else [PREFIX + "/raw/base/v1/.artifact.json"]

rule custom:
    input: upstream
    output: PREFIX + "/{{artifact}}/.artifact.json"
    run:
        raise RuntimeError("the benchmark is a dry run")
"""


def write_experiment(folder: Path, n: int) -> Path:
    experiment = {
        "artifacts": {"raw/base@v1": {"step": "benchsteps:noop", "config": {"seed": 0}}},
        "sweeps": {
            "sweep/item{i}@v1": {
                "step": "benchsteps:noop",
                "deps": {"src": "raw/base@v1"},
                "config": {"index": "{i}", "optimizer": {"learning_rate": 0.001}},
                "grid": {"i": {"range": [0, n]}},
            }
        },
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))
    # the user step's module must exist (checked at load); the dry run never calls it
    (folder / "benchsteps.py").write_text("def noop(ctx):\n    return {}\n")
    return path


def write_records(experiment_path: Path, prefix: str) -> int:
    """Success records for every artifact, with the fingerprints the recipe has now."""
    from marin_rules.artifacts.identity import artifact_location
    from marin_rules.artifacts.records import write_success
    from marin_rules.experiment import load_experiment

    sys.path.insert(0, str(experiment_path.parent))  # where its user step module is
    experiment = load_experiment(str(experiment_path))
    for artifact in experiment.artifacts.values():
        location = artifact_location(prefix, artifact.id)
        deps = {
            role: {"name": experiment[d].id.name, "version": experiment[d].id.version,
                   "path": artifact_location(prefix, experiment[d].id), "fingerprint": experiment[d].fingerprint}
            for role, d in artifact.deps.items()
        }  # fmt: skip
        entry = {
            "name": artifact.id.name, "version": artifact.id.version, "step": artifact.step,
            "fingerprint": artifact.fingerprint, "config": artifact.config, "deps": deps,
            "runtime": artifact.runtime, "path": location,
        }  # fmt: skip
        write_success(location, entry, {}, {"ended": "2026-01-01T00:00:00Z", "duration_s": 0.0})
    return len(experiment.artifacts)


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or "Nothing to be done" not in proc.stdout + proc.stderr:
        raise SystemExit(f"unexpected dry run result for {' '.join(cmd)}:\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="marin-dag-bench-") as tmp:
        root = Path(tmp)
        prefix = str(root / "art")
        ours_dir, base_dir = root / "ours", root / "baseline"
        ours_dir.mkdir()
        base_dir.mkdir()
        exp = write_experiment(ours_dir, args.artifacts)
        count = write_records(exp, prefix)
        (base_dir / "Snakefile").write_text(BASELINE_SNAKEFILE.format(n=args.artifacts, prefix=prefix))
        ours_cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", str(exp),
                    "--config", f"prefix={prefix}", "-n", "--cores", "1"]  # fmt: skip
        base_cmd = [SNAKEMAKE, "-s", str(base_dir / "Snakefile"), "-n", "--cores", "1", "--rerun-triggers", "mtime"]
        ours, base = [], []
        for _ in range(args.repeats):
            base.append(timed(base_cmd, base_dir))
            ours.append(timed(ours_cmd, ours_dir))
        ratio = statistics.median(ours) / statistics.median(base)
        print(f"{count} artifacts, dry run: marin-rules {statistics.median(ours):.2f} s, "
              f"plain Snakemake {statistics.median(base):.2f} s (medians of {args.repeats})", file=sys.stderr)  # fmt: skip
        print(json.dumps({
            "benchmark": "dag_overhead", "ratio": round(ratio, 3),
            "baseline": "plain Snakemake, same job graph, one wildcard rule, no hook (dry run)",
            "artifacts": count, "ours_s": [round(t, 3) for t in ours], "baseline_s": [round(t, 3) for t in base],
            "target": "<= 1.5",
        }))  # fmt: skip


if __name__ == "__main__":
    main()
