#!/usr/bin/env bash
# Numerics: every tiny zoo model (batch 2) through reefline's cpu backend (reefrun) against
# ONNX Runtime (onnxruntime-node) on the same inputs: max |reefline - ort| must be
# <= 1e-3 x max |ort| per output. `reefrun` fails on any plan whose idempotence check fails.
# Sequence models run at several lengths: short, the longest the model takes, and a batch of
# mixed lengths padded to one (ids and mask zero past each item's length, as the appliance
# pads a batch to its length bucket).
# With a third argument `full`, the full-size models at batch 1 instead (slower; CI runs both).
set -euo pipefail
zoo=$1
reefrun=$2
size=${3:-tiny}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$root/tests/ort/ensure.sh"
py=/usr/bin/python3
"$py" -c "import numpy, onnx" 2>/dev/null || { echo "skip: python3-onnx missing"; exit 77; }

if [ "$size" = full ]; then
  "$zoo" --out "$tmp/zoo" -q
  models=$(ls "$tmp"/zoo/*.onnx)
  batch=1
else
  "$zoo" --out "$tmp/zoo" --tiny -q
  models=$(ls "$tmp"/zoo/*_tiny.onnx)
  batch=2
fi
fail=0
# Runs for each model: "batch|extra run_model.js arguments|label".
runs_for() {
  local json=${1%.onnx}.json max
  max=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1])).get('max_sequence_length', 0))" "$json")
  if [ "$max" = 0 ]; then
    echo "$batch||"
  elif [ "$size" = full ]; then
    echo "1|--dim L=128|L=128"
    echo "2|--dim L=128 --lengths 128,37|L=128 lengths 128,37"
  else
    echo "$batch|--dim L=7|L=7"
    echo "1|--dim L=$max|L=$max"
    echo "3|--dim L=32 --lengths 32,9,1|L=32 lengths 32,9,1"
  fi
}
for m in $models; do
 name=$(basename "$m" .onnx)
 while IFS='|' read -r batch_n extra label; do
  out="$tmp/$name"
  rm -rf "$out"
  mkdir -p "$out"
  # shellcheck disable=SC2086
  node "$root/tests/ort/run_model.js" "$m" --batch $batch_n $extra --seed 5 --int-range 0,1000 --save-inputs \
    --output-dir "$out/ort" > /dev/null
  args=()
  for f in $(ls "$out"/ort/input_*.pb | sort -V); do args+=(--input "$f"); done
  n=$(ls "$out"/ort/output_*.pb | wc -l)
  outs=()
  for i in $(seq 0 $((n - 1))); do outs+=(--output "$out/got_$i.pb"); done
  if ! "$reefrun" "$m" "${args[@]}" "${outs[@]}" > "$out/reefrun.txt" 2>&1; then
    echo "FAIL $name $label: $(tail -n 1 "$out/reefrun.txt")"; fail=1; continue
  fi
  "$py" - "$out" "$n" "$name${label:+ ($label)}" <<'PY' || fail=1
import sys, numpy as np, onnx
from onnx import numpy_helper as h
out, n, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
worst = 0.0
for i in range(n):
    want = h.to_array(onnx.load_tensor(f"{out}/ort/output_{i}.pb")).astype(np.float64)
    got = h.to_array(onnx.load_tensor(f"{out}/got_{i}.pb")).astype(np.float64)
    if got.shape != want.shape:
        print(f"FAIL {name}: output {i} shape {got.shape} vs {want.shape}"); sys.exit(1)
    scale = max(np.abs(want).max(), 1e-12)
    err = np.abs(got - want).max() / scale
    worst = max(worst, err)
    if not err <= 1e-3:
        print(f"FAIL {name}: output {i} max error {err:.3g} of the output's scale"); sys.exit(1)
print(f"ok   {name}: max error {worst:.2e} of the output's scale")
PY
  rm -rf "$out"  # full-size inputs and outputs are large
 done < <(runs_for "$m")
done
exit $fail
