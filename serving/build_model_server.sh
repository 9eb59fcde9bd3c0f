#!/usr/bin/env bash
# Builds TensorFlow Serving's tensorflow_model_server with tf_ctr_ops linked in
# (serving/BUILD's :tf_ctr_ops_kernels). Never run by this project: our
# machines have no Bazel. See docs/serving.md.
set -euo pipefail

LABEL="//tensorflow_serving/tf_ctr_ops:tf_ctr_ops_kernels"
TARGET="tensorflow_serving/model_servers:tensorflow_model_server"
# Marks a copy this script made, so that a rerun only ever deletes its own.
MARKER=".copied_by_tf_ctr_ops"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<EOF
usage: serving/build_model_server.sh [--no-build] TF_SERVING_CHECKOUT [BAZEL_BUILD_OPTION...]

Copies tf_ctr_ops' C++ sources (cc/, cuda/) and serving/BUILD into
TF_SERVING_CHECKOUT/tensorflow_serving/tf_ctr_ops/, adds
$LABEL to SUPPORTED_TENSORFLOW_OPS in
tensorflow_serving/model_servers/BUILD (once, however often this runs), then
runs in the checkout:

  \${BAZEL:-bazel} build -c opt [BAZEL_BUILD_OPTION...] $TARGET

  --no-build  copy and edit only, and print the bazel command (to run it
              yourself, e.g. through TF Serving's tools/run_in_docker.sh)
  BAZEL       the Bazel binary to run (default: bazel; bazelisk works)

Versions: tf_ctr_ops targets TensorFlow 2.21, while TF Serving compiles the
TensorFlow its WORKSPACE pins (2.20 in its newest release when this was
written). Use a TF Serving commit that pins TF 2.21, or expect to adapt the
C++ to 2.20. CPU kernels only (the GPU kernels have no Bazel rule yet).
This script and serving/BUILD were never built with Bazel by the tf_ctr_ops
project: see docs/serving.md.
EOF
}

die() {
  echo "build_model_server.sh: error: $*" >&2
  exit 1
}

build=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --no-build) build=0; shift ;;
    --) shift; break ;;
    -*) usage >&2; die "unknown option: $1" ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  usage >&2
  exit 2
fi
checkout="$1"
shift
bazel_options=("$@")

# Everything is checked before anything is written, so a failed run leaves
# the checkout as it was.
[[ -d "$checkout" ]] || die "TF Serving checkout not found: '$checkout' is not a directory (clone https://github.com/tensorflow/serving and pass its path)"
checkout="$(cd "$checkout" && pwd)"
ops_build="$checkout/tensorflow_serving/model_servers/BUILD"
[[ -f "$ops_build" ]] || die "'$checkout' is not a TF Serving checkout: $ops_build is missing"

BAZEL="${BAZEL:-bazel}"
if [[ $build == 1 ]] && ! command -v "$BAZEL" >/dev/null 2>&1; then
  die "'$BAZEL' not found on PATH: install Bazel (or Bazelisk and set BAZEL=bazelisk), or pass --no-build to copy and edit only"
fi

already_linked=0
if grep -qF "\"$LABEL\"" "$ops_build"; then
  already_linked=1
else
  assignments="$(grep -cE '^SUPPORTED_TENSORFLOW_OPS[[:space:]]*=' "$ops_build" || true)"
  [[ "$assignments" == 1 ]] || die "expected one 'SUPPORTED_TENSORFLOW_OPS =' line in $ops_build, found ${assignments}: add \"$LABEL\" to that list by hand"
fi

dest="$checkout/tensorflow_serving/tf_ctr_ops"
if [[ -e "$dest" && ! -f "$dest/$MARKER" ]]; then
  die "$dest exists and was not made by this script: move it away first"
fi

# A fresh copy each time, so files deleted or renamed here do not linger there.
rm -rf -- "$dest"
mkdir -p "$dest/cc"
cp -R "$ROOT/cc/core" "$ROOT/cc/ops" "$ROOT/cc/kernels" "$ROOT/cc/grappler" "$dest/cc/"
cp -R "$ROOT/cuda" "$dest/cuda"
cp "$ROOT/serving/BUILD" "$dest/BUILD"
echo "copied from $ROOT by serving/build_model_server.sh; replaced on each run" >"$dest/$MARKER"
echo "copied tf_ctr_ops sources to $dest"

if [[ $already_linked == 1 ]]; then
  echo "$LABEL is already in SUPPORTED_TENSORFLOW_OPS"
else
  # Prefixing the right-hand side with a one-element list works whatever form
  # it has (a list, or if_v2(...) + if_not_v2(...) + [...] as in TF Serving
  # 2.x), and BUILD files cannot append to a global in a later statement.
  edited="$(mktemp)"
  trap 'rm -f "$edited"' EXIT
  awk -v label="$LABEL" '
    !done && /^SUPPORTED_TENSORFLOW_OPS[ \t]*=/ {
      sub(/^SUPPORTED_TENSORFLOW_OPS[ \t]*=[ \t]*/, "")
      print "# tf_ctr_ops: fused CTR ops, kernels and Grappler pass (added by its serving/build_model_server.sh)."
      print "SUPPORTED_TENSORFLOW_OPS = [\"" label "\"] + " $0
      done = 1
      next
    }
    { print }
  ' "$ops_build" >"$edited"
  # Written in place (not moved over) to keep the file's owner and mode.
  cat "$edited" >"$ops_build"
  echo "added $LABEL to SUPPORTED_TENSORFLOW_OPS in $ops_build"
fi

command_line=("$BAZEL" build -c opt ${bazel_options[@]+"${bazel_options[@]}"} "$TARGET")
if [[ $build == 0 ]]; then
  echo "--no-build: now run in $checkout:"
  echo "  ${command_line[*]}"
  exit 0
fi
echo "note: tf_ctr_ops targets TensorFlow 2.21; this builds against the TensorFlow that $checkout/WORKSPACE pins"
cd "$checkout"
"${command_line[@]}"
echo "built $checkout/bazel-bin/tensorflow_serving/model_servers/tensorflow_model_server"
