#!/usr/bin/env bash
# End to end over a real (virtual) network: a namespace "camera" and a veth pair, reefline on
# net_af_packet with the control plane, two IFs from the tiny zoo added with reefctl (an RT
# one fed at a uniform rate, a BE one fed closed-loop), reefgen as the cameras; then a BE
# sequence IF (token requests of mixed lengths) and a sensor IF answering tensors next to the
# RT camera, with bad sequence requests answered with errors while the others are served.
#  - every answer equals the model run directly through libml on the same image (reefverify);
#  - the scheduler preempts: with the BE load running, RT requests preempt BE work (preemption
#    counters in the stats and the metrics), the RT median latency stays within a bound of RT
#    alone, and every BE request is still answered with a result (none shed);
#  - adding and removing a third model during the run does not disturb the RT IF;
#  - bad requests to the control plane (unknown model, port conflict, corrupt ONNX) get errors;
#  - the rx pool's in-use gauge sees requests held under load and none once idle;
#  - metrics are served; shutdown through reefctl is clean (every mbuf back in its pool).
# Needs root (namespaces); skips (77) without. E2E_POLICY=seq (or streams: policies that never
# preempt) runs the daemon with that policy instead of reef; the test must then fail.
set -euo pipefail
reefgen=$1
reefline=$2
reefctl=$3
zoo=$4
reefverify=$5
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root"; exit 77; }
command -v ip >/dev/null && command -v curl >/dev/null || { echo "skip: needs iproute2 and curl"; exit 77; }

ns=reefe2e$$
host_if=reh$$
cam_if=rec$$
tmp=$(mktemp -d)
pid=
source "$(dirname "$0")/../scripts/lib/camera-netns.sh"
cleanup() {
  [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  camera_netns_down "$ns" "$host_if"
  [ -n "${KEEP_TMP:-}" ] && cp -r "$tmp" /tmp/e2e/ ; rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- reefline stderr:"; tail -n 40 "$tmp/reefline.err" || true; exit 1; }

camera_netns_up "$ns" "$host_if" "$cam_if" || { echo "skip: cannot create network namespaces here"; exit 77; }

"$zoo" --out "$tmp/zoo" --tiny --only resnet50_tiny,mobilenet_v2_tiny,alexnet_tiny,distilbert_tiny,sensor_tcn_tiny -q
ctl=(--endpoint "ipc://$tmp/control.sock")

# The repository, metrics and address come from a config file; the rest from flags.
cat > "$tmp/reefline.toml" <<EOF
repo = "$tmp/repo"
metrics = "127.0.0.1:0"
ip = "198.18.0.2"
policy = "${E2E_POLICY:-reef}"
EOF
"$reefline" --config "$tmp/reefline.toml" --control "ipc://$tmp/control.sock" --age-ms 500 \
  --eal "-l 0 --no-pci --no-shconf --no-huge -m 512 --no-telemetry --log-level lib.eal:error --vdev=net_af_packet0,iface=$host_if,framecnt=16384" \
  > "$tmp/reefline.out" 2> "$tmp/reefline.err" &
pid=$!
for _ in $(seq 200); do
  grep -q "reefline: serving" "$tmp/reefline.err" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || fail "reefline did not start"
  sleep 0.1
done
grep -q "reefline: serving" "$tmp/reefline.err" || fail "reefline did not start within 20 s"
"$reefctl" "${ctl[@]}" health

# Two IFs: RT camera model, BE batch model.
"$reefctl" "${ctl[@]}" add-model --name cam --onnx "$tmp/zoo/resnet50_tiny.onnx" --port 9100 --class rt --slo-ms 100 \
  || fail "add-model cam"
"$reefctl" "${ctl[@]}" add-model --name batch --onnx "$tmp/zoo/mobilenet_v2_tiny.onnx" --port 9200 --class be --slo-ms 2000 \
  --max-batch 8 || fail "add-model batch"
"$reefctl" "${ctl[@]}" list
shape_of() {  # HxWxC of an IF's image input, from describe --json
  "$reefctl" "${ctl[@]}" --json describe --name "$1" | python3 -c '
import json, sys
s = json.load(sys.stdin)["input"]["shape"]
print(f"{s[2]}x{s[3]}x{s[1]}")'
}
cam_shape=$(shape_of cam)
batch_shape=$(shape_of batch)
echo "cam takes $cam_shape images, batch takes $batch_shape"

# Control-plane errors: each a non-zero exit with the daemon's code on stderr.
expect_error() {  # CODE ARGS...
  local code=$1; shift
  if "$reefctl" "${ctl[@]}" "$@" > "$tmp/err.out" 2> "$tmp/err.txt"; then fail "reefctl $* succeeded"; fi
  grep -q "$code" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "reefctl $*: expected $code"; }
  echo "error as expected: $(head -n 1 "$tmp/err.txt")"
}
expect_error unknown_model describe --name nobody
expect_error unknown_model remove-model --name nobody
expect_error port_in_use add-model --name clash --onnx "$tmp/zoo/alexnet_tiny.onnx" --port 9100 --class be --slo-ms 50
expect_error model_exists add-model --name cam --onnx "$tmp/zoo/alexnet_tiny.onnx" --port 9300 --class be --slo-ms 50
head -c 5000 "$tmp/zoo/alexnet_tiny.onnx" > "$tmp/corrupt.onnx"
expect_error bad_model add-model --name corrupt --onnx "$tmp/corrupt.onnx" --port 9301 --class be --slo-ms 50

send() {  # NAME PORT SHAPE SEED extra reefgen args...
  local name=$1 port=$2 shape=$3 seed=$4; shift 4
  ip netns exec "$ns" "$reefgen" send --dst 198.18.0.2 --dport "$port" --shape "$shape" --frag-size 1024 \
    --seed "$seed" --timeout-ms 3000 --results "$tmp/$name.jsonl" --json "$@" > "$tmp/$name.txt" 2> "$tmp/$name.log" \
    || { cat "$tmp/$name.log" "$tmp/$name.txt"; fail "reefgen $name"; }
  tail -n 1 "$tmp/$name.txt"
}
field() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])' "$1" "$2"; }

