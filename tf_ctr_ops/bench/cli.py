"""The command line of the benchmarks: `python -m tf_ctr_ops.bench SUITE... [options]`
(or `tf-ctr-ops bench ...`).

`main(argv)` runs the suites in one process and returns their results, so
tests call it directly. On import, every suite module of this package
(`tf_ctr_ops/bench/*.py` but harness, report, cli and __main__) is imported,
and their `@suite` decorators register their suites in `harness.SUITES`: a
suite registers itself by living there.
"""

import argparse
import contextlib
import dataclasses
import datetime
import importlib
import json
import os
import pkgutil
import sys
import time

import numpy as np

from tf_ctr_ops import _errors
from tf_ctr_ops.bench import harness, models
from tf_ctr_ops.bench.harness import (GRIDS, BarAwareStream, Config, ForeignLoad, Progress, duration, environment,
                                      foreign_load_probe, headline_shapes, print_environment, progress,
                                      progress_label, require_gpu, showing_progress, warn_foreign_load)
from tf_ctr_ops.bench.report import markdown, plot, require_matplotlib

DESCRIPTION = "Benchmarks of the fused tf-ctr-ops kernels against the TF-native graphs they replace."

# Modules of this package that hold no suite.
NOT_SUITE_MODULES = frozenset({"__main__", "cli", "harness", "report"})


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o)}")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def parse_args(argv=None, prog="python -m tf_ctr_ops.bench"):
    # harness.SUITES, read when called: the suites registered by then (tests may swap the registry).
    suites = harness.SUITES
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                epilog="Shapes: --grid picks them; any of --batch/--vocab/--dim/--max-len "
                                       "runs one custom shape instead (the rest from the headline).")
    p.add_argument("suites", nargs="+", choices=sorted(suites) + ["all"],
                   help="suites to run, in order; all: every registered suite")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where both graphs and their tables live (gpu: '/GPU:0')")
    p.add_argument("--quick", action="store_true",
                   help="few repeats, a small copy probe and, unless --grid says otherwise, the quick grid")
    p.add_argument("--grid", choices=sorted(GRIDS),
                   help="headline (default without --quick): only the headline shape; quick (default "
                        "with --quick): it and a representative subset; full: it and the whole grid")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE ('-': stdout, "
                                                  "and everything else to stderr)")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown table of the results to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="also plot speedup against batch size per op "
                                                      "(needs matplotlib)")
    d = Config()
    p.add_argument("--batch", type=_positive_int, help=f"custom shape: batch (headline {d.batch})")
    p.add_argument("--vocab", type=_positive_int, help=f"custom shape: table rows (headline {d.vocab})")
    p.add_argument("--dim", type=_positive_int, help=f"custom shape: embedding dim (headline {d.dim})")
    p.add_argument("--max-len", type=_positive_int, help=f"custom shape: ids per row are uniform in [1, MAX_LEN] "
                                               f"(headline {d.max_len})")
    p.add_argument("--seed", type=_non_negative_int, default=d.seed)
    p.add_argument("--runs", type=_positive_int, default=None,
                   help=f"timed calls per callable, rounded up to whole interleaved blocks of {d.block} "
                        f"(default {d.runs}; at least {d.min_runs}, else ~{d.budget_s:g} s per callable)")
    p.add_argument("--copy-mb", type=_positive_int, default=None, help=f"copy-probe array size (default {d.copy_mb})")
    p.add_argument("--model", choices=models.MODELS, default="",
                   help="rewrite suite: a real model style instead of its Criteo model (see tf_ctr_ops/bench/models.py)")
    p.add_argument("--features", type=_positive_int, default=0,
                   help="rewrite suite: time the optimizer alone on its model scaled to 26 .. FEATURES features")
    args = p.parse_args(argv)
    if 0 < args.features < 26:
        p.error(f"--features must be at least 26, the rewrite suite's model's own count; got {args.features}")
    if args.model and args.features:
        # Each picks what the rewrite suite runs; neither scales the other.
        p.error("--model and --features choose different rewrite runs: give one of them")
    for option, given in (("--model", args.model), ("--features", args.features)):
        if given and not {"rewrite", "all"} & set(args.suites):
            p.error(f"{option} is an option of the rewrite suite, which is not among the suites run")
    if "all" in args.suites:
        order = harness.SUITE_ORDER
        args.suites = sorted(suites, key=lambda n: (order.index(n) if n in order else len(order), n))
    return args


