#!/usr/bin/env python3
"""Plots of the benchmarks' CSV files (docs/PERF.md links them).

    bench/plot.py dataplane CSV... --out PNG [--title MACHINE]
        dataplane_bench --sweep --csv: Mpps and image Gbit/s of the DPDK path and the socket
        path against the fragment size (median of the rounds, bars from min to max).
    bench/plot.py preemption CSV... --out PNG [--title MACHINE]
        preempt_bench --csv: preemption latency p50/p99, reset vs wait, against the number of
        queued BE kernels and against their length.
    bench/plot.py batching SERIES_CSV [SUMMARY_CSV] --out PNG [--title MACHINE] [--round N]
        slab_bench --csv-series (and --csv): batch size and per-batch worst latency over time
        for SLAB, AIMD and fixed in one round; with the summary, each policy's convergence time
        and the SLO.

Needs python3-matplotlib (Debian's /usr/bin/python3 has it when the package is installed).
Exit status 2 for bad input (a missing file or column, a value that is not a number), with a
message naming the file and the column.
"""
import argparse
import csv
import statistics
import sys


class BadInput(Exception):
    """Input the plot cannot be made from; the message names the file and what is wrong."""


# Columns each kind of CSV must have (the benchmarks write more).
DATAPLANE_COLUMNS = ["path", "frag_payload_bytes", "mpps", "payload_gbit_s"]
PREEMPTION_COLUMNS = ["sweep", "mode", "queued_kernels", "kernel_us", "p50_us", "p99_us"]
SERIES_COLUMNS = ["round", "policy", "time_ms", "batch_size", "worst_latency_ms", "target_batch"]
SUMMARY_COLUMNS = ["round", "policy", "converge_ms", "slo_ms"]

POLICY_COLORS = {"slab": "tab:blue", "aimd": "tab:orange", "fixed": "tab:green"}
PATH_STYLE = {"dpdk": ("tab:blue", "o", "DPDK path (1 lcore, in memory)"),
              "socket": ("tab:red", "s", "socket path (recvmmsg over loopback)")}
MODE_COLORS = {"reset": "tab:blue", "wait": "tab:red"}


def read_csv(path):
    """Rows of a CSV file as dicts, with its header; BadInput when unreadable or empty."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = reader.fieldnames or []
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from e
    except csv.Error as e:
        raise BadInput(f"{path}: not a CSV file: {e}") from e
    if not header:
        raise BadInput(f"{path}: empty file (no header row)")
    if not rows:
        raise BadInput(f"{path}: a header but no rows")
    return header, rows


def require(path, header, columns, what):
    for c in columns:
        if c not in header:
            raise BadInput(f"{path}: missing column '{c}' (a {what} needs: {', '.join(columns)})")


def number(path, row_index, row, column):
    """The column's value as a float; BadInput naming the file, line and column otherwise."""
    text = (row.get(column) or "").strip()
    try:
        return float(text)
    except ValueError:
        # Line numbers as an editor shows them: the header is line 1.
        raise BadInput(f"{path} line {row_index + 2}: column '{column}' is not a number: '{text}'") from None


def numbers(path, rows, column):
    return [number(path, i, r, column) for i, r in enumerate(rows)]


def titled(fig, what, machine):
    fig.suptitle(f"{what}\n{machine}" if machine else what, fontsize=11)


