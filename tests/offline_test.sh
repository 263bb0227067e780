#!/usr/bin/env bash
# Integration: reefgen writes a capture (clean, then impaired), reefline replays it through
# net_pcap offline with the crc32 IF, reefgen check verifies every response, and the
# counters account for every packet with no mbuf left behind.
set -euo pipefail
reefgen=$1
reefline=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

last_json() { tail -n 1 "$1"; }
field() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])" "$1" "$2"; }

run_case() {
  local name=$1; shift
  "$reefgen" pcap --out "$tmp/$name.req.pcap" "$@" > "$tmp/$name.gen.txt"
  "$reefline" --offline "$tmp/$name.req.pcap" --responses "$tmp/$name.resp.pcap" \
      --builtin crc32:9000 > "$tmp/$name.out.json" 2> "$tmp/$name.err.txt" \
    || { cat "$tmp/$name.err.txt"; echo "FAIL $name: reefline exited non-zero"; exit 1; }
  "$reefgen" check --requests "$tmp/$name.req.pcap" --responses "$tmp/$name.resp.pcap" \
      > "$tmp/$name.check.txt" \
    || { cat "$tmp/$name.check.txt"; echo "FAIL $name: reefgen check"; exit 1; }
  echo "$name: $(tail -n 1 "$tmp/$name.check.txt")"
  echo "$name: $(last_json "$tmp/$name.out.json")"
  [ "$(field "$tmp/$name.out.json" mbufs_in_use_at_exit)" = 0 ] || { echo "FAIL $name: mbufs leaked"; exit 1; }
  local completed sent
  completed=$(field "$tmp/$name.out.json" requests_completed)
  sent=$(field "$tmp/$name.out.json" responses_sent)
  [ "$completed" = "$sent" ] || { echo "FAIL $name: $completed completed but $sent responses"; exit 1; }
}

# Clean: every request completes and is answered.
run_case clean --requests 40 --shape 224x224x3 --frag-size 1024 --dport 9000 --seed 1
line=$(tail -n 1 "$tmp/clean.check.txt")
[[ "$line" == "requests=40 complete=40 responses=40 ok=40 bad=0" ]] || { echo "FAIL clean: $line"; exit 1; }
[ "$(field "$tmp/clean.out.json" rx_packets)" = $((40 * 147)) ] || { echo "FAIL clean: rx_packets"; exit 1; }
[ "$(field "$tmp/clean.out.json" drops_total)" = 0 ] || { echo "FAIL clean: unexpected drops"; exit 1; }

# Impaired: shuffled, duplicated, dropped and corrupted fragments, several cameras.
run_case impaired --requests 60 --shape 224x224x3 --frag-size 1024 --dport 9000 --seed 2 \
  --shuffle --dup 0.05 --drop 0.002 --corrupt 0.01 --sources 4
for k in drop_duplicate drop_bad_header; do
  [ "$(field "$tmp/impaired.out.json" $k)" -gt 0 ] || { echo "FAIL impaired: expected $k > 0"; exit 1; }
done
# Every packet is accounted for: held by a completed request, or dropped for one reason.
python3 - "$tmp/impaired.out.json" <<'PY'
import json, sys
c = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
# Packets of completed requests = rx - drops; at 147 fragments each this must divide evenly.
held = c["rx_packets"] - c["drops_total"]
assert held == c["requests_completed"] * 147, (held, c["requests_completed"])
PY

# Small MTU-sized fragments of token sequences, and traffic to a port with no IF.
run_case tokens --requests 30 --tokens 4096 --frag-size 1400 --dport 9000 --seed 3
"$reefgen" pcap --out "$tmp/other.req.pcap" --requests 5 --shape 64x64x3 --frag-size 1024 \
  --dport 9001 --seed 4 > /dev/null
"$reefline" --offline "$tmp/other.req.pcap" --responses "$tmp/other.resp.pcap" \
  --builtin crc32:9000 > "$tmp/other.out.json" 2>/dev/null
