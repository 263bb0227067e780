#!/usr/bin/env bash
# The Wireshark dissector (tools/wireshark/reefline.lua) against what reefgen and reefline put
# on the wire. reefgen writes request captures (images, tokens, tensors, raw; single- and
# multi-datagram; shuffled with duplicates; corrupted), reefline answers some offline (crc32
# built-in; with REEFLINE and ZOO also a top-k model, a tensor model and error answers), and
# tshark dissects each capture. An independent parser (python3 struct, below) reads every frame
# and says what the dissector must show; the two are compared FIELD BY FIELD: every header
# field, fragment bytes, the links between fragments (first frame, duplicates, completion,
# request <-> response), decoded tokens, tensor values, top-k classes and scores, crc32 results
# (also recomputed as CRC32C of the request payload) and error messages. Corrupted datagrams
# must carry exactly the expected expert info, one per corruption reefgen reports, and no
# decoded payload. Also: the documented one-row-per-packet tshark command.
#
#   tests/wireshark_test.sh REEFGEN [REEFLINE [ZOO]]
#
# Exits 77 (skip) when tshark is missing (scripts/setup installs it).
set -euo pipefail

reefgen=${1:?usage: wireshark_test.sh REEFGEN [REEFLINE [ZOO]]}
reefline=${2:-}
zoo=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dissector=$here/../tools/wireshark/reefline.lua
command -v tshark >/dev/null 2>&1 || { echo "skip: tshark missing (scripts/setup installs it)"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 not found"; exit 1; }
[[ -f $dissector ]] || { echo "FAIL: $dissector not found"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/wireshark_test.XXXXXX")
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# The reference: parses a capture with struct alone, runs tshark with the dissector, compares.
cat > "$work/check.py" <<'EOF'
import argparse, math, struct, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("dissector")
ap.add_argument("pcap")
ap.add_argument("--ports", default="9000", help="the dissector's port preference (its default)")
ap.add_argument("--two-pass", action="store_true")
ap.add_argument("--requests", help="request capture the crc32 results answer (recomputed here)")
ap.add_argument("--need", default="", help="NAME=MIN,...: at least MIN frames showed NAME")
ap.add_argument("--exact", default="", help="NAME=N,...: exactly N frames showed NAME")
ap.add_argument("--contract", action="store_true",
                help="also run the documented -Y reefline -T fields command")
a = ap.parse_args()

MAGIC = 0x52464C4E
EXPERTS = ["truncated", "bad_magic", "bad_version", "bad_kind", "bad_format", "bad_status",
           "reserved", "frag_count", "frag_index", "total_length", "empty_fragment", "offset",
           "dims", "result_size", "udp_length", "ip_checksum", "inconsistent", "duplicate",
           "error_status"]
FIELDS = ["frame.number", "reefline.magic", "reefline.version", "reefline.kind", "reefline.format",
          "reefline.status", "reefline.request_id", "reefline.frag_index", "reefline.frag_count",
          "reefline.payload_offset", "reefline.total_length", "reefline.dims.0", "reefline.dims.1",
          "reefline.dims.2", "reefline.dims.3", "reefline.reserved", "reefline.fragment_bytes",
          "reefline.first_frame", "reefline.duplicate_of", "reefline.completed_in",
          "reefline.request_in", "reefline.response_in", "reefline.token_count", "reefline.tokens",
          "reefline.tensor.value", "reefline.topk.class", "reefline.topk.score", "reefline.crc32",
          "reefline.crc32.length", "reefline.error_message", "_ws.col.Info"]
FIELDS += ["reefline.expert." + e for e in EXPERTS]
HEADER = FIELDS[1:16]
MAX_ELEMENTS = 16  # the dissector's "Elements shown" default


def read_pcap(path):
    d = open(path, "rb").read()
    magic = d[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        sys.exit(f"{path}: not a classic pcap file")
    linktype = struct.unpack(e + "I", d[20:24])[0]
    assert linktype == 1, f"{path}: link type {linktype}, want Ethernet"
    frames, pos = [], 24
    while pos < len(d):
        _, _, incl, _ = struct.unpack(e + "IIII", d[pos:pos + 16])
        frames.append(d[pos + 16:pos + 16 + incl])
        pos += 16 + incl
    return frames


def ip_sum_ok(h):
    s = sum(struct.unpack(">%dH" % (len(h) // 2), h))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return s == 0xffff


def parse_udp(f):
    """(src, sport, dst, dport, payload, ip_ok, udp_ok) or None when not IPv4/UDP."""
    l3, et = 14, struct.unpack(">H", f[12:14])[0]
    if et == 0x8100:
        l3, et = 18, struct.unpack(">H", f[16:18])[0]
    if et != 0x0800:
        return None
    ihl = (f[l3] & 15) * 4
    total = struct.unpack(">H", f[l3 + 2:l3 + 4])[0]
    if f[l3 + 9] != 17:
        return None
    src, dst = f[l3 + 12:l3 + 16], f[l3 + 16:l3 + 20]
    u = l3 + ihl
    sport, dport, ulen = struct.unpack(">HHH", f[u:u + 6])
    # Wireshark hands the UDP payload up to the smaller of the UDP and IPv4 lengths.
    end = min(l3 + total, len(f), u + ulen)
    return (src, sport, dst, dport, f[u + 8:end], ip_sum_ok(f[l3:l3 + ihl]), ulen == total - ihl)


def described(fmt, d):
    if fmt == 1: return d[0] * d[1] * d[2]
    if fmt in (2, 18):
        n = 4
        for x in d:
            if x: n *= x
        return n if any(d) else 0
    if fmt == 3: return 4 * d[0]
    if fmt == 17: return 8 * d[0]
    if fmt == 16: return 8
    return None


def format_ok(kind, fmt):
    if kind == 1: return fmt <= 3
    if kind == 2: return fmt in (16, 17, 18)
    return fmt in (0, 1, 2, 3, 16, 17, 18)


def header_problems(h, fraglen, ip_ok, udp_ok):
    p = set()
    if h["magic"] != MAGIC: p.add("bad_magic")
    if h["version"] != 1: p.add("bad_version")
    if p: return p, False
    k, fmt = h["kind"], h["format"]
    if k not in (1, 2, 3): p.add("bad_kind")
    elif not format_ok(k, fmt): p.add("bad_format")
    if k in (1, 2, 3) and not ((h["status"] != 0 and h["status"] <= 6) if k == 3 else h["status"] == 0):
        p.add("bad_status")
    if h["reserved"]: p.add("reserved")
    if h["count"] == 0 or h["count"] > 1024: p.add("frag_count")
    elif h["index"] >= h["count"]: p.add("frag_index")
    if h["total"] == 0 or h["total"] > 8 << 20: p.add("total_length")
    if fraglen == 0 and k != 3: p.add("empty_fragment")
    if h["offset"] + fraglen > h["total"]: p.add("offset")
    if fmt != 0 and fmt in (1, 2, 3, 16, 17, 18) and k != 3:
        want = described(fmt, h["dims"])
        if want is not None and want != h["total"]:
            p.add("result_size" if fmt in (16, 17) else "dims")
    if not p:
        if not udp_ok: p.add("udp_length")
        elif not ip_ok: p.add("ip_checksum")
    return p, True


def crc32c(data, _t=[]):
    if not _t:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
            _t.append(c)
    c = 0xffffffff
    for b in data:
        c = _t[(c ^ b) & 0xff] ^ (c >> 8)
    return c ^ 0xffffffff


ports = {int(x) for x in a.ports.split(",") if x}
frames = read_pcap(a.pcap)
messages = {}
expect = []  # per frame: None (not reefline) or a dict of field -> expected
counts = {}
contract_rows = []


def count(name):
    counts[name] = counts.get(name, 0) + 1


for number, f in enumerate(frames, 1):
    u = parse_udp(f)
    if u is None:
        expect.append(None)
        continue
    src, sport, dst, dport, p, ip_ok, udp_ok = u
    ours = sport in ports or dport in ports or (len(p) >= 40 and struct.unpack(">I", p[:4])[0] == MAGIC and p[4] == 1)
    if not ours:
        expect.append(None)
        continue
    count("frames")
    e = {"experts": set()}
    expect.append(e)
    if len(p) < 40:
        e["experts"] = {"truncated"}
        count("truncated")
        contract_rows.append(("", "", ""))  # a row, with no header fields to print
        continue
    v = struct.unpack(">IBBBBQHHII4HI", p[:40])
    h = dict(zip(["magic", "version", "kind", "format", "status", "id", "index", "count",
                  "offset", "total"], v[:10]))
    h["dims"], h["reserved"] = list(v[10:14]), v[14]
    for name, val in zip(HEADER, v):
        e[name] = val
    fraglen = len(p) - 40
    e["reefline.fragment_bytes"] = fraglen
    contract_rows.append((str(h["id"]), str(h["index"]), str(h["format"])))
    probs, trusted = header_problems(h, fraglen, ip_ok, udp_ok)
    e["experts"] = set(probs)
    e["info"] = (f"fragment {h['index']} of {h['count']} of request {h['id']}" if trusted else "malformed")
    for x in probs:
        count(x)
    if probs:
        continue
    count("valid")
    cls = "q" if h["kind"] == 1 else "r"
    key = (cls, src, sport, dst, dport, h["id"])
    other = ("r" if cls == "q" else "q", dst, dport, src, sport, h["id"])
    m = messages.get(key)
    if m is None:
        m = messages[key] = {"first": number, "shape": (h["count"], h["total"], h["format"], tuple(h["dims"])),
                             "by_index": {}, "completed": None, "response": None}
    e["m"] = m
    if m["first"] != number:
        e["reefline.first_frame"] = m["first"]
        count("first_frame")
    inconsistent = m["shape"] != (h["count"], h["total"], h["format"], tuple(h["dims"]))
    if h["index"] in m["by_index"]:
        e["reefline.duplicate_of"] = m["by_index"][h["index"]]
        e["experts"].add("duplicate")
        count("duplicate")
    elif not inconsistent:
        m["by_index"][h["index"]] = number
        if len(m["by_index"]) == h["count"]:
            m["completed"] = number
    if inconsistent:
        e["experts"].add("inconsistent")
        count("inconsistent")
        continue
    o = messages.get(other)
    if o is not None and cls == "r":
        e["reefline.request_in"] = o["first"]
        count("request_in")
        if o["response"] is None:
            o["response"] = number
    e["o"] = o if cls == "q" else None
    # What one pass shows (the message as far as the capture went); -2 shows the final state.
    e["completed_now"] = m["completed"]
    e["response_now"] = m["response"]
    if fraglen == 0:
        continue
    data, fmt = p[40:], h["format"]
    if h["kind"] == 3:
        e["reefline.error_message"] = data.decode("utf-8", "replace")
        e["experts"].add("error_status")
        count("error")
    elif fmt == 3:
        e["reefline.token_count"] = h["dims"][0]
        if h["offset"] % 4 == 0:
            n = min(fraglen // 4, MAX_ELEMENTS)
            e["reefline.tokens"] = list(struct.unpack("<%di" % n, data[:4 * n]))
            count("tokens")
    elif fmt in (2, 18):
        if h["offset"] % 4 == 0:
            n = min(fraglen // 4, MAX_ELEMENTS)
            e["reefline.tensor.value"] = list(struct.unpack("<%df" % n, data[:4 * n]))
            count("tensor")
    elif fmt == 16:
        if fraglen != 8:  # passes the header checks, so it is tied to its message
            e["experts"].add("result_size")
            count("result_size")
        else:
            e["reefline.crc32.length"], e["reefline.crc32"] = struct.unpack(">II", data)
            e["crc_of"] = other
            count("crc32")
    elif fmt == 17 and h["offset"] % 8 == 0:
        n = fraglen // 8
        pairs = [struct.unpack(">If", data[8 * i:8 * i + 8]) for i in range(n)]
        e["reefline.topk.class"] = [c for c, _ in pairs]
        e["reefline.topk.score"] = [s for _, s in pairs]
        count("topk")

for e in expect:
    if e and "m" in e:
        m = e["m"]
        c = m["completed"] if a.two_pass else e["completed_now"]
        if c is not None:
            e["reefline.completed_in"] = c
            count("completed_in")
        if e.get("o") is None and e.get("reefline.kind") == 1:
            r = m["response"] if a.two_pass else e["response_now"]
            if r is not None:
                e["reefline.response_in"] = r
                count("response_in")

# crc32 results: recompute CRC32C over each request payload, reassembled from its capture.
if a.requests:
    payloads = {}
    for f in read_pcap(a.requests):
        u = parse_udp(f)
        if u is None or len(u[4]) < 40: continue
        src, sport, dst, dport, p, ip_ok, udp_ok = u
        v = struct.unpack(">IBBBBQHHII4HI", p[:40])
        h = {"magic": v[0], "version": v[1], "kind": v[2], "format": v[3], "status": v[4], "index": v[6],
             "count": v[7], "offset": v[8], "total": v[9], "dims": list(v[10:14]), "reserved": v[14]}
        probs, _ = header_problems(h, len(p) - 40, ip_ok, udp_ok)
        if probs or h["kind"] != 1: continue
        buf = payloads.setdefault(("q", src, sport, dst, dport, v[5]), bytearray(h["total"]))
        buf[h["offset"]:h["offset"] + len(p) - 40] = p[40:]
    for e in expect:
        if e and "crc_of" in e:
            body = payloads.get(e["crc_of"])
            if body is None:
                print(f"  crc32 answer to request {e['reefline.request_id']}: no such request"); sys.exit(1)
            if (len(body), crc32c(body)) != (e["reefline.crc32.length"], e["reefline.crc32"]):
                print(f"  request {e['reefline.request_id']}: reefline answered crc32 "
                      f"{e['reefline.crc32']:#x} over {e['reefline.crc32.length']}, recomputed "
                      f"{crc32c(body):#x} over {len(body)}"); sys.exit(1)
            count("crc32_recomputed")

# The dissector's view.
cmd = ["tshark", "-n", "-X", "lua_script:" + a.dissector, "-o", "reefline.check_ip_checksum:TRUE",
       "-r", a.pcap, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=|", "-E", "header=n"]
if a.two_pass:
    cmd.append("-2")
if a.ports != "9000":
    cmd += ["-o", "reefline.ports:" + a.ports]
for fld in FIELDS:
    cmd += ["-e", fld]
out = subprocess.run(cmd, capture_output=True, text=True)
if out.returncode != 0 or "Lua" in out.stderr and "rror" in out.stderr:
    print(out.stderr); sys.exit("tshark failed")
rows = [line.split("\t") for line in out.stdout.splitlines()]
assert len(rows) == len(frames), (len(rows), len(frames))

bad = []
INT = set(HEADER) | {"reefline.fragment_bytes", "reefline.first_frame", "reefline.duplicate_of",
                     "reefline.completed_in", "reefline.request_in", "reefline.response_in",
                     "reefline.token_count", "reefline.crc32", "reefline.crc32.length"}


def same_float(x, y):
    return x == y or math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-37)


for number, (e, row) in enumerate(zip(expect, rows), 1):
    got = dict(zip(FIELDS, row))
    problems = []
    if e is None:
        extra = [k for k, v in got.items() if k.startswith("reefline.") and v]
        if extra:
            problems.append(f"not reefline, yet dissected: {extra[:4]}")
    else:
        fired = {x for x in EXPERTS if got["reefline.expert." + x]}
        if fired != e["experts"]:
            problems.append(f"expert info {sorted(fired)}, want {sorted(e['experts'])}")
        for k in FIELDS[1:-1 - len(EXPERTS)]:
            want, have = e.get(k), got[k]
            if k in INT:
                if (int(have, 0) if have else None) != want:
                    problems.append(f"{k} = {have!r}, want {want!r}")
            elif k in ("reefline.tokens", "reefline.topk.class"):
                if ([int(x) for x in have.split("|")] if have else None) != want:
                    problems.append(f"{k} = {have!r}, want {want!r}")
            elif k in ("reefline.tensor.value", "reefline.topk.score"):
                hv = [float(x) for x in have.split("|")] if have else None
                if (hv is None) != (want is None) or (hv and (len(hv) != len(want) or
                                                          not all(map(same_float, hv, want)))):
                    problems.append(f"{k} = {have!r}, want {want!r}")
            elif k == "reefline.error_message":
                if (have or None) != want:
                    problems.append(f"{k} = {have!r}, want {want!r}")
        if "info" in e and e["info"] not in got["_ws.col.Info"]:
            problems.append(f"info column {got['_ws.col.Info']!r} lacks {e['info']!r}")
    if problems:
        bad.append(f"  frame {number}: " + "; ".join(problems))

if a.contract:
    # The documented command: one row per reefline packet.
    c = subprocess.run(["tshark", "-X", "lua_script:" + a.dissector, "-r", a.pcap, "-Y", "reefline",
                        "-T", "fields", "-e", "reefline.request_id", "-e", "reefline.frag_index",
                        "-e", "reefline.format"], capture_output=True, text=True)
    got_rows = [tuple(l.split("\t")) for l in c.stdout.splitlines()]
    if got_rows != contract_rows:
        bad.append(f"  -Y reefline -T fields: {len(got_rows)} rows, want {len(contract_rows)} "
                   f"(first difference at row {next((i for i, (x, y) in enumerate(zip(got_rows, contract_rows)) if x != y), min(len(got_rows), len(contract_rows)))})")

for spec, exact in ((a.need, False), (a.exact, True)):
    for item in filter(None, spec.split(",")):
        name, n = item.split("=")
        have = counts.get(name, 0)
        if (have != int(n)) if exact else (have < int(n)):
            bad.append(f"  {name}: {have} frames, want {'exactly' if exact else 'at least'} {n}")

summary = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
if bad:
    print("\n".join(bad[:20]) + (f"\n  ... {len(bad) - 20} more" if len(bad) > 20 else ""))
    print("  " + summary)
    sys.exit(1)
print(summary)
EOF

# check NAME PCAP [check.py options]: field-by-field comparison of one capture.
check() {
  local name=$1 pcap=$2; shift 2
  local msg
  if msg=$(python3 "$work/check.py" "$dissector" "$pcap" "$@" 2>&1); then
    ok "$name: $(tail -n 1 <<< "$msg")"
  else
    fail "$name"
    echo "$msg"
  fi
}

gen() {  # gen NAME reefgen-pcap-args...: writes $work/NAME.pcap, keeps reefgen's summary
  local name=$1; shift
  "$reefgen" pcap --out "$work/$name.pcap" "$@" > "$work/$name.gen"
}

# ---- requests: every format, one datagram and many, through the port and the heuristic ----
gen image --requests 12 --shape 16x16x3 --frag-size 200 --dport 9000 --seed 11
check "image requests, 4 fragments each (port 9000)" "$work/image.pcap" --contract \
  --exact frames=48,valid=48,first_frame=36,completed_in=12
gen image1 --requests 4 --shape 8x8x3 --frag-size 1432 --dport 9000 --seed 12
check "image requests in one datagram" "$work/image1.pcap" --exact valid=4
gen tokens --requests 20 --tokens 1-300 --frag-size 256 --dport 9123 --seed 13
check "token requests of 1..300 tokens (heuristic, port 9123)" "$work/tokens.pcap" --contract \
  --need tokens=40,valid=40
gen tokens1 --requests 6 --tokens 10 --vocab 50000 --dport 9123 --seed 14
check "token requests in one datagram" "$work/tokens1.pcap" --exact tokens=6
gen tensor1 --requests 3 --format tensor --dims 16,6 --dport 9000 --seed 15
check "tensor requests in one datagram" "$work/tensor1.pcap" --exact tensor=3
# 1021-byte fragments: only the first of each request starts on an f32 (values decoded there).
gen tensor --requests 3 --format tensor --dims 64,6 --frag-size 1021 --dport 9000 --seed 16
check "tensor requests, unaligned fragments" "$work/tensor.pcap" --exact tensor=3,valid=6
head -c 3000 /dev/urandom > "$work/blob.bin"
gen raw --requests 3 --format raw --raw "$work/blob.bin" --frag-size 1000 --dport 9000 --seed 17
check "raw requests (file)" "$work/raw.pcap" --exact valid=9
gen rawsyn --requests 3 --format raw --shape 10x10x10 --frag-size 300 --dport 9000 --seed 18
check "raw requests (synthetic)" "$work/rawsyn.pcap" --exact valid=12

# ---- shuffled, duplicated: every copy flagged as a duplicate of the right frame ----
gen dup --requests 40 --tokens 50 --frag-size 64 --dport 9000 --seed 19 --shuffle --dup 0.2
dups=$(sed -n 's/.* duplicated=\([0-9]*\).*/\1/p' "$work/dup.gen")
check "shuffled with $dups duplicates" "$work/dup.pcap" --contract --exact "duplicate=$dups" \
  --need tokens=40,first_frame=100
# In two passes, every fragment of a complete request names the frame that completed it.
check "shuffled, two passes" "$work/dup.pcap" --two-pass --exact "duplicate=$dups" --need completed_in=160

# ---- corrupted: exactly one expert info per corruption, nothing decoded from those ----
gen corrupt --requests 64 --shape 8x8x3 --frag-size 50 --dport 9000 --seed 20 --shuffle --dup 0.05 \
  --corrupt 0.2
# reefgen's own count of each corruption, as the problem the dissector must report.
exact=$(python3 - "$work/corrupt.gen" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
c = dict(re.findall(r"(\w+)=(\d+)", t.split("\n")[0].split("corruptions:")[1]))
name = {"bad_magic": "bad_magic", "bad_version": "bad_version", "index_out_of_range": "frag_index",
        "offset_out_of_range": "offset", "udp_length": "udp_length", "ip_checksum": "ip_checksum"}
assert all(int(v) > 0 for v in c.values()), f"the seed does not exercise every corruption: {c}"
print(",".join(f"{name[k]}={v}" for k, v in c.items()))
EOF
) || { fail "corrupted capture: $exact"; exact=; }
if [[ -n $exact ]]; then
  check "corrupted ($exact)" "$work/corrupt.pcap" --contract --exact "$exact" --need valid=200
  # Off the preferred ports, only the heuristic finds packets: bad magic and version are not ours.
  gen corrupt2 --requests 32 --shape 8x8x3 --frag-size 50 --dport 9555 --seed 21 --corrupt 0.2
  check "corrupted off the preferred ports (heuristic only)" "$work/corrupt2.pcap" --exact bad_magic=0,bad_version=0 \
    --need frag_index=1,offset=1

  # With the port preference set to that port, they are shown and flagged again.
  check "corrupted, port preference 9555" "$work/corrupt2.pcap" --ports 9555 --need bad_magic=1,bad_version=1,frag_index=1
fi

# ---- every other header check, on hand-made datagrams (one problem each, port 9000) ----
python3 - "$work/crafted.pcap" <<'EOF2'
import struct, sys
def frame(payload, sport=40000, dport=9000):
    udp = struct.pack(">HHHH", sport, dport, 8 + len(payload), 0) + payload
    ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                               bytes([198, 18, 0, 1]), bytes([198, 18, 0, 2])))
    c = sum(struct.unpack(">10H", bytes(ip)))
    while c >> 16: c = (c & 0xffff) + (c >> 16)
    ip[10:12] = struct.pack(">H", 0xffff - c)
    return bytes.fromhex("020000000002" "020000000001" "0800") + bytes(ip) + udp
def hdr(kind=1, fmt=0, status=0, rid=7, index=0, count=1, offset=0, total=4, dims=(0, 0, 0, 0), reserved=0):
    return struct.pack(">IBBBBQHHII4HI", 0x52464C4E, 1, kind, fmt, status, rid, index, count, offset, total, *dims, reserved)
cases = [
    b"RFLN\x01\x01" + bytes(14),                        # truncated: 20 bytes
    hdr(reserved=5) + b"abcd",                            # reserved
    hdr(kind=9) + b"abcd",                                # bad_kind
    hdr(kind=1, fmt=17, dims=(1, 0, 0, 0), total=8) + bytes(8),  # bad_format: a result in a request
    hdr(kind=2, fmt=3, dims=(1, 0, 0, 0)) + bytes(4),     # bad_format: tokens in a response
    hdr(kind=2, fmt=16, status=3, total=8) + bytes(8),    # bad_status: a response not ok
    hdr(kind=3, status=0) + b"oops",                      # bad_status: an error with status ok
    hdr(count=0) + b"abcd",                               # frag_count
    hdr(count=1025) + b"abcd",                            # frag_count
    hdr(total=(8 << 20) + 4, offset=8 << 20) + b"abcd",   # total_length
    hdr(total=4),                                         # empty_fragment
    hdr(fmt=1, dims=(2, 2, 2, 0), total=12) + bytes(12),  # dims: 2x2x2 is 8 bytes
    hdr(fmt=3, dims=(5, 0, 0, 0), total=16) + bytes(16),  # dims: 5 tokens are 20 bytes
    hdr(fmt=2, dims=(0, 0, 0, 0), total=4) + bytes(4),    # dims: a tensor without extents
    hdr(kind=2, fmt=17, dims=(3, 0, 0, 0), total=16) + bytes(16),  # result_size: top-3 is 24 bytes
    hdr(kind=2, fmt=16, total=8, count=2) + bytes(4),     # result_size: crc32 split
    hdr(rid=8, fmt=3, dims=(2, 0, 0, 0), total=8) + struct.pack("<2i", -5, 70000),  # fine: tokens
    hdr(rid=9, kind=3, status=4, total=9) + b"too late!", # fine: an error and its message
]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<IHHiIII", 0xa1b2c3d4, 2, 4, 0, 0, 65535, 1))
    for c in cases:
        fr = frame(c)
        f.write(struct.pack("<IIII", 1700000000, 0, len(fr), len(fr)) + fr)
EOF2
check "hand-made malformed headers" "$work/crafted.pcap" --contract --exact \
  truncated=1,reserved=1,bad_kind=1,bad_format=2,bad_status=2,frag_count=2,total_length=1,empty_fragment=1,dims=3,result_size=2,valid=3,tokens=1,error=1

# ---- responses ----
if [[ -n $reefline ]]; then
  answer() {  # answer NAME REQUESTS-PCAP reefline-args...: $work/NAME.resp.pcap
    local name=$1 req=$2; shift 2
    "$reefline" --offline "$req" --responses "$work/$name.resp.pcap" "$@" > "$work/$name.out" 2> "$work/$name.err" || {
      cat "$work/$name.err"; fail "$name: reefline exited non-zero"; return 1; }
  }
  if answer crc "$work/image.pcap" --builtin crc32:9000; then
    check "crc32 answers (recomputed CRC32C of each request)" "$work/crc.resp.pcap" \
      --requests "$work/image.pcap" --exact crc32=12,crc32_recomputed=12
    # Requests and answers in one capture: each names the other (two passes).
    mergecap -F pcap -a -w "$work/crc.both.pcap" "$work/image.pcap" "$work/crc.resp.pcap"
    check "requests and crc32 answers linked" "$work/crc.both.pcap" --two-pass \
      --requests "$work/image.pcap" --exact request_in=12,response_in=48,crc32_recomputed=12
  fi
  if answer crcraw "$work/raw.pcap" --builtin crc32:9000; then
    check "crc32 answers to raw requests" "$work/crcraw.resp.pcap" --requests "$work/raw.pcap" \
      --exact crc32_recomputed=3
  fi
  if [[ -n $zoo ]]; then
    "$zoo" --out "$work/zoo" --tiny --only resnet50_tiny,sensor_tcn_tiny -q
    # Images for the top-k IF, and token requests it refuses (error answers with a message).
    gen model_img --requests 6 --shape 64x64x3 --frag-size 1021 --dport 9100 --seed 22 --shuffle
    gen model_tok --requests 2 --tokens 10 --dport 9100 --seed 23
    mergecap -F pcap -a -w "$work/model.pcap" "$work/model_img.pcap" "$work/model_tok.pcap"
    if answer model "$work/model.pcap" --model "rt:9100:$work/zoo/resnet50_tiny.onnx:rt:600000"; then
      check "top-k and error answers (heuristic, port 9100)" "$work/model.resp.pcap" --exact topk=6,error=2
    fi
    gen sensor --requests 3 --format tensor --dims 64,6 --frag-size 1000 --dport 9101 --seed 24
    if answer sensor "$work/sensor.pcap" --model "sensor:9101:$work/zoo/sensor_tcn_tiny.onnx:be:600000:tensor"; then
      check "tensor answers" "$work/sensor.resp.pcap" --exact tensor=3
    fi
  fi
fi

echo "wireshark: $passed passed, $failed failed"
[[ $failed == 0 ]]
