"""The same loss and gradients on one device and on a mesh of 8 fake CPU devices
((data=2, expert=4) with expert-parallel all_to_all, and (data=8, expert=1)).

Fake devices must be set before JAX initialises, and this pytest process already has
JAX with one device, so the comparison runs in a subprocess (tests/model_mesh_check.py)
with a timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).with_name("model_mesh_check.py")


@pytest.mark.slow
def test_loss_and_gradients_on_8_fake_devices_match_one_device():
    proc = subprocess.run(
        [sys.executable, str(HELPER), "capacity:2x4,8x1", "ragged:2x4"],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["expert_parallel_traces"] >= 1  # capacity on 2x4 took the shard_map + all_to_all path
    for impl, meshes in (("capacity", ("2x4", "8x1")), ("ragged", ("2x4",))):
        for mesh in meshes:
            got = out[impl][mesh]
            assert got["dropped"] == 0.0
            assert abs(got["loss"] - out[impl]["single"]) < 1e-5, (impl, mesh, got)
            assert got["grad_rel_diff"] < 1e-4, (impl, mesh, got)
