#!/usr/bin/env bash
# scripts/lib/soak_judge.py, the soak's verdict on the daemon's resource samples and its tally
# of the senders' reports, on made-up series: a flat run passes; RSS, fds, threads or mbufs that
# climb fail, each naming what grew; a count that wobbles by one passes; too few samples fail.
set -euo pipefail
judge="$(dirname "$0")/../scripts/lib/soak_judge.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# series NAME: 40 samples over 120 s (warm-up 30 s, last third from 80 s); a column is a
# python expression in i (0..39), t (seconds) and r (a fixed pseudo-random jitter in 0..1).
series() {
  python3 - "$tmp/$1" "$2" "$3" "$4" "$5" "$6" <<'PY'
import random, sys
path, rss, fds, threads, rx, tx = sys.argv[1:]
rng = random.Random(7)
with open(path, "w") as f:
    for i in range(40):
        t, r = 3 * (i + 1), rng.random()
        v = [eval(e, {"i": i, "t": t, "r": r}) for e in (rss, fds, threads, rx, tx)]
        f.write(f"{t} {int(v[0])} {int(v[1])} {int(v[2])} {int(v[3])} {int(v[4])}\n")
PY
}
# expect NAME STATUS [TEXT]: the verdict's exit status, and TEXT among its lines.
expect() {
  local rc=0
  python3 "$judge" judge "$tmp/$1" 30 120 5 512 > "$tmp/$1.out" || rc=$?
  [ "$rc" = "$2" ] || { cat "$tmp/$1.out"; fail "$1: exit $rc, expected $2"; }
  [ -z "${3:-}" ] || grep -q "$3" "$tmp/$1.out" || { cat "$tmp/$1.out"; fail "$1: no line with '$3'"; }
  tail -n 1 "$tmp/$1.out" | grep -Eq '^rss_growth_pct=(-?[0-9]+\.[0-9]|nan)$' \
    || { cat "$tmp/$1.out"; fail "$1: the last line is not rss_growth_pct=A"; }
  echo "$1: $(tail -n 1 "$tmp/$1.out") ${3:+($3)}"
}

# Steady, with noise: RSS within 1%, mbufs in flight jumping between 0 and 400.
series flat '225000 + 2000 * r' '22' '12' '400 * r' '0'
expect flat 0
grep -q '^rss_growth_pct=' "$tmp/flat.out" || fail "flat: no rss_growth_pct"
# RSS climbing 1 MiB every sample: +40 MiB over the run.
series rss_leak '225000 + 1024 * i' '22' '12' '48' '0'
expect rss_leak 1 'FAIL: RSS grew'
# A slow climb below the tolerance passes.
series rss_slow '225000 + 100 * i' '22' '12' '48' '0'
expect rss_slow 0
# One fd per sample.
series fd_leak '225000' '22 + i' '12' '48' '0'
expect fd_leak 1 'FAIL: fds grew'
# A thread that comes and goes (an IF added and removed) is not growth.
series thread_wobble '225000' '22' '12 + (i % 2)' '48' '0'
expect thread_wobble 0
series thread_leak '225000' '22' '12 + i // 4' '48' '0'
expect thread_leak 1 'FAIL: threads grew'
# Mbufs that never come back: 40 more held each sample.
series mbuf_leak '225000' '22' '12' '48 + 40 * i' '0'
expect mbuf_leak 1 'FAIL: mbufs in use grew'
series tx_leak '225000' '22' '12' '48' '30 * i'
expect tx_leak 1 'FAIL: mbufs in use grew'
# The growth figure: from the last warm-up sample (t=30) to the last (t=120).
series growth '100000 + (1000 * (i - 9) if i > 9 else 0)' '22' '12' '0' '0'
expect growth 1 'rss_growth_pct=30.0'
head -n 3 "$tmp/flat" > "$tmp/short"
expect short 1 'too few samples'

# tally: sums over the chunks; a chunk still running (empty) or cut off is skipped.
mkdir "$tmp/chunks"
echo '{"sent":100,"responses":99,"ok":97,"bad":2,"lost":1,"p50_us":1500,"p90_us":2000,"p99_us":6000,"p999_us":7000,"errors":1}' > "$tmp/chunks/0.txt"
printf 'a log line\n{"sent":50,"responses":50,"ok":50,"bad":0,"lost":0,"p50_us":2500,"p90_us":3000,"p99_us":8000,"p999_us":9000}\n' > "$tmp/chunks/1.txt"
: > "$tmp/chunks/2.txt"
echo '{"sent":' > "$tmp/chunks/3.txt"
got=$(python3 "$judge" tally "$tmp/chunks")
[ "$got" = "chunks=2 sent=150 responses=149 ok=147 bad=2 errors=1 lost=1 p50_ms=2.0 p99_ms=7.0" ] || fail "tally: $got"
echo "tally: $got"
echo "soak_judge: ok"
