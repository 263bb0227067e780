#!/usr/bin/env bash
# Kubernetes manifests test, offline: deploy/k8s/check/check.js validates every manifest
# (kinds and apiVersions, the OpenAPI schemas of Kubernetes and prometheus-operator, unknown
# fields, references between the objects, PromQL, embedded shell scripts; overlays rendered,
# and compared with `kubectl kustomize` where kubectl is installed). Then: broken copies of the
# manifests must be refused, each for the reason it was broken; the appliance's entrypoint
# derives the per-node arguments from the pod's environment; and, given the daemon, the
# ConfigMap's configuration and the arguments the entrypoint passes are options it takes.
#
#   tests/k8s_test.sh [BUILD/ifmanager/reefline]
#
# Installs the validator's npm packages into deploy/k8s/check (npm ci --ignore-scripts) when
# they are missing; exits 77 (skip) without node or npm, or when the registry is unreachable.
set -euo pipefail

reefline=${1:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
k8s=$root/deploy/k8s
check_dir=$k8s/check
work=$(mktemp -d "${TMPDIR:-/tmp}/k8s_test.XXXXXX")
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

command -v node >/dev/null || { echo "SKIP: node not found (scripts/setup installs it)"; exit 77; }
command -v npm >/dev/null || { echo "SKIP: npm not found (scripts/setup installs it)"; exit 77; }
# The validator's packages, pinned by package-lock.json, installed once; a lock keeps parallel
# runs from installing at once.
if [[ ! -d $check_dir/node_modules/kubernetes-models ]]; then
  (
    flock 9
    if [[ ! -d $check_dir/node_modules/kubernetes-models ]]; then
      echo "installing the validator's packages into $check_dir"
      (cd "$check_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) ||
        { echo "SKIP: npm ci failed (registry unreachable?)"; exit 77; }
    fi
  ) 9>"${TMPDIR:-/tmp}/reefline-k8s-npm-install.lock"
fi

# ---- every manifest ----
kubectl_arg=()
# kubectl renders kustomizations offline; a second opinion on the overlays where it exists.
if command -v kubectl >/dev/null && kubectl kustomize "$k8s/base" >/dev/null 2>&1; then
  kubectl_arg=(--kubectl)
else
  echo "note: no kubectl (or it cannot render kustomizations): overlays are rendered by check.js alone"
fi
if node "$check_dir/check.js" --metrics-source "$root/ifmanager/metrics.cc" --metrics-source "$root/ifmanager/if_stats.h" "${kubectl_arg[@]}" "$k8s" >"$work/check.log" 2>&1; then
  ok "deploy/k8s: $(tail -1 "$work/check.log")"
else
  grep -E '^FAIL|Error' "$work/check.log" || tail -5 "$work/check.log"
  fail "deploy/k8s: $(tail -1 "$work/check.log")"
fi

# ---- broken manifests are refused, for the right reason ----
# broken NAME FILE SED-EXPRESSION EXPECTED: a copy of deploy/k8s with FILE edited must fail
# with a line containing EXPECTED.
broken() {
  local name=$1 file=$2 expr=$3 want=$4 copy=$work/broken/$1
  rm -rf "$copy"
  mkdir -p "$copy"
  cp -r "$k8s/base" "$k8s/overlays" "$k8s"/*.yaml "$copy/"
  sed -i "$expr" "$copy/$file"
  if cmp -s "$copy/$file" "$k8s/$file"; then
    fail "$name: the edit changed nothing in $file (the test is stale)"
    return
  fi
  if node "$check_dir/check.js" --metrics-source "$root/ifmanager/metrics.cc" --metrics-source "$root/ifmanager/if_stats.h" "$copy" >"$copy.log" 2>&1; then
    fail "$name: accepted"
  elif grep -q "^FAIL: .*$want" "$copy.log"; then
    ok "$name: refused ($(grep -m1 "^FAIL: .*$want" "$copy.log" | cut -c7- | cut -c1-150))"
  else
    fail "$name: refused, but not for '$want': $(grep -m1 '^FAIL' "$copy.log")"
  fi
}
broken "misspelt field" base/daemonset.yaml 's/failureThreshold: 120/failureTreshold: 120/' "does not exist in type"
broken "unknown apiVersion" base/daemonset.yaml 's#^apiVersion: apps/v1#apiVersion: extensions/v1beta1#' "unknown apiVersion/kind"
broken "unknown kind" base/service.yaml 's/^kind: Service/kind: Servise/' "unknown apiVersion/kind"
broken "missing required field" base/service.yaml '0,/      port: 5555/{/      port: 5555/d}' "must have required property port"
broken "wrong type" base/daemonset.yaml 's/containerPort: 5555/containerPort: "5555x"/' "must be integer"
broken "value outside the enum" base/networkpolicy.yaml '0,/protocol: TCP/s//protocol: TPC/' "must be equal to one of the allowed values"
broken "misspelt field in a CRD" base/servicemonitor.yaml 's/scrapeTimeout:/scrapeTimout:/' "does not exist in type"
broken "PromQL syntax" base/prometheusrule.yaml 's/rate(reefline_if_shed_total\[5m\])/rate(reefline_if_shed_total[5m]/' "PromQL syntax error"
broken "metric the daemon does not export" base/prometheusrule.yaml 's/reefline_port_rx_missed_total/reefline_port_rx_miss_total/' "does not export"
broken "missing ConfigMap" base/configmap.yaml 's/name: reefline-config/name: reefline-conf/' "no ConfigMap reefline-config"
broken "hugepages request != limit" base/daemonset.yaml '0,/hugepages-2Mi: 2Gi/s//hugepages-2Mi: 1Gi/' "must be equal"
broken "no hugepage volume" base/daemonset.yaml 's/medium: HugePages-2Mi/medium: Memory/' "without a mounted HugePages-2Mi emptyDir"
broken "VF not requested" base/sriov-network.yaml 's#resourceName: intel.com/reefline_vfs#resourceName: intel.com/other_vfs#' "no container requests intel.com/other_vfs"
broken "no such network" base/daemonset.yaml 's#k8s.v1.cni.cncf.io/networks: reefline-sriov#k8s.v1.cni.cncf.io/networks: sriov-net#' "no NetworkAttachmentDefinition"
broken "Service selects nothing" base/service.yaml 's/    app.kubernetes.io\/name: reefline$/    app.kubernetes.io\/name: reef/' "selects no workload"
broken "ServiceMonitor port" base/servicemonitor.yaml 's/- port: metrics/- port: metric/' "not a port of"
broken "NetworkPolicy shuts a port" base/networkpolicy.yaml 's/port: 9465/port: 9466/' "not admitted"
broken "shell syntax in the entrypoint" base/configmap.yaml 's/^    set -eu$/    set -eu; if then/' "shell syntax"
broken "overlay patches what the base lacks" overlays/gpu/daemonset-gpu.yaml '0,/  name: reefline/s//  name: reefline-gpu/' "does not have"
broken "unquoted number in env" add-model-job.yaml 's/value: "9100"/value: 9100/' "value must be string"

# ---- the entrypoint: per-node arguments from the pod's environment ----
node -e '
const YAML = require(process.argv[1] + "/node_modules/yaml");
const fs = require("fs");
const cm = YAML.parse(fs.readFileSync(process.argv[2], "utf8"), { version: "1.1" });
for (const [k, v] of Object.entries(cm.data)) fs.writeFileSync(process.argv[3] + "/" + k, v);
' "$check_dir" "$k8s/base/configmap.yaml" "$work" 2>&1 || fail "cannot extract the ConfigMap's files"
mkdir -p "$work/bin"
# A stand-in daemon that prints its arguments, one per line.
printf '#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n' >"$work/bin/reefline"
chmod +x "$work/bin/reefline"
node_name=$(awk '!/^#/ && NF {print $1; exit}' "$work/appliances.tsv")
node_ip=$(awk '!/^#/ && NF {print $2; exit}' "$work/appliances.tsv")
cpus=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
n=$(echo "$cpus" | tr ',' '\n' | awk -F- '{n += ($2 == "" ? 1 : $2 - $1 + 1)} END {print n}')
run_entrypoint() {
  env -i PATH="$work/bin:/usr/bin:/bin" REEFLINE_CONFIG_DIR="$work" HUGEPAGES_MB=2048 MEMORY_LIMIT_MB=8192 \
    PCIDEVICE_INTEL_COM_REEFLINE_VFS=0000:3b:02.1,0000:3b:02.2 "$@" sh "$work/entrypoint.sh"
}
if args=$(run_entrypoint NODE_NAME="$node_name" 2>"$work/entrypoint.err"); then
  # The arguments the daemon gets, as one line to compare.
  got=$(tr '\n' ' ' <<<"$args")
  want="--config $work/reefline.toml --ip $node_ip --backend cpu --compute-units $((n > 1 ? n - 1 : 1)) --memory-budget 6144M --eal -l $(echo "$cpus" | cut -d, -f1 | cut -d- -f1) -a 0000:3b:02.1 --in-memory --iova-mode=va -m 2048 --no-telemetry "
  [[ $got == "$want" ]] && ok "entrypoint: $node_name -> --ip $node_ip, the first VF, the pod's cpus, hugepages and memory" ||
    fail "entrypoint passed '$got', want '$want'"
else
  fail "entrypoint failed: $(cat "$work/entrypoint.err")"
fi
if args=$(run_entrypoint NODE_NAME="$node_name" REEFLINE_BACKEND=cuda 2>/dev/null) && grep -qx cuda <<<"$args"; then
  ok "entrypoint: REEFLINE_BACKEND=cuda (the GPU overlay) gives --backend cuda"
else
  fail "entrypoint ignores REEFLINE_BACKEND"
fi
set +e
run_entrypoint NODE_NAME=no-such-node >/dev/null 2>"$work/entrypoint.err"
rc=$?
set -e
[[ $rc == 1 ]] && grep -q "no-such-node has no line in appliances.tsv" "$work/entrypoint.err" &&
  ok "entrypoint: a node without an address is refused" || fail "entrypoint on an unknown node: exit $rc, $(cat "$work/entrypoint.err")"
set +e
env -i PATH="$work/bin:/usr/bin:/bin" REEFLINE_CONFIG_DIR="$work" NODE_NAME="$node_name" HUGEPAGES_MB=2048 \
  MEMORY_LIMIT_MB=8192 sh "$work/entrypoint.sh" >/dev/null 2>"$work/entrypoint.err"
rc=$?
set -e
[[ $rc == 1 ]] && grep -q "did not get an SR-IOV VF" "$work/entrypoint.err" &&
  ok "entrypoint: a pod without a VF is refused" || fail "entrypoint without a VF: exit $rc, $(cat "$work/entrypoint.err")"

# ---- the daemon takes the ConfigMap's configuration and the entrypoint's arguments ----
if [[ -n $reefline ]]; then
  # --help parses the file and the arguments and runs the options' checks, starting nothing.
  if out=$("$reefline" --config "$work/reefline.toml" --help 2>&1 >/dev/null); then
    ok "the ConfigMap's reefline.toml: every key is a daemon option"
  else
    fail "the ConfigMap's reefline.toml: $out"
  fi
  mapfile -t daemon_args < <(run_entrypoint NODE_NAME="$node_name" 2>/dev/null)
  if out=$("$reefline" "${daemon_args[@]}" --help 2>&1 >/dev/null); then
    ok "the entrypoint's arguments are daemon options"
  else
    fail "the entrypoint's arguments: $out"
  fi
else
  echo "note: no reefline given: the ConfigMap's configuration is not checked against the daemon"
fi

echo "k8s: $passed passed, $failed failed"
[[ $failed == 0 ]]