# 1. RT alone: uniform 40 requests/s.
send rt_alone 9100 "$cam_shape" 21 --requests 80 --rate 40
# 2. RT with the BE load (closed loop, 8 outstanding), and a third model added and removed
#    while both run. Enough BE requests to outlast the RT run (2 s): SLAB serves the tiny
#    MobileNet at 1000-3000 requests/s on the 2-core VM, and 8000 once ran out before the RT
#    run ended with the faster depthwise kernels.
be_requests=20000
ip netns exec "$ns" "$reefgen" send --dst 198.18.0.2 --dport 9200 --shape "$batch_shape" --frag-size 1024 \
  --seed 31 --timeout-ms 3000 --closed-loop 8 --requests "$be_requests" --results "$tmp/be.jsonl" --json \
  > "$tmp/be.txt" 2> "$tmp/be.log" &
be=$!
( sleep 0.5
  "$reefctl" "${ctl[@]}" add-model --name extra --onnx "$tmp/zoo/alexnet_tiny.onnx" --port 9300 --class be --slo-ms 500 \
    > "$tmp/extra.txt" 2>&1 && sleep 0.5 && "$reefctl" "${ctl[@]}" remove-model --name extra >> "$tmp/extra.txt" 2>&1 \
    && echo ok >> "$tmp/extra.txt" ) &
churn=$!
# While both run: the receive pool's gauge sees the requests being served.
( for _ in $(seq 10); do
    "$reefctl" "${ctl[@]}" --json stats | python3 -c 'import json, sys; print(json.load(sys.stdin)["port"]["rx_mbufs_in_use"])'
    sleep 0.2
  done > "$tmp/mbufs_loaded.txt" 2>&1 ) &
sampler=$!
send rt_loaded 9100 "$cam_shape" 22 --requests 80 --rate 40
# The comparison with RT alone means something only if the BE load lasted the whole RT run.
kill -0 "$be" 2>/dev/null || fail "the BE load ended before the RT run did: raise its --requests"
wait "$sampler" || { cat "$tmp/mbufs_loaded.txt"; fail "stats during the run"; }
wait "$churn" || true
grep -q "^ok$" "$tmp/extra.txt" || { cat "$tmp/extra.txt"; fail "adding/removing a model during the run"; }
wait "$be" || { cat "$tmp/be.log" "$tmp/be.txt"; fail "BE load"; }
tail -n 1 "$tmp/be.txt"

