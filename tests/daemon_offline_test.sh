#!/usr/bin/env bash
# The daemon's model IFs on a device backend, offline: reefline replays captures (net_pcap)
# into an RT and a BE image IF, a sequence IF (token requests of mixed lengths) and a tensor IF
# answering tensors; reefgen check collects the answers and reefverify checks every one
# against libml run directly on the same inputs (cpu backend). With `cpu` (tests/meson.build)
# it checks the data path and the offline tools; with `cuda`/`hip` (scripts/gpu-build,
# tests/gpu/meson.build) it checks `reefline --backend cuda|hip`: the packet memory registered
# with the device, the gather kernel reading payloads in place, the model's kernels from the
# GPU kernel library, RT and BE tasks through the scheduler. Exits 77 (skip) without a device.
#
# daemon_offline_test.sh BACKEND REEFLINE REEFGEN REEFVERIFY ZOO [REQUESTS [MAX_BATCH]]
# REQUESTS per IF (default 6) and the IFs' largest batch (default the daemon's and, for the
# configured BE IF, 4): scripts/gpu-check gives the SIMT emulation, which takes seconds per
# batch and warms every batch size up at start, fewer of both.
set -euo pipefail
backend=$1 reefline=$2 reefgen=$3 reefverify=$4 zoo=$5 requests=${6:-6} max_batch=${7:-}
case $requests in ''|*[!0-9]*|0) echo "REQUESTS must be a positive number, not '$requests'"; exit 2 ;; esac
case $max_batch in *[!0-9]*|0) echo "MAX_BATCH must be a positive number, not '$max_batch'"; exit 2 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$zoo" --out "$tmp" --tiny --only resnet50_tiny,mobilenet_v2_tiny,distilbert_tiny,sensor_tcn_tiny -q

# [OUTPUT=tensor] run NAME MODEL CLASS SEED PAYLOAD [reefline args...]: REQUESTS requests (shuffled
# fragments of 1021 bytes: tokens and floats straddle datagrams) to one IF. PAYLOAD: the
# reefgen/reefverify arguments that say what the requests carry.
run() {
  local name=$1 model=$2 cls=$3 seed=$4 payload=$5; shift 5
  # MAX_BATCH as a flag, but not beside a --config that sets it (a flag overrides the file).
  local limit=()
  [ -n "$max_batch" ] && [[ " $* " != *" --config "* ]] && limit=(--max-batch "$max_batch")
  # shellcheck disable=SC2086
  "$reefgen" pcap --out "$tmp/$name.req.pcap" --requests "$requests" $payload --frag-size 1021 --dport 9100 \
    --seed "$seed" --shuffle > /dev/null
  # A generous SLO: the software SIMT machine (-Dgpu_emu=true) takes seconds per batch.
  if ! "$reefline" --backend "$backend" --offline "$tmp/$name.req.pcap" --responses "$tmp/$name.resp.pcap" \
      --model "$name:9100:$tmp/$model.onnx:$cls:600000${OUTPUT:+:$OUTPUT}" "${limit[@]}" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"; then
    if grep -qE "no (CUDA|HIP) device" "$tmp/$name.err"; then
      echo "SKIP: $(grep -oE "no (CUDA|HIP) device.*" "$tmp/$name.err" | head -1)"
      exit 77
    fi
    cat "$tmp/$name.err"; echo "FAIL $name: reefline exited non-zero"; exit 1
  fi
  grep -q "backend" "$tmp/$name.err" && grep "reefline: port" "$tmp/$name.err"
  python3 - "$tmp/$name.out" "$name" "$requests" <<'PY'
import json, sys
c = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert c["mbufs_in_use_at_exit"] == 0, f"{sys.argv[2]}: mbufs leaked"
assert c["responses_sent"] == int(sys.argv[3]), f"{sys.argv[2]}: {c['responses_sent']} responses"
PY
  "$reefgen" check --requests "$tmp/$name.req.pcap" --responses "$tmp/$name.resp.pcap" --expect model \
    --results "$tmp/$name.jsonl" --seed "$seed" > "$tmp/$name.check" \
    || { cat "$tmp/$name.check"; echo "FAIL $name: reefgen check"; exit 1; }
  # shellcheck disable=SC2086
  "$reefverify" --model "$tmp/$model.onnx" --results "$tmp/$name.jsonl" $payload --seed "$seed" --no-errors \
    | tail -n 1 | tee "$tmp/$name.verify"
  grep -q "verified=$requests mismatched=0 errors=0" "$tmp/$name.verify" || { echo "FAIL $name: answers differ from libml"; exit 1; }
}

