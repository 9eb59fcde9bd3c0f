"""Command line: `tf-ctr-ops COMMAND ...` or `python -m tf_ctr_ops COMMAND ...`.

Commands:
  bench SUITE... [options]   op-level benchmarks (python -m tf_ctr_ops.bench --help)
"""

import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from tf_ctr_ops import bench

        bench.main(rest)
        return 0
    print(f"tf-ctr-ops: unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
