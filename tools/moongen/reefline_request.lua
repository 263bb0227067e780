-- reefline_request: builds reefline wire protocol v1 requests (docs/protocol.md,
-- clients/c/wire/protocol.h) as UDP payloads, exactly as reefgen cuts them, and reefgen's synthetic
-- payloads bit for bit (tools/reefgen/payload.cc, tools/reefgen/common.h).
--
-- Plain Lua, no MoonGen API: the load generator (reefline-load.lua) fills packet buffers from
-- these strings, and tests/moongen_test.sh compares them byte for byte with reefgen's captures
-- under a stock interpreter. It runs on Lua 5.3/5.4 (native 64-bit integers) and on LuaJIT 2.1,
-- MoonGen's interpreter (64-bit arithmetic on ffi uint64_t cdata): reefgen's generators are
-- xorshift64* and SplitMix64, which need exact 64-bit wrap-around multiplication. Lua 5.1/5.2
-- without ffi have only doubles and are refused when the module loads.
--
--   local R = require "reefline_request"
--   local udp = R.fragments(id, "tokens", {8}, payload, 1024)      -- list of UDP payloads
--   local src = R.source{format = "tokens", tokens = 64, seed = 3}  -- reefgen's payloads
--   local id, fmt, dims, payload = src:payload(n)                   -- request n, like reefgen
--   local udp = src:request(n, 1400)                                -- its fragments
local M = {}

