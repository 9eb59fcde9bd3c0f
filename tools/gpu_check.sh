#!/usr/bin/env bash
# The GPU checks in one command, on a machine with a GPU, nvcc, and a Python
# with pybind11, pytest and CuPy or PyTorch (TensorFlow is not needed: the GPU
# kernels are tested through the framework-free core, tf_ctr_ops._core):
#
#   1. builds tf_ctr_ops._core with CUDA in place (TF_CTR_OPS_CORE_ONLY=1;
#      sm_90 unless TF_CTR_OPS_CUDA_ARCHS says otherwise);
#   2. runs the four GPU test files; a skipped test fails the run, since a
#      skipped GPU test is not a GPU test passed;
#   3. runs them under compute-sanitizer memcheck and racecheck
#      (.ci/compute_sanitizer.sh);
#   4. runs the core-level GPU benchmarks: tools/bench_core_gpu.py (lookup and
#      string_embedding times against the copy bandwidth of the same run, with
#      bags of 1 to 99 ids, then lookups alone with bags of 1 to 4) and
#      tools/bench_table_gpu.py (hash-table finds per second, and the time of an
#      inserting find of a training batch).
#
#   bash tools/gpu_check.sh                 # everything
#   SANITIZE=0 BENCH=0 bash tools/gpu_check.sh      # build and tests only
#   BENCH_ARGS="--json bench.json" bash tools/gpu_check.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export TF_CTR_OPS_CORE_ONLY=1 TF_CTR_OPS_CUDA=1 TF_CTR_OPS_CUDA_ARCHS="${TF_CTR_OPS_CUDA_ARCHS:-90}"

echo "+ build tf_ctr_ops._core (CUDA, sm_${TF_CTR_OPS_CUDA_ARCHS})"
"$PYTHON" setup.py -q build_ext --inplace

TESTS=(tests/test_gpu_core.py tests/test_gpu_strings_core.py tests/test_gpu_hash_table.py tests/test_gpu_bindings_host.py)
echo "+ pytest ${TESTS[*]}"
log="$(mktemp)"
"$PYTHON" -m pytest -q -rs -p no:cacheprovider "${TESTS[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || exit "$status"
if grep -qE '[0-9]+ skipped' "$log"; then
  echo "tools/gpu_check.sh: GPU tests were skipped (see the reasons above): no GPU, or a core without CUDA" >&2
  exit 1
fi

if [ "${SANITIZE:-1}" != "0" ]; then
  PYTHON="$PYTHON" bash .ci/compute_sanitizer.sh
fi
if [ "${BENCH:-1}" != "0" ]; then
  echo "+ python tools/bench_core_gpu.py ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  "$PYTHON" tools/bench_core_gpu.py ${BENCH_ARGS:-}
  # Most CTR fields hold one to a few ids: those bags take the group-per-bag
  # kernel, which the table above (1 to 99 ids) never runs.
  echo "+ python tools/bench_core_gpu.py (short bags)"
  "$PYTHON" tools/bench_core_gpu.py --cases lookup-fp32,lookup-fp16,lookup-bf16,lookup-fp32-hash \
    --max-len 4 --batch 4194304
  echo "+ python tools/bench_table_gpu.py"
  "$PYTHON" tools/bench_table_gpu.py
fi
echo "+ tools/gpu_check.sh passed"
