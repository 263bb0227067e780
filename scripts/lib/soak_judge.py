#!/usr/bin/env python3
"""The soak's arithmetic (scripts/soak): tallies of the traffic senders, and the verdict on the
daemon's resource samples.

  soak_judge.py tally DIR
      DIR holds one reefgen `send --json` output per chunk (*.txt, the JSON object on the last
      line). Prints `chunks=N sent=N responses=N ok=N bad=N errors=N lost=N p50_ms=X p99_ms=X`
      where errors are the bad answers that were the appliance's own error replies (a shed
      request; the rest of bad were wrong results) and p50/p99 are the medians over the chunks
      of each chunk's percentile.

  soak_judge.py judge SAMPLES WARMUP_S TOTAL_S RSS_TOL_PCT MBUF_TOL
      SAMPLES: lines `t_s rss_kb fds threads rx_mbufs_in_use tx_mbufs_in_use`. The warm-up
      window is t <= WARMUP_S, the last third t >= 2/3 TOTAL_S. Fails (exit 1, one line per
      reason) when
        - RSS: the last third's median is above the warm-up's median by more than RSS_TOL_PCT;
        - fds or threads: every sample of the last third is above every sample of the warm-up
          (a level that rose and stayed; a count that merely wobbles by one, such as a thread
          of the IF the control loop adds and removes, does not trip it);
        - mbufs in use (rx + tx): the last third's median is above the warm-up's median by
          more than MBUF_TOL (in-flight traffic makes single samples noisy; a leak climbs).
      The last line printed is `rss_growth_pct=A` (RSS from the last warm-up sample to the last
      sample, one decimal).
"""
import json
import pathlib
import statistics
import sys


def tally(directory: str) -> int:
    totals = {"chunks": 0, "sent": 0, "responses": 0, "ok": 0, "bad": 0, "errors": 0, "lost": 0}
    p50, p99 = [], []
    for path in sorted(pathlib.Path(directory).glob("*.txt")):
        lines = path.read_text(errors="replace").strip().splitlines()
        if not lines:
            continue  # a chunk still running
        try:
            r = json.loads(lines[-1])
        except json.JSONDecodeError:
            continue
        totals["chunks"] += 1
        for k in ("sent", "responses", "ok", "bad", "errors", "lost"):
            totals[k] += int(r.get(k, 0))
        if r.get("responses"):
            p50.append(r["p50_us"] / 1000)
            p99.append(r["p99_us"] / 1000)
    fields = " ".join(f"{k}={v}" for k, v in totals.items())
    med = lambda xs: f"{statistics.median(xs):.1f}" if xs else "nan"
    print(f"{fields} p50_ms={med(p50)} p99_ms={med(p99)}")
    return 0


def judge(samples_path: str, warmup_s: float, total_s: float, rss_tol_pct: float, mbuf_tol: float) -> int:
    rows = []
    for line in pathlib.Path(samples_path).read_text().splitlines():
        parts = line.split()
        if len(parts) == 6:
            rows.append([float(p) for p in parts])
    warm = [r for r in rows if r[0] <= warmup_s]
    last = [r for r in rows if r[0] >= total_s * 2 / 3]
    if len(warm) < 2 or len(last) < 2:
        print(f"too few samples to judge: {len(warm)} in the warm-up, {len(last)} in the last third")
        print("rss_growth_pct=nan")
        return 1
    failures = []
    col = lambda rs, i: [r[i] for r in rs]

    rss_warm, rss_last = statistics.median(col(warm, 1)), statistics.median(col(last, 1))
    rss_pct = 100 * (rss_last - rss_warm) / rss_warm
    print(f"RSS median: warm-up {rss_warm / 1024:.1f} MiB, last third {rss_last / 1024:.1f} MiB "
          f"({rss_pct:+.1f}%, tolerance {rss_tol_pct:g}%)")
    if rss_pct > rss_tol_pct:
        failures.append(f"RSS grew: last third's median {rss_pct:+.1f}% over the warm-up's (tolerance {rss_tol_pct:g}%)")

    for i, what in ((2, "fds"), (3, "threads")):
        lo_last, hi_warm = min(col(last, i)), max(col(warm, i))
        print(f"{what}: warm-up {min(col(warm, i)):.0f}..{hi_warm:.0f}, last third {lo_last:.0f}..{max(col(last, i)):.0f}")
        if lo_last > hi_warm:
            failures.append(f"{what} grew: every sample of the last third ({lo_last:.0f} or more) is above the warm-up's maximum ({hi_warm:.0f})")

    mb_warm = statistics.median([r[4] + r[5] for r in warm])
    mb_last = statistics.median([r[4] + r[5] for r in last])
    print(f"mbufs in use (rx + tx) median: warm-up {mb_warm:.0f}, last third {mb_last:.0f} (tolerance +{mbuf_tol:g})")
    if mb_last > mb_warm + mbuf_tol:
        failures.append(f"mbufs in use grew: last third's median {mb_last:.0f}, warm-up's {mb_warm:.0f} (tolerance +{mbuf_tol:g})")

    for f in failures:
        print("FAIL: " + f)
    at_warm_end = warm[-1][1]
    print(f"rss_growth_pct={100 * (rows[-1][1] - at_warm_end) / at_warm_end:.1f}")
    return 1 if failures else 0


def main(argv) -> int:
    if len(argv) == 3 and argv[1] == "tally":
        return tally(argv[2])
    if len(argv) == 7 and argv[1] == "judge":
        try:
            numbers = [float(a) for a in argv[3:]]
        except ValueError:
            numbers = None
        if numbers:
            return judge(argv[2], *numbers)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