for run in rt_alone rt_loaded; do
  [ "$(field "$tmp/$run.txt" lost)" = 0 ] || fail "$run lost requests"
  [ "$(field "$tmp/$run.txt" responses)" = 80 ] || fail "$run: not every request answered"
done
[ "$(field "$tmp/be.txt" responses)" = "$be_requests" ] || fail "BE: not every request answered"

# Every result equals libml on the same image.
"$reefverify" --model "$tmp/zoo/resnet50_tiny.onnx" --results "$tmp/rt_alone.jsonl" --shape "$cam_shape" --seed 21 --no-errors \
  | tail -n 1 | tee "$tmp/v1.txt"
"$reefverify" --model "$tmp/zoo/resnet50_tiny.onnx" --results "$tmp/rt_loaded.jsonl" --shape "$cam_shape" --seed 22 --no-errors \
  | tail -n 1 | tee "$tmp/v2.txt"
"$reefverify" --model "$tmp/zoo/mobilenet_v2_tiny.onnx" --results "$tmp/be.jsonl" --shape "$batch_shape" --seed 31 \
  | tail -n 1 | tee "$tmp/v3.txt"
grep -q "verified=80 mismatched=0 errors=0" "$tmp/v1.txt" || fail "RT (alone) answers differ from libml"
grep -q "verified=80 mismatched=0 errors=0" "$tmp/v2.txt" || fail "RT (loaded) answers differ from libml"
grep -q "mismatched=0" "$tmp/v3.txt" || fail "BE answers differ from libml"

p50_alone=$(field "$tmp/rt_alone.txt" p50_us)
p50_loaded=$(field "$tmp/rt_loaded.txt" p50_us)
p99_alone=$(field "$tmp/rt_alone.txt" p99_us)
p99_loaded=$(field "$tmp/rt_loaded.txt" p99_us)
echo "RT median: alone ${p50_alone} us, with the BE load ${p50_loaded} us; p99: alone ${p99_alone} us, with the BE load ${p99_loaded} us"
# RT under the BE load: the median within 1.5 x RT alone + 1 ms. Measured on the 2-core VM
# (cpu backend; RT alone 0.95-1.34 ms): reef 1.10-1.55 ms loaded in 8 runs (0.9-1.5x alone);
# seq, which lets the running BE batch block RT, 3.5-5.9 ms in 4 runs; streams, which shares
# the device without preempting, 2.6-3.3 ms in 3 runs. Both fail the bound in every run, and
# the preemption check below as well. The median, not p99: p99 over 80 requests swings 3x
# between runs of one build.
rt_bound=$(( p50_alone * 3 / 2 + 1000 ))
[ "$p50_loaded" -le "$rt_bound" ] \
  || fail "RT median with the BE load ${p50_loaded} us exceeds the bound ${rt_bound} us (1.5 x alone + 1 ms): BE work blocks RT"
# Every BE request answered with a result: none shed, none failed.
[ "$(field "$tmp/be.txt" ok)" = "$be_requests" ] || fail "BE: $(tail -n 1 "$tmp/be.txt"): requests shed or answered with an error"
# The rx pool's gauge saw requests held while the load ran.
max_in_use=$(sort -n "$tmp/mbufs_loaded.txt" | tail -n 1)
[ "${max_in_use:-0}" -gt 0 ] || fail "rx_mbufs_in_use stayed 0 under load: $(tr '\n' ' ' < "$tmp/mbufs_loaded.txt")"

