#!/usr/bin/env bash
# The training benchmarks on a GPU, at widths where its matmul units have work to do.
#
# Runs under a machine's own python3 with jax[cuda], flax, optax and tqdm installed
# (this repo on PYTHONPATH, nothing else of ours needed): attention_check.py (cuDNN
# against XLA attention), then train_throughput.py at two widths with 128-dimension
# heads, and once with AdamW alone (what Muon costs). Each JSON line goes to OUT
# (default ./gpu-bench), with the device, driver and package versions.
# Usage: OUT=folder bash benchmarks/gpu_train_throughput.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-bench}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/device.txt"
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" | tee -a "$out/device.txt"
timeout 120 python3 benchmarks/attention_check.py | tee -a "$out/attention_check.jsonl"
for run in "--d-model 2048 --batch 64 --seq 1024 --head-dim 128" \
           "--d-model 2048 --batch 64 --seq 1024 --head-dim 128 --optimizer adamw --backends capacity" \
           "--d-model 1024 --batch 64 --seq 1024 --head-dim 128 --backends capacity"; do
  echo "== $run"
  # shellcheck disable=SC2086
  timeout 150 python3 benchmarks/train_throughput.py $run --rounds 8 2> >(tail -n 8 >&2) | tee -a "$out/train_throughput.jsonl"
done
