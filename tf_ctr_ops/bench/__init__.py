"""Benchmarks of the fused tf-ctr-ops kernels against the TF-native graphs they replace.

    python -m tf_ctr_ops.bench all --quick                  # every suite, a representative subset (< 2 min)
    python -m tf_ctr_ops.bench lookup --grid full           # the whole grid (long: prints an estimate)
    python -m tf_ctr_ops.bench string                       # only the headline shape and its targets
    python -m tf_ctr_ops.bench all --quick --json out.json --markdown out.md --plot out.png
    python -m tf_ctr_ops.bench lookup --device gpu          # the same on '/GPU:0'
    python -m tf_ctr_ops.bench rewrite --quick              # a TF-native SavedModel before / after rewriting

Every suite is a function registered in `harness.SUITES` (see `@suite`); it
takes a `Config` and returns a JSON-able dict with its cases and target
verdicts. The modules of this package:

    harness.py   Config, Shape and the grids, interleaved timing, agreement checks,
                 copy bandwidth, environment probes, progress, errors, the suite registry
    report.py    terminal tables, Markdown, the plot
    cli.py       the command line: parse_args, config_from_args, estimate, main
    lookup.py    the `lookup` suite
    strings.py   the `string` and `multi` suites
    rewrite.py   the `rewrite` suite (a TF-native SavedModel before / after rewriting)
    columns.py   the `columns` suite (crossed and bucketized feature columns)
    models.py    the real model styles of `rewrite --model NAME`

Suites import harness and report (and rewrite imports models), never the
reverse; harness imports no other module of this package, report only harness.
cli imports every other module of this package on import (tf_ctr_ops/bench/*.py
but harness, report, cli and __main__), so a suite registers itself by living
here. `main(argv)` runs suites in one process and returns their results, so
tests call it directly.

Shapes: `Config.shapes` lists the `Shape`s (batch, table rows, dim, ids per
row, id distribution) a suite runs. The grid is batch 1, 64, 1024, 8192 x
dim 8, 32, 128 x about 1, 10, 50 ids per row x uniform and Zipf ids x 1e5 and
1e7 table rows; tables that do not fit in the memory available are skipped,
with a note. The headline shape (B=4096, V=1e6, D=32, ~50 ids per row, both
distributions) carries the targets. `--grid full` runs it and the whole grid,
`--quick` runs it and a small subset of the grid with few repeats, and the
default (`--grid headline`) runs only it: the README Quickstart, and so CI, run
`tf-ctr-ops bench lookup`, which must stay short. `--batch/--vocab/--dim/--max-len`
replace the headline by one custom shape and run only that.

Method, for every case: the fused and the native graph are each one
`tf.function` (graph mode) over a `tf.Variable` table and id containers
(`tf.SparseTensor` / `tf.RaggedTensor`) passed as arguments, as in a training
step; fused and native get separate Variables holding the same values (see
`lookup.lookup_suite` for why). Before anything is timed, the fused output, the native
output and the framework-free core output (`tf_ctr_ops._core` on the same NumPy
data) are compared, and a mismatch aborts the suite: a benchmark never times a
wrong answer. Then, after warm-up calls, they are timed in alternating blocks of
back-to-back calls (`harness.time_interleaved`), each call forced to host with
`.numpy()` and timed with `time.perf_counter`; we report the median and the
p10/p90 of the calls. Effective bandwidth counts the table rows read
(nnz * D * itemsize) plus the output written (B * D * itemsize), against a
memory-copy bandwidth (read + write bytes / s) measured in the same run.
Targets are reported as met / not met; a missed target is not an error. The
share of CPU time other processes took during the run is reported too, since a
shared machine makes every figure slower and noisier.

On GPU (`--device gpu`) both graphs are placed on '/GPU:0' with their tables;
string inputs stay host strings, so the fused side packs them on the host and
copies the packed bytes to the device inside the timed call, as serving does.
The copy bandwidth is then the device's (an elementwise read + write of
copy_mb), and the core is not timed: it works on host arrays here.
"""


from tf_ctr_ops.bench.cli import config_from_args, estimate, main, parse_args
from tf_ctr_ops.bench.harness import (GRIDS, HEADLINE, SUITE_ORDER, SUITES, BenchmarkError, BenchmarkMismatch, Config,
                                      Progress, Shape, check_agreement, environment, full_grid, headline_shapes,
                                      mem_available_bytes, memory_shortfall, progress, progress_label, quick_grid,
                                      suite, summarize, time_interleaved, timed_entry)
from tf_ctr_ops.bench.report import markdown, plot, print_table, print_targets

__all__ = [
    "main", "parse_args", "config_from_args", "estimate",
    "BenchmarkError", "BenchmarkMismatch", "suite", "SUITES", "SUITE_ORDER",
    "Config", "Shape", "HEADLINE", "GRIDS", "headline_shapes", "full_grid", "quick_grid",
    "time_interleaved", "summarize", "check_agreement", "timed_entry",
    "Progress", "progress", "progress_label", "environment", "mem_available_bytes", "memory_shortfall",
    "markdown", "plot", "print_table", "print_targets",
]
