#!/usr/bin/env bash
# Model zoo test: writes the tiny zoo, checks every model with onnx.checker (full_check) and
# strict shape inference, runs it in ONNX Runtime (tests/ort/run_model.js, batch 2; sequence
# models at length L=24) and checks that outputs are finite, input-dependent and not degenerate.
# The sequence classifiers (distilbert, bert) mask padding: a padded batch gives each item the
# logits it gets alone, unpadded; and they refuse a length past their position table. Also: the
# zoo is deterministic for a seed, --only and bad usage, and run_model.js's TensorProto files
# round-trip.
#
#   tests/zoo_test.sh BUILD/tools/zoo
#
# Installs onnxruntime-node into tests/ort (npm install --ignore-scripts) when it is missing.
set -euo pipefail

zoo=${1:?usage: zoo_test.sh ZOO_EXE}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ort_dir=$here/ort
run_model=$ort_dir/run_model.js
work=$(mktemp -d "${TMPDIR:-/tmp}/zoo_test.XXXXXX")
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# Python with the onnx package (Debian's python3-onnx lives in /usr/bin/python3, which a
# pyenv or venv python3 earlier in PATH may not see).
py=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import onnx' >/dev/null 2>&1; then
    py=$p
    break
  fi
done
[[ -n $py ]] || { echo "FAIL: no python3 with the onnx package (apt-get install python3-onnx)"; exit 1; }
command -v node >/dev/null || { echo "FAIL: node not found (scripts/setup installs it)"; exit 1; }

# onnxruntime-node, installed once; a lock keeps parallel tests from installing at once.
if [[ ! -d $ort_dir/node_modules/onnxruntime-node ]]; then
  (
    flock 9
    if [[ ! -d $ort_dir/node_modules/onnxruntime-node ]]; then
      echo "installing onnxruntime-node into $ort_dir"
      (cd "$ort_dir" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error)
    fi
  ) 9>"${TMPDIR:-/tmp}/reefline-ort-npm-install.lock"
fi

# ---- usage ----
set +e
"$zoo" --out "$work/bad" --only nosuchmodel >/dev/null 2>&1
rc=$?
set -e
[[ $rc == 2 ]] && ok "unknown model name exits 2" || fail "unknown model name exit status $rc, want 2"
names=$("$zoo" --list | cut -f1 | tr '\n' ' ')
want="vgg19 resnet152 densenet201 inception_v3 distilbert bert resnet50 alexnet mobilenet_v2"
want+=" densenet121 sensor_tcn "
[[ $names == "$want" ]] && ok "--list" || fail "--list gave '$names'"

# ---- the tiny zoo; determinism ----
start=$(date +%s%N)
"$zoo" --out "$work/zoo" --tiny --seed 1 --write-calibration
echo "tiny zoo written in $((($(date +%s%N) - start) / 1000000)) ms"
"$zoo" --out "$work/again" --only resnet50_tiny,distilbert --tiny --seed 1 -q
"$zoo" --out "$work/seed2" --only resnet50 --tiny --seed 2 -q
if cmp -s "$work/zoo/resnet50_tiny.onnx" "$work/again/resnet50_tiny.onnx" &&
   cmp -s "$work/zoo/distilbert_tiny.onnx" "$work/again/distilbert_tiny.onnx" &&
   cmp -s "$work/zoo/resnet50_tiny.json" "$work/again/resnet50_tiny.json"; then
  ok "same seed, same bytes"
else
  fail "same seed gave different files"
fi
cmp -s "$work/zoo/resnet50_tiny.onnx" "$work/seed2/resnet50_tiny.onnx" &&
  fail "seeds 1 and 2 gave the same weights" || ok "another seed, other weights"

# ---- onnx.checker and shape inference; the .json agrees with the model ----
if "$py" - "$work/zoo" <<'EOF'; then ok "onnx.checker full_check + strict shape inference"; else fail "onnx checks"; fi
import glob, json, os, sys
import onnx
from onnx import shape_inference

