"""Dry-run cost of a gs:// prefix against a local one, with every artifact built.

Model: a sweep of N artifacts (default 1,000) that all depend on one upstream, every
success record present, once on a local prefix and once on a gs:// prefix (the local
GCS emulator, tests/gcs_emulator.py). We time the real `snakemake -n` of our Snakefile
on each, alternating: on gs:// the main process lists the prefix once and fetches the
records into `.snakemake/marin-mirror` in one concurrent bulk read; then Snakemake and
the drift checks read the mirror. "cold" starts with no mirror (a new checkout, the
worst case), "warm" with the mirror of the previous run (nothing changed: nothing is
fetched). The ratio is median gs:// cold over median local (target <= 1.5).

With `--large` (default 10,000) it times the local dry run at that size and ESTIMATES the
gs:// cold one as that plus the measured per-record gs:// overhead at N times 10,001:
the emulator rewrites its whole metadata file on every upload (O(n) per write), so
putting 10,000 records on it would take hours. Its single-threaded server (listen
backlog 5) also needs gcsfs's concurrency capped (`FSSPEC_GCS={"batch_size": 4}`,
fsspec's own setting); real GCS serves the bulk fetch with far more parallelism.
Snakemake's own GCS storage plugin checks each file separately (upstream #3816: 131
minutes before the first job on 14,000 files).

    .venv/bin/python benchmarks/remote_overhead.py [--artifacts 1000] [--repeats 2] [--large 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests")]

from dag_overhead import SNAKEMAKE, timed, write_experiment, write_records  # noqa: E402
from gcs_emulator import BUCKET, apply_env, emulator_env, start_emulator  # noqa: E402


def upload_records(local_prefix: str, gs_prefix: str) -> int:
    """Copy every record of the local prefix to the gs:// one, in one bulk write."""
    from marin_rules.artifacts import storage

    fs, root = storage.filesystem(gs_prefix)
    files = {}
    for dirpath, _, names in os.walk(local_prefix):
        for name in names:
            path = os.path.join(dirpath, name)
            files[f"{root}/{os.path.relpath(path, local_prefix)}"] = Path(path).read_bytes()
    fs.pipe(files, batch_size=1)  # the emulator's fastest way (see main)
    return len(files)


def dry_run(workdir: Path, experiment: Path, prefix: str, cold: bool) -> float:
    if cold:
        shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
    cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", str(experiment),
           "--config", f"prefix={prefix}", "-n", "--cores", "1"]  # fmt: skip
    return timed(cmd, workdir)


def setup(root: Path, n: int, tag: str) -> tuple[Path, str, str]:
    """An experiment of n built artifacts, on a local prefix and on a gs:// one."""
    workdir = root / tag
    workdir.mkdir()
    experiment = write_experiment(workdir, n)
    local = str(root / f"art-{tag}")
    write_records(experiment, local)
    remote = f"gs://{BUCKET}/{tag}"
    upload_records(local, remote)
    return experiment, local, remote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--large", type=int, default=10000, help="also time this many (0: skip)")
    args = parser.parse_args()
    proc, port = start_emulator()
    apply_env(emulator_env(port))  # this process and the snakemake runs talk to 127.0.0.1 only
    # the emulator serves one request at a time (listen backlog 5): gcsfs's default
    # concurrency overflows it into TCP SYN retries of seconds; fsspec's own knob caps it
    os.environ.setdefault("FSSPEC_GCS", json.dumps({"batch_size": 4}))
    try:
        with tempfile.TemporaryDirectory(prefix="marin-remote-bench-") as tmp:
            root = Path(tmp)
            experiment, local, remote = setup(root, args.artifacts, "small")
            workdir = experiment.parent
            local_s, cold_s, warm_s = [], [], []
            for _ in range(args.repeats):
                local_s.append(dry_run(workdir, experiment, local, cold=False))
                cold_s.append(dry_run(workdir, experiment, remote, cold=True))
                warm_s.append(dry_run(workdir, experiment, remote, cold=False))
            large = {}
            if args.large:  # see the module docstring: the local run is measured, gs:// estimated
                (root / "large").mkdir()
                big = write_experiment(root / "large", args.large)
                big_local = str(root / "art-large")
                write_records(big, big_local)
                large_local = dry_run(big.parent, big, big_local, cold=False)
                per_record = (statistics.median(cold_s) - statistics.median(local_s)) / (args.artifacts + 1)
                large = {
                    "large_artifacts": args.large + 1,
                    "large_local_s": round(large_local, 2),
                    "large_gs_cold_s_estimated": round(large_local + per_record * (args.large + 1), 2),
                }
    finally:
        proc.kill()
        proc.wait(timeout=10)
    med = {k: statistics.median(v) for k, v in (("local", local_s), ("cold", cold_s), ("warm", warm_s))}
    print(f"{args.artifacts + 1} artifacts, snakemake -n: local {med['local']:.2f} s, gs:// cold {med['cold']:.2f} s, "
          f"gs:// warm {med['warm']:.2f} s (medians of {args.repeats}; machine shared)", file=sys.stderr)  # fmt: skip
    if large:
        print(f"{large['large_artifacts']} artifacts: local {large['large_local_s']} s (measured), gs:// cold "
              f"{large['large_gs_cold_s_estimated']} s (estimated)", file=sys.stderr)  # fmt: skip
    print(json.dumps({
        "benchmark": "remote_overhead", "ratio": round(med["cold"] / med["local"], 3),
        "baseline": "the same dry run (real snakemake -n, all built) on a local prefix, alternating",
        "artifacts": args.artifacts + 1, "local_s": [round(t, 3) for t in local_s],
        "gs_cold_s": [round(t, 3) for t in cold_s], "gs_warm_s": [round(t, 3) for t in warm_s],
        "warm_ratio": round(med["warm"] / med["local"], 3), **large, "target": "<= 1.5 (gs:// cold over local)",
    }))  # fmt: skip


if __name__ == "__main__":
    main()
