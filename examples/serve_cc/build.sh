#!/usr/bin/env bash
# Builds examples/serve_cc/serve against the TensorFlow of $PYTHON (the pip
# wheel ships libtensorflow_cc, libtensorflow_framework and the C API headers).
#   PYTHON=.venv/bin/python bash examples/serve_cc/build.sh [OUT]
# OUT defaults to ./serve; CXX, CXXFLAGS and LDFLAGS are honoured. Linux only:
# the wheel's libraries are linked by their versioned names (.so.2).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="${1:-serve}"
# The last two lines only: anything TensorFlow prints on import goes before them.
paths="$(TF_CPP_MIN_LOG_LEVEL=3 "$PYTHON" -c \
  'import tensorflow as tf; print(tf.sysconfig.get_lib()); print(tf.sysconfig.get_include())' | tail -n 2)" || paths=""
TF_LIB="$(head -n 1 <<<"$paths")"
TF_INC="$(tail -n 1 <<<"$paths")"
if [ -z "$TF_LIB" ] || [ ! -f "$TF_LIB/libtensorflow_cc.so.2" ]; then
  echo "build.sh: no TensorFlow pip wheel (with libtensorflow_cc.so.2) found by $PYTHON;" \
       "set PYTHON to the interpreter that has tensorflow installed" >&2
  exit 1
fi
# shellcheck disable=SC2086  # CXXFLAGS and LDFLAGS are lists of flags
"${CXX:-g++}" -std=c++17 -O2 ${CXXFLAGS:-} -I"$TF_INC" "$HERE/serve.cc" -o "$OUT" \
  -L"$TF_LIB" -l:libtensorflow_cc.so.2 -l:libtensorflow_framework.so.2 -Wl,-rpath,"$TF_LIB" ${LDFLAGS:-}
echo "$OUT"
