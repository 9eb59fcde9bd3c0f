"""`python -m tf_ctr_ops.bench SUITE... [options]`: see tf_ctr_ops/bench/cli.py."""

import sys

from tf_ctr_ops.bench.cli import run

sys.exit(run())
