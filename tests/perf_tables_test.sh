#!/bin/bash
# docs/PERF.md's generated tables (bench/perf_tables.py) are what docs/data/*.csv hold: the
# check passes on the checkout, fails naming the table when a CSV changes, a rewrite brings the
# page up to date, and a CSV without a column the table needs is refused naming the column.
#
#   tests/perf_tables_test.sh SOURCE_ROOT
set -euo pipefail
src=$1
script=$src/bench/perf_tables.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 "$script" --root "$src" --check || fail "docs/PERF.md's generated tables are stale: run bench/perf_tables.py"

mkdir -p "$tmp/docs"
cp "$src/docs/PERF.md" "$tmp/docs/"
cp -r "$src/docs/data" "$tmp/docs/"
# A re-run of preempt_bench that measured another reset p50 at 10 queued kernels.
sed -i -E '0,/^cpu,queued,reset,10,200,200,200,[0-9.]+,/s//cpu,queued,reset,10,200,200,200,31.4,/' "$tmp/docs/data/preempt.csv"
grep -q '^cpu,queued,reset,10,200,200,200,31.4,' "$tmp/docs/data/preempt.csv" || fail "could not edit the copy of preempt.csv"
set +e
python3 "$script" --root "$tmp" --check 2> "$tmp/err"; rc=$?
set -e
[ $rc = 1 ] || fail "--check on a changed CSV exited $rc, expected 1"
grep -q "table(s) preempt" "$tmp/err" || { cat "$tmp/err"; fail "--check does not name the stale table"; }
python3 "$script" --root "$tmp" | grep -q "preempt rewritten" || fail "the rewrite did not report the preempt table"
grep -q '^| queued | 10 | 200 | 31.4 |' "$tmp/docs/PERF.md" || fail "the rewritten table lacks the new figure"
python3 "$script" --root "$tmp" --check > /dev/null || fail "--check fails right after a rewrite"
cmp -s <(sed '/perf_tables: preempt/,/perf_tables: end/d' "$src/docs/PERF.md") \
       <(sed '/perf_tables: preempt/,/perf_tables: end/d' "$tmp/docs/PERF.md") || fail "the rewrite changed text outside the table"

# A CSV missing a column the table needs.
cut -d, -f1-8 "$src/docs/data/preempt.csv" > "$tmp/docs/data/preempt.csv"
set +e
python3 "$script" --root "$tmp" --check 2> "$tmp/err"; rc=$?
set -e
[ $rc = 2 ] || fail "a CSV without p99_us: exit $rc, expected 2"
grep -q "missing column 'p99_us'" "$tmp/err" || { cat "$tmp/err"; fail "the error does not name the column"; }
echo "perf_tables: ok"