def config_from_args(args):
    custom = {k: v for k, v in (("batch", args.batch), ("vocab", args.vocab), ("dim", args.dim),
                                ("max_len", args.max_len)) if v is not None}
    cfg = Config(seed=args.seed, device="/GPU:0" if args.device == "gpu" else "/CPU:0", model=args.model,
                 features=args.features, **custom)
    if args.quick:
        cfg.quicken()
    if custom:
        cfg.grid = "custom"
    else:
        cfg.grid = args.grid or ("quick" if args.quick else "headline")
    cfg.shapes = tuple(headline_shapes(cfg.batch, cfg.vocab, cfg.dim, cfg.max_len)
                       + ([] if custom else GRIDS[cfg.grid]()))
    if args.runs is not None:
        cfg.runs = args.runs
        cfg.min_runs = min(cfg.min_runs, args.runs)
    if args.copy_mb is not None:
        cfg.copy_mb = args.copy_mb
    return cfg


def estimate(cfg, suites):
    """(progress steps, rough seconds, suites without an estimate) of running `suites`."""
    steps, seconds, unknown = 0, 0.0, []
    for name in suites:
        if name in harness.ESTIMATES:
            n, s = harness.ESTIMATES[name](cfg)
            steps, seconds = steps + n, seconds + s
        else:
            steps, unknown = steps + 1, unknown + [name]
    return steps, seconds, unknown


def main(argv=None, prog="python -m tf_ctr_ops.bench"):
    """Runs the suites named in argv; returns {"env": ..., "suites": {name: result}, ...}."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = parse_args(argv, prog)
    cfg = config_from_args(args)
    # Fail before the long part, not after it.
    for path, what in ((args.json, "--json"), (args.markdown, "--markdown"), (args.plot, "--plot")):
        why = "" if path in (None, "-") else _errors.unwritable(path)
        if why:
            raise harness.BenchmarkError(f"{what} {why}")
    if args.plot:
        require_matplotlib()
    if cfg.on_gpu:
        require_gpu()
    json_to_stdout = args.json == "-"
    real_stdout = sys.stdout
    steps, seconds, unknown = estimate(cfg, args.suites)
    bar = Progress(steps, enabled=False if json_to_stdout else None)
    out = sys.stderr if json_to_stdout else BarAwareStream(sys.stdout, bar)
    with showing_progress(bar), contextlib.redirect_stdout(out):
        results = _run(args, cfg, bar, seconds, unknown, argv)
    with contextlib.redirect_stdout(sys.stderr if json_to_stdout else real_stdout):
        try:
            _write_outputs(args, results, real_stdout)
        except OSError as e:  # checked before the run, but the disk may have filled or the folder gone since
            raise harness.BenchmarkError(f"the results were not written: {_errors.summary(e)}") from e
    return results


def _run(args, cfg, bar, seconds, unknown, argv):
    env = environment(cfg.device)
    env["foreign_cpu_load_before"] = foreign_load_probe()
    print_environment(env)
    warn_foreign_load("just before the run", env["foreign_cpu_load_before"])
    shapes = cfg.shape_list()
    print(f"suites {' '.join(args.suites)}: grid {cfg.grid}, {len(shapes)} shape(s) on {cfg.device}"
          f"{' (quick repeats)' if cfg.quick else ''}; estimated {duration(seconds)} (rough)"
          f"{' plus ' + ', '.join(unknown) + ' (no estimate)' if unknown else ''}\n")
    t0 = time.perf_counter()
    load = ForeignLoad()
    results = {"env": env, "argv": list(sys.argv[1:] if argv is None else argv), "suites": {},
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    for name in args.suites:
        progress_label(name)
        before = bar.done
        results["suites"][name] = harness.SUITES[name](dataclasses.replace(cfg))
        if name not in harness.ESTIMATES and bar.done == before:
            progress(name)
    results["wall_s"] = time.perf_counter() - t0
    env["foreign_cpu_load_during"] = load.fraction()
    bar.clear()
    warn_foreign_load("during the run", env["foreign_cpu_load_during"])
    during = env["foreign_cpu_load_during"]
    print(f"done in {results['wall_s']:.1f}s"
          + (f"; other processes used {100 * during:.1f}% of the CPUs meanwhile" if during is not None else ""))
    return results


def _write_outputs(args, results, stdout):
    if args.json == "-":
        json.dump(results, stdout, indent=2, default=_json_default)
        stdout.write("\n")
        stdout.flush()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=_json_default)
        print(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
        print(f"wrote {args.markdown}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")


def import_suite_modules():
    """Imports the suite modules of this package, whose @suite decorators register their suites in harness."""
    package = __name__.rpartition(".")[0]
    found = pkgutil.iter_modules([os.path.dirname(os.path.abspath(__file__))])
    for mod in sorted(found, key=lambda m: m.name):
        if mod.name not in NOT_SUITE_MODULES:
            importlib.import_module(f"{package}.{mod.name}")


import_suite_modules()


def run(argv=None):
    """`python -m tf_ctr_ops.bench`: main, with a BenchmarkError as a one-line error and exit status 2."""
    try:
        main(argv)
    except harness.BenchmarkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
