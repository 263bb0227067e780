# Sourced by the tests that run ONNX Runtime: skips the test (exit 77) without node, and
# installs onnxruntime-node into tests/ort on first use (one npm at a time across parallel
# tests). Needs $root, the repository root.
command -v node >/dev/null || { echo "skip: node missing"; exit 77; }
if [ ! -d "$root/tests/ort/node_modules/onnxruntime-node" ]; then
  (cd "$root/tests/ort" && flock /tmp/reefline-npm.lock npm install --ignore-scripts --no-audit --no-fund >/dev/null)
fi
