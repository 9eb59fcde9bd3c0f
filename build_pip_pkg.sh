#!/usr/bin/env bash
# Builds a tf-ctr-ops wheel into OUTDIR (default: dist/) against the TensorFlow
# installed in the current Python environment. The wheel pins that exact TF
# version. Set TF_CTR_OPS_CUDA=0/1 to force the CUDA choice (see setup.py).
set -euo pipefail
OUTDIR="${1:-dist}"
PYTHON="${PYTHON:-python3}"
cd "$(dirname "$0")"
"$PYTHON" -c "import tensorflow, pybind11" 2>/dev/null || {
  echo "build_pip_pkg.sh: install the build requirements first: $PYTHON -m pip install -r requirements-build.txt" >&2
  exit 1
}
mkdir -p "$OUTDIR"
"$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$OUTDIR" .
ls -1 "$OUTDIR"/tf_ctr_ops-*.whl
