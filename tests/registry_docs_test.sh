#!/bin/bash
# The policy and backend registries (preempt/policy_registry.h policies(), preempt/backend_registry.h
# backends()) against the docs: every policy the daemon's --help lists is described in the
# README, docs/architecture.md, preempt/README.md and the shipped configuration's comment, and
# every backend in the README, so that a policy or backend added to a registry and not to the
# docs fails here. Usage: registry_docs_test.sh REEFLINE_EXE
set -euo pipefail
reefline=$1
root=$(cd "$(dirname "$0")/.." && pwd)
help=$("$reefline" --help)
python3 - "$root" "$help" <<'PY'
import re, sys, pathlib
root = pathlib.Path(sys.argv[1])
text = sys.argv[2]
def section(title):
    at = text.index(title)
    body = text[at + len(title):]
    end = re.search(r"\n\s+-", body)
    return re.findall(r"^\s+([a-z_0-9]+): ", body[:end.start() if end else len(body)], re.M)
policies, backends = section("GPU scheduling policy:"), section("device backend:")
assert len(policies) >= 6 and "reef" in policies, policies
assert backends and backends[0] == "cpu", backends
bad = []
for doc in ("README.md", "docs/architecture.md", "preempt/README.md", "deploy/config/reefline.toml"):
    words = set(re.findall(r"[a-z_0-9]+", (root / doc).read_text()))
    bad += [f"{doc}: policy {p} is not described" for p in policies if p not in words]
readme = set(re.findall(r"[a-z_0-9]+", (root / "README.md").read_text()))
bad += [f"README.md: backend {b} is not described" for b in backends if b not in readme]
print("policies:", ", ".join(policies), "| backends:", ", ".join(backends))
if bad:
    print("\n".join(bad)); sys.exit(1)
PY