[ "$(field "$tmp/other.out.json" drop_unknown_port)" = $((5 * 12)) ] || { echo "FAIL: unknown_port"; exit 1; }
[ "$(field "$tmp/other.out.json" responses_sent)" = 0 ] || { echo "FAIL: answered an unknown port"; exit 1; }
# Many incomplete requests (drops and corruption leave most of 200 incomplete, 16 interleaved at
# a time): the partial ones must not drain the rx pool, so every request that the capture
# completes is answered and the NIC never runs out of mbufs.
run_case partial --requests 200 --shape 224x224x3 --frag-size 1024 --dport 9000 --seed 1 \
  --shuffle --dup 0.05 --drop 0.01 --corrupt 0.01
read -r complete ok < <(sed -n 's/^requests=[0-9]* complete=\([0-9]*\) responses=[0-9]* ok=\([0-9]*\) bad=0$/\1 \2/p' "$tmp/partial.check.txt")
[ -n "${complete:-}" ] && [ "$complete" -gt 0 ] && [ "$ok" = "$complete" ] \
  || { echo "FAIL partial: $(tail -n 1 "$tmp/partial.check.txt") (ok must equal complete)"; exit 1; }
[ "$(field "$tmp/partial.out.json" port_rx_nombuf)" = 0 ] || { echo "FAIL partial: the rx pool ran dry"; exit 1; }
[ "$(field "$tmp/partial.out.json" drop_memory_pressure)" -gt 0 ] || { echo "FAIL partial: no eviction under memory pressure"; exit 1; }

# Watermarks that cannot work are usage errors, before EAL starts.
for bad in "--reassembly-low 8000" "--reassembly-high 20000" "--mbufs 1023" "--ip 198.18.0.2/33"; do
  rc=0
  # shellcheck disable=SC2086
  "$reefline" --offline "$tmp/clean.req.pcap" --responses "$tmp/bad.pcap" --builtin crc32:9000 $bad \
    > /dev/null 2> "$tmp/bad.err" || rc=$?
  [ "$rc" = 2 ] || { cat "$tmp/bad.err"; echo "FAIL: '$bad' exited $rc, expected 2"; exit 1; }
  echo "usage error for $bad: $(head -n 1 "$tmp/bad.err")"
done

# A second daemon on a file prefix that a running one holds says so, and how to avoid it.
prefix="reefline_offline_test_$$"
# EAL leaves the prefix's runtime directory behind (where depends on the user).
trap 'rm -rf "$tmp" "/var/run/dpdk/$prefix" "${XDG_RUNTIME_DIR:-/tmp}/dpdk/$prefix" "/tmp/dpdk/$prefix"' EXIT
eal="-l 0 --no-pci --no-huge -m 256 --no-telemetry --log-level lib.eal:error --file-prefix $prefix --vdev=net_null0,no-rx=1"
"$reefline" --eal "$eal" --repo "$tmp/repo1" --control "ipc://$tmp/ctl1" --metrics off --duration 20 \
  --builtin crc32:9000 > "$tmp/first.out" 2> "$tmp/first.err" &
first=$!
for _ in $(seq 100); do grep -q "reefline: serving" "$tmp/first.err" && break; sleep 0.1; done
grep -q "reefline: serving" "$tmp/first.err" || { kill "$first"; cat "$tmp/first.err"; echo "FAIL: first daemon did not start"; exit 1; }
rc=0
"$reefline" --eal "$eal" --repo "$tmp/repo2" --control "ipc://$tmp/ctl2" --metrics off --duration 1 \
  --builtin crc32:9000 > /dev/null 2> "$tmp/second.err" || rc=$?
kill -INT "$first"
wait "$first" || true
[ "$rc" = 1 ] || { cat "$tmp/second.err"; echo "FAIL: second daemon on a busy prefix exited $rc, expected 1"; exit 1; }
grep -q "EAL initialisation failed: the file prefix '$prefix' is in use by process $first .*--file-prefix" "$tmp/second.err" \
  || { cat "$tmp/second.err"; echo "FAIL: no clear reason for the busy file prefix"; exit 1; }
echo "busy file prefix: $(grep 'EAL initialisation failed' "$tmp/second.err")"
echo "offline integration: ok"
