#!/usr/bin/env bash
# The MoonGen request builder (tools/moongen/reefline_request.lua) against reefgen: for token
# requests with seeds and lengths drawn from a range, raw files, synthetic raw, image and tensor
# payloads, one fragment and many, the module's UDP payloads must equal BYTE FOR BYTE those in
# the capture `reefgen pcap` writes with the same options (extracted with python3 struct). Both
# refuse a request of more than 1024 fragments. Every check runs under each interpreter found:
# a stock Lua 5.3/5.4 and LuaJIT (MoonGen's own; optional).
#
# The userscript (tools/moongen/reefline-load.lua) is checked for syntax (luac -p), and with
# LuaJIT it runs against a stub of the few MoonGen calls it makes: the frames it sends must
# carry reefgen's UDP payloads (request ids too, past --distinct), correct Ethernet/IPv4/UDP
# headers, and its receive side must count answers and errors fed to it.
#
#   tests/moongen_test.sh BUILD/tools/reefgen
#
# Exits 77 (skip) when no Lua 5.3+ or LuaJIT interpreter is installed (apt-get install lua5.4).
set -euo pipefail

reefgen=${1:?usage: moongen_test.sh REEFGEN}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
moongen_dir=$(cd "$here/../tools/moongen" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/moongen_test.XXXXXX")
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# Interpreters: the first stock Lua with 64-bit integers, and LuaJIT.
luas=()
for l in lua5.4 lua5.3 lua; do
  if command -v "$l" >/dev/null 2>&1 && "$l" -e 'assert(math.type)' 2>/dev/null; then
    luas+=("$l")
    break
  fi
done
command -v luajit >/dev/null 2>&1 && luas+=(luajit)
[[ ${#luas[@]} -gt 0 ]] || { echo "skip: no Lua 5.3+ or LuaJIT interpreter (apt-get install lua5.4)"; exit 77; }
echo "interpreters: ${luas[*]}"

# drive.lua DIR reefgen-args...: the module's UDP payloads for reefgen's options, one hex line
# each, in reefgen's order (requests in order, fragments in index order: no --shuffle). Also
# decodes each header back and checks it against what was asked for.
cat > "$work/drive.lua" <<'EOF'
package.path = arg[1] .. "/?.lua;" .. package.path
local R = require "reefline_request"
local o, requests, frag = {}, 1, 1024
local i = 2
while arg[i] do
  local k, v = arg[i], arg[i + 1]
  if k == "--requests" then requests = tonumber(v)
  elseif k == "--frag-size" then frag = tonumber(v)
  elseif k == "--seed" then o.seed = v
  elseif k == "--format" then o.format = v
  elseif k == "--vocab" then o.vocab = tonumber(v)
  elseif k == "--shape" then
    local h, w, c = v:match("^(%d+)x(%d+)x(%d+)$")
    o.shape = { tonumber(h), tonumber(w), tonumber(c) }
  elseif k == "--tokens" then
    local a, b = v:match("^(%d+)-(%d+)$")
    if a then o.tokens, o.tokens_max = tonumber(a), tonumber(b) else o.tokens = tonumber(v) end
  elseif k == "--dims" then
    o.dims = {}
    for d in v:gmatch("%d+") do o.dims[#o.dims + 1] = tonumber(d) end
  elseif k == "--raw" then o.raw = R.read_file(v)
  end  -- addresses and ports do not reach the UDP payload
  i = i + 2
end
local ok, src = pcall(R.source, o)
if not ok then io.stderr:write(tostring(src), "\n") os.exit(2) end
local out = {}
for n = 0, requests - 1 do
  local id, fmt, dims, payload = src:payload(n)
  local ok2, frags = pcall(R.fragments, id, fmt, dims, payload, frag)
  if not ok2 then io.stderr:write(tostring(frags), "\n") os.exit(2) end
  for j, p in ipairs(frags) do
    local h = assert(R.parse_header(p))
    assert(h.id == R.id_string(id) and h.frag_index == j - 1 and h.frag_count == #frags
      and h.total_length == #payload and h.payload_offset == (j - 1) * frag and h.kind == 1
      and h.format == fmt and h.fragment_length == #p - 40, "header does not decode back")
    out[#out + 1] = (p:gsub(".", function(c) return string.format("%02x", c:byte()) end))
  end
end
io.write(table.concat(out, "\n"), "\n")
EOF

# UDP payloads of a capture, one hex line each (struct only: Ethernet, IPv4, UDP).
cat > "$work/udp_payloads.py" <<'EOF'
import struct, sys
d = open(sys.argv[1], "rb").read()
e = "<" if d[:4] == b"\xd4\xc3\xb2\xa1" else ">"
assert struct.unpack(e + "I", d[:4])[0] == 0xa1b2c3d4, "not a microsecond pcap"
pos, out = 24, []
while pos < len(d):
    incl = struct.unpack(e + "I", d[pos + 8:pos + 12])[0]
    f = d[pos + 16:pos + 16 + incl]
    pos += 16 + incl
    assert struct.unpack(">H", f[12:14])[0] == 0x0800 and f[23] == 17, "not IPv4/UDP"
    u = 14 + (f[14] & 15) * 4
    ulen = struct.unpack(">H", f[u + 4:u + 6])[0]
    out.append(f[u + 8:u + ulen].hex())
print("\n".join(out))
EOF

# same NAME reefgen-args...: reefgen's payloads and the module's, byte for byte.
same() {
  local name=$1; shift
  "$reefgen" pcap --out "$work/ref.pcap" --src 10.1.2.3 --dst 10.1.2.4 --sport 5000 --dport 9001 "$@" > /dev/null
  python3 "$work/udp_payloads.py" "$work/ref.pcap" > "$work/ref.hex"
  local lua packets
  packets=$(wc -l < "$work/ref.hex")
  for lua in "${luas[@]}"; do
    if ! "$lua" "$work/drive.lua" "$moongen_dir" "$@" > "$work/lua.hex" 2> "$work/lua.err"; then
      fail "$name ($lua): $(cat "$work/lua.err")"
    elif cmp -s "$work/ref.hex" "$work/lua.hex"; then
      ok "$name ($lua): $packets UDP payloads identical"
    else
      fail "$name ($lua): UDP payloads differ from reefgen's"
      diff <(cut -c1-160 "$work/ref.hex") <(cut -c1-160 "$work/lua.hex") | head -6
    fi
  done
}

# ---- the request builder against reefgen ----
same "tokens, one datagram" --requests 4 --tokens 64 --seed 3
same "tokens, 3 fragments of 1432 bytes" --requests 3 --tokens 1000 --seed 7 --frag-size 1432
same "tokens 1-300 (length drawn per request)" --requests 24 --tokens 1-300 --seed 9 --frag-size 100
same "tokens, full vocabulary and u64 seed, 7-byte fragments" --requests 3 --tokens 50 --vocab 2147483647 \
  --seed 18446744073709551615 --frag-size 7
head -c 3001 /dev/urandom > "$work/blob.bin"
head -c 48 /dev/urandom > "$work/tokens.bin"
head -c 300 /dev/urandom > "$work/image.bin"
head -c 1024 /dev/urandom > "$work/kib.bin"
same "raw file, 4 fragments (last shorter)" --requests 2 --format raw --raw "$work/blob.bin" --frag-size 1000 --seed 4
same "raw file as tokens, 10-byte fragments" --requests 2 --format tokens --raw "$work/tokens.bin" --frag-size 10
same "raw file as an image" --requests 2 --format image --shape 10x10x3 --raw "$work/image.bin" --frag-size 128
same "raw file, 1024 one-byte fragments" --requests 1 --format raw --raw "$work/kib.bin" --frag-size 1
same "synthetic raw" --requests 3 --format raw --shape 5x7x3 --seed 5 --frag-size 50
same "synthetic images" --requests 3 --shape 16x20x3 --seed 2 --frag-size 333
same "synthetic images, 1 and 4 channels" --requests 2 --shape 9x7x1 --seed 6 --frag-size 1432
same "synthetic images, 4 channels" --requests 2 --shape 5x6x4 --seed 6
same "synthetic tensors 16x6" --requests 3 --format tensor --dims 16,6 --seed 4 --frag-size 100
same "synthetic tensors 3x4x5x2" --requests 2 --format tensor --dims 3,4,5,2 --seed 5 --frag-size 1000
same "40 requests (ids base+n), default seed" --requests 40 --tokens 3

# Both refuse more than 1024 fragments.
for lua in "${luas[@]}"; do
  set +e
  "$reefgen" pcap --out "$work/big.pcap" --requests 1 --format raw --raw "$work/blob.bin" --frag-size 2 > /dev/null 2>&1
  rc_gen=$?
  "$lua" "$work/drive.lua" "$moongen_dir" --requests 1 --format raw --raw "$work/blob.bin" --frag-size 2 > /dev/null 2> "$work/err"
  rc_lua=$?
  set -e
  if [[ $rc_gen == 2 && $rc_lua == 2 ]] && grep -q "1024" "$work/err"; then
    ok "1501 fragments refused by reefgen and the module ($lua)"
  else
    fail "1501 fragments: reefgen exit $rc_gen, module exit $rc_lua ($(cat "$work/err"))"
  fi
done

# ---- the userscript ----
script=$moongen_dir/reefline-load.lua
# One file per luac call: Debian's luac5.4 crashes on "-p" with several files.
for f in "$script" "$moongen_dir/reefline_request.lua"; do
  for c in luac luac5.4 luac5.3; do command -v "$c" >/dev/null 2>&1 && break; c=; done
  [[ -n $c ]] || break
  if "$c" -p "$f" 2> "$work/luac.err"; then
    ok "$c -p $(basename "$f")"
  else
    fail "$c -p $(basename "$f"): $(cat "$work/luac.err")"
  fi
  if command -v luajit >/dev/null 2>&1; then  # MoonGen's compiler
    if luajit -b "$f" "$work/bytecode.out" 2> "$work/luac.err"; then
      ok "luajit -b $(basename "$f")"
    else
      fail "luajit -b $(basename "$f"): $(cat "$work/luac.err")"
    fi
  fi
done

if command -v luajit >/dev/null 2>&1; then
  # stub.lua SCRIPT TX_OUT RX_IN -- ARGS: the MoonGen calls the script makes, over plain memory;
  # every frame sent is written to TX_OUT (hex), RX_IN's frames are received.
  cat > "$work/stub.lua" <<'EOF'
local ffi = require "ffi"
local script, tx_out, rx_in = arg[1], arg[2], arg[3]
local argv = {}
for i = 5, #arg do argv[#argv + 1] = arg[i] end

local stopped, rx_frames = false, {}
for line in io.lines(rx_in) do rx_frames[#rx_frames + 1] = line end
local out = assert(io.open(tx_out, "w"))
local clock = 0

local function new_buf()
  local b = { mem = ffi.new("uint8_t[?]", 65536), size = 0 }
  function b:getBytes() return self.mem end
  function b:setSize(n) self.size = n end
  function b:getSize() return self.size end
  return b
end
local function buf_array(n)
  local a = { size = n, maxSize = n, bufs = {} }
  for i = 1, n do a.bufs[i] = new_buf() end
  return setmetatable(a, { __index = function(t, k)
    if type(k) == "number" then return t.bufs[k] end
    return ({
      allocN = function(self, size, num) assert(num <= self.maxSize) self.size = num
        for i = 1, num do self.bufs[i].size = size end end,
      offloadUdpChecksums = function() end,
      free = function() end, freeAll = function() end,
    })[k]
  end })
end

package.preload["moongen"] = function()
  return {
    running = function() return not stopped or #rx_frames > 0 end,
    stop = function() stopped = true end,
    getTime = function() clock = clock + 1e-6 return clock end,
    sleepMillis = function() end,
    startTask = function(name, ...)
      local args = { ... }
      local done = false
      return { wait = function() if not done then done = true _G[name](unpack(args)) end end }
    end,
  }
end
package.preload["memory"] = function()
  return {
    createMemPool = function(o) return { bufArray = function(_, n) return buf_array(n or 63) end } end,
    bufArray = function(n) return buf_array(n or 63) end,
  }
end
package.preload["device"] = function()
  local dev = {
    getMacString = function() return "02:00:00:00:00:01" end,
    getTxQueue = function() return {
      setRate = function() end,
      send = function(_, bufs)
        for i = 1, bufs.size do
          local b = bufs[i]
          local t = {}
          for j = 0, b.size - 1 do t[#t + 1] = string.format("%02x", b.mem[j]) end
          out:write(table.concat(t), "\n")
        end
        return bufs.size
      end,
    } end,
    getRxQueue = function() return {
      tryRecv = function(_, bufs)
        local n = 0
        while n < bufs.size and #rx_frames > 0 do
          n = n + 1
          local hex = table.remove(rx_frames, 1)
          local b = bufs[n]
          for j = 0, #hex / 2 - 1 do b.mem[j] = tonumber(hex:sub(2 * j + 1, 2 * j + 2), 16) end
          b.size = #hex / 2
        end
        return n
      end,
    } end,
  }
  return { config = function() return dev end, waitForLinks = function() end }
end

-- The part of argparse that configure() uses.
local parser, specs = {}, {}
local function spec(kind, name)
  local s = { kind = kind, name = name }
  specs[#specs + 1] = s
  local o = {}
  function o:default(v) s.default = v return self end
  function o:convert(f) s.convert = f return self end
  function o:target(t) s.target = t return self end
  function o:args() return self end
  return o
end
function parser:description() end
function parser:argument(name) return spec("argument", name) end
function parser:option(names) return spec("option", names:match("%-%-([%w%-]+)")) end
function parser:flag(names) return spec("flag", names:match("%-%-([%w%-]+)")) end

dofile(script)
configure(parser)
local args, positional = {}, {}
local i = 1
while argv[i] do
  local a = argv[i]
  if a:sub(1, 2) == "--" then
    local s
    for _, x in ipairs(specs) do if x.name == a:sub(3) then s = x end end
    assert(s, "unknown option " .. a)
    if s.kind == "flag" then s.value = true else s.value = argv[i + 1]; i = i + 1 end
  else
    positional[#positional + 1] = a
  end
  i = i + 1
end
local p = 1
for _, s in ipairs(specs) do
  if s.kind == "argument" then s.value = positional[p]; p = p + 1 end
  local v = s.value
  if v == nil then v = s.default end
  if v ~= nil and s.convert then v = s.convert(v) end
  args[s.target or s.name:gsub("%-", "_")] = v
end
master(args)
out:close()
EOF

  # Checks the frames the script sent: addresses, lengths, IPv4 checksum, UDP payloads (to
  # reefgen's, the request ids of repeated payloads patched to base + n).
  cat > "$work/frames.py" <<'EOF'
import struct, sys
frames = [bytes.fromhex(l) for l in open(sys.argv[1]).read().split()]
ref = [bytes.fromhex(l) for l in open(sys.argv[2]).read().split()]
cameras = int(sys.argv[3])
assert len(frames) == len(ref), f"{len(frames)} frames, reefgen wrote {len(ref)}"
for n, (f, r) in enumerate(zip(frames, ref)):
    assert f[:6] == bytes.fromhex("3cfdfeaabbcc") and f[6:12] == bytes.fromhex("020000000001"), "MACs"
    assert f[12:14] == b"\x08\x00" and f[14] == 0x45 and f[23] == 17, "not IPv4/UDP"
    assert struct.unpack(">H", f[16:18])[0] == len(f) - 14, "IPv4 total length"
    assert f[20:22] == b"\x40\x00", "DF"
    s = sum(struct.unpack(">10H", f[14:34]))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    assert s == 0xffff, "IPv4 header checksum"
    assert f[26:30] == bytes([10, 1, 2, 3]) and f[30:34] == bytes([10, 1, 2, 4]), "IPs"
    sport, dport, ulen = struct.unpack(">HHH", f[34:40])
    assert dport == 9001 and ulen == len(f) - 34, (dport, ulen)
    rid = struct.unpack(">Q", r[8:16])[0]
    base = struct.unpack(">Q", ref[0][8:16])[0]
    assert sport == 5000 + (rid - base) % cameras, f"frame {n}: source port {sport}"
    assert f[42:] == r, f"frame {n}: UDP payload differs from reefgen's"
print(f"{len(frames)} frames")
EOF

  # Answers for the receive side: crc32 results to every request, one an error, one cut short,
  # and an ARP frame; built with the module (kind response/error) inside a frame from python.
  cat > "$work/answers.lua" <<'EOF'
package.path = arg[1] .. "/?.lua;" .. package.path
local R = require "reefline_request"
local src = R.source{ format = "tokens", tokens = 10, seed = 31 }
for n = 0, 5 do
  local id = R.u64.add(src.id_base, n)
  local frags
  if n == 1 then
    frags = R.fragments(id, "raw", nil, "this IF takes image_u8_hwc requests", 1024, { kind = R.KIND.error, status = R.STATUS.unsupported_format })
  elseif n == 2 then
    frags = { R.fragments(id, "result_tensor_f32", { 300 }, string.rep("\0", 1200), 1000, { kind = R.KIND.response })[1] }
  else
    frags = R.fragments(id, "result_crc32", nil, string.rep("\1", 8), 1024, { kind = R.KIND.response })
  end
  for _, p in ipairs(frags) do
    print((40000 + n % 2) .. " " .. (p:gsub(".", function(c) return string.format("%02x", c:byte()) end)))
  end
end
EOF

  stub_run() {  # stub_run NAME CAMERAS reefgen-args... -- script-args...
    local name=$1 cameras=$2; shift 2
    local gen=() run=()
    while [[ $# -gt 0 && $1 != -- ]]; do gen+=("$1"); shift; done
    shift
    run=("$@")
    "$reefgen" pcap --out "$work/stub_ref.pcap" --src 10.1.2.3 --dst 10.1.2.4 --sport 5000 --dport 9001 \
      --sources "$cameras" "${gen[@]}" > /dev/null
    python3 "$work/udp_payloads.py" "$work/stub_ref.pcap" > "$work/stub_ref.hex"
    if ! luajit "$work/stub.lua" "$script" "$work/tx.hex" "$work/rx.hex" -- 0 --src 10.1.2.3 --dst 10.1.2.4 \
        --sport 5000 --dport 9001 --dst-mac 3c:fd:fe:aa:bb:cc --cameras "$cameras" --rate 0 "${run[@]}" \
        > "$work/stub.out" 2>&1; then
      fail "$name: the userscript failed under stubs"; cat "$work/stub.out"; return
    fi
    if msg=$(python3 "$work/frames.py" "$work/tx.hex" "$work/stub_ref.hex" "$cameras" 2>&1); then
      ok "$name: $msg as reefgen's, headers right"
    else
      fail "$name: $msg"
    fi
  }

  : > "$work/rx.hex"
  stub_run "userscript, tokens" 3 --requests 7 --tokens 100 --seed 3 --frag-size 64 -- \
    --requests 7 --distinct 7 --format tokens --tokens 100 --seed 3 --fragment-size 64
  stub_run "userscript, images" 1 --requests 2 --shape 16x16x3 --seed 8 --frag-size 400 -- \
    --requests 2 --format image --shape 16x16x3 --seed 8 --fragment-size 400
  stub_run "userscript, tensors" 2 --requests 3 --format tensor --dims 16,6 --seed 4 -- \
    --requests 3 --format tensor --dims 16,6 --seed 4
  # Past --distinct, payloads repeat with the ids reefgen gives those requests: the same frames
  # for a payload that does not depend on n (a raw file).
  stub_run "userscript, 20 requests from 3 distinct payloads (raw file)" 4 --requests 20 --format raw \
    --raw "$work/blob.bin" --frag-size 1432 -- --requests 20 --distinct 3 --format raw --raw "$work/blob.bin" \
    --fragment-size 1432

  # Receive side: 4 crc32 answers (4 complete), 1 error, 1 answer missing its last fragment, ARP.
  luajit "$work/answers.lua" "$moongen_dir" | python3 -c '
import struct, sys
for line in sys.stdin:
    port, hexp = line.split()
    p = bytes.fromhex(hexp)
    udp = struct.pack(">HHHH", 9001, int(port), 8 + len(p), 0) + p
    ip = bytes([0x45, 0]) + struct.pack(">H", 20 + len(udp)) + bytes(4) + bytes([64, 17, 0, 0, 10, 1, 2, 4, 10, 1, 2, 3])
    print((bytes.fromhex("020000000001" "3cfdfeaabbcc" "0800") + ip + udp).hex())
print((bytes.fromhex("ffffffffffff" "3cfdfeaabbcc" "0806") + bytes(28)).hex())
' > "$work/rx.hex"
  if luajit "$work/stub.lua" "$script" "$work/tx.hex" "$work/rx.hex" -- 0 --src 10.1.2.3 --dst 10.1.2.4 \
      --sport 40000 --dport 9001 --dst-mac 3c:fd:fe:aa:bb:cc --cameras 2 --rate 0 --requests 1 \
      --format tokens --tokens 10 > "$work/rx.out" 2>&1 &&
     grep -q "received fragments=6 responses=4 errors=1 (unsupported_format=1) incomplete=1 malformed=0 foreign=1" "$work/rx.out"; then
    ok "userscript receive side: $(grep received "$work/rx.out")"
  else
    fail "userscript receive side"; cat "$work/rx.out"
  fi
else
  echo "note: luajit not installed: the userscript is not run against MoonGen stubs"
fi

echo "moongen: $passed passed, $failed failed"
[[ $failed == 0 ]]
