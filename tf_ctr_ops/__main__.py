"""Command line: `tf-ctr-ops COMMAND ...` or `python -m tf_ctr_ops COMMAND ...`.

Commands:
  bench SUITE... [options]   op-level benchmarks (python -m tf_ctr_ops.bench --help)
  optimize SRC DST [--verify|--no-verify] [--inputs FILE] [--report REPORT.json] [--signature KEY ...]
                   [--serving-device cpu|gpu] [--disable PATTERN ...] [--merge-partitions]
                             rewrite a SavedModel's TF-native CTR subgraphs into the
                             fused ops, verified in a fresh process before DST is
                             written (python -m tf_ctr_ops optimize --help)
"""

import argparse
import contextlib
import signal
import subprocess
import sys
import threading


def optimize_main(argv):
    parser = argparse.ArgumentParser(
        prog="tf-ctr-ops optimize",
        description="Rewrite a SavedModel with CtrFusionOptimizer into a new SavedModel that serves the "
        "same signatures (load it after `import tf_ctr_ops`), and print what was fused, what was left "
        "alone and why, and the verification. DST is written only once the rewritten model has loaded and run "
        "in a fresh process (and matched the original's outputs, when verifying); otherwise the command "
        "exits with status 1 and DST is left as it was.")
    parser.add_argument("src", help="SavedModel directory to read")
    parser.add_argument("dst", help="SavedModel directory to write")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="run both models on the same inputs and compare outputs and latency (default: on); "
                        "it fails when no inputs the original accepts are found")
    parser.add_argument("--inputs", metavar="FILE",
                        help="inputs to verify on: an .npz of the signature's inputs (named INPUT or "
                        "SIGNATURE/INPUT), or a TFRecord file of serialized tf.Examples for a signature whose "
                        "one input is such a string; default: synthesized from the graph (its vocabularies "
                        "and ParseExample spec)")
    parser.add_argument("--report", metavar="REPORT.json", help="also write the full report as JSON")
    parser.add_argument("--signature", metavar="KEY", nargs="+", action="extend", dest="signatures",
                        help="rewrite only these signatures (others are copied unchanged); default all")
    parser.add_argument("--serving-device", choices=("cpu", "gpu"), default=None,
                        help="where DST will be served: 'cpu' reads string inputs in place (no pack copy) "
                        "and fuses vocabulary lookups (CPU-only ops); default: a model that serves on either")
    parser.add_argument("--disable", metavar="PATTERN", nargs="+", action="extend", default=[],
                        help="patterns not to run, as the report names them (say, vocab_lookup): the subgraphs "
                        "they fuse stay native while the others fuse")
    parser.add_argument("--merge-partitions", action="store_true",
                        help="merge a TF2 model's partitioned tables (lists of variables read with "
                        "partition_strategy) into one variable each: a copy made now, which writes, restored "
                        "checkpoints and a newer export's variables/ do not reach; for a model served as exported")
    args = parser.parse_args(argv)

    if args.inputs and not args.verify:
        parser.error("--inputs is for verification: drop --no-verify")
    from tf_ctr_ops import _errors

    if args.report:  # checked now, not once the model is rewritten
        why = _report_clash(args) or _errors.unwritable(args.report)
        if why:
            parser.error(f"--report {why}")

    import tensorflow as tf
    from google.protobuf.message import DecodeError

    from tf_ctr_ops import rewrite

    unknown = sorted(set(args.disable) - set(rewrite.pattern_names()))
    if unknown:
        parser.error(f"--disable: unknown pattern(s) {', '.join(unknown)}; the patterns are "
                     f"{', '.join(rewrite.pattern_names())}")
    try:
        with _exiting_on_signals(rewrite.exit_on_signal):  # a kill removes the temporary models beside DST
            report = rewrite.optimize_saved_model(args.src, args.dst, signature_keys=args.signatures,
                                                  verify=args.verify, serving_device=args.serving_device,
                                                  inputs_file=args.inputs, disabled_patterns=args.disable,
                                                  merge_partitions=args.merge_partitions)
    except (rewrite.RewriteError, ValueError) as e:
        print(f"tf-ctr-ops optimize: error: {e}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as e:
        print(f"tf-ctr-ops optimize: error: a model's check in a fresh process ran past {e.timeout:g} s; DST is "
              "left as it was", file=sys.stderr)
        return 1
    except (OSError, DecodeError, tf.errors.OpError) as e:  # a SavedModel TF cannot read, a DST not writable
        print(f"tf-ctr-ops optimize: error: {_errors.summary(e)}", file=sys.stderr)
        return 1
    print(report.summary())
    if args.report:
        try:
            with open(args.report, "w") as f:
                f.write(report.to_json() + "\n")
        except OSError as e:
            print(f"tf-ctr-ops optimize: error: the report was not written: {_errors.summary(e)}", file=sys.stderr)
            return 1
    return 0 if report.ok else 1


@contextlib.contextmanager
def _exiting_on_signals(handler):
    """SIGTERM and SIGINT handled by `handler` within, then as before (the
    command may run inside another program's process: the tests')."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    # A signal ignored since the start (SIGINT in a shell's background job) stays ignored.
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _report_clash(args):
    """Why the report would overwrite a file the command reads or writes, or ""."""
    from tf_ctr_ops import _errors

    if _errors.same_path(args.report, args.dst):  # DST is still to be written as a folder
        return f"{args.report} is DST: give the report a file name of its own"
    for what, folder in (("DST", args.dst), ("SRC", args.src)):
        if _errors.inside(args.report, folder):
            return f"{args.report} lies inside {what}, whose files it would overwrite"
    if args.inputs and _errors.same_path(args.report, args.inputs):
        return f"{args.report} is the --inputs file"
    for place in (args.dst, args.src, args.inputs):
        same = place and _errors.same_file_in(args.report, place)
        if same:
            return f"{args.report} is {same} (through a link), which it would write"
    return ""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from tf_ctr_ops import bench

        try:
            bench.main(rest, prog="tf-ctr-ops bench")
        except bench.BenchmarkError as e:
            print(f"tf-ctr-ops bench: error: {e}", file=sys.stderr)
            return 2
        return 0
    if command == "optimize":
        return optimize_main(rest)
    print(f"tf-ctr-ops: unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