M.MAGIC = 0x52464C4E  -- "RFLN"
M.VERSION = 1
M.HEADER_SIZE = 40
M.MAX_FRAGMENTS = 1024
M.MAX_TOTAL_LENGTH = 8 * 1024 * 1024
-- The largest fragment whose Ethernet/IPv4/UDP frame still fits a 65535-byte datagram (as
-- reefgen's max_frag_size), and the one that fits a 1500-byte MTU.
M.MAX_FRAG_SIZE = 65535 - 14 - 20 - 8 - 40
M.MTU_FRAG_SIZE = 1500 - 20 - 8 - 40

M.KIND = { request = 1, response = 2, error = 3 }
M.FORMAT = {
  raw = 0, image_u8_hwc = 1, tensor_f32 = 2, tokens_i32 = 3,
  result_crc32 = 16, result_topk = 17, result_tensor_f32 = 18,
}
-- reefgen's --format spellings.
local format_alias = { raw = 0, image = 1, tensor = 2, tokens = 3 }
M.STATUS = {
  ok = 0, bad_request = 1, unsupported_format = 2, overloaded = 3,
  deadline_exceeded = 4, internal_error = 5, shutting_down = 6,
}
M.DEFAULT_VOCAB = 1000  -- reefgen's --vocab default

-------------------------------------------------------------------------------------------
-- 64-bit unsigned arithmetic. Every value of type "u64" below is an opaque backend value: a
-- Lua integer (5.3+, two's complement bit pattern) or a uint64_t cdata (LuaJIT).
-------------------------------------------------------------------------------------------
local U
if math.type and math.maxinteger and math.maxinteger == 0x7fffffffffffffff then
  -- Compiled from a string: LuaJIT (and 5.1/5.2) would reject the 5.3 operators at parse time.
  U = assert(load([[
    local U = {}
    U.backend = "lua" .. _VERSION:sub(5)
    function U.from(x)  -- a Lua number, integer or decimal string
      if type(x) == "string" then
        local v = 0
        assert(x:match("^%d+$"), "not a decimal number: " .. x)
        for d in x:gmatch("%d") do v = v * 10 + tonumber(d) end  -- wraps mod 2^64
        return v
      end
      local i = math.tointeger(x)
      assert(i, "not an integer: " .. tostring(x))
      return i
    end
    function U.k(hi, lo) return (hi << 32) | lo end
    function U.xor(a, b) return a ~ b end
    function U.band(a, b) return a & b end
    function U.shr(a, n) return a >> n end  -- logical
    function U.shl(a, n) return a << n end
    function U.mul(a, b) return a * b end   -- wraps mod 2^64
    function U.add(a, b) return a + b end
    function U.is_zero(a) return a == 0 end
    function U.byte(a, i) return (a >> (8 * i)) & 0xff end  -- byte i, 0 = least significant
    function U.num(a)  -- exact below 2^53
      if a < 0 then return (a >> 1) * 2.0 + (a & 1) end
      return a
    end
    function U.tostring(a) return string.format("%u", a) end
    function U.f32_bytes(v) return string.pack("<f", v) end
    return U
  ]], "=reefline_request/u64_lua53"))()
elseif jit then
  local ffi = require("ffi")
  local bit = require("bit")
  local u64 = ffi.typeof("uint64_t")
  U = { backend = "luajit" }
  function U.from(x)
    if type(x) == "string" then
      assert(x:match("^%d+$"), "not a decimal number: " .. x)
      local v = u64(0)
      for d in x:gmatch("%d") do v = v * 10 + tonumber(d) end
      return v
    end
    if type(x) == "number" then assert(x == math.floor(x) and x >= 0, "not a u64: " .. x) end
    return u64(x)
  end
  function U.k(hi, lo) return bit.lshift(u64(hi), 32) + lo end
  function U.xor(a, b) return bit.bxor(u64(a), u64(b)) end
  function U.band(a, b) return bit.band(u64(a), u64(b)) end
  function U.shr(a, n) return bit.rshift(u64(a), n) end
  function U.shl(a, n) return bit.lshift(u64(a), n) end
  function U.mul(a, b) return u64(a) * u64(b) end
  function U.add(a, b) return u64(a) + u64(b) end
  function U.is_zero(a) return u64(a) == u64(0) end
  function U.byte(a, i) return tonumber(bit.band(bit.rshift(u64(a), 8 * i), 0xff)) end
  function U.num(a) return tonumber(u64(a)) end
  function U.tostring(a) return (tostring(u64(a)):gsub("ULL$", "")) end
  local f32 = ffi.new("union { float f; uint8_t b[4]; }")
  local little = ffi.abi("le")
  function U.f32_bytes(v)
    f32.f = v
    if little then return string.char(f32.b[0], f32.b[1], f32.b[2], f32.b[3]) end
    return string.char(f32.b[3], f32.b[2], f32.b[1], f32.b[0])
  end
else
  error("reefline_request needs Lua 5.3+ or LuaJIT (64-bit integers), not " .. _VERSION)
end
M.u64 = U
M.backend = U.backend

local from, k, xor, band, shr, shl, mul, add, byte, num =
  U.from, U.k, U.xor, U.band, U.shr, U.shl, U.mul, U.add, U.byte, U.num
local char, concat, floor = string.char, table.concat, math.floor

-- reefgen's constants (tools/reefgen/common.h), as hi:lo halves so that every backend reads them.
local GOLDEN = k(0x9e3779b9, 0x7f4a7c15)
local MIX1 = k(0xbf58476d, 0x1ce4e5b9)
local MIX2 = k(0x94d049bb, 0x133111eb)
local XS_MUL = k(0x2545f491, 0x4f6cdd1d)
local LO32 = k(0, 0xffffffff)

--- SplitMix64 (reefgen::splitmix64).
function M.splitmix64(x)
  x = add(from(x), GOLDEN)
  x = mul(xor(x, shr(x, 30)), MIX1)
  x = mul(xor(x, shr(x, 27)), MIX2)
  return xor(x, shr(x, 31))
end
local splitmix64 = M.splitmix64

-- High 64 bits of the unsigned 128-bit product a*b, from 32-bit halves (reefgen's rng::below
-- takes them from an unsigned __int128).
local function mulhi(a, b)
  local a0, a1 = band(a, LO32), shr(a, 32)
  local b0, b1 = band(b, LO32), shr(b, 32)
  local p00, p01, p10, p11 = mul(a0, b0), mul(a0, b1), mul(a1, b0), mul(a1, b1)
  local mid = add(add(shr(p00, 32), band(p01, LO32)), band(p10, LO32))
  return add(add(add(p11, shr(p01, 32)), shr(p10, 32)), shr(mid, 32))
end

local rng_mt = {}
rng_mt.__index = rng_mt

--- reefgen::rng: xorshift64* seeded through SplitMix64 from (seed, stream).
function M.rng(seed, stream)
  local s = splitmix64(xor(from(seed), splitmix64(add(from(stream or 0), 0x5eed))))
  if U.is_zero(s) then s = XS_MUL end
  return setmetatable({ state = s }, rng_mt)
end

function rng_mt:next()
  local s = self.state
  s = xor(s, shr(s, 12))
  s = xor(s, shl(s, 25))
  s = xor(s, shr(s, 27))
  self.state = s
  return mul(s, XS_MUL)
end

--- Uniform in [0, bound), bound a positive Lua number below 2^53 (multiply-shift).
function rng_mt:below(bound)
  return num(mulhi(self:next(), from(bound)))
end

--- Uniform double in [0, 1): the top 53 bits times 2^-53, as reefgen.
local two_m53 = 2 ^ -53
function rng_mt:uniform()
  return num(shr(self:next(), 11)) * two_m53
end

--- The first request id of a capture written with `seed` (reefgen::request_id_base): request
--- n carries base + n.
function M.request_id_base(seed)
  return add(shl(shr(splitmix64(xor(from(seed), 0x1d5)), 24), 16), 1)
end

--- A request id as a decimal string (ids are u64; Lua 5.3 integers would print signed).
M.id_string = U.tostring

-------------------------------------------------------------------------------------------
-- Header and fragments
-------------------------------------------------------------------------------------------

local function be16(v) return char(floor(v / 256) % 256, v % 256) end
local function be32(v)
  return char(floor(v / 16777216) % 256, floor(v / 65536) % 256, floor(v / 256) % 256, v % 256)
end
local function be64(v)
  v = from(v)
  return char(byte(v, 7), byte(v, 6), byte(v, 5), byte(v, 4), byte(v, 3), byte(v, 2), byte(v, 1), byte(v, 0))
end

--- A format number from a number or a name ("image", "image_u8_hwc", "tokens", ...).
function M.format_number(f)
  if type(f) == "number" then return f end
  local v = format_alias[f] or M.FORMAT[f]
  if not v then error("unknown reefline format: " .. tostring(f), 2) end
  return v
end

--- Payload bytes that `dims` describe for `format` (wire::described_length), 0 when unused.
function M.described_length(format, dims)
  format = M.format_number(format)
  local d = dims or {}
  if format == 1 then return (d[1] or 0) * (d[2] or 0) * (d[3] or 0) end
  if format == 2 or format == 18 then
    local n, any = 4, false
    for i = 1, 4 do
      if (d[i] or 0) ~= 0 then n, any = n * d[i], true end
    end
    return any and n or 0
  end
  if format == 3 then return (d[1] or 0) * 4 end
  return 0
end

--- The 40-byte header (wire::encode) for a table of fields: kind, format, status, request_id,
--- frag_index, frag_count, payload_offset, total_length, dims (up to 4 extents).
function M.header(f)
  local d = f.dims or {}
  return be32(M.MAGIC) .. char(M.VERSION, f.kind or 1, M.format_number(f.format or 0), f.status or 0)
    .. be64(f.request_id or 0) .. be16(f.frag_index or 0) .. be16(f.frag_count or 1)
    .. be32(f.payload_offset or 0) .. be32(f.total_length or 0)
    .. be16(d[1] or 0) .. be16(d[2] or 0) .. be16(d[3] or 0) .. be16(d[4] or 0)
    .. be32(0)
end

--- Decodes the header at `pos` (default 1) of string `s`: a table of fields (request_id as a
--- u64 backend value, id as its decimal string), or nil and why.
function M.parse_header(s, pos)
  pos = pos or 1
  if #s - pos + 1 < M.HEADER_SIZE then return nil, "shorter than the 40-byte header" end
  local b = { s:byte(pos, pos + 39) }
  local function u16(i) return b[i] * 256 + b[i + 1] end
  local function u32(i) return ((b[i] * 256 + b[i + 1]) * 256 + b[i + 2]) * 256 + b[i + 3] end
  local id = from(0)
  for i = 9, 16 do id = add(shl(id, 8), b[i]) end
  local h = {
    magic = u32(1), version = b[5], kind = b[6], format = b[7], status = b[8],
    request_id = id, id = U.tostring(id), frag_index = u16(17), frag_count = u16(19),
    payload_offset = u32(21), total_length = u32(25),
    dims = { u16(29), u16(31), u16(33), u16(35) }, reserved = u32(37),
    fragment_length = #s - pos + 1 - M.HEADER_SIZE,
  }
  if h.magic ~= M.MAGIC then return nil, "bad magic", h end
  if h.version ~= M.VERSION then return nil, "bad version", h end
  return h
end

-- reefgen's check_fragment_plan: the same limits, the same refusals.
local function check_plan(total, frag_size)
  if total == 0 then error("empty payload", 3) end
  if total > M.MAX_TOTAL_LENGTH then
    error(("payload of %d bytes exceeds the protocol limit of %d"):format(total, M.MAX_TOTAL_LENGTH), 3)
  end
  if frag_size < 1 or frag_size > M.MAX_FRAG_SIZE or frag_size ~= floor(frag_size) then
    error("fragment size must be 1.." .. M.MAX_FRAG_SIZE, 3)
  end
  local count = floor((total + frag_size - 1) / frag_size)
  if count > M.MAX_FRAGMENTS then
    error(("fragment size %d cuts a %d-byte request into %d fragments; the protocol allows %d")
      :format(frag_size, total, count, M.MAX_FRAGMENTS), 3)
  end
  return count
end

--- The UDP payloads (header + fragment, in index order) of one message: fragment i carries
--- bytes [i*F, min((i+1)*F, total)) of `payload`, as reefgen's plan_fragments(). `opts` may
--- set kind and status (default: a request, status 0).
function M.fragments(request_id, format, dims, payload, frag_size, opts)
  opts = opts or {}
  frag_size = frag_size or 1024
  local total = #payload
  local count = check_plan(total, frag_size)
  local fields = {
    kind = opts.kind or M.KIND.request, format = M.format_number(format), status = opts.status or 0,
    request_id = from(request_id), frag_count = count, total_length = total, dims = dims,
  }
  local out = {}
  for i = 0, count - 1 do
    fields.frag_index = i
    fields.payload_offset = i * frag_size
    out[i + 1] = M.header(fields) .. payload:sub(i * frag_size + 1, math.min((i + 1) * frag_size, total))
  end
  return out
end

-------------------------------------------------------------------------------------------
-- reefgen's synthetic payloads (tools/reefgen/payload.cc), bit for bit
-------------------------------------------------------------------------------------------

-- Builds a string from byte values without one huge string.char call (argument limits).
local function bytes_to_string(t)
  local parts, n = {}, #t
  for i = 1, n, 4096 do
    parts[#parts + 1] = char((table.unpack or unpack)(t, i, math.min(i + 4095, n)))
  end
  return concat(parts)
end

local function le32(v)  -- v an integer in [-2^31, 2^32)
  if v < 0 then v = v + 4294967296 end
  return char(v % 256, floor(v / 256) % 256, floor(v / 65536) % 256, floor(v / 16777216) % 256)
end
M.le32 = le32

-- RNG streams (payload.cc): request n of each generator draws from its own stream.
local STREAM_IMAGE, STREAM_RANDOM, STREAM_TOKENS = 0x1000, 0x2000, 0x3000
local STREAM_TENSOR_WAVE, STREAM_TENSOR_NOISE, STREAM_TOKEN_LENGTH = 2 ^ 48, 2 * 2 ^ 48, 3 * 2 ^ 48
local function stream(base, n) return add(from(base), from(n)) end

--- fill_image: u8 HWC per-channel gradients shifted per request, plus jitter 0..15 - 8.
function M.image_payload(h, w, c, seed, n)
  local r = M.rng(seed, stream(STREAM_IMAGE, n))
  local h1, w1, d1 = math.max(h - 1, 1), math.max(w - 1, 1), math.max(h + w - 2, 1)
  local shift = (n * 37) % 256
  local out, i = {}, 0
  for y = 0, h - 1 do
    for x = 0, w - 1 do
      for ch = 0, c - 1 do
        local base
        local m = ch % 3
        if m == 0 then base = floor(x * 255 / w1)
        elseif m == 1 then base = floor(y * 255 / h1)
        else base = floor((x + y) * 255 / d1) end
        local jitter = num(shr(r:next(), 60))
        i = i + 1
        out[i] = (base + shift + jitter - 8) % 256  -- uint8 wrap-around, as the C++ cast
      end
    end
  end
  return bytes_to_string(out)
end

--- fill_random: each draw's 8 bytes little-endian, the last draw cut to what is left.
function M.random_payload(length, seed, n)
  local r = M.rng(seed, stream(STREAM_RANDOM, n))
  local out, i = {}, 0
  while i < length do
    local v = r:next()
    for b = 0, math.min(8, length - i) - 1 do out[i + b + 1] = byte(v, b) end
    i = i + 8
  end
  return bytes_to_string(out)
end

--- fill_tokens: `count` ids uniform below `vocab`, little-endian i32.
function M.token_payload(count, vocab, seed, n)
  local r = M.rng(seed, stream(STREAM_TOKENS, n))
  local out = {}
  for i = 1, count do out[i] = le32(r:below(vocab)) end
  return concat(out)
end

--- payload_source::tokens_of: request n's length, uniform in [min, max] for a range.
function M.token_count(min, max, seed, n)
  if max == nil or max == min then return min end
  local r = M.rng(seed, stream(STREAM_TOKEN_LENGTH, n))
  return min + r:below(max - min + 1)
end

-- std::round: half away from zero. x - floor(x) is exact for |x| < 2^52.
local function round(x)
  if x < 0 then return -round(-x) end
  local f = floor(x)
  if x - f >= 0.5 then return f + 1 end
  return f
end

--- portable_sin: range reduction and a Taylor polynomial from + and * alone, so every host
--- (and this module) computes the same bits.
function M.portable_sin(x)
  local two_pi, pi, half_pi = 6.283185307179586, 3.141592653589793, 1.5707963267948966
  if x ~= x or x == math.huge or x == -math.huge then return 0 / 0 end
  x = x - two_pi * round(x / two_pi)
  if x > half_pi then x = pi - x elseif x < -half_pi then x = -pi - x end
  local x2 = x * x
  local p = 1.0 / 355687428096000.0
  local cs = { -1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0,
               -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0, 1.0 }
  for i = 1, #cs do p = p * x2 + cs[i] end
  return x * p
end
local portable_sin = M.portable_sin

--- fill_tensor: sensor-like windows, the last extent channels; little-endian f32. Exact as long
--- as reefgen was compiled without FMA contraction (x86-64 without -march: the default).
function M.tensor_payload(dims, seed, n)
  local two_pi = 6.283185307179586
  local total = 1
  for i = 1, #dims do total = total * dims[i] end
  local channels = dims[#dims]
  local steps = floor(total / channels)
  local shape = M.rng(seed, stream(STREAM_TENSOR_WAVE, n))
  local waves = {}
  for c = 1, channels do
    local w = {}
    w.offset = 0.4 * shape:uniform() - 0.2
    w.a1 = 0.5 + 0.5 * shape:uniform()
    w.f1 = 0.5 + 3.5 * shape:uniform()
    w.p1 = two_pi * shape:uniform()
    w.a2 = 0.1 + 0.3 * shape:uniform()
    w.f2 = 4 + 8 * shape:uniform()
    w.p2 = two_pi * shape:uniform()
    waves[c] = w
  end
  local noise = M.rng(seed, stream(STREAM_TENSOR_NOISE, n))
  local span = math.max(steps, 1) + 0.0
  local out, i = {}, 0
  local f32 = U.f32_bytes
  for t = 0, steps - 1 do
    for c = 1, channels do
      local w = waves[c]
      local x = t / span
      local v = w.offset + w.a1 * portable_sin(two_pi * w.f1 * x + w.p1)
        + w.a2 * portable_sin(two_pi * w.f2 * x + w.p2) + 0.1 * (noise:uniform() - 0.5)
      i = i + 1
      out[i] = f32(v)
    end
  end
  return concat(out)
end

--- A whole file as a string (reefgen --raw).
function M.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-------------------------------------------------------------------------------------------
-- A payload source: reefgen's payload_source for the same options
-------------------------------------------------------------------------------------------

local source_mt = {}
source_mt.__index = source_mt

--- opts (reefgen pcap/send options): format ("image" default, "tokens", "tensor", "raw"),
--- shape {H, W, C} (default 224x224x3), tokens (L) and tokens_max (for MIN-MAX), vocab,
--- dims {D1..D4} (tensor), raw (file contents as a string), seed (default 1).
function M.source(opts)
  local s = setmetatable({}, source_mt)
  s.format = M.format_number(opts.format or (opts.tokens and "tokens") or (opts.dims and "tensor") or "image")
  s.shape = opts.shape or { 224, 224, 3 }
  s.seed = from(opts.seed or 1)
  s.vocab = opts.vocab or M.DEFAULT_VOCAB
  s.raw = opts.raw
  s.dims = { 0, 0, 0, 0 }
  local total
  if s.format == 1 then
    s.dims = { s.shape[1], s.shape[2], s.shape[3], 0 }
    total = s.shape[1] * s.shape[2] * s.shape[3]
    if s.raw and #s.raw ~= total then error(("raw: %d bytes, the shape needs %d"):format(#s.raw, total), 2) end
  elseif s.format == 3 then
    local count = opts.tokens or 0
    s.tokens_max = math.max(count, opts.tokens_max or count)
    if s.raw then
      if s.tokens_max ~= count then error("raw: a file has one length; a token range needs synthetic tokens", 2) end
      if #s.raw % 4 ~= 0 then error("raw: not a whole number of i32 tokens", 2) end
      if count ~= 0 and count * 4 ~= #s.raw then error("raw: does not hold " .. count .. " tokens", 2) end
      count = #s.raw / 4
      s.tokens_max = count
    end
    if count == 0 then error("tokens: needs a length L > 0", 2) end
    if s.tokens_max > 65535 then error("tokens: at most 65535 (dims are 16 bits)", 2) end
    s.tokens_min = count
    s.dims = { s.tokens_max, 0, 0, 0 }
    total = s.tokens_max * 4
  elseif s.format == 2 then
    local d = opts.dims or {}
    if #d < 1 or #d > 4 then error("tensor: needs 1 to 4 extents", 2) end
    s.tensor_dims = d
    total = 4
    for i = 1, #d do s.dims[i] = d[i]; total = total * d[i] end
    if s.raw and #s.raw ~= total then error(("raw: %d bytes, the dims need %d"):format(#s.raw, total), 2) end
  elseif s.format == 0 then
    total = s.raw and #s.raw or s.shape[1] * s.shape[2] * s.shape[3]
  else
    error("unsupported request format " .. s.format, 2)
  end
  if total == 0 or total > M.MAX_TOTAL_LENGTH then error("payload size " .. total .. " out of range", 2) end
  s.total_length = total
  s.id_base = M.request_id_base(s.seed)
  return s
end

--- Request n (0-based, as reefgen numbers them): request id, format, dims, payload bytes.
function source_mt:payload(n)
  local id = add(self.id_base, n)
  local dims = { self.dims[1], self.dims[2], self.dims[3], self.dims[4] }
  if self.raw then return id, self.format, dims, self.raw end
  local f, bytes = self.format, nil
  if f == 1 then
    bytes = M.image_payload(self.shape[1], self.shape[2], self.shape[3], self.seed, n)
  elseif f == 3 then
    local count = M.token_count(self.tokens_min, self.tokens_max, self.seed, n)
    dims[1] = count
    bytes = M.token_payload(count, self.vocab, self.seed, n)
  elseif f == 2 then
    bytes = M.tensor_payload(self.tensor_dims, self.seed, n)
  else
    bytes = M.random_payload(self.total_length, self.seed, n)
  end
  return id, f, dims, bytes
end

--- Request n's UDP payloads, cut into fragments of `frag_size` bytes (default 1024).
function source_mt:request(n, frag_size)
  local id, f, dims, bytes = self:payload(n)
  return M.fragments(id, f, dims, bytes, frag_size or 1024)
end

return M
