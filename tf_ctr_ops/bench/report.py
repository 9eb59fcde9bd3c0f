"""The benchmark's outputs: terminal tables, Markdown and the plot.

Reads the results the suites return (see `harness`); imports no suite.
"""

import math

import numpy as np

from tf_ctr_ops.bench.harness import POOLED_BYTES, BenchmarkError, Shape

# ---------------------------------------------------------------------------
# Terminal


def print_copy(copy, cfg):
    """The copy-bandwidth line a suite prints before its cases."""
    parts = ", ".join(f"{k} {v:.1f}" for k, v in copy.items() if k.endswith(("thread", "threads")))
    print(f"memory copy: {copy['best_GBps']:.1f} GB/s read+write ({copy['method']}"
          f"{'; ' + parts if parts else ''}; {cfg.copy_mb} MiB)")
    print()


def fmt_t(s):
    """A timing summary as "median [p10-p90]" in ms."""
    return f"{s['median_ms']:.3g} [{s['p10_ms']:.3g}-{s['p90_ms']:.3g}]"


def _others(c):
    """References beyond native a case was timed against (Tensor-table tf.nn, separate calls, ...)."""
    skip = {"fused", "native", "core", "GBps", "max_abs_err", "copy_on_read"}
    out = []
    for k, v in c.items():
        if k not in skip and isinstance(v, dict) and "median_ms" in v:
            out.append(f"{k} {v['median_ms']:.3g} ({v['median_ms'] / c['fused']['median_ms']:.2f}x)")
    return ", ".join(out)


def print_table(result):
    """The terminal table of any suite whose cases have fused/native timings."""
    cols = [("case", 20, "<"), ("shape", 26, "<"), ("fused ms [p10-p90]", 22, ">"),
            ("native ms [p10-p90]", 22, ">"), ("speedup", 8, ">"), ("core ms", 8, ">"), ("TF ovh", 7, ">"),
            ("GB/s", 6, ">"), ("/copy", 5, ">"), ("others ms (fused speedup)", 0, "<")]
    line = lambda vals: " ".join(f"{v:{a}{w}}" for v, (_, w, a) in zip(vals, cols)).rstrip()  # noqa: E731
    hdr = line([c[0] for c in cols])
    print(hdr)
    print("-" * len(hdr))
    for c in result.get("cases", []):
        if "fused" not in c or "native" not in c:
            continue
        core = c.get("core")
        print(line([c["case"], c.get("shape", ""), fmt_t(c["fused"]), fmt_t(c["native"]),
                    f"{c['speedup']:.2f}x", f"{core['median_ms']:.3g}" if core else "-",
                    f"{c['tf_overhead_ms']:.2g}" if "tf_overhead_ms" in c else "-",
                    f"{c['GBps']['fused']:.3g}" if "GBps" in c else "-",
                    f"{c['frac_copy']:.2g}" if "frac_copy" in c else "-", _others(c)]))
    for s in result.get("skipped", []):
        print(f"skipped {s['shape']} {s['dist']}: {s['reason']}")


def speedup_text(speedup, need):
    """A speedup as "2.49x": two decimals, cut rather than rounded where a
    missed target would round up to it ("2.50x NOT MET" for 2.4996)."""
    if speedup < need and float(f"{speedup:.2f}") >= need:
        return f"{math.floor(round(speedup * 100, 6)) / 100:.2f}x"  # round first: 0.29 * 100 is 28.999...
    return f"{speedup:.2f}x"  # as the table prints it


def print_targets(result):
    print()
    for t in result.get("targets", []):
        verdict = "met" if t["met"] else "NOT MET"
        print(f"target {t['target']} >= {t['min_speedup']}x [{t['dist']}, {t.get('shape', '')}]: "
              f"{speedup_text(t['speedup'], t['min_speedup'])}  {verdict}")
    print()


# ---------------------------------------------------------------------------
# Markdown


def _all_cases(results):
    for name, res in results["suites"].items():
        for c in res.get("cases", []):
            if "fused" in c and "native" in c:
                yield name, c


def machine_line(results):
    env = results["env"]
    where = env.get("gpu_name") or f"{env['cpu_model']}, {env['nproc']} cores"
    load = env.get("foreign_cpu_load_during")
    load = f"; other processes used {100 * load:.0f}% of the CPUs during the run" if load is not None else ""
    return (f"Machine: {where} ({env['device']}); TensorFlow {env['tensorflow']}, tf_ctr_ops "
            f"{env['tf_ctr_ops']}; {results['date']}{load}.")