def dims(vi):
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]

bad = 0
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.onnx")))
assert len(files) == 11, files
for f in files:
    name = os.path.basename(f)
    try:
        m = onnx.load(f)
        onnx.checker.check_model(m, full_check=True)
        inferred = shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
        meta = json.load(open(f[:-5] + ".json"))
        assert meta["file"] == name and meta["opset"] == 17 and meta["tiny"], meta
        assert [o["name"] for o in meta["inputs"]] == [i.name for i in m.graph.input]
        for o, vi in zip(meta["outputs"], inferred.graph.output):
            assert o["name"] == vi.name and o["shape"] == dims(vi), (o, dims(vi))
            assert dims(vi)[0] == "N", "batch dimension must be symbolic"
        for i, vi in zip(meta["inputs"], m.graph.input):
            assert i["shape"] == dims(vi) and dims(vi)[0] == "N"
            # Integer inputs say which values are valid (ids [0, vocab), masks [0, 2)).
            assert (i["dtype"] == "int64") == ("range" in i), i
        if "max_sequence_length" in meta:  # sequence models: [N, L] inputs, L symbolic
            assert meta["max_sequence_length"] == 64, meta["max_sequence_length"]
            assert all(i["shape"] == ["N", "L"] for i in meta["inputs"]), meta["inputs"]
            assert [vi.name for vi in m.graph.input][:2] == ["input_ids", "attention_mask"]
        assert len(m.graph.node) == meta["nodes"]
        ops = {}
        for n in m.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        assert ops == meta["op_types"], (ops, meta["op_types"])
        # Every node input is a graph input, an initializer or a node's output: all weights
        # are initializers, none computed in-graph (no Constant nodes either).
        known = {i.name for i in m.graph.input} | {t.name for t in m.graph.initializer}
        known |= {o for n in m.graph.node for o in n.output}
        assert all(i in known for n in m.graph.node for i in n.input), "dangling input"
        assert "Constant" not in ops
        print(f"  {name}: {len(m.graph.node)} nodes, {meta['params']} params, ops {sorted(ops)}")
    except Exception as e:  # report every model, then fail
        print(f"  {name}: {type(e).__name__}: {e}")
        bad += 1
sys.exit(1 if bad else 0)
EOF

# The op kinds each architecture is meant to exercise.
if "$py" - "$work/zoo" <<'EOF'; then ok "op coverage per model"; else fail "op coverage"; fi
import json, os, sys
want = {
    "vgg19": {"Conv": 16, "Gemm": 3, "MaxPool": 5, "Dropout": 2},
    "alexnet": {"Conv": 5, "Gemm": 3, "LRN": 2, "MaxPool": 3, "Dropout": 2},
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Add": 16},
    "resnet152": {"Conv": 155, "BatchNormalization": 155, "Add": 50},
    "densenet201": {"Conv": 200, "Concat": 98, "AveragePool": 3, "BatchNormalization": 201},
    "densenet121": {"Conv": 120, "Concat": 58, "AveragePool": 3, "BatchNormalization": 121},
    "inception_v3": {"Conv": 94, "Concat": 15, "AveragePool": 9, "MaxPool": 4},
    "mobilenet_v2": {"Conv": 52, "Clip": 35, "Add": 10},
    # Gathers: word (+ token type) and position embeddings, Shape(ids)[1], hidden[:, 0].
    "distilbert": {"Gather": 4, "LayerNormalization": 13, "Softmax": 6, "Erf": 6, "MatMul": 48,
                   "Slice": 1, "Equal": 1, "Where": 6, "Gemm": 2, "Relu": 1},
    "bert": {"Gather": 5, "LayerNormalization": 25, "Softmax": 12, "Erf": 12, "MatMul": 96,
             "Slice": 1, "Cast": 1, "Sub": 1, "Gemm": 2, "Tanh": 1},
    "sensor_tcn": {"Conv": 9, "Relu": 8, "Add": 4, "GlobalAveragePool": 1, "Gemm": 1},
}
bad = 0
for arch, ops in want.items():
    got = json.load(open(os.path.join(sys.argv[1], arch + "_tiny.json")))["op_types"]
    for op, n in ops.items():
        if got.get(op) != n:
            print(f"  {arch}: {op} x{got.get(op)}, want x{n}")
            bad += 1
