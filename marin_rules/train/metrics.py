"""Training metrics: one JSON line per logged step, and the loss-curve picture.

Model: `MetricsLog` keeps every record of the run in memory and rewrites
`{output}/metrics.jsonl` whole after each log (a single PUT on object stores, so
readers never see a torn line; the file stays small: one line per `log_every`).
A resumed run starts from the records of the killed one, minus those after the
checkpoint it resumes from, so the file reads as one uninterrupted run.
Training records carry `"split": "train"`, validation records `"split": "val"`.
`plot_losses` draws both curves into `loss.png` with matplotlib's Agg backend (a
train curve of a few points, down to one when `num_train_steps <= log_every`, with
markers, or it would not show).
Only process 0 writes (the caller decides; see `distributed.is_writer`).
"""

from __future__ import annotations

import io
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from marin_rules.artifacts import storage
from marin_rules.artifacts.errors import decode_json


def _clean(value: Any) -> Any:
    """JSON-able copy: numpy/jax scalars to floats, non-finite floats to strings."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist"):
        return _clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclass
class MetricsLog:
    location: str  # {output}/metrics.jsonl
    records: list[dict] = field(default_factory=list)

    @classmethod
    def resume(cls, location: str, up_to_step: int) -> "MetricsLog":
        """The log of an earlier attempt, cut to records at or before `up_to_step`."""
        records: list[dict] = []
        if up_to_step > 0 and storage.exists(location):
            unreadable = 0
            for line in storage.read_bytes(location).decode("utf-8", errors="replace").splitlines():
                try:
                    record = decode_json(line) if line.strip() else None
                except ValueError:
                    record = None
                    unreadable += 1
                if isinstance(record, dict) and isinstance(record.get("step", 0), int) and record.get("step", 0) <= up_to_step:
                    records.append(record)
            if unreadable:  # the curve loses those points; training does not depend on them
                print(f"{location}: {unreadable} unreadable line(s) dropped while resuming", file=sys.stderr, flush=True)
        return cls(location, records)

    def log(self, record: dict) -> None:
        """Add a record (replacing one of the same split and step) and rewrite the file."""
        key = (record.get("split"), record.get("step"))
        self.records = [r for r in self.records if (r.get("split"), r.get("step")) != key]
        self.records.append(_clean(record))
        self.flush()

    def flush(self) -> None:
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.records)
        storage.write_text_atomic(self.location, text)

    def curve(self, split: str, key: str = "loss") -> tuple[list[int], list[float]]:
        pairs = [
            (r["step"], r[key])
            for r in self.records
            if r.get("split") == split and isinstance(r.get(key), (int, float))
        ]
        return [s for s, _ in pairs], [v for _, v in pairs]


FEW_POINTS = 5  # a train curve of at most this many points is drawn with markers


def plot_losses(log: MetricsLog, location: str, title: str = "", baseline: float | None = None) -> None:
    """Write the train and validation loss curves as a PNG to `location`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global state, no display

    fig = Figure(figsize=(7, 4.5), dpi=110)
    ax = fig.subplots()
    steps, losses = log.curve("train")
    style = "o-" if len(steps) <= FEW_POINTS else "-"  # a single point draws no line: only a marker shows it
    ax.plot(steps, losses, style, label="train", color="tab:blue", linewidth=1.2, markersize=4)
    vsteps, vlosses = log.curve("val")
    if vsteps:
        ax.plot(vsteps, vlosses, "o-", label="validation", color="tab:orange", linewidth=1.2)
    if baseline is not None and math.isfinite(baseline):
        ax.axhline(baseline, linestyle="--", color="gray", linewidth=1, label="unigram (validation)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    storage.write_bytes_atomic(location, buf.getvalue())