def _config_shape(config):
    """The shape a suite without per-case shapes ran at, from its config."""
    try:
        return Shape(config["batch"], config["vocab"], config["dim"], config["max_len"], "").label()
    except (TypeError, KeyError):
        return ""


def _bytes_legend(results):
    """What the GB/s column divides, per group of cases counting alike."""
    cases_by_rule = {}
    for _, c in _all_cases(results):
        if "GBps" in c:
            cases_by_rule.setdefault(c.get("bytes_counted", POOLED_BYTES), []).append(c["case"])
    if len(cases_by_rule) <= 1:
        return next(iter(cases_by_rule), POOLED_BYTES)
    return "; ".join(f"{rule} for {', '.join(cases)}" for rule, cases in cases_by_rule.items())


def markdown(results):
    """The results as a Markdown table, with a line naming the machine and the date."""
    head = ("| case | shape | fused ms | native ms | speedup | GB/s | fraction of copy bandwidth |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for name, c in _all_cases(results):
        shape = c.get("shape") or _config_shape(results["suites"][name].get("config"))
        if c.get("dist") and not c["case"].endswith(c["dist"]):
            shape = f"{shape} {c['dist']}"
        gbps = f"{c['GBps']['fused']:.3g}" if "GBps" in c else ""
        frac = f"{c['frac_copy']:.2g}" if "frac_copy" in c else ""
        rows.append(f"| {c['case']} | {shape} | {c['fused']['median_ms']:.3g} | {c['native']['median_ms']:.3g} "
                    f"| {c['speedup']:.2f}x | {gbps} | {frac} |")
    copies = ", ".join(f"{name} {res['copy_bandwidth']['best_GBps']:.1f}"
                       for name, res in results["suites"].items() if "copy_bandwidth" in res)
    legend = "Medians of repeated calls"
    if any("GBps" in c for _, c in _all_cases(results)):
        legend += f"; GB/s = bytes / fused time, the bytes counted as {_bytes_legend(results)}"
    if copies:  # a suite timing whole models (rewrite) counts no bytes and probes no copy
        legend += f"; copy bandwidth (GB/s, read + write, measured in the same run): {copies}"
    notes = [machine_line(results), legend + "."]
    targets = [f"- {t['target']} >= {t['min_speedup']}x [{t['dist']}, {t.get('shape', '')}]: "
               f"{speedup_text(t['speedup'], t['min_speedup'])}, {'met' if t['met'] else 'NOT MET'}"
               for res in results["suites"].values() for t in res.get("targets", [])]
    if targets:
        custom = any((res.get("config") or {}).get("grid") == "custom" for res in results["suites"].values())
        heading = ("Targets (stated for the headline shape), judged at the custom shape:" if custom
                   else "Targets, at the headline shape:")
        notes += ["", heading, ""] + targets
    return "\n".join([head, *rows, "", *notes]) + "\n"


# ---------------------------------------------------------------------------
# Plot


def _series(c):
    if "series" in c:
        return c["series"]
    dist = c.get("dist")
    return c["case"][: -len(dist) - 1] if dist and c["case"].endswith("/" + dist) else c["case"]


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise BenchmarkError("--plot needs matplotlib, which is not installed: pip install matplotlib "
                             "(or install tf-ctr-ops with its 'plot' extra: pip install 'tf-ctr-ops[plot]')") from None
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    return plt


def plot(results, path):
    """Speedup against batch size per op: geometric mean over the other axes, and their range.

    The headline cases are left out when grid cases exist: they are one other
    shape (V=1M, ~50 ids), and would make a bump at B=4096 that is no batch effect.
    """
    plt = require_matplotlib()
    from matplotlib.ticker import ScalarFormatter

    cases = [(name, c) for name, c in _all_cases(results) if "batch" in c]
    if any(not c.get("headline") for _, c in cases):
        cases = [(name, c) for name, c in cases if not c.get("headline")]
    series = {}
    for suite_name, c in cases:
        label = _series(c) if _series(c).startswith(suite_name) else f"{suite_name}: {_series(c)}"
        series.setdefault(label, {}).setdefault(c["batch"], []).append(c["speedup"])
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, by_batch in sorted(series.items()):
        xs = sorted(by_batch)
        mid = [float(np.exp(np.mean(np.log(by_batch[x])))) for x in xs]
        lo = [m - min(by_batch[x]) for m, x in zip(mid, xs)]
        hi = [max(by_batch[x]) - m for m, x in zip(mid, xs)]
        ax.errorbar(xs, mid, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup of the fused op over TF-native (x)")
    ax.set_title("tf-ctr-ops: speedup vs batch size per op (geometric mean over the other grid axes; "
                 "bars: their range)", fontsize=8)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, machine_line(results), fontsize=6)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
