#!/usr/bin/env bash
# bench_report: what the benchmarks share for reporting (bench/bench_report.h) and their plots
# (bench/plot.py).
# 1. A quick dataplane_bench run writes its results as CSV (the header, a row whose values
#    agree with the contract line, a quoted field holding a comma), prints a progress line per
#    step on stderr, and keeps its last stdout line in the contract's format.
# 2. An unwritable --csv fails before anything is measured, with an error naming the file.
# 3. plot.py draws the three plots (dataplane, preemption, batching) from CSV files written
#    here in the benchmarks' formats, and refuses a CSV that lacks a column (naming it), a
#    value that is not a number and a missing file.
# Skips (77) without python3-matplotlib for /usr/bin/python3.
#
#   tests/bench_report_test.sh DATAPLANE_BENCH PLOT_PY
set -euo pipefail
bench=$1
plot=$2
python=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -c 'import matplotlib' 2>/dev/null || { echo "skip: python3-matplotlib missing (apt-get install python3-matplotlib)"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

# --- 1. dataplane_bench --csv ----------------------------------------------------------------
"$bench" --quick --no-socket --csv "$tmp/dp.csv" > "$tmp/out.txt" 2> "$tmp/err.txt" \
  || { cat "$tmp/out.txt" "$tmp/err.txt"; fail "dataplane_bench --quick --no-socket --csv exited non-zero"; }
cat "$tmp/err.txt"
last=$(tail -n 1 "$tmp/out.txt")
echo "last line: $last"
[[ $last =~ ^mpps_per_core=[0-9]+\.[0-9]{3}\ socket_mpps=0\.000\ ratio=0\.00$ ]] \
  || fail "the last line is not 'mpps_per_core=X socket_mpps=0.000 ratio=0.00': $last"
grep -Eq '^dataplane_bench \[1/1\] DPDK path, 1024 B fragments: [0-9]+\.[0-9]{2} s \([0-9.]+ Mpps\)$' "$tmp/err.txt" \
  || fail "no progress line for the DPDK path on stderr"
grep -q 'Mpps' "$tmp/out.txt" || fail "the table is gone from stdout"
! grep -q '^dataplane_bench \[' "$tmp/out.txt" || fail "progress lines on stdout"
ls "$tmp"/dp.csv.tmp.* > /dev/null 2>&1 && fail "the temporary file was left behind"
# The description has a comma, so it is quoted (RFC 4180).
grep -q '^dpdk,"dpdk (1 lcore, in memory)",1,1024,' "$tmp/dp.csv" || { cat "$tmp/dp.csv"; fail "the row is not quoted as expected"; }
"$python" - "$tmp/dp.csv" "$last" <<'PY'
import csv, sys
path, last = sys.argv[1], sys.argv[2]
with open(path, newline="") as f:
    rows = list(csv.reader(f))
want = ["path", "path_description", "round", "frag_payload_bytes", "frame_bytes", "frags_per_request", "inflight",
        "seconds", "mpps", "ns_per_packet", "payload_gbit_s", "completed_requests", "cpu_share_pct",
        "offered_mpps", "kernel_lost_pct"]
assert rows[0] == want, f"header {rows[0]}, expected {want}"
assert len(rows) == 2, f"{len(rows) - 1} rows; --no-socket measures one path"
r = dict(zip(rows[0], rows[1]))
assert r["path"] == "dpdk" and r["path_description"] == "dpdk (1 lcore, in memory)", r
assert (r["frag_payload_bytes"], r["frame_bytes"], r["frags_per_request"], r["inflight"]) == ("1024", "1106", "147", "64"), r
mpps = float(r["mpps"])
contract = float(last.split()[0].split("=")[1])
assert mpps > 0 and abs(mpps - contract) < 0.0015, f"CSV says {mpps} Mpps, the last line {contract}"
# 150528 image bytes per 147 packets, 8 bits: the payload rate follows from the packet rate.
assert abs(float(r["payload_gbit_s"]) - mpps * 1e6 * 150528 / 147 * 8 / 1e9) < 0.02, r
assert int(r["completed_requests"]) > 0 and float(r["seconds"]) >= 0.5, r
assert r["offered_mpps"] == "" and r["kernel_lost_pct"] == "", "socket-only columns filled for the DPDK path"
print("dataplane_bench --csv: ok")
PY

# --- 2. an unwritable CSV ------------------------------------------------------------------
bad="$tmp/no/such/dir/dp.csv"
if "$bench" --quick --no-socket --csv "$bad" > "$tmp/bad_out.txt" 2> "$tmp/bad_err.txt"; then
  fail "dataplane_bench accepted --csv $bad"
fi
grep -qF "$bad" "$tmp/bad_err.txt" || { cat "$tmp/bad_err.txt"; fail "the error does not name $bad"; }
! grep -q 'DPDK path' "$tmp/bad_err.txt" || fail "it measured before finding that the CSV cannot be written"
echo "unwritable --csv: ok ($(head -n 1 "$tmp/bad_err.txt"))"

# --- 3. plot.py ----------------------------------------------------------------------------
# The benchmarks' formats, small and made up here (the plots of real runs are in docs/img).
cat > "$tmp/dataplane.csv" <<'CSV'
path,path_description,round,frag_payload_bytes,frame_bytes,frags_per_request,inflight,seconds,mpps,ns_per_packet,payload_gbit_s,completed_requests,cpu_share_pct,offered_mpps,kernel_lost_pct
dpdk,"dpdk (1 lcore, in memory)",1,256,338,588,64,1.0,12.0,83.3,24.6,1300,99.0,,
socket,"socket (loopback, receiver; sender on cpu 0, receiver on cpu 1)",1,256,338,588,64,1.0,0.6,1666.7,1.2,60,90.0,0.7,1.5
dpdk,"dpdk (1 lcore, in memory)",1,1024,1106,147,64,1.0,17.0,58.8,139.3,7400,99.0,,
socket,"socket (loopback, receiver; sender on cpu 0, receiver on cpu 1)",1,1024,1106,147,64,1.0,0.5,2000.0,4.1,220,90.0,0.6,0.2
dpdk,"dpdk (1 lcore, in memory)",2,1024,1106,147,64,1.0,15.0,66.7,122.9,6500,97.0,,
socket,"socket (loopback, receiver; sender on cpu 0, receiver on cpu 1)",2,1024,1106,147,64,1.0,0.4,2500.0,3.3,180,88.0,0.5,0.1
CSV
cat > "$tmp/preemption.csv" <<'CSV'
device,sweep,mode,queued_kernels,kernel_us,samples,measured,p50_us,p99_us,launch_p50_us
cpu,queued,reset,10,200,200,200,16.7,86.9,9.0
cpu,queued,wait,10,200,200,200,661.8,1384.6,650.0
cpu,queued,reset,1000,200,200,200,9.7,23.5,7.0
cpu,queued,wait,1000,200,200,200,687.1,794.3,680.0
cpu,length,reset,200,10,200,200,18.3,41.3,9.0
cpu,length,wait,200,10,200,200,36.6,51.6,30.0
cpu,length,reset,200,1000,200,200,9.3,29.1,7.0
cpu,length,wait,200,1000,200,200,3411.8,3993.5,3400.0
cpu,contract,reset,200,200,200,200,8.8,24.1,7.3
CSV
"$python" - "$tmp/series.csv" "$tmp/summary.csv" <<'PY'
import sys
# Three policies' batches over 2 s: a target that climbs, latencies under a 25 ms SLO.
with open(sys.argv[1], "w") as f:
    f.write("round,policy,time_ms,batch_size,service_ms,worst_latency_ms,target_batch,predicted_ms,margin_ms\n")
    for policy, final, step in (("slab", 9, 40.0), ("aimd", 3, 400.0), ("fixed", 16, 0.0)):
        t = 0.0
        while t < 2000:
            target = final if step == 0 else min(final, 1 + int(t / step))
            f.write(f"1,{policy},{t:.2f},{target},{2 + target * 0.5:.3f},{4 + target:.3f},{target},{2 + target * 0.5:.3f},0.500\n")
            t += 3 + target
with open(sys.argv[2], "w") as f:
    f.write("round,policy,order_in_round,rate_req_s,slo_ms,seconds,converge_ms,reach_ms,in_band_pct,within_slo_req_s,"
            "arrivals,answered,late,shed,violation_pct,mean_batch,final_target,drain_pct,p50_ms,p99_ms,generator_lag_p99_ms\n")
    f.write("1,slab,1,1150.0,25,4,320.0,320.0,99.0,1140.0,4600,4600,0,0,0.00,8.50,9,0.0,6.00,14.00,0.20\n")
    f.write("1,aimd,2,1150.0,25,4,1200.0,1200.0,99.0,1140.0,4600,4600,0,0,0.00,2.50,3,0.0,2.00,8.00,0.20\n")
    f.write("1,fixed,3,1150.0,25,4,0.0,0.0,100.0,1100.0,4600,4600,40,0,0.87,13.00,16,0.0,12.00,24.00,0.20\n")
PY
title="test fixture, not a measurement"
"$python" "$plot" dataplane "$tmp/dataplane.csv" --out "$tmp/dataplane.png" --title "$title"
"$python" "$plot" preemption "$tmp/preemption.csv" --out "$tmp/preemption.png" --title "$title"
"$python" "$plot" batching "$tmp/series.csv" "$tmp/summary.csv" --out "$tmp/batching.png" --title "$title"
"$python" "$plot" batching "$tmp/series.csv" --out "$tmp/batching_series_only.png"
for png in dataplane preemption batching batching_series_only; do
  f="$tmp/$png.png"
  [ -s "$f" ] || fail "plot.py wrote no $png.png"
  [ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "$png.png is not a PNG"
  size=$(stat -c %s "$f")
  [ "$size" -lt 153600 ] || fail "$png.png is $size bytes (the limit is 150 KB)"
  echo "plot.py: $png.png, $size bytes"
done

# Refused: a column missing (named in the message), a value that is not a number, no file.
refuse() {  # KIND FILE EXPECTED...
  local kind=$1 file=$2
  shift 2
  local rc=0
  "$python" "$plot" "$kind" "$file" --out "$tmp/refused.png" > "$tmp/refuse.txt" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "plot.py $kind accepted $file"
  for want in "$@"; do
    grep -qF -- "$want" "$tmp/refuse.txt" || { cat "$tmp/refuse.txt"; fail "plot.py $kind $file: the message lacks '$want'"; }
  done
  [ ! -e "$tmp/refused.png" ] || fail "plot.py $kind wrote a PNG from $file"
  echo "plot.py refuses $(basename "$file") (exit $rc): $(cat "$tmp/refuse.txt")"
}
sed '1s/,mpps,/,packets,/' "$tmp/dataplane.csv" > "$tmp/dataplane_no_mpps.csv"
refuse dataplane "$tmp/dataplane_no_mpps.csv" "missing column 'mpps'" dataplane_no_mpps.csv
sed 's/,p99_us,/,p99,/' "$tmp/preemption.csv" > "$tmp/preemption_no_p99.csv"
refuse preemption "$tmp/preemption_no_p99.csv" "missing column 'p99_us'"
sed 's/,worst_latency_ms,/,worst,/' "$tmp/series.csv" > "$tmp/series_no_worst.csv"
refuse batching "$tmp/series_no_worst.csv" "missing column 'worst_latency_ms'"
sed '2s/,12\.0,/,fast,/' "$tmp/dataplane.csv" > "$tmp/dataplane_text.csv"
refuse dataplane "$tmp/dataplane_text.csv" "line 2" "column 'mpps' is not a number: 'fast'"
refuse dataplane "$tmp/absent.csv" "cannot read $tmp/absent.csv"
echo "bench_report: ok"
