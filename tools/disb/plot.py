#!/usr/bin/env python3
"""DISB's plots in the style of REEF Fig. 11: per workload, one bar per policy, for the RT
latency (mean, normalised to rt_only) and the overall throughput (normalised to rt_only).

    tools/disb/plot.py results.csv fig11.png
"""
import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = list(csv.DictReader(open(sys.argv[1])))
    if not rows:
        print("plot.py: no rows in " + sys.argv[1], file=sys.stderr)
        return 1
    workloads, policies = [], []
    for r in rows:
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
        if r["policy"] not in policies:
            policies.append(r["policy"])
    value = {(r["workload"], r["policy"]): r for r in rows}

    def get(w, p, key):
        r = value.get((w, p))
        try:
            v = float(r[key]) if r else math.nan
        except ValueError:
            v = math.nan
        return 0.0 if math.isnan(v) else v

    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(workloads) * 2), 4))
    width = 0.8 / len(policies)
    for ax, key, title in ((axes[0], "rt_mean_vs_rt_only", "RT latency (mean) / rt_only"),
                           (axes[1], "throughput_vs_rt_only", "Overall throughput / rt_only")):
        for i, p in enumerate(policies):
            xs = [k + (i - (len(policies) - 1) / 2) * width for k in range(len(workloads))]
            ax.bar(xs, [get(w, p, key) for w in workloads], width, label=p)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads)
        ax.set_title(title)
        ax.set_xlabel("workload")
    axes[0].legend(fontsize=8)
    fig.suptitle("DISB on reefline (normalised to rt_only)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