# Statistics agree with what the cameras saw; metrics are served.
"$reefctl" "${ctl[@]}" stats
"$reefctl" "${ctl[@]}" --json stats > "$tmp/stats.json"
python3 - "$tmp/stats.json" "$be_requests" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ifs = {i["name"]: i for i in s["ifs"]}
assert set(ifs) == {"cam", "batch"}, ifs.keys()
assert ifs["cam"]["responses_total"] == 160, ifs["cam"]
assert ifs["batch"]["responses_total"] + ifs["batch"]["shed_total"] == int(sys.argv[2]), ifs["batch"]
assert ifs["cam"]["latency_seconds"]["count"] == 160
assert s["scheduler"]["completed_rt"] > 0 and s["scheduler"]["completed_be"] > 0, s["scheduler"]
# RT requests preempted BE work: counted by the scheduler and against the BE IF.
assert s["scheduler"]["preemptions"] > 0, f"no preemptions: {s['scheduler']}"
assert ifs["batch"]["preemptions_total"] > 0, ifs["batch"]
print(f"preemptions: {s['scheduler']['preemptions']} (policy {s['scheduler']['policy']})")
# Idle now: every mbuf is back in its pool while the daemon still runs.
assert s["port"]["rx_mbufs_in_use"] == 0 and s["port"]["tx_mbufs_in_use"] == 0, s["port"]
PY
mport=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$tmp/reefline.err")
curl -sf "http://127.0.0.1:$mport/metrics" > "$tmp/metrics.txt" || fail "metrics endpoint"
grep -q '^reefline_if_responses_total{if="cam",class="rt"} 160' "$tmp/metrics.txt" || { grep cam "$tmp/metrics.txt" | head; fail "metrics"; }
grep -q '^reefline_if_latency_seconds_bucket{if="cam"' "$tmp/metrics.txt" || fail "latency histogram"
awk '$1 == "reefline_scheduler_preemptions_total" && $2 > 0 {found = 1} END {exit !found}' "$tmp/metrics.txt" \
  || { grep preemptions "$tmp/metrics.txt"; fail "metrics: no preemptions"; }
grep -q '^reefline_port_rx_mbufs_in_use{port="0",driver="net_af_packet"} 0$' "$tmp/metrics.txt" \
  || { grep mbufs "$tmp/metrics.txt"; fail "metrics: rx mbufs in use"; }

# 3. A BE sequence IF (DistilBERT: token requests of 8..64 tokens, length buckets 16/32/64)
#    and a sensor IF answering tensors, next to the RT camera; bad requests to the sequence
#    IF (tokens outside the vocabulary, too many tokens, an image) get errors naming the
#    problem while the camera and the good sequences are served. Every answer is verified.
"$reefctl" "${ctl[@]}" add-model --name text --onnx "$tmp/zoo/distilbert_tiny.onnx" --port 9300 --class be \
  --slo-ms 2000 --max-batch 8 > /dev/null || fail "add-model text"
"$reefctl" "${ctl[@]}" add-model --name imu --onnx "$tmp/zoo/sensor_tcn_tiny.onnx" --port 9400 --class be \
  --slo-ms 2000 --output tensor > /dev/null || fail "add-model imu"
"$reefctl" "${ctl[@]}" --json describe --name text > "$tmp/text.json"
"$reefctl" "${ctl[@]}" --json describe --name imu > "$tmp/imu.json"
python3 - "$tmp/text.json" "$tmp/imu.json" <<'PY' || fail "describe of the sequence and tensor IFs"
import json, sys
t, i = (json.load(open(p)) for p in sys.argv[1:3])
assert t["input_format"] == "tokens_i32" and t["sequence_lengths"] == [16, 32, 64] and t["vocabulary"] == 1024, t
assert i["input_format"] == "tensor_f32" and i["tensor_dims"] == [64, 6] and i["output"] == "tensor", i
PY
seq() {  # NAME extra reefgen args... (to the text IF)
  local name=$1; shift
  ip netns exec "$ns" "$reefgen" send --dst 198.18.0.2 --dport 9300 --timeout-ms 3000 --results "$tmp/$name.jsonl" \
    --json "$@" > "$tmp/$name.txt" 2> "$tmp/$name.log" || true
}
seq text --tokens 8-64 --frag-size 100 --closed-loop 8 --requests 400 --seed 41 &
text=$!
ip netns exec "$ns" "$reefgen" send --dst 198.18.0.2 --dport 9400 --format tensor --dims 64,6 --rate 100 --requests 60 \
  --seed 42 --timeout-ms 3000 --results "$tmp/imu.jsonl" --json > "$tmp/imu.txt" 2> "$tmp/imu.log" &
