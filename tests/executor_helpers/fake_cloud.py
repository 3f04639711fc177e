"""Installs the fake `gcloud` (and the metadata `curl`, and a `python3` that is this
venv's) into a bin folder for tests; see fake_gcloud.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def install_fake_cloud(bin_dir: Path, root: Path, workers: int = 1) -> dict[str, str]:
    """Write the fake tools; return the environment that puts them first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        "gcloud": f'#!/usr/bin/env bash\nexec {sys.executable} {HERE / "fake_gcloud.py"} "$@"\n',
        # the TPU metadata server: this worker's number and one endpoint per worker
        "curl": '#!/usr/bin/env bash\ncase "$*" in\n'
        '  *agent-worker-number*) echo "$FAKE_WORKER_ID" ;;\n'
        '  *worker-network-endpoints*) seq -s, 1 "$FAKE_GCLOUD_WORKERS" ;;\n'
        '  *) echo "fake curl: $*" >&2; exit 22 ;;\nesac\n',
        "python3": f'#!/usr/bin/env bash\nexec {sys.executable} "$@"\n',
    }
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_GCLOUD_ROOT": str(root),
        "FAKE_GCLOUD_WORKERS": str(workers),
    }


def gcloud_calls(root: Path) -> list[list[str]]:
    path = root / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
