#!/usr/bin/env bash
# Live integration: a network namespace "camera" and a veth pair (198.18.0.0/15 addresses).
# reefline runs on net_af_packet on the root side; tcpreplay replays a reefgen capture into
# it at a set rate while the responses are captured and checked by reefgen; then reefgen
# sends live requests over a kernel UDP socket and verifies every answer it receives.
# Needs root (namespaces); skips (77) without.
set -euo pipefail
reefgen=$1
reefline=$2
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root"; exit 77; }
command -v ip >/dev/null && command -v tcpreplay >/dev/null && command -v tshark >/dev/null \
  || { echo "skip: needs iproute2, tcpreplay and tshark"; exit 77; }

ns=reefcam$$
host_if=rfh$$
cam_if=rfc$$
tmp=$(mktemp -d)
pid=
source "$(dirname "$0")/../scripts/lib/camera-netns.sh"
cleanup() {
  [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  camera_netns_down "$ns" "$host_if"
  rm -rf "$tmp"
}
trap cleanup EXIT

# Waits until reefline (pid $1, stderr in $2) has published its IFs, or fails with its log.
wait_started() {
  for _ in $(seq 100); do
    grep -q "IF crc32:9000" "$2" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || { cat "$2"; echo "FAIL: reefline did not start"; exit 1; }
    sleep 0.1
  done
  cat "$2"; echo "FAIL: reefline did not start within 10 s"; exit 1
}

camera_netns_up "$ns" "$host_if" "$cam_if" || { echo "skip: cannot create network namespaces here"; exit 77; }
host_mac=$(cat /sys/class/net/$host_if/address)
cam_mac=$(ip netns exec "$ns" cat /sys/class/net/$cam_if/address)

"$reefline" --eal "-l 0 --no-pci --no-shconf --no-huge -m 512 --no-telemetry --log-level lib.eal:error --vdev=net_af_packet0,iface=$host_if,framecnt=16384" \
  --control "ipc://$tmp/control.sock" --repo "$tmp/repo" --metrics off \
  --builtin crc32:9000 --ip 198.18.0.2 --age-ms 500 > "$tmp/reefline.out" 2> "$tmp/reefline.err" &
pid=$!
wait_started "$pid" "$tmp/reefline.err"

# 1. tcpreplay of a capture at a set rate; responses captured on the camera side.
"$reefgen" pcap --out "$tmp/req.pcap" --requests 50 --shape 224x224x3 --frag-size 1024 \
  --dport 9000 --seed 11 --shuffle --dup 0.02 --src 198.18.0.1 --dst 198.18.0.2 \
  --src-mac "$cam_mac" --dst-mac "$host_mac" > /dev/null
ip netns exec "$ns" tshark -i "$cam_if" -f "udp src port 9000" -w "$tmp/resp.pcap" 2> "$tmp/tshark.err" &
cap=$!
for _ in $(seq 300); do grep -q "Capturing on" "$tmp/tshark.err" 2>/dev/null && break; sleep 0.1; done
grep -q "Capturing on" "$tmp/tshark.err" || { cat "$tmp/tshark.err"; echo "FAIL: tshark did not start"; exit 1; }
ip netns exec "$ns" tcpreplay -q -i "$cam_if" --pps 50000 "$tmp/req.pcap" > "$tmp/tcpreplay.txt" 2>&1
# Responses lag the last request by at most the age limit; then stop the capture.
for _ in $(seq 50); do
  sleep 0.1
  n=$(ip netns exec "$ns" tshark -r "$tmp/resp.pcap" 2>/dev/null | wc -l || echo 0)
  [ "$n" -ge 50 ] && break
done
kill -INT "$cap"; wait "$cap" 2>/dev/null || true
"$reefgen" check --requests "$tmp/req.pcap" --responses "$tmp/resp.pcap" | tee "$tmp/check.txt" | tail -n 1
tail -n 1 "$tmp/check.txt" | grep -q "requests=50 complete=50 responses=50 ok=50 bad=0" \
  || { echo "FAIL: replayed requests not all answered correctly"; exit 1; }

# 2. Live requests over a kernel UDP socket, verified as they are answered.
ip netns exec "$ns" "$reefgen" send --dst 198.18.0.2 --dport 9000 --requests 100 --rate 200 \
  --shape 224x224x3 --frag-size 1024 --sport 41000 --timeout-ms 2000 --max-loss 0 --seed 12 \
  | tee "$tmp/send.txt" | tail -n 1
tail -n 1 "$tmp/send.txt" | grep -q "sent=100 responses=100 ok=100 bad=0 lost=0" \
  || { echo "FAIL: live requests"; exit 1; }

kill -INT "$pid"
wait "$pid" || { cat "$tmp/reefline.err"; echo "FAIL: reefline exit status"; exit 1; }
pid=
json=$(tail -n 1 "$tmp/reefline.out")
echo "$json"
python3 - "$json" <<'PY'
import json, sys
c = json.loads(sys.argv[1])
assert c["mbufs_in_use_at_exit"] == 0, "mbufs leaked"
assert c["requests_completed"] == 150, c["requests_completed"]
assert c["arp_replies"] >= 1, "the camera should have resolved the appliance by ARP"
assert c["responses_sent"] == 150, c["responses_sent"]
assert c["drop_ring_full"] == 0 and c["drop_table_full"] == 0, "unexpected drops"
# Late duplicates (a copy arriving after its request completed) open an entry that expires;
# every request started is either completed or timed out.
assert c["requests_started"] == c["requests_completed"] + c["requests_timed_out"], c
PY

# 3. Two lcores and two rx queues: rx runs on the worker lcore, net_af_packet's fanout spreads
# flows over its queues, and two cameras send at once from different ports. Both lcores
# busy-poll, so on a 2-core machine the cameras and the kernel share them: keep the rate low.
"$reefline" --eal "-l 0-1 --no-pci --no-shconf --no-huge -m 512 --no-telemetry --log-level lib.eal:error --vdev=net_af_packet0,iface=$host_if,qpairs=2,framecnt=16384" \
  --control "ipc://$tmp/control.sock" --repo "$tmp/repo" --metrics off \
  --builtin crc32:9000 --ip 198.18.0.2 --rx-queues 2 --age-ms 500 > "$tmp/reefline2.out" 2> "$tmp/reefline2.err" &
pid=$!
wait_started "$pid" "$tmp/reefline2.err"
grep -q "2 rx queue" "$tmp/reefline2.err" || { cat "$tmp/reefline2.err"; echo "FAIL: expected 2 rx queues"; exit 1; }
for sport in 42000 42001; do
  ip netns exec "$ns" "$reefgen" send --dst 198.18.0.2 --dport 9000 --requests 60 --rate 60 \
    --shape 224x224x3 --frag-size 1024 --sport $sport --timeout-ms 2000 --max-loss 0 \
    --seed $sport > "$tmp/send.$sport.txt" &
done
wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
for sport in 42000 42001; do
  tail -n 1 "$tmp/send.$sport.txt"
  tail -n 1 "$tmp/send.$sport.txt" | grep -q "sent=60 responses=60 ok=60 bad=0 lost=0" \
    || { echo "FAIL: camera $sport with 2 rx queues"; exit 1; }
done
kill -INT "$pid"
wait "$pid" || { cat "$tmp/reefline2.err"; echo "FAIL: reefline (2 queues) exit status"; exit 1; }
pid=
python3 - "$(tail -n 1 "$tmp/reefline2.out")" <<'PY'
import json, sys
c = json.loads(sys.argv[1])
assert c["mbufs_in_use_at_exit"] == 0, "mbufs leaked"
assert c["requests_completed"] == 120 and c["responses_sent"] == 120, c
assert c["requests_timed_out"] == 0, c
PY
echo "live integration: ok"