run rt resnet50_tiny rt 3 "--shape 64x64x3"
# The BE run takes its batch limit from a JSON configuration file (flags add the rest).
printf '{"max-batch": %s, "policy": "reef", "age-ms": 500}\n' "${max_batch:-4}" > "$tmp/be.json"
run be mobilenet_v2_tiny be 4 "--shape 64x64x3" --config "$tmp/be.json"
# Token sequences of 1..64 tokens (length buckets 16, 32, 64) to a BE DistilBERT, and sensor
# windows to a temporal convolution network answering its output tensor.
run seq distilbert_tiny be 5 "--tokens 1-64"
OUTPUT=tensor run sensor sensor_tcn_tiny be 6 "--format tensor --dims 64,6"

# The abacus policy (cpu builds, where abacus_train and reefctl are built beside the zoo tool):
# a predictor trained for the two image models, the daemon serving with it (every answer still
# libml's), with the kernel profiles only, and a corrupt predictor refused naming its problem.
tools=$(dirname "$zoo")
if [ "$backend" = cpu ] && [ -x "$tools/abacus_train" ] && [ -x "$tools/reefctl" ]; then
  "$tools/abacus_train" "$tmp/resnet50_tiny.onnx" "$tmp/mobilenet_v2_tiny.onnx" --batches 1,2 --groups 40 --epochs 300 \
    --out "$tmp/abacus.json" | tail -n 1
  run abacus_rt resnet50_tiny rt 7 "--shape 64x64x3" --policy abacus --abacus-predictor "$tmp/abacus.json"
  grep -q "abacus predicts from the predictor $tmp/abacus.json" "$tmp/abacus_rt.err" \
    || { cat "$tmp/abacus_rt.err"; echo "FAIL: the daemon did not take the predictor"; exit 1; }
  run abacus_seq distilbert_tiny be 8 "--tokens 1-64" --policy abacus
  grep -q "abacus predicts from the kernel profiles" "$tmp/abacus_seq.err" \
    || { cat "$tmp/abacus_seq.err"; echo "FAIL: without a predictor abacus uses the profiles"; exit 1; }
  python3 - "$tmp/abacus.json" "$tmp/bad.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["mlp"]["layers"][1]["w"] = p["mlp"]["layers"][1]["w"][:-1]
