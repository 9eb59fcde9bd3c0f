"""Rewrite any SavedModel's TF-native CTR subgraphs into tf-ctr-ops' fused ops.

    python examples/optimize_saved_model.py model/                 # writes model_ctr_fused/
    python examples/optimize_saved_model.py model/ model_fused/ --report report.json

The Python-API twin of `tf-ctr-ops optimize`: it calls
`tf_ctr_ops.rewrite.optimize_saved_model`, which optimizes every signature
with CtrFusionOptimizer, writes a SavedModel serving the same signatures,
runs both models on the same inputs and compares them, and prints the
report: per signature, each fused subgraph, each candidate left alone and
why, the op counts before and after, and the verification. It exits with 1
when the rewritten model does not reproduce the original.

To serve the result, `import tf_ctr_ops` before `tf.saved_model.load`: the
fused ops live in its library.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402

from tf_ctr_ops import rewrite  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", metavar="PATH", help="SavedModel directory to rewrite")
    parser.add_argument("dst", metavar="DST", nargs="?", help="where to write the rewritten SavedModel "
                        "(default: PATH_ctr_fused beside it)")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip running both models on synthesized inputs")
    parser.add_argument("--signature", metavar="KEY", action="append", dest="signatures",
                        help="rewrite only this signature (repeatable); others are copied unchanged")
    parser.add_argument("--report", metavar="REPORT.json", help="also write the full report as JSON")
    args = parser.parse_args(argv)
    report_dir = os.path.dirname(os.path.abspath(args.report or "."))
    if args.report and (os.path.isdir(args.report) or not os.access(report_dir, os.W_OK)):
        parser.error(f"--report {args.report} cannot be written")  # now, not once DST is written
    return args


def main(argv=None):
    args = parse_args(argv)
    # Through abspath: a SRC of "." gives ../NAME_ctr_fused, not ./._ctr_fused inside it.
    dst = args.dst or os.path.relpath(os.path.abspath(args.src) + "_ctr_fused")
    try:
        report = rewrite.optimize_saved_model(args.src, dst, signature_keys=args.signatures, verify=args.verify)
    except (rewrite.RewriteError, ValueError) as e:  # nothing was written to dst (a bad src or dst: ValueError)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (OSError, DecodeError, tf.errors.OpError) as e:  # a SavedModel TF cannot read, a DST not writable
        print(f"error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    print(report.summary())
    if args.report:
        with open(args.report, "w") as f:
            f.write(report.to_json() + "\n")
    fused = rewrite.fused_subgraph_count(report.matches)
    print(f"wrote {dst}: {fused} subgraph(s) fused, {rewrite.left_alone_count(report.skips)} left alone"
          + ("" if report.ok else "; the rewritten model does NOT reproduce the original"))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
