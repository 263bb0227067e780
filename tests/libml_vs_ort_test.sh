#!/usr/bin/env bash
# libml_vs_ort: reefline's cpu device against ONNX Runtime, the two taking turns run by run.
# 1. tests/ort/run_model.js --serve answers each "run" line with "run_ms <ms>" and refuses any
#    other command (exit 2, naming it).
# 2. A quick run on the zoo's tiny ResNet-50 and MobileNet-v2 (under the full models' names)
#    prints a progress line per model and batch, the table, a CSV row each, and the last line
#    `resnet50_ratio=A mobilenet_v2_ratio=B` with positive ratios.
# 3. An ONNX Runtime that dies at start makes the bench exit 1 saying so, not hang or crash.
# Skips (77) without node.
#
#   tests/libml_vs_ort_test.sh ZOO LIBML_VS_ORT
set -euo pipefail
zoo=$1
bench=$2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$root/tests/ort/ensure.sh"
fail() { echo "FAIL: $*"; exit 1; }

"$zoo" --out "$tmp/zoo" --tiny --only resnet50,mobilenet_v2 -q
mkdir "$tmp/models"
for m in resnet50 mobilenet_v2; do cp "$tmp/zoo/${m}_tiny.onnx" "$tmp/models/$m.onnx"; done

# --- 1. run_model.js --serve -------------------------------------------------------------------
printf 'run\nrun\n' | node "$root/tests/ort/run_model.js" "$tmp/models/mobilenet_v2.onnx" --serve > "$tmp/serve.txt" \
  || fail "run_model.js --serve exited non-zero"
cat "$tmp/serve.txt"
[ "$(grep -cE '^run_ms [0-9]+(\.[0-9]+)?(e-?[0-9]+)?$' "$tmp/serve.txt")" = 2 ] && [ "$(wc -l < "$tmp/serve.txt")" = 2 ] \
  || fail "two 'run' lines did not get exactly two 'run_ms <ms>' answers"
rc=0
printf 'run\nstop\n' | node "$root/tests/ort/run_model.js" "$tmp/models/mobilenet_v2.onnx" --serve > "$tmp/bad.txt" 2> "$tmp/bad.err" || rc=$?
[ "$rc" = 2 ] || fail "an unknown command exited $rc, not 2"
grep -q "unknown command 'stop'" "$tmp/bad.err" || fail "the error does not name the command: $(cat "$tmp/bad.err")"
[ "$(wc -l < "$tmp/bad.txt")" = 1 ] || fail "the run before the bad command was not answered"

# --- 2. a quick comparison -------------------------------------------------------------------------
"$bench" --models "$tmp/models" --only resnet50,mobilenet_v2 --quick --threads 1 --csv "$tmp/r.csv" \
  > "$tmp/out.txt" 2> "$tmp/err.txt" || { cat "$tmp/out.txt" "$tmp/err.txt"; fail "libml_vs_ort --quick exited non-zero"; }
cat "$tmp/out.txt" "$tmp/err.txt"
last=$(tail -n 1 "$tmp/out.txt")
[[ $last =~ ^resnet50_ratio=([0-9]+\.[0-9]{3})\ mobilenet_v2_ratio=([0-9]+\.[0-9]{3})$ ]] \
  || fail "the last line is not 'resnet50_ratio=A mobilenet_v2_ratio=B': $last"
for r in "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"; do
  awk -v r="$r" 'BEGIN { exit !(r > 0) }' || fail "ratio $r is not positive"
done
[ "$(grep -c 'reefline and ONNX Runtime taking turns' "$tmp/err.txt")" = 2 ] || fail "not one progress line per model"
grep -q 'sides taking turns' "$tmp/out.txt" || fail "the table does not say how it was measured"
/usr/bin/python3 - "$tmp/r.csv" "$last" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
assert [r["model"] for r in rows] == ["resnet50", "mobilenet_v2"], rows
last = dict(kv.split("=") for kv in sys.argv[2].split())
for r in rows:
    assert r["batch"] == "1" and r["compute_units"] == "1" and r["timed_runs"] == "3", r
    assert float(r["reefline_ms"]) > 0 and float(r["ort_ms"]) > 0, r
    assert abs(float(r["ratio"]) - float(last[r["model"] + "_ratio"])) < 0.0015, (r, last)
print("libml_vs_ort --csv: ok")
PY

# --- 3. ONNX Runtime dies -------------------------------------------------------------------------
mkdir -p "$tmp/root/tests/ort/node_modules/onnxruntime-node"
printf '%s\n' "console.error('run_model.js: cannot load the model (planted)'); process.exit(1);" > "$tmp/root/tests/ort/run_model.js"
rc=0
timeout 120 "$bench" --root "$tmp/root" --models "$tmp/models" --only mobilenet_v2 --quick --threads 1 \
  > "$tmp/dead.txt" 2> "$tmp/dead.err" || rc=$?
cat "$tmp/dead.err"
[ "$rc" = 1 ] || fail "a dead ONNX Runtime: exit $rc, not 1"
grep -q 'ONNX Runtime stopped answering' "$tmp/dead.err" || fail "the error does not say ONNX Runtime stopped"
grep -q 'cannot load the model (planted)' "$tmp/dead.err" || fail "ONNX Runtime's own error is not shown"
echo "libml_vs_ort: ok"
