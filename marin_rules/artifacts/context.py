"""What a step receives: `StepContext`.

Every step, built-in or user-defined, is a plain function `step(ctx) -> dict`:
it reads `ctx.config` and `ctx.deps`, writes under `ctx.output`, and returns a small
JSON-able summary that becomes `result` in the success record. Locations are strings:
a local path or an fsspec URL (`gs://bucket/a/b`). A mixture role maps each upstream
location to its weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class StepContext:
    name: str  # e.g. "checkpoints/nano-moe"
    version: str  # e.g. "v1"
    config: Mapping[str, Any]  # the recipe, as the experiment gave it
    deps: Mapping[str, str | Mapping[str, float]]  # role -> location (or location -> weight)
    runtime: Mapping[str, Any] = field(default_factory=dict)  # execution choices, not identity
    output: str = ""  # this artifact's location: write here

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"
