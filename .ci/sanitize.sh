#!/usr/bin/env bash
# Sanitizer stage: builds a copy of this checkout with AddressSanitizer and
# UndefinedBehaviorSanitizer (TF_CTR_OPS_SANITIZE=address,undefined, CPU-only)
# in a temporary folder, then runs the core tests, the TF op tests and the fuzz
# harness against that build. Any ASan or UBSan report fails the stage.
#
#   .ci/sanitize.sh                 # default test selection (see TESTS below)
#   PYTHON=.venv/bin/python .ci/sanitize.sh tests/test_strings.py -k hash
#   KEEP=1 .ci/sanitize.sh          # keep the sanitized build (its path is printed)
#   MARKERS="not slow" .ci/sanitize.sh tests/test_rewrite_vocab.py   # with its SavedModel tests
#
# PYTHON: an interpreter with TensorFlow, pytest, hypothesis (and atheris for
# the fuzz test) installed; default: .venv/bin/python, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3 )}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tf-ctr-ops-sanitize.XXXXXX")"
if [ "${KEEP:-0}" = 1 ]; then echo "sanitized build kept in $WORK/src"; else trap 'rm -rf "$WORK"' EXIT; fi
start=$SECONDS

# The working tree as it is (tracked and untracked, minus ignored build outputs).
mkdir -p "$WORK/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$WORK/src/" 2>/dev/null || true)
cd "$WORK/src"
echo "+ sanitized build in $WORK/src"
TF_CTR_OPS_CUDA=0 TF_CTR_OPS_SANITIZE=address,undefined "$PYTHON" setup.py -q build_ext --inplace >"$WORK/build.log" 2>&1 \
  || { tail -50 "$WORK/build.log"; exit 1; }
grep -q "SANITIZE = 'address,undefined'" tf_ctr_ops/_build_info.py || { echo "not a sanitized build" >&2; exit 1; }
echo "+ built in $((SECONDS - start)) s"

# Python itself is not instrumented, so the ASan runtime must be the first
# library loaded (LD_PRELOAD), before the instrumented extension modules.
# libstdc++ is preloaded too: without it, ASan's __cxa_throw interceptor finds
# no real __cxa_throw when it starts (python does not link libstdc++) and
# aborts with "CHECK failed: ... real___cxa_throw" at the first C++ exception.
export LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
# detect_leaks=0: LeakSanitizer would report CPython's and TensorFlow's
#   process-lifetime allocations (interned objects, op and kernel registries)
#   at exit; it cannot tell them from ours, and leaks are not what this checks.
# allocator_may_return_null=1: tests ask for impossible sizes on purpose; TF's
#   allocator turns a null return into ResourceExhausted, while ASan by default
#   aborts on any allocation above its size limit instead of returning null.
# halt_on_error=1, abort_on_error=0: the first report ends the process with a
#   non-zero status (the test, and so the stage, fails) and a readable stack.
# detect_stack_use_after_return=1: also catch pointers to dead stack frames.
# check_initialization_order=1: static-initialization-order bugs across the
#   two shared libraries.
# log_path: reports go to files as well as being fatal; pytest captures a
#   test's stderr and loses it when the process dies, so the script prints
#   them at the end.
REPORTS="$WORK/reports"
mkdir -p "$REPORTS"
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1:check_initialization_order=1:log_path=$REPORTS/asan"
# print_stacktrace=1: where the undefined behaviour happened; halt_on_error=1:
#   make it fatal (by default UBSan only prints a line and carries on).
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$REPORTS/ubsan"
export TF_CPP_MIN_LOG_LEVEL=3
# Keep the sanitized runs modest: fewer examples and a shorter fuzz run (the
# main suite runs more examples on the optimized build; CI has 30 minutes).
export TF_CTR_OPS_HYPOTHESIS_EXAMPLES="${TF_CTR_OPS_HYPOTHESIS_EXAMPLES:-25}"
export TF_CTR_OPS_FUZZ_SECONDS="${TF_CTR_OPS_FUZZ_SECONDS:-15}"
export TF_CTR_OPS_CONCURRENCY_ITERS="${TF_CTR_OPS_CONCURRENCY_ITERS:-10}"

# Everything that runs the C++ on the CPU build. test_bench times things (slow
# and meaningless under ASan); the GPU core tests skip themselves without
# CUDA. The Keras layer tests are left to the main suite: they call the ops
# tested here, and their time under ASan is Keras' (fit, save, load).
TESTS=(tests/test_lookup.py tests/test_strings.py
       tests/test_properties.py tests/test_concurrency.py tests/test_limits.py tests/test_fuzz.py
       tests/test_gpu_core.py tests/test_gpu_strings_core.py tests/test_string_tensors.py tests/test_vocab.py
       tests/test_vocab_sparse.py tests/test_columns.py tests/test_multi_hot_dense.py
       tests/test_hash_table.py tests/test_in_place_table.py tests/test_pool_paths.py)
# The Grappler optimizer's core (test_rewrite.py) and its hostile and
# malformed graphs (test_rewrite_safe.py) run their C++ here too. The pattern
# families' own test files (test_rewrite_*.py) are left to the main suite,
# which runs every pattern on the optimized build: on this build they cost
# CI minutes it does not have. So are the tests marked saved_model in the
# files here (SavedModel writing and fresh Python processes, mostly
# TensorFlow's time; the same C++ runs in their in-process tests) and those
# marked huge (tens of millions of elements through TF's reference ops: the
# same kernels run here on small inputs).
TESTS+=(tests/test_rewrite.py tests/test_rewrite_safe.py)
MARKERS="${MARKERS:-not slow and not saved_model and not huge}"
if [ "$#" -gt 0 ]; then TESTS=("$@"); fi

# The real-data samples live next to the checkout, not next to the copy.
export TF_CTR_OPS_DATA="${TF_CTR_OPS_DATA:-$ROOT/../shared/data}"

# Two test processes (pytest-xdist, from the test extra) where installed: the
# stage is CPU-bound and CI has two cores.
PARALLEL=()
if "$PYTHON" -c "import xdist" 2>/dev/null; then PARALLEL=(-n "${TF_CTR_OPS_TEST_PROCESSES:-2}"); fi

echo "+ pytest ${PARALLEL[*]} -m '$MARKERS' ${TESTS[*]}"
# -p no:cacheprovider: the copy is thrown away; -rs: list skips with reasons.
rc=0
"$PYTHON" -m pytest -q -rs -p no:cacheprovider --durations=15 "${PARALLEL[@]}" -m "$MARKERS" "${TESTS[@]}" || rc=$?
if compgen -G "$REPORTS/*" >/dev/null; then
  for f in "$REPORTS"/*; do echo "=== $f"; head -c 20000 "$f"; done
  echo "sanitizer reports above: stage failed" >&2
  exit 1
fi
[ "$rc" = 0 ] || { echo "tests failed under the sanitizers (exit $rc)" >&2; exit "$rc"; }
echo "+ sanitizer stage passed in $((SECONDS - start)) s"