json.dump(p, open(sys.argv[2], "w"))
PY
  rc=0
  timeout 60 "$reefline" --offline "$tmp/rt.req.pcap" --responses "$tmp/bad.pcap" --policy abacus \
    --abacus-predictor "$tmp/bad.json" --model "x:9100:$tmp/resnet50_tiny.onnx" > /dev/null 2> "$tmp/bad.err" || rc=$?
  [ "$rc" != 0 ] && grep -q "bad.json: mlp layer 1: \"w\" has 1023 numbers, 1024 expected" "$tmp/bad.err" \
    || { cat "$tmp/bad.err"; echo "FAIL: a corrupt predictor must stop the daemon, naming the problem (exit $rc)"; exit 1; }
  echo "corrupt predictor refused: $(grep -o 'bad.json: .*' "$tmp/bad.err")"
  # Live (net_null port): reefctl health shows the policy and its predictor.
  "$reefline" --policy abacus --abacus-predictor "$tmp/abacus.json" --control "ipc://$tmp/live.sock" --metrics off \
    --repo "$tmp/repo" --eal "--no-pci --no-huge -m 256 --vdev=net_null0,no-rx=1" > /dev/null 2> "$tmp/live.err" &
  live=$!
  for _ in $(seq 100); do [ -S "$tmp/live.sock" ] && break; sleep 0.1; done
  "$tools/reefctl" --endpoint "ipc://$tmp/live.sock" health | tee "$tmp/health.txt" | grep -E "^(policy|abacus) "
  "$tools/reefctl" --endpoint "ipc://$tmp/live.sock" shutdown > /dev/null
  wait "$live" || { cat "$tmp/live.err"; echo "FAIL: the live daemon"; exit 1; }
  grep -q "^policy *abacus" "$tmp/health.txt" && grep -q "^abacus *predictor $tmp/abacus.json: 2 model(s)" "$tmp/health.txt" \
    || { cat "$tmp/health.txt"; echo "FAIL: reefctl health does not show the abacus policy and its predictor"; exit 1; }

  # FIFOs where the daemon reads files (nothing ever writes them: opening one for reading
  # would wait for ever). The repository's abacus.json, an entry's config.json and
  # profile.json, and a model file added over the control plane: each refused naming what it
  # is, and the daemon starts, serves and answers.
  mkdir -p "$tmp/fifo_repo/cam" "$tmp/fifo_repo/tagger"
  mkfifo "$tmp/fifo_repo/abacus.json" "$tmp/fifo_repo/cam/config.json" "$tmp/fifo.onnx"
  cp "$tmp/resnet50_tiny.onnx" "$tmp/fifo_repo/cam/model.onnx"
  cp "$tmp/resnet50_tiny.onnx" "$tmp/fifo_repo/tagger/model.onnx"
  printf '{"port": 9200}\n' > "$tmp/fifo_repo/tagger/config.json"
  mkfifo "$tmp/fifo_repo/tagger/profile.json"
  timeout 120 "$reefline" --policy abacus --control "ipc://$tmp/fifo.sock" --metrics off --repo "$tmp/fifo_repo" \
    --eal "--no-pci --no-huge -m 256 --vdev=net_null0,no-rx=1" > /dev/null 2> "$tmp/fifo.err" &
  live=$!
  for _ in $(seq 300); do [ -S "$tmp/fifo.sock" ] && break; sleep 0.1; done
  [ -S "$tmp/fifo.sock" ] || { kill "$live"; cat "$tmp/fifo.err"; echo "FAIL: a FIFO in the repository blocked the start"; exit 1; }
  rc=0
  timeout 30 "$tools/reefctl" --endpoint "ipc://$tmp/fifo.sock" --json health > "$tmp/fifo_health.json" || rc=$?
  timeout 30 "$tools/reefctl" --endpoint "ipc://$tmp/fifo.sock" --json list > "$tmp/fifo_list.json" || rc=$?
  add_rc=0
  timeout 30 "$tools/reefctl" --endpoint "ipc://$tmp/fifo.sock" add-model --name f --port 9300 --onnx "$tmp/fifo.onnx" \
    > "$tmp/fifo_add.out" 2>&1 || add_rc=$?
  timeout 30 "$tools/reefctl" --endpoint "ipc://$tmp/fifo.sock" shutdown > /dev/null
  wait "$live" || { cat "$tmp/fifo.err"; echo "FAIL: the daemon with FIFOs in its repository"; exit 1; }
  [ "$rc" = 0 ] || { cat "$tmp/fifo.err"; echo "FAIL: health with FIFOs in the repository (exit $rc)"; exit 1; }
  python3 - "$tmp/fifo_health.json" "$tmp/fifo.err" "$tmp/fifo_add.out" "$add_rc" "$tmp/fifo_list.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))
listed = json.load(open(sys.argv[5]))
err = open(sys.argv[2]).read()
add = open(sys.argv[3]).read()
assert "abacus.json is a FIFO, not a regular file" in json.dumps(h["abacus"]), h["abacus"]
assert "config.json is a FIFO, not a regular file" in err, err
assert [m["name"] for m in listed["models"]] == ["tagger"], listed  # its profile, a FIFO, measured again
assert int(sys.argv[4]) != 0 and "not a regular file" in add, (sys.argv[4], add)
print("FIFOs refused: abacus.json, config.json, profile.json (profiled again), a model file")
PY
fi

# A bad configuration file is a usage error (exit 2) that names the problem.
bad_config() {  # FILE-CONTENT EXPECTED-TEXT
  printf '%s' "$1" > "$tmp/bad.conf"
  local rc=0
  # (the timeout: a daemon that accepted the file would start serving)
  timeout 60 "$reefline" --backend "$backend" --config "$tmp/bad.conf" --metrics off --control "ipc://$tmp/c.sock" \
    > /dev/null 2> "$tmp/bad.err" || rc=$?
  [ "$rc" = 2 ] && grep -q "$2" "$tmp/bad.err" || { cat "$tmp/bad.err"; echo "FAIL: config '$1': exit $rc"; exit 1; }
}
bad_config '{"max-batch": 4, "bogus": 1}' "unknown option 'bogus'"
bad_config 'max-batch = 4
bogus = 1' "unknown option 'bogus'"
bad_config '{"max-batch": 4,' "not valid JSON"
bad_config '{"eal": {"nested": 1}}' '"eal": expected a string'
# A FIFO as --config is refused, not waited on.
rm -f "$tmp/fifo.conf" && mkfifo "$tmp/fifo.conf"
rc=0
timeout 60 "$reefline" --backend "$backend" --config "$tmp/fifo.conf" --metrics off > /dev/null 2> "$tmp/bad.err" || rc=$?
[ "$rc" = 2 ] && grep -q "fifo.conf is a FIFO, not a regular file" "$tmp/bad.err" \
  || { cat "$tmp/bad.err"; echo "FAIL: --config FIFO: exit $rc"; exit 1; }
echo "daemon offline ($backend): ok"
