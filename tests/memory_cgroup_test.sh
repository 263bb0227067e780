#!/usr/bin/env bash
# The memory budget inside a memory cgroup (a Kubernetes pod, a systemd slice with
# MemoryMax): the daemon runs in a cgroup of its own whose limit is far below what the host
# has available. Its default budget must come from the cgroup (health: budget_source
# "cgroup", the cgroup named), a model whose planned footprint fits the host but not the
# cgroup must be refused with bad_model naming the budget, and the daemon must still be alive
# and serving afterwards (before, the model was admitted and the kernel OOM-killed the daemon,
# losing every IF). A small model that fits is still taken.
#
# The cgroup: v2 where the memory controller can be enabled for a child of a writable
# cgroup2 mount, else v1's memory hierarchy. Needs root; skips (77) when no memory cgroup can
# be made here.
#
#   memory_cgroup_test.sh REEFLINE REEFCTL ZOO
set -euo pipefail
reefline=$1 reefctl=$2 zoo=$3
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root"; exit 77; }
py=/usr/bin/python3
"$py" -c "import onnx" 2>/dev/null || { echo "skip: python3-onnx missing (scripts/setup installs it)"; exit 77; }

tmp=$(mktemp -d)
cg=
pid=
limit=$((768 << 20))
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# A cgroup with a memory limit: v2 first, then v1.
name=reefline_budget_$$
v2=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
v1=$(awk '$3 == "cgroup" && $4 ~ /(^|,)memory(,|$)/ {print $2; exit}' /proc/mounts)
version=
if [ -n "$v2" ] && grep -qw memory "$v2/cgroup.controllers" 2>/dev/null; then
  grep -qw memory "$v2/cgroup.subtree_control" 2>/dev/null || echo +memory > "$v2/cgroup.subtree_control" 2>/dev/null || true
  if grep -qw memory "$v2/cgroup.subtree_control" 2>/dev/null && mkdir "$v2/$name" 2>/dev/null; then
    cg=$v2/$name
    if echo "$limit" > "$cg/memory.max" 2>/dev/null; then version=v2; else rmdir "$cg"; cg=; fi
  fi
fi
if [ -z "$version" ] && [ -n "$v1" ] && mkdir "$v1/$name" 2>/dev/null; then
  cg=$v1/$name
  if echo "$limit" > "$cg/memory.limit_in_bytes" 2>/dev/null; then version=v1; else rmdir "$cg"; cg=; fi
fi
[ -n "$version" ] || { echo "skip: no memory cgroup can be made here"; exit 77; }
echo "cgroup $version: $cg, limit $((limit >> 20)) MiB"

# Models: a tiny classifier that fits, and one whose Expand makes a 1x3x2048x4096 f32 tensor
# per image (96 MiB; with max_batch 16 its arenas take about 3 GiB): a small file, a large
# footprint.
"$zoo" --out "$tmp" --tiny --only resnet50_tiny -q
"$py" - "$tmp/expand.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
shape = numpy_helper.from_array(np.array([1, 3, 2048, 4096], dtype=np.int64), "shape")
g = helper.make_graph(
    [helper.make_node("Expand", ["x", "shape"], ["big"]),
     helper.make_node("ReduceMean", ["big"], ["y"], axes=[2, 3], keepdims=0)],
    "expand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 1, 1])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [shape])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
onnx.save(m, sys.argv[1])
PY

# The daemon, moved into the cgroup before it starts (its EAL memory is charged there too).
sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
  "$reefline" --control "ipc://$tmp/c.sock" --metrics off --repo "$tmp/repo" \
  --eal "--no-pci --no-huge -m 128 --vdev=net_null0,no-rx=1" > "$tmp/out" 2> "$tmp/err" &
pid=$!
for _ in $(seq 300); do [ -S "$tmp/c.sock" ] && break; sleep 0.1; done
[ -S "$tmp/c.sock" ] || { cat "$tmp/err"; echo "FAIL: the daemon did not start"; exit 1; }
grep "memory budget" "$tmp/err"

"$reefctl" --endpoint "ipc://$tmp/c.sock" --json health > "$tmp/health.json"
add_rc=0
"$reefctl" --endpoint "ipc://$tmp/c.sock" add-model --name big --port 9100 --onnx "$tmp/expand.onnx" --max-batch 16 \
  > "$tmp/big.out" 2>&1 || add_rc=$?
cat "$tmp/big.out"
kill -0 "$pid" 2>/dev/null || { cat "$tmp/err"; echo "FAIL: the daemon died (OOM-killed?) adding a model the cgroup cannot hold"; exit 1; }
"$reefctl" --endpoint "ipc://$tmp/c.sock" add-model --name small --port 9101 --onnx "$tmp/resnet50_tiny.onnx" \
  --max-batch 2 > /dev/null
"$reefctl" --endpoint "ipc://$tmp/c.sock" --json list > "$tmp/list.json"
"$reefctl" --endpoint "ipc://$tmp/c.sock" shutdown > /dev/null
wait "$pid" || { cat "$tmp/err"; echo "FAIL: the daemon's exit"; exit 1; }
pid=

"$py" - "$tmp/health.json" "$tmp/list.json" "$cg" "$limit" "$add_rc" "$tmp/big.out" <<'PY'
import json, sys
health, listed = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
cg, limit, add_rc, big = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), open(sys.argv[6]).read()
m = health["memory"]
assert m["budget_source"] == "cgroup", m
assert cg in m["available_at_start"], m
assert 0 < m["budget_bytes"] <= limit * 3 // 4, m
assert add_rc != 0 and "bad_model" in big and "budget" in big, (add_rc, big)
assert [x["name"] for x in listed["models"]] == ["small"], listed
print(f"budget {m['budget_bytes'] >> 20} MiB from the cgroup ({m['available_at_start']}); "
      "the model it cannot hold refused, the daemon alive, a small one taken")
PY
echo "memory cgroup: ok"
