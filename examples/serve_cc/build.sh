#!/usr/bin/env bash
# Builds examples/serve_cc/serve against the TensorFlow of $PYTHON (the pip
# wheel ships libtensorflow_cc, libtensorflow_framework and the C API headers).
#   PYTHON=.venv/bin/python bash examples/serve_cc/build.sh [OUT]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="${1:-$HERE/serve}"
TF_DIR="$("$PYTHON" -c 'import os, tensorflow as tf; print(os.path.dirname(tf.__file__))' 2>/dev/null)"
TF_INC="$TF_DIR/include"
g++ -std=c++17 -O2 -I"$TF_INC" "$HERE/serve.cc" -o "$OUT" \
  -L"$TF_DIR" -l:libtensorflow_cc.so.2 -l:libtensorflow_framework.so.2 -Wl,-rpath,"$TF_DIR"
echo "$OUT"