imu=$!
seq oov --tokens 16 --vocab 100000 --requests 20 --rate 50 --seed 43 --sport 42001
seq long --tokens 65 --requests 5 --rate 50 --seed 44 --sport 42002
seq image --shape 8x8x3 --requests 5 --rate 50 --seed 45 --sport 42003
send rt_seq 9100 "$cam_shape" 23 --requests 80 --rate 40
wait "$text" "$imu" || true
echo "text: $(tail -n 1 "$tmp/text.txt")"
echo "imu: $(tail -n 1 "$tmp/imu.txt")"
[ "$(field "$tmp/text.txt" ok)" = 400 ] || { cat "$tmp/text.log"; fail "text: $(tail -n 1 "$tmp/text.txt")"; }
[ "$(field "$tmp/imu.txt" ok)" = 60 ] || { cat "$tmp/imu.log"; fail "imu: $(tail -n 1 "$tmp/imu.txt")"; }
[ "$(field "$tmp/rt_seq.txt" ok)" = 80 ] || fail "the camera was not served while the sequence IF ran"
"$reefverify" --model "$tmp/zoo/distilbert_tiny.onnx" --results "$tmp/text.jsonl" --tokens 8-64 --seed 41 --no-errors \
  | tail -n 1 | tee "$tmp/v4.txt"
"$reefverify" --model "$tmp/zoo/sensor_tcn_tiny.onnx" --results "$tmp/imu.jsonl" --format tensor --dims 64,6 --seed 42 \
  --no-errors | tail -n 1 | tee "$tmp/v5.txt"
"$reefverify" --model "$tmp/zoo/resnet50_tiny.onnx" --results "$tmp/rt_seq.jsonl" --shape "$cam_shape" --seed 23 \
  --no-errors | tail -n 1 | tee "$tmp/v6.txt"
grep -q "verified=400 mismatched=0 errors=0" "$tmp/v4.txt" || fail "sequence answers differ from libml"
grep -q "verified=60 mismatched=0 errors=0" "$tmp/v5.txt" || fail "tensor answers differ from libml"
grep -q "verified=80 mismatched=0 errors=0" "$tmp/v6.txt" || fail "camera answers (next to the sequence IF) differ from libml"
# Bad requests: every one answered with an error naming the problem; a refusal for a token
# outside the vocabulary is confirmed by reefverify on the rebuilt request.
python3 - "$tmp" <<'PY' || fail "errors for bad sequence requests"
import json, sys
tmp = sys.argv[1]
want = {"oov": (20, "outside the vocabulary [0, 1024)"), "long": (5, "expected 1..64 tokens, got 65"),
        "image": (5, "this IF takes tokens_i32 requests (1..64 tokens)")}
for name, (count, text) in want.items():
    lines = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl") if l.strip()]
    assert len(lines) == count, f"{name}: {len(lines)} answers of {count}"
    for l in lines:
        assert l["kind"] == "error" and text in l["message"], f"{name}: {l}"
    print(f"{name}: {count} errors, e.g. {lines[0]['message']!r}")
PY
# (reefverify exits 1 here: nothing verified, every answer an error, as it should be.)
"$reefverify" --model "$tmp/zoo/distilbert_tiny.onnx" --results "$tmp/oov.jsonl" --tokens 16 --vocab 100000 --seed 43 \
  | tail -n 1 | tee "$tmp/v7.txt" || true
grep -q "mismatched=0 errors=20" "$tmp/v7.txt" || fail "out-of-vocabulary refusals do not match the requests"
"$reefctl" "${ctl[@]}" stats

# The repository holds both models; shutdown through the control plane is clean.
[ -f "$tmp/repo/cam/model.onnx" ] && [ -f "$tmp/repo/batch/config.json" ] && [ ! -e "$tmp/repo/extra" ] \
  || fail "repository contents"
"$reefctl" "${ctl[@]}" shutdown
wait "$pid" || fail "reefline exit status"
pid=
python3 - "$(tail -n 1 "$tmp/reefline.out")" <<'PY'
import json, sys
c = json.loads(sys.argv[1])
assert c["mbufs_in_use_at_exit"] == 0, "mbufs leaked"
PY
"$reefctl" "${ctl[@]}" health > /dev/null 2>&1 && fail "reefctl health should fail with the daemon gone"
echo "e2e: ok (RT median alone ${p50_alone} us, with BE ${p50_loaded} us; p99 alone ${p99_alone} us, with BE ${p99_loaded} us)"