def plot_dataplane(plt, files, out, machine):
    # (path, fragment bytes) -> measurements over the rounds
    mpps, gbps = {}, {}
    for path in files:
        header, rows = read_csv(path)
        require(path, header, DATAPLANE_COLUMNS, "dataplane CSV (dataplane_bench --csv)")
        for i, r in enumerate(rows):
            key = (r["path"], number(path, i, r, "frag_payload_bytes"))
            mpps.setdefault(key, []).append(number(path, i, r, "mpps"))
            gbps.setdefault(key, []).append(number(path, i, r, "payload_gbit_s"))
    paths = [p for p in PATH_STYLE if any(k[0] == p for k in mpps)]
    paths += sorted({k[0] for k in mpps} - set(paths))
    fig, (ax_pps, ax_bps) = plt.subplots(1, 2, figsize=(11, 4.4))
    for name in paths:
        color, marker, label = PATH_STYLE.get(name, (None, "^", name))
        sizes = sorted(k[1] for k in mpps if k[0] == name)
        for ax, data in ((ax_pps, mpps), (ax_bps, gbps)):
            med = [statistics.median(data[(name, s)]) for s in sizes]
            low = [m - min(data[(name, s)]) for m, s in zip(med, sizes)]
            high = [max(data[(name, s)]) - m for m, s in zip(med, sizes)]
            ax.errorbar(sizes, med, yerr=[low, high], color=color, marker=marker, capsize=3, label=label)
    # The ratio the last line reports, at every size both paths ran.
    if "dpdk" in paths and "socket" in paths:
        for s in sorted(k[1] for k in mpps if k[0] == "dpdk"):
            if ("socket", s) in mpps:
                d, k = statistics.median(mpps[("dpdk", s)]), statistics.median(mpps[("socket", s)])
                if k > 0:
                    ax_pps.annotate(f"{d / k:.0f}x", (s, d), textcoords="offset points", xytext=(0, 8),
                                    ha="center", fontsize=8, color="tab:blue")
    for ax in (ax_pps, ax_bps):
        ax.set_yscale("log")
        ax.set_xlabel("fragment payload (bytes per datagram)")
        ax.grid(True, which="both", alpha=0.3)
    ax_pps.set_ylabel("Mpps (million packets/s, one receiving core)")
    ax_pps.set_title("Packets per second (label: DPDK / socket)", fontsize=10)
    ax_bps.set_ylabel("image payload delivered (Gbit/s)")
    ax_bps.set_title("Payload throughput", fontsize=10)
    ax_pps.legend(fontsize=8, loc="center right")
    titled(fig, "reefline data plane: parse + reassembly of 224x224x3 images, median of rounds (bars: min..max)",
           machine)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def plot_preemption(plt, files, out, machine):
    # (sweep, mode, x) -> (p50s, p99s)
    values = {}
    for path in files:
        header, rows = read_csv(path)
        require(path, header, PREEMPTION_COLUMNS, "preemption CSV (preempt_bench --csv)")
        for i, r in enumerate(rows):
            sweep = r["sweep"]
            if sweep not in ("queued", "length"):
                continue
            x = number(path, i, r, "queued_kernels" if sweep == "queued" else "kernel_us")
            p50, p99 = values.setdefault((sweep, r["mode"], x), ([], []))
            p50.append(number(path, i, r, "p50_us"))
            p99.append(number(path, i, r, "p99_us"))
    if not values:
        raise BadInput(f"{', '.join(files)}: no rows of sweep 'queued' or 'length' "
                       "(preempt_bench --quick measures only one configuration; run it without --quick)")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    panels = (("queued", "queued BE kernels (200 us each)", "vs the number of queued BE kernels"),
              ("length", "BE kernel length (us, 200 queued)", "vs the BE kernels' length"))
    for ax, (sweep, xlabel, title) in zip(axes, panels):
        modes = sorted({k[1] for k in values if k[0] == sweep})
        for mode in modes:
            xs = sorted(k[2] for k in values if k[0] == sweep and k[1] == mode)
            p50 = [statistics.median(values[(sweep, mode, x)][0]) for x in xs]
            p99 = [statistics.median(values[(sweep, mode, x)][1]) for x in xs]
            color = MODE_COLORS.get(mode)
            name = {"reset": "reset (REEF)", "wait": "wait (REEF-N)"}.get(mode, mode)
            ax.plot(xs, p99, color=color, marker="o", label=f"{name} p99")
            ax.plot(xs, p50, color=color, marker="o", linestyle="--", alpha=0.7, label=f"{name} p50")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if not modes:
            ax.text(0.5, 0.5, f"no '{sweep}' rows", transform=ax.transAxes, ha="center")
    axes[0].set_ylabel("preemption latency (us): RT arrival -> first RT block running")
    axes[0].legend(fontsize=8)
    titled(fig, "reefline preemption on the cpu device: reset-based vs wait-based", machine)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def plot_batching(plt, files, out, machine, round_wanted):
    series, summary = None, None
    for path in files:
        header, rows = read_csv(path)
        if "time_ms" in header:
            require(path, header, SERIES_COLUMNS, "batching series CSV (slab_bench --csv-series)")
            series = (path, rows)
        elif "converge_ms" in header:
            require(path, header, SUMMARY_COLUMNS, "batching summary CSV (slab_bench --csv)")
            summary = (path, rows)
        else:
            require(path, header, SERIES_COLUMNS, "batching series CSV (slab_bench --csv-series)")
    if series is None:
        raise BadInput("batching needs the per-batch series (slab_bench --csv-series FILE)")
    path, rows = series
    rounds = numbers(path, rows, "round")
    chosen = round_wanted if round_wanted is not None else min(rounds)
    picked = [(i, r) for i, (r, n) in enumerate(zip(rows, rounds)) if n == chosen]
    if not picked:
        raise BadInput(f"{path}: no batches of round {chosen:g} (rounds present: "
                       f"{', '.join(f'{n:g}' for n in sorted(set(rounds)))})")
    by_policy = {}
    for i, r in picked:
        by_policy.setdefault(r["policy"], []).append((number(path, i, r, "time_ms"), number(path, i, r, "batch_size"),
                                                      number(path, i, r, "target_batch"),
                                                      number(path, i, r, "worst_latency_ms")))
    converge, slo = {}, None
    if summary:
        spath, srows = summary
        for i, r in enumerate(srows):
            if number(spath, i, r, "round") == chosen:
                converge[r["policy"]] = number(spath, i, r, "converge_ms")
                slo = number(spath, i, r, "slo_ms")
    policies = [p for p in POLICY_COLORS if p in by_policy] + sorted(set(by_policy) - set(POLICY_COLORS))
    fig, (ax_b, ax_l) = plt.subplots(2, 1, figsize=(11, 6.6), sharex=True)
    window_ms = 100.0
    worst_seen = 0.0
    for p in policies:
        pts = sorted(by_policy[p])
        t = [x[0] for x in pts]
        color = POLICY_COLORS.get(p)
        label = p if p not in converge else f"{p} (converged at {converge[p]:.0f} ms)"
        # Batch sizes actually run as faint dots, the controller's target as a step line.
        ax_b.scatter(t, [x[1] for x in pts], s=3, color=color, alpha=0.15, linewidths=0, rasterized=True)
        ax_b.step(t, [x[2] for x in pts], where="post", color=color, linewidth=1.4, label=label)
        if p in converge:
            ax_b.axvline(converge[p], color=color, linestyle=":", linewidth=1)
        # Worst latency per batch: the 95th percentile in windows of 100 ms (thousands of
        # batches per policy would hide each other as points).
        bins = {}
        for time_ms, _, _, worst in pts:
            bins.setdefault(int(time_ms // window_ms), []).append(worst)
        centres = sorted(bins)
        p95 = [sorted(bins[b])[min(len(bins[b]) - 1, int(0.95 * len(bins[b])))] for b in centres]
        worst_seen = max([worst_seen] + p95)
        ax_l.plot([(b + 0.5) * window_ms for b in centres], p95, color=color, marker=".", markersize=3,
                  linewidth=1.2, label=p)
    if slo is not None:
        ax_l.axhline(slo, color="black", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
    if worst_seen > 0 and slo and worst_seen > 20 * slo:
        ax_l.set_yscale("log")  # an overload run: backlogs of seconds beside a tens-of-ms SLO
    ax_b.set_ylabel("batch size (requests)\nline: target, dots: batches run")
    ax_b.set_title(f"Batch size over time (round {chosen:g}; each policy starts from a new controller"
                   + ("; dotted: convergence" if converge else "") + ")", fontsize=10)
    ax_b.legend(fontsize=8, loc="lower right")
    ax_b.grid(True, alpha=0.3)
    ax_l.set_ylabel("worst request latency per batch (ms)\n95th percentile per 100 ms")
    ax_l.set_xlabel("time since the start of the run (ms)")
    ax_l.legend(fontsize=8, loc="upper right")
    ax_l.grid(True, which="both", alpha=0.3)
    titled(fig, "reefline batching: SLAB vs AIMD vs fixed on the same arrivals (slab_bench)", machine)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv):
    parser = argparse.ArgumentParser(
        prog="plot.py", description=__doc__.split("\n\n")[0],
        usage="plot.py {dataplane,preemption,batching} CSV... --out PNG [--title MACHINE] [--round N]")
    parser.add_argument("kind", choices=["dataplane", "preemption", "batching"])
    parser.add_argument("csv", nargs="+", help="CSV files written by the benchmark")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--title", default="", help="the machine (and date) the data comes from")
    parser.add_argument("--round", type=float, default=None, help="batching: the round to plot (default: the first)")
    args = parser.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display on the machines this runs on
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plot.py: matplotlib is missing for {sys.executable} (Debian: apt-get install python3-matplotlib, "
              "then run it with /usr/bin/python3)", file=sys.stderr)
        return 2
    try:
        if args.kind == "dataplane":
            plot_dataplane(plt, args.csv, args.out, args.title)
        elif args.kind == "preemption":
            plot_preemption(plt, args.csv, args.out, args.title)
        else:
            plot_batching(plt, args.csv, args.out, args.title, args.round)
    except BadInput as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"plot.py: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
