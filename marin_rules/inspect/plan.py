"""A priced plan: what each training job that would run costs, before it runs.

Model: a `train` artifact's recipe fixes its model (`ModelConfig`) and its tokens,
num_train_steps * batch_size * seq_len. FLOPs = tokens * `flops_per_token` (nanoGPT's
count, `marin_rules/model/flops.py`: 6 per active matmul parameter plus attention).
Time on an accelerator = FLOPs / (chips * peak bf16 FLOP/s per chip * MFU), for the
accelerator the artifact's `runtime` names (`tpu: v5p-8`, or `accelerator: h100-8`),
at a stated MFU (default 40%). TPU v2-v5p names count TensorCores (two per chip);
v5e (`v5litepod-N`) and v6e names count chips. Time on this CPU = FLOPs / the
FLOP/s past train records on the prefix achieved (tokens_per_s * flops_per_token,
the median, preferring records built on this host) + their median overhead beyond
the timed steps (compile, evaluation, checkpoints); unknown without such records.
The vocabulary comes from the model config, else the one the tokenized data (or
its tokenizer) recorded when built, else the tokenizer recipe's `vocab_size`. A job whose mesh or batch split does not fit the devices of its
accelerator (`device_refusal`: the checks the run makes at its start) gets a warning
line under its price. Reads records; runs nothing. The jobs that would run are the train
artifacts with no success record; a corrupt one stops the plan with its one line, as
it stops `snakemake -n`.
"""

from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.identity import RECORD_FILE, artifact_location
from marin_rules.experiment import Artifact, Experiment
from marin_rules.inspect import reading
from marin_rules.model.flops import active_params, flops_per_token, matmul_params, total_params

DEFAULT_MFU = 0.4
# Peak dense bf16 FLOP/s per chip, and how many units of the name's count make a chip.
PEAK_FLOPS: dict[str, tuple[float, int]] = {
    "v2": (45e12, 2), "v3": (123e12, 2), "v4": (275e12, 2), "v5p": (459e12, 2),
    "v5e": (197e12, 1), "v5litepod": (197e12, 1), "v6e": (918e12, 1),
    "a100": (312e12, 1), "h100": (989e12, 1), "h200": (989e12, 1), "b200": (2250e12, 1),
    "l4": (121e12, 1), "a10g": (70e12, 1), "v100": (125e12, 1),
}  # fmt: skip


@dataclass(frozen=True)
class Accelerator:
    name: str  # as the runtime gave it, e.g. "v5p-8"
    chips: int
    peak_per_chip: float
    devices: int  # as JAX counts them: TensorCores on v2 and v3, chips on v4 and later (megacore)

    @property
    def peak(self) -> float:
        return self.chips * self.peak_per_chip