sys.exit(1 if bad else 0)
EOF

# ---- ONNX Runtime: every tiny model, batch 2, seeded inputs ----
for f in "$work"/zoo/*.onnx; do
  stem=$(basename "$f" .onnx)
  range=$("$py" -c 'import json,sys; i=json.load(open(sys.argv[1]))["inputs"][0]; r=i.get("range"); print(f"{r[0]},{r[1]}" if r else "0,100")' "$work/zoo/$stem.json")
  # Sequence models: length 24 (run_model.js makes attention_mask ones, token_type_ids zeros).
  len_args=()
  grep -q '"max_sequence_length"' "$work/zoo/$stem.json" && len_args=(--dim L=24)
  if ! node "$run_model" "$f" --batch 2 "${len_args[@]}" --seed 3 --int-range "$range" --repeat 5 \
      --output-dir "$work/ort/$stem" --save-inputs --quiet; then
    fail "$stem: onnxruntime could not run it"
    continue
  fi
  if msg=$("$py" - "$work/ort/$stem/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
o = s["outputs"][0]
st = o["stats"]
problems = []
if st["nonfinite"]:
    problems.append(f"{st['nonfinite']} non-finite values")
elif st["std"] < 1e-2:
    problems.append(f"output std {st['std']:.3g}: vanished")
elif st["max_row_diff"] < 1e-3 * st["std"]:
    problems.append("both batch items give the same output: the input is ignored")
if o["dims"][0] != 2:
    problems.append(f"output dims {o['dims']}: batch 2 not honoured")
if "softmax" in st:
    sm = st["softmax"]
    if sm["mean_max_prob"] > 0.99:
        problems.append(f"softmax one-hot (mean max prob {sm['mean_max_prob']:.4f})")
    if sm["mean_entropy"] > 0.999 * sm["max_entropy"]:
        problems.append("softmax flat")
if s["run_ms"]["median"] > 100:
    problems.append(f"median run {s['run_ms']['median']:.1f} ms, want < 100")
desc = (f"{o['dims']} mean {st['mean']:.3g} std {st['std']:.3g} "
        f"range [{st['min']:.3g}, {st['max']:.3g}] run {s['run_ms']['median']:.2f} ms")
if "softmax" in st:
    desc += f" max prob {st['softmax']['max_prob']:.3f}"
print("; ".join(problems) if problems else desc)
sys.exit(1 if problems else 0)
EOF
  ); then
    ok "$stem in onnxruntime: $msg"
  else
    fail "$stem in onnxruntime: $msg"
  fi
done

# ---- the zoo's own reference output (its calibration pass) agrees with onnxruntime ----
for ref_in in "$work"/zoo/*.calib_input.pb; do
  stem=$(basename "$ref_in" .calib_input.pb)
  node "$run_model" "$work/zoo/$stem.onnx" --input "$ref_in" --output-dir "$work/calib/$stem" \
    --quiet || { fail "$stem: onnxruntime on the calibration batch"; continue; }
  if msg=$("$py" - "$work/zoo/$stem.calib_output.pb" "$work/calib/$stem/output_0.pb" <<'EOF'
import sys
import numpy as np
import onnx
from onnx import numpy_helper
ref, got = (numpy_helper.to_array(onnx.load_tensor(f)).astype(np.float64) for f in sys.argv[1:])
assert ref.shape == got.shape, (ref.shape, got.shape)
err = np.abs(ref - got).max() / np.sqrt((ref ** 2).mean())
print(f"batch {ref.shape[0]}, max |diff| / rms {err:.2e}")
sys.exit(0 if err < 1e-3 else 1)
EOF
  ); then
    ok "$stem: zoo reference = onnxruntime ($msg)"
  else
    fail "$stem: zoo reference != onnxruntime ($msg)"
  fi
done

# ---- run_model.js TensorProto files: inputs fed back give the same outputs; onnx reads them ----
d=$work/ort/resnet50_tiny
node "$run_model" "$work/zoo/resnet50_tiny.onnx" --input "input=$d/input_0.pb" \
  --output-dir "$work/ort/replay" --quiet
cmp -s "$d/output_0.pb" "$work/ort/replay/output_0.pb" && ok "run_model.js: saved input replays" ||
  fail "run_model.js: replaying the saved input gave other outputs"
if "$py" - "$d" "$work/ort/distilbert_tiny" <<'EOF'; then ok "run_model.js TensorProto files read by onnx"; else fail "TensorProto files"; fi
import json, sys
import numpy as np
import onnx
from onnx import numpy_helper
for d in sys.argv[1:]:
    s = json.load(open(d + "/summary.json"))
    out = numpy_helper.to_array(onnx.load_tensor(d + "/output_0.pb"))
    inp = numpy_helper.to_array(onnx.load_tensor(d + "/input_0.pb"))
    o = s["outputs"][0]
    assert list(out.shape) == o["dims"] and out.dtype == np.float32, (out.shape, out.dtype)
    assert abs(float(out.mean()) - o["stats"]["mean"]) < 1e-4 * (1 + abs(o["stats"]["mean"]))
    assert list(inp.shape) == s["inputs"][0]["dims"], inp.shape
print("  shapes and statistics agree")
EOF
# A TensorProto written by onnx (float_data, not raw_data) is read too.
"$py" - "$work/in_fd.pb" "$work/zoo/distilbert_tiny.json" <<'EOF'
import json, sys
import numpy as np
from onnx import helper, TensorProto
meta = json.load(open(sys.argv[2]))
seq = 24  # the symbolic L, given to run_model.js as --dim L=24
ids = (np.arange(2 * seq) * 7919 % meta["inputs"][0]["range"][1]).astype(np.int64)
t = helper.make_tensor("input_ids", TensorProto.INT64, [2, seq], ids.tolist())  # int64_data
open(sys.argv[1], "wb").write(t.SerializeToString())
EOF
if node "$run_model" "$work/zoo/distilbert_tiny.onnx" --input "$work/in_fd.pb" --dim L=24 \
    --output-dir "$work/ort/fd" --quiet; then
  ok "run_model.js reads int64_data TensorProto"
else
  fail "run_model.js could not read an int64_data TensorProto"
fi

# ---- sequence classifiers: padding is masked; lengths past the position table are refused ----
# A batch of 2 with lengths 24 and 9 padded to L=32 (ids past the length 0, mask 0; run_model.js
# --lengths) must give each item the logits it gets alone at its own length, unpadded: padded keys
# get exactly zero attention weight, so only rounding differs.
for arch in distilbert bert; do
  stem=${arch}_tiny
  vocab=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["inputs"][0]["range"][1])' \
    "$work/zoo/$stem.json")
  d=$work/mask/$stem
  if ! node "$run_model" "$work/zoo/$stem.onnx" --batch 2 --dim L=32 --lengths 24,9 --seed 11 \
      --int-range "0,$vocab" --output-dir "$d/padded" --save-inputs --quiet; then
    fail "$stem: onnxruntime could not run the padded batch"
    continue
  fi
  # Each item alone: its inputs cut to its length, as NAME.pb in item<b>/; and item 1 padded
  # but with a mask of all ones (unmasked/), which must change its logits, else this test could
  # not see a model that ignores its mask.
  if ! "$py" - "$d" 24 9 <<'EOF'; then fail "$stem: the padded inputs"; continue; fi
import glob, os, sys
import numpy as np
import onnx
from onnx import numpy_helper
d, lengths = sys.argv[1], [int(x) for x in sys.argv[2:]]
for f in sorted(glob.glob(os.path.join(d, "padded", "input_*.pb"))):
    t = onnx.load_tensor(f)
    a = numpy_helper.to_array(t)
    for b, n in enumerate(lengths):
        assert (a[b, n:] == 0).all(), f"{t.name}: item {b} is not zero past {n}"
        if t.name == "attention_mask":
            assert (a[b, :n] == 1).all(), "the mask must be ones up to the length"
        os.makedirs(os.path.join(d, f"item{b}"), exist_ok=True)
        one = numpy_helper.from_array(np.ascontiguousarray(a[b:b + 1, :n]), t.name)
        open(os.path.join(d, f"item{b}", t.name + ".pb"), "wb").write(one.SerializeToString())
    u = np.ones_like(a[1:2]) if t.name == "attention_mask" else a[1:2]
    os.makedirs(os.path.join(d, "unmasked"), exist_ok=True)
    open(os.path.join(d, "unmasked", t.name + ".pb"), "wb").write(
        numpy_helper.from_array(np.ascontiguousarray(u), t.name).SerializeToString())
EOF
  ran=1
  for run in item0 item1 unmasked; do
    inputs=()
    for f in "$d/$run"/*.pb; do inputs+=(--input "$(basename "$f" .pb)=$f"); done
    node "$run_model" "$work/zoo/$stem.onnx" "${inputs[@]}" --output-dir "$d/out_$run" --quiet ||
      ran=0
  done
  [[ $ran == 1 ]] || { fail "$stem: onnxruntime could not run the unpadded items"; continue; }
  if msg=$("$py" - "$d" <<'EOF'
import sys
import numpy as np
import onnx
from onnx import numpy_helper
d = sys.argv[1]
load = lambda f: numpy_helper.to_array(onnx.load_tensor(f)).astype(np.float64)
padded = load(f"{d}/padded/output_0.pb")
worst = 0.0
for b in range(2):
    alone = load(f"{d}/out_item{b}/output_0.pb")
    assert alone.shape == (1, padded.shape[1]), alone.shape
    worst = max(worst, np.abs(padded[b] - alone[0]).max() / np.abs(alone).max())
# The two items must differ, else agreeing with them alone proves little.
assert np.abs(padded[0] - padded[1]).max() > 1e-2 * np.abs(padded).max(), "the items agree"
unmasked = load(f"{d}/out_unmasked/output_0.pb")[0]
alone1 = load(f"{d}/out_item1/output_0.pb")[0]
assert np.abs(unmasked - alone1).max() > 1e-3 * np.abs(alone1).max(), "the mask does nothing"
print(f"lengths 24, 9 padded to 32: max |padded - alone| / max |logit| {worst:.1e}")
sys.exit(0 if worst < 1e-5 else 1)
EOF
  ); then
    ok "$stem: padding masked ($msg)"
  else
    fail "$stem: padding changes the logits ($msg)"
  fi

  # The position table has 64 rows: L=64 runs; L=65 cannot broadcast and must fail.
  if node "$run_model" "$work/zoo/$stem.onnx" --dim L=64 --int-range "0,$vocab" --quiet; then
    ok "$stem: L=64 (max_sequence_length) runs"
  else
    fail "$stem: L=64 (max_sequence_length) does not run"
  fi
  set +e
  node "$run_model" "$work/zoo/$stem.onnx" --dim L=65 --int-range "0,$vocab" --quiet 2>/dev/null
  rc=$?
  set -e
  [[ $rc == 1 ]] && ok "$stem: L=65 refused (exit 1)" || fail "$stem: L=65 exit status $rc, want 1"
done

echo "zoo: $passed passed, $failed failed"
[[ $failed == 0 ]]
