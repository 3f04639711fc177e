"""Joining the processes of one training run: `jax.distributed` from explicit settings.

Model: a run is one process (the default) or N processes that each own some local
devices and together form one global device mesh, the way each worker of a TPU
pod slice runs the same command. The settings come from the artifact's
`runtime.distributed` (never from the fingerprinted config):

    distributed: {coordinator: "127.0.0.1:PORT", num_processes: 2, process_id: 0}
    distributed: auto          # TPU VM: JAX reads the slice's metadata itself

`initialize` must run before anything touches a JAX backend. Only process 0
writes metrics, plots and `model.json` (`is_writer`); every process takes part in
collectives and in orbax checkpointing, which coordinates itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from marin_rules.artifacts.errors import ConfigError


@dataclass(frozen=True)
class DistributedConfig:
    coordinator: str | None = None  # "host:port" of process 0; None with auto
    num_processes: int = 1
    process_id: int = 0
    auto: bool = False  # let jax.distributed.initialize() detect a TPU VM slice

    @property
    def enabled(self) -> bool:
        return self.auto or self.num_processes > 1


def parse_distributed(value: Any) -> DistributedConfig:
    """`runtime.distributed` as a `DistributedConfig` (None: a single process)."""
    field = "runtime.distributed"
    if value is None or value is False:
        return DistributedConfig()
    if value == "auto":
        return DistributedConfig(auto=True)
    if not isinstance(value, Mapping):
        raise ConfigError(
            field, f"expected 'auto' or {{coordinator: 'host:port', num_processes: N, process_id: i}}, got {value!r}"
        )
    unknown = set(value) - {"coordinator", "num_processes", "process_id"}
    if unknown:
        raise ConfigError(f"{field}.{sorted(unknown)[0]}", "unknown key; expected coordinator, num_processes, process_id")
    coordinator = value.get("coordinator")
    n = value.get("num_processes", 1)
    i = value.get("process_id", 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"{field}.num_processes", f"expected an integer >= 1, got {n!r}")
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
        raise ConfigError(f"{field}.process_id", f"expected an integer in [0, {n}), got {i!r}")
    if n > 1 and (not isinstance(coordinator, str) or ":" not in coordinator):
        raise ConfigError(f"{field}.coordinator", f"expected 'host:port' of process 0, got {coordinator!r}")
    return DistributedConfig(coordinator=coordinator, num_processes=n, process_id=i)


def initialize(settings: DistributedConfig) -> None:
    """Join the run's processes (a no-op for one process or when already joined)."""
    if not settings.enabled:
        return
    import jax

    if jax.distributed.is_initialized():
        return
    if settings.auto:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(
            coordinator_address=settings.coordinator,
            num_processes=settings.num_processes,
            process_id=settings.process_id,
        )


def process_index() -> int:
    import jax

    return jax.process_index()


def is_writer() -> bool:
    """True on the one process that writes metrics, plots and records."""
    return process_index() == 0
