#!/usr/bin/env bash
# The Wireshark dissector (tools/wireshark/reefline.lua) on hostile input: no capture may make it
# raise a Lua error. tshark dissects, in one pass and in two (-2, with the IPv4 checksum
# preference on and every element of a fragment decoded), with the full tree (-V):
#   * every capture of the seed corpus tests/fuzz/corpus/dissector/ (valid requests and answers
#     of every format, and hostile datagrams: dims whose product passes 2^53 and 2^64, fragment
#     counts of 0, indexes past the count, huge total lengths and offsets, truncated headers,
#     every header field wrong, duplicated and inconsistent fragments, answers to unknown
#     requests, odd request ids, ICMP-quoted and snap-length-cut datagrams), which must be
#     exactly what tests/fuzz/dissector_corpus.py writes;
#   * seeded mutants of those datagrams (dissector_corpus.py mutate: bit flips, boundary values
#     over the header and dims, truncation, extension, wrong UDP/IPv4 lengths, snap-length cuts,
#     duplicated frames, originals beside their mutants), in three captures of a few hundred
#     (each corpus capture as likely a source as any other), the same on every run.
# Any "Lua Error" in tshark's output, or tshark failing, fails the test. Also: the valid_*
# captures carry no error or warning expert info, and every reefline frame of the dims_*
# captures carries reefline.expert.dims (malformed), so a reverted fix fails here twice over.
#
#   tests/dissector_fuzz_test.sh [DISSECTOR.lua]
#
# DISSECTOR defaults to tools/wireshark/reefline.lua. DISSECTOR_FUZZ_MUTANTS (default 400 per
# mutant capture) and DISSECTOR_FUZZ_SEED (default 1) widen or move the search when run by hand
# (a failure names the capture and frame; DISSECTOR_FUZZ_KEEP=DIR keeps the captures there).
# Exits 77 (skip) when tshark is missing (scripts/setup installs it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dissector=${1:-$here/../tools/wireshark/reefline.lua}
generator=$here/fuzz/dissector_corpus.py
corpus=$here/fuzz/corpus/dissector
mutants_per_file=${DISSECTOR_FUZZ_MUTANTS:-400}
seed=${DISSECTOR_FUZZ_SEED:-1}
command -v tshark >/dev/null 2>&1 || { echo "skip: tshark missing (scripts/setup installs it)"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 not found"; exit 1; }
[[ -f $dissector ]] || { echo "FAIL: $dissector not found"; exit 1; }
dissector=$(cd "$(dirname "$dissector")" && pwd)/$(basename "$dissector")
work=$(mktemp -d "${TMPDIR:-/tmp}/dissector_fuzz_test.XXXXXX")
trap 'rm -rf "$work"' EXIT
export HOME=$work  # no personal Wireshark preferences or plugins
start=$SECONDS

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# ---- the committed corpus is what the generator writes ----
python3 "$generator" write "$work/regen"
stale=$( (cd "$work/regen" && printf '%s\n' *.pcap; cd "$corpus" && printf '%s\n' *.pcap) | sort | uniq -u)
differ=$(cd "$work/regen" && for f in *.pcap; do [[ ! -f $corpus/$f ]] || cmp -s "$f" "$corpus/$f" || echo "$f"; done)
if [[ -z $stale$differ ]]; then
  captures=("$corpus"/*.pcap)
  ok "corpus: ${#captures[@]} captures, as dissector_corpus.py writes them"
else
  fail "corpus differs from dissector_corpus.py (missing or extra: ${stale//$'\n'/ }; changed: ${differ//$'\n'/ });" \
    "rewrite it with: python3 tests/fuzz/dissector_corpus.py write"
fi

# ---- mutants: three captures, each of mutants of every corpus capture's datagrams together ----
# (so that mutants also meet other messages' reassembly and linking state).
for i in 1 2 3; do
  python3 "$generator" mutate "$work/mutants_$i.pcap" $((seed * 1000 + i)) "$mutants_per_file" "$corpus"/*.pcap
done
if [[ -n ${DISSECTOR_FUZZ_KEEP:-} ]]; then mkdir -p "$DISSECTOR_FUZZ_KEEP"; cp "$work"/mutants_*.pcap "$DISSECTOR_FUZZ_KEEP"/; fi

# dissect NAME PCAP [tshark options]: full tree; fails on a Lua error or tshark failing.
dissect() {
  local name=$1 pcap=$2; shift 2
  local out=$work/out.txt rc=0
  tshark -n -X "lua_script:$dissector" -r "$pcap" -V "$@" > "$out" 2>&1 || rc=$?
  local frames errors
  frames=$(grep -c '^Frame [0-9]*:' "$out" || true)
  # A Lua error in a dissection ("Lua Error: ..." in the tree), or tshark's own complaint about
  # the script (a syntax or loading error: "tshark: Lua: ...").
  errors=$(grep -c 'Lua Error\|^\(tshark: \)\?Lua: ' "$out" || true)
  if [[ $rc != 0 || $errors != 0 || $frames == 0 ]]; then
    fail "$name: tshark exit $rc, $frames frames, $errors lines with a Lua error"
    # Each Lua error with the frame it came from.
    awk '/^Frame [0-9]+:/ {frame = $2}
         /Lua Error/ {m = $0; sub(/^.*Lua Error: /, "", m); sub(/\]$/, "", m)
                      if (!seen[m]++) print "  frame " frame ": Lua Error: " m}' "$out" | head -n 10
    grep -m 5 '^\(tshark: \)\?Lua: ' "$out" || true
    [[ $rc == 0 ]] || tail -n 5 "$out"
    return 1
  fi
  cp "$out" "$work/last.txt"
}

# ---- every capture, one pass and two ----
corpus_ok=0
corpus_runs=0
for f in "$corpus"/*.pcap "$work"/mutants_*.pcap; do
  n=$(basename "$f" .pcap)
  for mode in one two; do
    corpus_runs=$((corpus_runs + 1))
    if [[ $mode == one ]]; then
      dissect "$n (one pass)" "$f" || continue
    else
      dissect "$n (two passes)" "$f" -2 -o reefline.check_ip_checksum:TRUE -o reefline.max_elements:4096 || continue
    fi
    corpus_ok=$((corpus_ok + 1))
    # Valid captures: nothing flagged (notes such as error answers are fine).
    if [[ $n == valid_* ]] && grep -q 'Expert Info (\(Error\|Warning\)/' "$work/last.txt"; then
      fail "$n ($mode pass): a valid capture has error or warning expert info:"
      grep 'Expert Info (\(Error\|Warning\)/' "$work/last.txt" | sort | uniq -c | head -n 5
    fi
  done
done
mutants=("$work"/mutants_*.pcap)
if [[ $corpus_ok == "$corpus_runs" ]]; then
  ok "no Lua error in $corpus_runs tshark runs (corpus and ${#mutants[@]} captures of mutants, one and two passes)"
fi

# ---- dims whose product passes 2^53 / 2^64: every reefline frame malformed (expert dims) ----
for f in "$corpus"/dims_*.pcap; do
  n=$(basename "$f" .pcap)
  rows=$(tshark -n -X "lua_script:$dissector" -r "$f" -T fields -E header=n \
           -e frame.number -e reefline.magic -e reefline.expert.dims 2>/dev/null) || true
  total=$(awk -F'\t' '$2 != ""' <<< "$rows" | wc -l)
  unflagged=$(awk -F'\t' '$2 != "" && $3 == "" {printf " %s", $1}' <<< "$rows")
  if [[ $total -gt 0 && -z $unflagged ]]; then
    ok "$n: all $total reefline frames carry reefline.expert.dims"
  else
    fail "$n: $total reefline frames; without reefline.expert.dims:${unflagged:- (none dissected)}"
  fi
done

echo "dissector_fuzz: $passed passed, $failed failed ($((SECONDS - start)) s)"
[[ $failed == 0 ]]
