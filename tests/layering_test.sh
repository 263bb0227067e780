#!/bin/bash
# Layering (docs/architecture.md, "Layering"): each folder includes only the folders below it.
# The wire protocol includes nothing of reefline; the client library stands on its own headers
# and the protocol's; preempt/ knows nothing of models or packets; and so on up to the daemon.
# Fails naming every include that crosses a layer the wrong way.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

# folder | the folders its sources may include ("self" is the folder itself)
rules='
clients/c/wire|self
clients/c|self clients/c/wire
dataplane|self clients/c/wire
preempt|self
dkp|self preempt
libml/kernels|self preempt
libml|self libml/kernels preempt dkp
ifmanager|self dataplane libml libml/kernels preempt dkp clients/c/wire
'

layer_of() {  # include path -> the layer folder it belongs to
  case "$1" in
    clients/c/wire/*) echo clients/c/wire ;;
    clients/c/*) echo clients/c ;;
    libml/kernels/*) echo libml/kernels ;;
    *) echo "${1%%/*}" ;;
  esac
}

list_sources() {  # the tracked sources under a folder (any source file outside a checkout)
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then git ls-files -- "$1"; else find "$1" -type f; fi |
    grep -E '\.(h|hpp|cc|cpp|c|cu|cuh)$'
}

bad=0 checked=0
while IFS='|' read -r folder allowed; do
  [ -n "$folder" ] || continue
  while IFS= read -r file; do
    # files of a deeper layer folder are checked under that folder's own rule
    [ "$(layer_of "$file")" = "$folder" ] || continue
    while IFS= read -r inc; do
      checked=$((checked + 1))
      layer=$(layer_of "$inc")
      ok=0
      for a in $allowed; do
        [ "$a" = self ] && a=$folder
        [ "$layer" = "$a" ] && ok=1
      done
      if [ $ok = 0 ]; then
        echo "FAIL layering: $file includes \"$inc\" ($folder may include: ${allowed//self/$folder})"
        bad=$((bad + 1))
      fi
    done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$file")
  done < <(list_sources "$folder")
done <<< "$rules"

echo "layering: $checked includes checked, $bad crossing a layer the wrong way"
[ "$checked" -gt 100 ] || { echo "FAIL layering: too few includes found (wrong root?)"; exit 1; }
[ $bad = 0 ]