def parse_accelerator(text: Any) -> Accelerator | None:
    """`v5p-8` -> 4 chips of v5p; `h100-8` -> 8 H100s; `h100` -> one. None when unknown."""
    if not isinstance(text, str) or not text:
        return None
    kind, _, count = text.strip().lower().rpartition("-")
    if not kind or not count.isdigit():
        kind, count = text.strip().lower(), "1"
    if kind not in PEAK_FLOPS or int(count) < 1:
        return None
    peak, per_chip = PEAK_FLOPS[kind]
    chips = max(1, int(count) // per_chip)
    return Accelerator(text, chips, peak, int(count) if kind in ("v2", "v3") else chips)


@dataclass(frozen=True)
class CpuSpeed:
    flops_per_s: float  # achieved training FLOP/s (median of past runs)
    overhead_s: float  # median time beyond the timed steps
    runs: int
    this_host: bool


@dataclass(frozen=True)
class JobPrice:
    key: str
    total_params: int
    active_params: int
    matmul_params: int  # the N of the FLOPs' 6N (`flops.matmul_params`)
    tokens: int
    flops: float
    accelerator: Accelerator | None
    accelerator_s: float | None
    cpu_s: float | None
    note: str = ""
    named: str = ""  # the accelerator the runtime names, known or not
    refusal: str = ""  # why the run would stop at its start on that accelerator (`device_refusal`)

    def accelerator_text(self) -> str:
        """What the plan line says of the accelerator: its time, or why there is none."""
        if self.accelerator:
            return f"{self.accelerator.name} ({self.accelerator.chips} chip(s)): {human(self.accelerator_s)}"
        if self.named:
            return (f"accelerator {self.named!r} unknown: no peak FLOP/s known (known: {', '.join(PEAK_FLOPS)}), "
                    "time unknown")  # fmt: skip
        return "no accelerator named in runtime"


def _vocab_size(experiment: Experiment, artifact: Artifact, prefix: str | None) -> int | None:
    """The tokenizer's vocabulary behind a train artifact's data (first member of a
    mixture): as the tokenized data or the tokenizer recorded it when built on `prefix`
    (a trained tokenizer may end with fewer ids than asked), else its recipe's `vocab_size`."""
    data = artifact.deps.get("data")
    first = data if isinstance(data, str) else next(iter(data or {}), None)
    tokenized = experiment.artifacts.get(first) if first else None
    tokenizer_key = tokenized.deps.get("tokenizer") if tokenized else None
    tokenizer = experiment.artifacts.get(tokenizer_key) if isinstance(tokenizer_key, str) else None
    for built in (tokenized, tokenizer) if prefix is not None else ():
        record = reading.record_dict(artifact_location(prefix, built.id), built.id) if built else None
        size = ((record or {}).get("result") or {}).get("vocab_size")
        if isinstance(size, int) and not isinstance(size, bool):
            return size
    size = (tokenizer.config if tokenizer else {}).get("vocab_size")
    return size if isinstance(size, int) else None


def price_job(
    experiment: Experiment, key: str, mfu: float = DEFAULT_MFU, cpu: CpuSpeed | None = None,
    prefix: str | None = None, fresh: bool = False,
) -> JobPrice:
    """`key`'s price; `prefix`: where it and its upstreams may be built (their recorded
    vocabulary; a stopped run of it resumes from its newest checkpoint, priced for the
    steps left, unless `fresh`: forced, it starts over)."""
    from marin_rules.train.config import parse_train_config  # pure Python, no JAX

    artifact = experiment[key]
    vocab = _vocab_size(experiment, artifact, prefix)
    notes = [] if vocab or "vocab_size" in artifact.config.get("model", {}) else ["vocabulary assumed 4096"]
    train = parse_train_config(artifact.config, vocab_size=vocab)
    model = train.model
    done = None if prefix is None or fresh else _resumes_from(experiment, prefix, artifact)
    building = None if prefix is None else _building(artifact_location(prefix, artifact.id))
    if building:  # a run that needs it waits for that build instead
        notes.append(f"building now ({building}): a run waits for that build")
    kept = None if prefix is None or fresh or building else _kept_by_killed_rebuild(experiment, prefix, artifact)
    if kept:  # its job restores that build and serves it (job/main.py, forcing.recover_interrupted)
        notes.append(f"a forced rebuild of it was killed: the next run puts the previous build back from {kept} "
                     "and serves it, training nothing")  # fmt: skip
    elif done:
        notes.append(f"resumes from step {done} of {train.num_train_steps}")
    steps = 0 if kept else train.num_train_steps - min(done or 0, train.num_train_steps)
    tokens = steps * train.batch_size * train.seq_len
    flops = float(tokens * flops_per_token(model, train.seq_len))
    named = artifact.runtime.get("accelerator") or artifact.runtime.get("tpu")
    accelerator = parse_accelerator(named)
    accelerator_s = flops / (accelerator.peak * mfu) if accelerator else None
    cpu_s = flops / cpu.flops_per_s + cpu.overhead_s if cpu else None
    params = total_params(model), active_params(model), matmul_params(model)
    refusal = device_refusal(train, accelerator) if accelerator else ""
    return JobPrice(key, *params, tokens, flops, accelerator, accelerator_s, cpu_s, "; ".join(notes), str(named or ""),
                    refusal)  # fmt: skip


BUILT_NOTE = "built: a run serves it; priced as a rebuild (-f)"


def _building(location: str) -> str | None:
    """Who builds the artifact at `location` now (a live holder of its lease), else None."""
    from marin_rules.artifacts.lease import held_live
    from marin_rules.inspect.status import read_holder

    holder = read_holder(location)
    return holder.describe() if held_live(holder) else None


def _kept_by_killed_rebuild(experiment: Experiment, prefix: str, artifact: Artifact) -> str | None:
    """Where a forced rebuild that was killed (no live holder: `_building` said none) put
    the previous build it replaced, when its next job serves that build again (job/main.py:
    a finished build, the rebuild not owed by a cascade, made from today's upstream
    builds), else None (that job puts it back, then rebuilds)."""
    from marin_rules.artifacts.builds import rebuilt_upstreams

    location = artifact_location(prefix, artifact.id)
    moved = reading.unended_rebuild(location)
    if moved is None or reading.unended_rebuild_owed(location) or reading.unended_move(location):
        return None  # its job puts the old build back, then rebuilds
    try:
        record = storage.read_json(storage.join(location, moved, RECORD_FILE))
        now = _upstream_builds_now(experiment, prefix, artifact)
    except (MarinError, OSError, ValueError):  # pricing is advice
        return None
    if not isinstance(record, dict) or now is None or rebuilt_upstreams(record.get("deps") or {}, now):
        return None
    return moved


def _upstream_builds_now(experiment: Experiment, prefix: str, artifact: Artifact) -> dict[str, Any] | None:
    """The builds of the artifact's upstreams on `prefix` now (`builds.upstream_builds`)."""
    from marin_rules.artifacts.builds import upstream_builds

    ids = {key: experiment[key].id for key in artifact.upstream_keys()}
    return upstream_builds(list(ids), lambda key: reading.record_dict(artifact_location(prefix, ids[key]), ids[key]))


def _resumes_from(experiment: Experiment, prefix: str, artifact: Artifact) -> int | None:
    """The checkpoint step a stopped (unbuilt, not forced, not dev) run resumes from:
    None when it has none, or its job will refuse them (another recipe: planning says so)
    or set them aside (other upstream builds) and start over."""
    from marin_rules.job.attempt import job_recipe, resumes
    from marin_rules.train.recipe import resumable_step

    location = artifact_location(prefix, artifact.id)
    if artifact.id.is_dev or reading.record_dict(location, artifact.id) is not None or reading.forced_rebuild_owed(location):
        return None
    try:
        step = resumable_step(location)
        if step is None:
            return None
        upstreams = _upstream_builds_now(experiment, prefix, artifact)
        return step if resumes(location, job_recipe(artifact, experiment, prefix, location), upstreams) else None
    except (MarinError, OSError, ValueError):  # pricing is advice
        return None


def device_refusal(train: Any, accelerator: Accelerator) -> str:
    """The one line a train run of `train` (a TrainConfig) would stop on at its start on
    `accelerator` (its mesh does not fit the devices, or its batch does not split over
    them: train/config.py `mesh_on`, `check_batch_split`), else "". The split per process
    is left to the run (how many hosts a pod type has is not known here)."""
    from marin_rules.artifacts.errors import ConfigError
    from marin_rules.train.config import check_batch_split, mesh_on  # pure Python, no JAX

    try:
        data, expert = mesh_on(train, accelerator.devices, accelerator.name)
        check_batch_split(train, data * expert, processes=1)
    except ConfigError as e:
        return str(e)
    return ""


def cpu_speed(records: Iterable[Mapping[str, Any]], host: str | None = None) -> CpuSpeed | None:
    """Achieved FLOP/s and overhead of past train records (those built on `host` when
    there are any), or None when no record measured its speed."""
    host = host or socket.gethostname()
    measured = []
    for record in records:
        result = record.get("result") or {}
        tps, fpt = result.get("tokens_per_s"), result.get("flops_per_token")
        if not (isinstance(tps, (int, float)) and isinstance(fpt, (int, float)) and tps > 0 and fpt > 0):
            continue
        if "distributed" in (record.get("runtime") or {}) or (result.get("processes") or 1) > 1:
            continue  # a pod's speed is not this CPU's
        duration = (record.get("provenance") or {}).get("duration_s")
        tokens = result.get("tokens_seen") or 0
        steps, resumed = (record.get("config") or {}).get("num_train_steps"), result.get("resumed_from_step") or 0
        if isinstance(steps, int) and steps > 0 and isinstance(resumed, int) and 0 < resumed <= steps:
            tokens *= 1 - resumed / steps  # the record's duration is its last attempt's: from the resumed step
        overhead = max(0.0, duration - tokens / tps) if isinstance(duration, (int, float)) else 0.0
        measured.append(((record.get("provenance") or {}).get("host") == host, tps * fpt, overhead))
    local = [m for m in measured if m[0]]
    chosen = local or measured
    if not chosen:
        return None
    return CpuSpeed(
        statistics.median(m[1] for m in chosen), statistics.median(m[2] for m in chosen), len(chosen), bool(local)
    )


def past_train_records(experiment: Experiment, prefix: str) -> list[dict]:
    """Success records of every version on the prefix of the experiment's train names
    (every user's dev versions among them: `reading.builds_on_prefix`)."""
    out = []
    names = sorted({a.id.name for a in experiment.artifacts.values() if a.step == "train"})
    for name in names:
        for found in reading.builds_on_prefix(prefix, name):
            try:
                record = reading.record_dict(artifact_location(prefix, found), found)
            except MarinError:
                continue
            if record is not None and record.get("step") == "train":
                out.append(record)
    return out


def jobs_to_run(experiment: Experiment, prefix: str) -> list[str]:
    """Train artifacts without a success record (missing, failed), dev versions (every
    run rebuilds them), and built ones a forced run that stopped still owes a rebuild
    (`reading.owed_rebuilds`). A corrupt record raises its one line (`CorruptRecord`,
    naming the rebuild), as `snakemake -n` stops on it: no run builds it until it is
    deleted or forced."""
    keys = []
    owed = None
    for key in [k for k, a in experiment.artifacts.items() if a.step == "train"]:
        if experiment[key].id.is_dev or \
                reading.record_dict(artifact_location(prefix, experiment[key].id), experiment[key].id) is None:  # fmt: skip
            keys.append(key)
            continue
        owed = reading.owed_rebuilds(experiment, prefix) if owed is None else owed
        if key in owed:
            keys.append(key)
    return keys


def human(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    hours = f"{seconds / 3600:.3g} h"
    if seconds < 90:
        return f"{hours} ({seconds:.3g} s)"
    if seconds < 5400:
        return f"{hours} ({seconds / 60:.1f} min)"
    if seconds < 48 * 3600:
        return hours
    return f"{hours} ({seconds / 86400:.1f} days)"


def count(n: float) -> str:
    """1.23k, 4.56M, 7.89B, 1.00T; from 1000T on in powers of ten (3.00e22)."""
    if abs(n) >= 1e15:
        return f"{n:.2e}".replace("e+", "e")
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def plan_lines(
    experiment: Experiment, prefix: str, keys: Iterable[str] | None = None, mfu: float = DEFAULT_MFU,
    forced: Iterable[str] = (), named: bool = False,
) -> list[str]:
    """The priced plan as lines (for `marin plan`, and for stderr during `snakemake -n`).
    `keys`: the train artifacts that would run (default: those with no success record);
    `forced`: those of them that start over. `named`: `keys` are the ones a user named
    (`marin plan KEY`): one no run would build (it is served) is priced as its rebuild,
    saying so; planning passes the jobs Snakemake will run."""
    to_run = jobs_to_run(experiment, prefix) if keys is None or named else None
    keys = [k for k in (to_run if keys is None else keys) if experiment[k].step == "train"]
    if not keys:
        return ["plan: no training job to run"]
    cpu = cpu_speed(past_train_records(experiment, prefix))
    forced = set(forced)
    prices = [price_job(experiment, k, mfu, cpu, prefix, fresh=k in forced) for k in keys]
    if named:  # a key no run would build (it is served; one a killed rebuild left trains nothing): its rebuild
        prices = [replace(p, note="; ".join(filter(None, [BUILT_NOTE, p.note])))
                  if p.tokens and p.key not in to_run and p.key not in forced else p for p in prices]  # fmt: skip
    if cpu:
        where = "records built on this host" if cpu.this_host else "records built on other hosts"
        cpu_text = (
            f"this CPU at the {cpu.flops_per_s / 1e9:.1f} GFLOP/s measured by {cpu.runs} past run(s) "
            f"({where}) plus {cpu.overhead_s:.0f} s overhead each"
        )
    else:
        cpu_text = "this CPU: unknown until a training run of this experiment on this prefix has measured its speed"
    lines = [
        f"plan: {len(prices)} training job(s); FLOPs as model/flops.py counts them (6 x active matmul "
        f"params x tokens + attention); accelerators at {mfu:.0%} MFU of peak bf16; {cpu_text}"
    ]
    for p in prices:
        lines.append(
            f"  {p.key}: params {count(p.total_params)} total, {count(p.active_params)} active"
            + (f" ({count(p.matmul_params)} in the FLOPs)" if p.matmul_params != p.active_params else "") + "; "
            f"tokens {count(p.tokens)}; FLOPs {p.flops:.3g}; {p.accelerator_text()}; this CPU: {human(p.cpu_s)}"
            + (f" ({p.note})" if p.note else "")
        )
        if p.refusal:
            lines.append(f"  warning: {p.key} would stop at its start on {p.accelerator.name}: {p.refusal}")
    flops = sum(p.flops for p in prices)
    tokens = sum(p.tokens for p in prices)
    acc_total = _sum_or_none([p.accelerator_s for p in prices])
    cpu_total = _sum_or_none([p.cpu_s for p in prices])
    lines.append(
        f"  total: {len(prices)} job(s), tokens {count(tokens)}, FLOPs {flops:.3g}, accelerators "
        f"{human(acc_total)} one after another, this CPU {human(cpu_total)}"
    )
    return lines


def _sum_or_none(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)
