"""The registry of running job processes (`.snakemake/marin-jobs/<snakemake pid>/<job
pid>`) cleans up after runs that died: registering prunes entries whose process no
longer exists and registries left empty; unregistering removes its registry once empty.
Real processes: a reaped child's pid stands for a dead job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from marin_rules.workflow.signals import register, registered


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)  # reaped: the pid no longer exists
    return proc.pid


def entry(registry: Path, pid: int) -> None:
    registry.mkdir(parents=True, exist_ok=True)
    (registry / str(pid)).write_text(str(pid))


def test_registering_prunes_dead_entries_and_empty_registries_and_touches_nothing_else(tmp_path):
    root = tmp_path / ".snakemake" / "marin-jobs"
    dead, live = dead_pid(), os.getpid()
    entry(root / "111", dead)
    entry(root / "111", live)  # a job still running in an older run: kept
    entry(root / "222", dead)  # a killed run: its registry goes
    (root / "333").mkdir()  # left empty
    (root / "notes").mkdir()  # not a registry: untouched
    unregister = register(str(root / "444"), live)
    assert registered(str(root / "111")) == [live]
    assert sorted(p.name for p in root.iterdir()) == ["111", "444", "notes"]
    assert registered(str(root / "444")) == [live]
    unregister()
    assert sorted(p.name for p in root.iterdir()) == ["111", "notes"]  # its empty registry removed
    unregister()  # idempotent
