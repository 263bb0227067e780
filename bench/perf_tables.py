#!/usr/bin/env python3
"""The tables of docs/PERF.md that the benchmarks' CSV files (docs/data/) hold, generated.

    bench/perf_tables.py [--root DIR]           rewrite the generated tables in DIR/docs/PERF.md
    bench/perf_tables.py [--root DIR] --check   exit 1 (naming the table) when one is stale

A generated table sits between two markers in PERF.md:

    <!-- perf_tables: NAME from docs/data/FILE.csv; bench/perf_tables.py writes it, do not edit -->
    ...
    <!-- perf_tables: end -->

so re-running a benchmark with `--csv docs/data/FILE.csv` and then this script updates the page.
The readers and checks of bench/plot.py are shared: a missing file or column, or a value that is
not a number, is an error (exit 2) naming the file and the column.
"""
import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot import BadInput, read_csv, require, number  # noqa: E402


def fmt(v, digits=1):
    return f"{v:.{digits}f}"


def median_by(path, rows, key_columns, value_column):
    """{key tuple: median of value_column over the rows with that key} in first-seen order."""
    groups = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r[c] for c in key_columns), []).append(number(path, i, r, value_column))
    return {k: statistics.median(v) for k, v in groups.items()}


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def dataplane_table(path):
    """dataplane_bench --sweep --csv: both paths against the fragment size, median of rounds."""
    header, rows = read_csv(path)
    require(path, header, ["path", "frag_payload_bytes", "frags_per_request", "mpps"], "dataplane table")
    mpps = median_by(path, rows, ["path", "frag_payload_bytes"], "mpps")
    frags = {r["frag_payload_bytes"]: r["frags_per_request"] for r in rows}
    sizes = sorted({r["frag_payload_bytes"] for r in rows}, key=int)
    out = []
    for s in sizes:
        dpdk, sock = mpps.get(("dpdk", s)), mpps.get(("socket", s))
        ratio = fmt(dpdk / sock, 1) + "x" if dpdk and sock else "-"
        out.append([s, frags[s], fmt(dpdk, 2) if dpdk else "-", fmt(sock, 3) if sock else "-", ratio])
    return table(["fragment payload (B)", "fragments per request", "DPDK path Mpps/core", "socket path Mpps",
                  "ratio"], out)


def preempt_table(path):
    """preempt_bench --csv: reset against wait by queued BE kernels and by their length."""
    header, rows = read_csv(path)
    require(path, header, ["sweep", "mode", "queued_kernels", "kernel_us", "p50_us", "p99_us"], "preemption table")
    cells = {}
    for i, r in enumerate(rows):
        key = (r["sweep"], r["queued_kernels"], r["kernel_us"])
        cells.setdefault(key, {})[r["mode"]] = (number(path, i, r, "p50_us"), number(path, i, r, "p99_us"))
    out = []
    for (sweep, queued, us), modes in cells.items():
        row = [sweep, queued, us]
        for m in ("reset", "wait"):
            p = modes.get(m)
            row += [fmt(p[0]), fmt(p[1])] if p else ["-", "-"]
        out.append(row)
    return table(["sweep", "queued BE kernels", "kernel (us)", "reset p50 (us)", "reset p99", "wait p50",
                  "wait p99"], out)


def policies_table(path):
    """preempt_bench --csv-policies: each policy with 1 and 4 closed-loop BE clients."""
    header, rows = read_csv(path)
    require(path, header, ["policy", "restore", "be_clients", "rt_mean_us", "rt_p99_us", "tasks_per_s",
                           "reexecuted_kernels"], "policies table")
    cells, clients = {}, []
    for i, r in enumerate(rows):
        if r["be_clients"] not in clients:
            clients.append(r["be_clients"])
        cells.setdefault((r["policy"], r["restore"]), {})[r["be_clients"]] = [
            fmt(number(path, i, r, "rt_mean_us")), fmt(number(path, i, r, "rt_p99_us")),
            fmt(number(path, i, r, "tasks_per_s"), 0), str(int(number(path, i, r, "reexecuted_kernels")))]
    columns = ["RT mean (us)", "RT p99 (us)", "tasks/s", "kernels re-executed"]
    header_out = ["policy", "restore"] + [f"{c}, {n} BE" for c in columns for n in clients]
    out = []
    for (policy, restore), by_clients in cells.items():
        row = [policy, restore]
        for k in range(len(columns)):
            row += [by_clients[n][k] if n in by_clients else "-" for n in clients]
        out.append(row)
    return table(header_out, out)


def slab_table(path):
    """slab_bench --csv: each controller over the rounds (median)."""
    header, rows = read_csv(path)
    cols = ["policy", "converge_ms", "within_slo_req_s", "violation_pct", "mean_batch", "p99_ms"]
    require(path, header, cols, "batching table")
    policies = []
    for r in rows:
        if r["policy"] not in policies:
            policies.append(r["policy"])
    med = {c: median_by(path, rows, ["policy"], c) for c in cols[1:]}
    rounds = len({r.get("round") for r in rows})
    out = [[p, fmt(med["converge_ms"][(p,)]), fmt(med["within_slo_req_s"][(p,)]), fmt(med["violation_pct"][(p,)], 2),
            fmt(med["mean_batch"][(p,)], 2), fmt(med["p99_ms"][(p,)], 2)] for p in policies]
    return table([f"controller (median of {rounds} rounds)", "converge (ms)", "within-SLO req/s", "late %",
                  "mean batch", "p99 (ms)"], out)


TABLES = {"dataplane": dataplane_table, "preempt": preempt_table, "policies": policies_table, "slab": slab_table}
BEGIN = re.compile(r"^<!-- perf_tables: (\w+) from (docs/data/[\w.-]+\.csv); .* -->$")
END = "<!-- perf_tables: end -->"


def regenerate(root, text):
    """PERF.md's text with every marked table regenerated, and the names of those that changed."""
    lines, out, changed, i = text.split("\n"), [], [], 0
    while i < len(lines):
        out.append(lines[i])
        m = BEGIN.match(lines[i])
        i += 1
        if not m:
            continue
        name, csv_path = m.group(1), m.group(2)
        if name not in TABLES:
            raise BadInput(f"docs/PERF.md: unknown table '{name}' (known: {', '.join(TABLES)})")
        old = []
        while i < len(lines) and lines[i] != END:
            old.append(lines[i])
            i += 1
        if i == len(lines):
            raise BadInput(f"docs/PERF.md: table '{name}' has no '{END}' line")
        new = TABLES[name](os.path.join(root, csv_path))
        if new != old:
            changed.append(name)
        out += new
    return "\n".join(out), changed


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--check", action="store_true", help="fail when a generated table is stale; write nothing")
    args = ap.parse_args(argv)
    perf = os.path.join(args.root, "docs", "PERF.md")
    try:
        with open(perf) as f:
            text = f.read()
        new, changed = regenerate(args.root, text)
    except (BadInput, OSError) as e:
        print(f"perf_tables.py: {e}", file=sys.stderr)
        return 2
    if args.check:
        if changed:
            print(f"perf_tables.py: docs/PERF.md is stale in table(s) {', '.join(changed)}: run bench/perf_tables.py",
                  file=sys.stderr)
            return 1
        print(f"perf_tables.py: {len(re.findall(BEGIN.pattern, text, re.M))} tables up to date")
        return 0
    if changed:
        with open(perf, "w") as f:
            f.write(new)
    print(f"perf_tables.py: {', '.join(changed) if changed else 'nothing'} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
