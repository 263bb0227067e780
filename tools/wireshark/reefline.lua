-- Wireshark / tshark dissector for the reefline wire protocol v1 (docs/protocol.md; the C++
-- definition is clients/c/wire/protocol.h).
--
--   tshark -X lua_script:tools/wireshark/reefline.lua -r capture.pcap -Y reefline
--   wireshark: copy this file to ~/.local/lib/wireshark/plugins/ (tools/wireshark/README.md)
--
-- Every UDP datagram holds one 40-byte big-endian header and one fragment of a message. The
-- dissector is registered twice: as a heuristic on all of UDP (magic "RFLN" and version 1), so
-- traffic to any IF port is found, and on a UDP port range preference (default 9000), so that
-- packets on those ports whose magic or version is broken are still shown and flagged rather
-- than left as "Data". Header problems that make reefline drop a packet (the drop_* counters of
-- docs/protocol.md) are expert infos of group Malformed; a flagged packet's payload is not
-- interpreted, so a corrupt header never yields plausible-looking tokens or scores.
--
-- Written for the Lua 5.2 that Wireshark embeds (numbers are doubles, no integer division or
-- bit operators) and correct under the Lua 5.3/5.4 of newer Wireshark builds (64-bit integers
-- that wrap on overflow, integer formats that refuse floats). Every header field is at most
-- 32 bits, so sums of a few of them are exact in either; a product of dims is not (4 x 65535^4
-- is about 2^66), so it is bounded as it is built (described_length) and never formatted
-- with %d unbounded. A hostile header must earn an expert info, never a Lua error.

local reefline = Proto("reefline", "reefline Protocol v1")

local MAGIC = 0x52464C4E
local VERSION = 1
local HEADER_SIZE = 40
local MAX_FRAGMENTS = 1024
local MAX_TOTAL_LENGTH = 8 * 1024 * 1024
-- What total_length (u32) can hold, plus one: a length described by dims that reaches this can
-- never equal a total length, whatever its exact value.
local BEYOND_U32 = 4294967296

local KIND_REQUEST, KIND_RESPONSE, KIND_ERROR = 1, 2, 3
local FMT_RAW, FMT_IMAGE, FMT_TENSOR, FMT_TOKENS = 0, 1, 2, 3
local FMT_CRC32, FMT_TOPK, FMT_RESULT_TENSOR = 16, 17, 18

local kind_names = { [1] = "request", [2] = "response", [3] = "error" }
local format_names = {
  [0] = "raw", [1] = "image_u8_hwc", [2] = "tensor_f32", [3] = "tokens_i32",
  [16] = "result_crc32", [17] = "result_topk", [18] = "result_tensor_f32",
}
local status_names = {
  [0] = "ok", [1] = "bad_request", [2] = "unsupported_format", [3] = "overloaded",
  [4] = "deadline_exceeded", [5] = "internal_error", [6] = "shutting_down",
}

---------------------------------------------------------------------------------------------
-- Fields
---------------------------------------------------------------------------------------------
local pf = {
  magic = ProtoField.uint32("reefline.magic", "Magic", base.HEX),
  version = ProtoField.uint8("reefline.version", "Version", base.DEC),
  kind = ProtoField.uint8("reefline.kind", "Kind", base.DEC, kind_names),
  format = ProtoField.uint8("reefline.format", "Format", base.DEC, format_names),
  status = ProtoField.uint8("reefline.status", "Status", base.DEC, status_names),
  request_id = ProtoField.uint64("reefline.request_id", "Request ID", base.DEC),
  frag_index = ProtoField.uint16("reefline.frag_index", "Fragment index", base.DEC),
  frag_count = ProtoField.uint16("reefline.frag_count", "Fragment count", base.DEC),
  payload_offset = ProtoField.uint32("reefline.payload_offset", "Payload offset", base.DEC),
  total_length = ProtoField.uint32("reefline.total_length", "Total length", base.DEC),
  dims = ProtoField.string("reefline.dims", "Dims"),
  dim0 = ProtoField.uint16("reefline.dims.0", "Dim 0", base.DEC),
  dim1 = ProtoField.uint16("reefline.dims.1", "Dim 1", base.DEC),
  dim2 = ProtoField.uint16("reefline.dims.2", "Dim 2", base.DEC),
  dim3 = ProtoField.uint16("reefline.dims.3", "Dim 3", base.DEC),
  reserved = ProtoField.uint32("reefline.reserved", "Reserved", base.HEX),

  -- This datagram's share of the message, and how it relates to the other datagrams.
  fragment_bytes = ProtoField.uint32("reefline.fragment_bytes", "Fragment bytes", base.DEC),
  fragment = ProtoField.string("reefline.fragment", "Fragment"),
  data = ProtoField.bytes("reefline.data", "Fragment data"),
  first_frame = ProtoField.framenum("reefline.first_frame", "First fragment of this message in frame", base.NONE),
  completed_in = ProtoField.framenum("reefline.completed_in", "Message completed in frame", base.NONE),
  fragments_seen = ProtoField.uint16("reefline.fragments_seen", "Distinct fragments seen", base.DEC),
  duplicate_of = ProtoField.framenum("reefline.duplicate_of", "Duplicate of frame", base.NONE),
  request_in = ProtoField.framenum("reefline.request_in", "Request in frame", base.NONE, frametype.REQUEST),
  response_in = ProtoField.framenum("reefline.response_in", "Response in frame", base.NONE, frametype.RESPONSE),

  -- Payload contents.
  image = ProtoField.string("reefline.image", "Image"),
  token_count = ProtoField.uint32("reefline.token_count", "Token count", base.DEC),
  tokens = ProtoField.int32("reefline.tokens", "Token", base.DEC),
  token_first = ProtoField.uint32("reefline.tokens.first", "First token index in this fragment", base.DEC),
  tensor_elements = ProtoField.uint32("reefline.tensor.elements", "Tensor elements", base.DEC),
  tensor_first = ProtoField.uint32("reefline.tensor.first", "First element index in this fragment", base.DEC),
  tensor_value = ProtoField.float("reefline.tensor.value", "Value"),
  topk_k = ProtoField.uint16("reefline.topk.k", "k", base.DEC),
  topk_rank = ProtoField.uint32("reefline.topk.rank", "Rank", base.DEC),
  topk_class = ProtoField.uint32("reefline.topk.class", "Class", base.DEC),
  topk_score = ProtoField.float("reefline.topk.score", "Score"),
  crc32_length = ProtoField.uint32("reefline.crc32.length", "Request payload length", base.DEC),
  crc32 = ProtoField.uint32("reefline.crc32", "CRC32C", base.HEX),
  error_message = ProtoField.string("reefline.error_message", "Error message", base.UNICODE),
}
local field_list = {}
for _, f in pairs(pf) do field_list[#field_list + 1] = f end
reefline.fields = field_list

local G, S = expert.group, expert.severity
local ef = {
  truncated = ProtoExpert.new("reefline.expert.truncated", "Shorter than the 40-byte header", G.MALFORMED, S.ERROR),
  bad_magic = ProtoExpert.new("reefline.expert.bad_magic", "Bad magic (not RFLN)", G.MALFORMED, S.ERROR),
  bad_version = ProtoExpert.new("reefline.expert.bad_version", "Unsupported version", G.MALFORMED, S.ERROR),
  bad_kind = ProtoExpert.new("reefline.expert.bad_kind", "Unknown kind", G.MALFORMED, S.ERROR),
  bad_format = ProtoExpert.new("reefline.expert.bad_format", "Format not valid for this kind", G.MALFORMED, S.ERROR),
  bad_status = ProtoExpert.new("reefline.expert.bad_status", "Status not valid for this kind", G.MALFORMED, S.ERROR),
  reserved = ProtoExpert.new("reefline.expert.reserved", "Reserved field is not zero", G.MALFORMED, S.ERROR),
  frag_count = ProtoExpert.new("reefline.expert.frag_count", "Fragment count out of range (1..1024)", G.MALFORMED, S.ERROR),
  frag_index = ProtoExpert.new("reefline.expert.frag_index", "Fragment index >= fragment count", G.MALFORMED, S.ERROR),
  total_length = ProtoExpert.new("reefline.expert.total_length", "Total length out of range (1..8 MiB)", G.MALFORMED, S.ERROR),
  empty = ProtoExpert.new("reefline.expert.empty_fragment", "Empty fragment", G.MALFORMED, S.ERROR),
  offset = ProtoExpert.new("reefline.expert.offset", "Payload offset + fragment length beyond total length", G.MALFORMED, S.ERROR),
  dims = ProtoExpert.new("reefline.expert.dims", "Dims do not describe the total length for the format", G.MALFORMED, S.ERROR),
  udp_length = ProtoExpert.new("reefline.expert.udp_length", "UDP length disagrees with the IPv4 payload (reefline: drop_bad_length)", G.MALFORMED, S.ERROR),
  ip_checksum = ProtoExpert.new("reefline.expert.ip_checksum", "IPv4 header checksum wrong (reefline: drop_bad_ip)", G.CHECKSUM, S.ERROR),
  result_size = ProtoExpert.new("reefline.expert.result_size", "Result payload size wrong for its format", G.MALFORMED, S.ERROR),
  inconsistent = ProtoExpert.new("reefline.expert.inconsistent", "Disagrees with an earlier fragment of this message", G.SEQUENCE, S.WARN),
  duplicate = ProtoExpert.new("reefline.expert.duplicate", "Duplicate fragment", G.SEQUENCE, S.NOTE),
  error_status = ProtoExpert.new("reefline.expert.error_status", "Request failed", G.RESPONSE_CODE, S.NOTE),
}
local expert_list = {}
for _, e in pairs(ef) do expert_list[#expert_list + 1] = e end
reefline.experts = expert_list

---------------------------------------------------------------------------------------------
-- Preferences
---------------------------------------------------------------------------------------------
local DEFAULT_PORTS = "9000"
reefline.prefs.ports = Pref.range("UDP ports", DEFAULT_PORTS,
  "UDP ports of reefline IFs; packets to or from them are dissected even when their magic or "
  .. "version is wrong (elsewhere a heuristic finds packets with a valid magic and version)", 65535)
reefline.prefs.heuristic = Pref.bool("Heuristic on all UDP", true,
  "Find reefline packets on any UDP port by their magic and version")
reefline.prefs.max_elements = Pref.uint("Elements shown", 16,
  "How many tokens or tensor values of a fragment to decode into the tree")
reefline.prefs.check_ip_checksum = Pref.bool("Verify IPv4 header checksums", false,
  "Flag datagrams whose IPv4 header checksum is wrong, which reefline drops (drop_bad_ip). Off by "
  .. "default, as in Wireshark's IPv4 dissector: captures on a sending host with checksum "
  .. "offload show checksums the NIC has not filled in yet")

local udp_port_table = DissectorTable.get("udp.port")

-- The layers below, to apply reefline's own checks on them (docs/protocol.md, "Limits").
local f_udp_length = Field.new("udp.length")
local f_ip = Field.new("ip")
local f_ip_hdr_len = Field.new("ip.hdr_len")
local f_ip_len = Field.new("ip.len")

-- The innermost value of a field in this packet (a tunnel would give several).
local function last(field)
  local all = { field() }
  return all[#all]
end

-- reefline drops a datagram whose UDP length is not the IPv4 payload length (drop_bad_length).
local function udp_length_problem()
  local ul, il, hl = last(f_udp_length), last(f_ip_len), last(f_ip_hdr_len)
  if not (ul and il and hl) then return nil end
  if ul.value ~= il.value - hl.value then
    return string.format("UDP length %d, IPv4 payload %d bytes", ul.value, il.value - hl.value)
  end
end

-- reefline verifies the IPv4 header checksum in software when the NIC does not (drop_bad_ip).
local function ip_checksum_problem()
  local ip, hl = last(f_ip), last(f_ip_hdr_len)
  if not (ip and hl) then return nil end
  local r, n = ip.range, hl.value
  if not r or r:len() < n then return nil end
  local sum = 0
  for i = 0, n - 2, 2 do sum = sum + r(i, 2):uint() end
  while sum > 0xffff do sum = sum % 65536 + math.floor(sum / 65536) end
  if sum ~= 0xffff then return "IPv4 header checksum wrong" end
end

-- The range last added to udp.port, removed again when the preference changes.
local registered_ports = nil

local function register_ports()
  if registered_ports then udp_port_table:remove(registered_ports, reefline) end
  registered_ports = tostring(reefline.prefs.ports)
  if registered_ports ~= "" then udp_port_table:add(registered_ports, reefline) end
end

---------------------------------------------------------------------------------------------
-- State that ties datagrams together. Frames are first dissected in capture order (tshark's
-- single pass, the GUI's first pass); what is learnt about a frame then is kept per frame
-- number, so that redissection (the GUI, tshark -2) shows the same and can add what only later
-- frames told (completed_in, response_in).
---------------------------------------------------------------------------------------------
local messages, frames

function reefline.init()
  messages, frames = {}, {}
  register_ports()
end

function reefline.prefs_changed()
  register_ports()
end

local function dims_text(d)
  local parts = {}
  local last = 0
  for i = 1, 4 do if d[i] ~= 0 then last = i end end
  for i = 1, last do parts[#parts + 1] = tostring(d[i]) end
  if #parts == 0 then return "none" end
  return table.concat(parts, " x ")
end

-- n * x for n <= BEYOND_U32 and a u16 x, saturated at BEYOND_U32: the product stays below
-- 2^49, exact as a double (Lua 5.2) and far from wrapping as an integer (Lua 5.3+), however
-- many dims are multiplied in.
local function times(n, x)
  n = n * x
  if n > BEYOND_U32 then return BEYOND_U32 end
  return n
end

-- Payload bytes that dims describe for a format (wire::described_length), nil when unused;
-- BEYOND_U32 for "more than any total length", never an inexact or wrapped product.
local function described_length(fmt, d)
  if fmt == FMT_IMAGE then return times(times(d[1], d[2]), d[3]) end
  if fmt == FMT_TENSOR or fmt == FMT_RESULT_TENSOR then
    local n, any = 4, false
    for i = 1, 4 do if d[i] ~= 0 then n, any = times(n, d[i]), true end end
    return any and n or 0
  end
  if fmt == FMT_TOKENS then return times(4, d[1]) end
  if fmt == FMT_TOPK then return times(8, d[1]) end
  if fmt == FMT_CRC32 then return 8 end
  return nil
end

-- A described length as text: exact up to what a u32 holds, and no %d of a huge number.
local function length_text(n)
  if n >= BEYOND_U32 then return "more than 4294967295" end
  return string.format("%d", n)
end

-- Which formats each kind may carry (validate_request for requests; responses carry results;
-- errors carry a message, raw).
local function format_ok(kind, fmt)
  if kind == KIND_REQUEST then return fmt <= FMT_TOKENS end
  if kind == KIND_RESPONSE then return fmt == FMT_CRC32 or fmt == FMT_TOPK or fmt == FMT_RESULT_TENSOR end
  return format_names[fmt] ~= nil
end

local function status_ok(kind, status)
  if kind == KIND_ERROR then return status ~= 0 and status_names[status] ~= nil end
  return status == 0
end

---------------------------------------------------------------------------------------------
-- Payload decoding (only for headers without problems)
---------------------------------------------------------------------------------------------

-- Little-endian 4-byte elements present in this fragment, when it starts on an element.
local function add_elements(tree, data, h, field, first_field, reader, what)
  if h.offset % 4 ~= 0 then
    tree:add(data, "[" .. what .. ": fragment does not start on an element boundary]")
    return nil
  end
  local n = math.floor(data:len() / 4)
  local shown = math.min(n, reefline.prefs.max_elements)
  local first = math.floor(h.offset / 4)
  tree:add(first_field, first):set_generated()
  local values = {}
  for i = 0, shown - 1 do
    local r = data(i * 4, 4)
    local v = reader(r)
    tree:add_le(field, r)
    values[#values + 1] = v
  end
  return values, first, n
end

local function decode_payload(tvb, tree, h, data)
  local fmt = h.format
  local single = h.count == 1 and h.offset == 0 and h.fraglen == h.total and h.captured == h.fraglen
  local info = ""
  if h.kind == KIND_ERROR then
    local msg = data:string(ENC_UTF_8)
    tree:add(pf.error_message, data, msg)
    tree:add_proto_expert_info(ef.error_status, (status_names[h.status] or "status " .. h.status) .. ": " .. msg)
    return ': "' .. msg .. (single and '"' or '..."')
  end
  if fmt == FMT_IMAGE then
    tree:add(pf.image, tvb(28, 6), string.format("%d x %d x %d u8 HWC (%d bytes)", h.dims[1], h.dims[2], h.dims[3], h.total))
      :set_generated()
  elseif fmt == FMT_TOKENS then
    tree:add(pf.token_count, tvb(28, 2), h.dims[1]):set_generated()
    local t = tree:add(data, "Tokens (little-endian i32)")
    local values, first = add_elements(t, data, h, pf.tokens, pf.token_first, function(r) return r:le_int() end, "tokens")
    if values and #values > 0 then
      local s = {}
      for i = 1, #values do s[i] = tostring(values[i]) end
      t:append_text(string.format(" from token %d: %s%s", first, table.concat(s, ", "),
        (#values < data:len() / 4) and ", ..." or ""))
      if first == 0 then info = ", tokens [" .. table.concat(s, " ", 1, math.min(#s, 8)) .. (#s > 8 and " ...]" or "]") end
    end
  elseif fmt == FMT_TENSOR or fmt == FMT_RESULT_TENSOR then
    tree:add(pf.tensor_elements, tvb(28, 8), math.floor(h.total / 4)):set_generated()
    local t = tree:add(data, "Tensor " .. dims_text(h.dims) .. " (little-endian f32)")
    local values, first = add_elements(t, data, h, pf.tensor_value, pf.tensor_first, function(r) return r:le_float() end, "values")
    if values and #values > 0 then
      local s = {}
      for i = 1, math.min(#values, 4) do s[i] = string.format("%.4g", values[i]) end
      if first == 0 then info = ", values [" .. table.concat(s, ", ") .. (#values > 4 and ", ...]" or "]") end
    end
  elseif fmt == FMT_CRC32 then
    -- The result_size check leaves exactly 8 bytes in one datagram; the capture may hold fewer.
    if data:len() < 8 then
      tree:add(data, "[result_crc32: cut by the capture]")
      return info
    end
    tree:add(pf.crc32_length, data(0, 4))
    tree:add(pf.crc32, data(4, 4))
    info = string.format(": crc32c 0x%08x over %d bytes", data(4, 4):uint(), data(0, 4):uint())
  elseif fmt == FMT_TOPK then
    tree:add(pf.topk_k, tvb(28, 2), h.dims[1]):set_generated()
    if h.offset % 8 == 0 then
      local n = math.floor(data:len() / 8)
      for i = 0, n - 1 do
        local r = data(i * 8, 8)
        local rank = math.floor(h.offset / 8) + i + 1
        local cls, score = r(0, 4):uint(), r(4, 4):float()
        local e = tree:add(r, string.format("#%d: class %d, score %g", rank, cls, score))
        e:add(pf.topk_rank, rank):set_generated()
        e:add(pf.topk_class, r(0, 4))
        e:add(pf.topk_score, r(4, 4))
        if rank == 1 then info = string.format(": class %d (%g)", cls, score) end
      end
    else
      tree:add(data, "[top-k: fragment does not start on an entry boundary]")
    end
  end
  return info
end

---------------------------------------------------------------------------------------------
-- The dissector
---------------------------------------------------------------------------------------------
local function dissect(tvb, pinfo, root)
  pinfo.cols.protocol = "REEFLINE"
  -- The datagram's length on the wire decides what reefline would do with it; only the bytes
  -- the capture kept (fewer after a snap length) can be read. Every read below stays within
  -- those: a range past them is a Lua error, not an expert info.
  local len = tvb:len()
  local wire_len = tvb:reported_len()
  local tree = root:add(reefline, tvb())
  if wire_len < HEADER_SIZE then
    tree:add_proto_expert_info(ef.truncated, string.format("%d bytes, the header needs %d", wire_len, HEADER_SIZE))
    pinfo.cols.info = string.format("reefline [truncated: %d bytes]", wire_len)
    if len > 0 then tree:add(pf.data, tvb()) end
    return len
  end
  if len < HEADER_SIZE then
    -- A whole header on the wire, of which the capture kept less: nothing to check or decode.
    tree:add(tvb(), string.format("[Header cut by the capture: %d of %d bytes captured]", len, wire_len))
    pinfo.cols.info = string.format("reefline [header cut by the capture: %d of %d bytes]", len, wire_len)
    return len
  end

  local h = {
    magic = tvb(0, 4):uint(), version = tvb(4, 1):uint(), kind = tvb(5, 1):uint(),
    format = tvb(6, 1):uint(), status = tvb(7, 1):uint(), id = tvb(8, 8):uint64(),
    index = tvb(16, 2):uint(), count = tvb(18, 2):uint(), offset = tvb(20, 4):uint(),
    total = tvb(24, 4):uint(),
    dims = { tvb(28, 2):uint(), tvb(30, 2):uint(), tvb(32, 2):uint(), tvb(34, 2):uint() },
    reserved = tvb(36, 4):uint(),
    fraglen = wire_len - HEADER_SIZE, -- the fragment's bytes in the datagram
    captured = len - HEADER_SIZE,     -- of those, the bytes in the capture
  }
  local id_text = tostring(h.id)

  local problems = {}
  local function problem(item, e, text)
    item:add_proto_expert_info(e, text)
    problems[#problems + 1] = text
  end

  local it_magic = tree:add(pf.magic, tvb(0, 4))
  local it_version = tree:add(pf.version, tvb(4, 1))
  local it_kind = tree:add(pf.kind, tvb(5, 1))
  local it_format = tree:add(pf.format, tvb(6, 1))
  local it_status = tree:add(pf.status, tvb(7, 1))
  tree:add(pf.request_id, tvb(8, 8))
  local it_index = tree:add(pf.frag_index, tvb(16, 2))
  local it_count = tree:add(pf.frag_count, tvb(18, 2))
  local it_offset = tree:add(pf.payload_offset, tvb(20, 4))
  local it_total = tree:add(pf.total_length, tvb(24, 4))
  local it_dims = tree:add(pf.dims, tvb(28, 8), dims_text(h.dims))
  it_dims:add(pf.dim0, tvb(28, 2))
  it_dims:add(pf.dim1, tvb(30, 2))
  it_dims:add(pf.dim2, tvb(32, 2))
  it_dims:add(pf.dim3, tvb(34, 2))
  local it_reserved = tree:add(pf.reserved, tvb(36, 4))

  -- A wrong magic or version means nothing else in the header can be trusted: flag it and
  -- stop interpreting (the datagram is shown, but tied to no message and not decoded).
  local trusted = true
  if h.magic ~= MAGIC then
    problem(it_magic, ef.bad_magic, string.format("bad magic 0x%08x", h.magic))
    trusted = false
  end
  if h.version ~= VERSION then
    problem(it_version, ef.bad_version, string.format("bad version %d", h.version))
    trusted = false
  end
  if trusted then
    -- The checks of wire::validate_request (and reefgen's response checks), each reported.
    if not kind_names[h.kind] then
      problem(it_kind, ef.bad_kind, string.format("unknown kind %d", h.kind))
    elseif not format_ok(h.kind, h.format) then
      problem(it_format, ef.bad_format, string.format("format %s in a %s",
        format_names[h.format] or tostring(h.format), kind_names[h.kind]))
    end
    if kind_names[h.kind] and not status_ok(h.kind, h.status) then
      problem(it_status, ef.bad_status, string.format("status %d in a %s", h.status, kind_names[h.kind]))
    end
    if h.reserved ~= 0 then problem(it_reserved, ef.reserved, string.format("reserved 0x%08x", h.reserved)) end
    if h.count == 0 or h.count > MAX_FRAGMENTS then
      problem(it_count, ef.frag_count, string.format("fragment count %d", h.count))
    elseif h.index >= h.count then
      problem(it_index, ef.frag_index, string.format("fragment index %d >= count %d", h.index, h.count))
    end
    if h.total == 0 or h.total > MAX_TOTAL_LENGTH then
      problem(it_total, ef.total_length, string.format("total length %d", h.total))
    end
    if h.fraglen == 0 and h.kind ~= KIND_ERROR then problem(tree, ef.empty, "empty fragment") end
    if h.offset + h.fraglen > h.total then
      problem(it_offset, ef.offset, string.format("offset %d + %d bytes > total length %d", h.offset, h.fraglen, h.total))
    end
    if h.format ~= FMT_RAW and format_names[h.format] and h.kind ~= KIND_ERROR then
      local want = described_length(h.format, h.dims)
      if want and want ~= h.total then
        local e = (h.format == FMT_CRC32 or h.format == FMT_TOPK) and ef.result_size or ef.dims
        problem(it_dims, e, string.format("dims %s describe %s bytes of %s, total length is %d",
          dims_text(h.dims), length_text(want), format_names[h.format], h.total))
      end
    end
  end

  -- The lower layers as reefline checks them: such a datagram never reaches reassembly.
  if trusted and #problems == 0 then
    local why = udp_length_problem()
    if why then problem(tree, ef.udp_length, why) end
    if reefline.prefs.check_ip_checksum then
      why = ip_checksum_problem()
      if why then problem(tree, ef.ip_checksum, why) end
    end
  end

  -- This datagram's place in its message.
  local first_byte, last_byte = h.offset, h.offset + h.fraglen - 1
  local frag_text = string.format("%d of %d of request %s", h.index, h.count, id_text)
  tree:add(pf.fragment, tvb(16, 4), frag_text):set_generated()
  local it_bytes
  if h.fraglen > 0 then
    it_bytes = tree:add(pf.fragment_bytes, h.captured > 0 and tvb(HEADER_SIZE) or tvb(0, 0), h.fraglen)
    it_bytes:append_text(string.format(" (bytes %d..%d of %d)", first_byte, last_byte, h.total))
    if h.captured < h.fraglen then it_bytes:append_text(string.format(", %d captured", h.captured)) end
  else
    it_bytes = tree:add(pf.fragment_bytes, tvb(0, 0), 0)
  end
  it_bytes:set_generated()

  local info
  local kname = kind_names[h.kind] or ("kind " .. h.kind)
  local fname = format_names[h.format] or ("format " .. h.format)
  if h.kind == KIND_ERROR then fname = status_names[h.status] or ("status " .. h.status) end
  info = string.format("%s %s, fragment %s", kname, fname, frag_text)
  if h.count > 1 and h.fraglen > 0 then
    info = info .. string.format(", bytes %d..%d of %d", first_byte, last_byte, h.total)
  end

  -- Tie the datagram to its message: by (source, destination, request id, kind) as reefline
  -- keys requests by (source address, source port, request id). First pass only, and only
  -- datagrams without problems: reefline drops the others before they reach reassembly. Nor
  -- a datagram quoted in an ICMP error (its first bytes, which reefline never receives).
  if #problems == 0 and not pinfo.visited and not pinfo.in_error_pkt then
    local src, dst = tostring(pinfo.src) .. ":" .. pinfo.src_port, tostring(pinfo.dst) .. ":" .. pinfo.dst_port
    local class = h.kind == KIND_REQUEST and "q" or "r"
    local key = table.concat({ class, src, dst, id_text }, "|")
    -- The request a response answers goes the other way.
    local other = table.concat({ class == "q" and "r" or "q", dst, src, id_text }, "|")
    local m = messages[key]
    local fi = {}
    if not m then
      m = { first = pinfo.number, count = h.count, total = h.total, format = h.format,
            dims = dims_text(h.dims), by_index = {}, seen = 0 }
      messages[key] = m
    end
    fi.message = m
    if m.count ~= h.count or m.total ~= h.total or m.format ~= h.format or m.dims ~= dims_text(h.dims) then
      fi.inconsistent = m.first
    end
    local prev = m.by_index[h.index]
    if prev then
      fi.duplicate_of = prev
    elseif not fi.inconsistent then
      m.by_index[h.index] = pinfo.number
      m.seen = m.seen + 1
      if m.seen == m.count then m.completed_in = pinfo.number end
    end
    fi.seen = m.seen
    local o = messages[other]
    if o then
      fi.peer = o
      if class == "r" and not o.response_in then o.response_in = pinfo.number end
    end
    frames[pinfo.number] = fi
  end

  local fi = frames[pinfo.number]
  if fi then
    local m = fi.message
    if m.first ~= pinfo.number then tree:add(pf.first_frame, m.first):set_generated() end
    if fi.seen then tree:add(pf.fragments_seen, fi.seen):set_generated() end
    if m.completed_in then tree:add(pf.completed_in, m.completed_in):set_generated() end
    if fi.duplicate_of then
      tree:add(pf.duplicate_of, fi.duplicate_of):set_generated()
      tree:add_proto_expert_info(ef.duplicate, string.format("duplicate of frame %d", fi.duplicate_of))
      info = info .. " [duplicate]"
    end
    if fi.inconsistent then
      problem(tree, ef.inconsistent, string.format("fragment count, total length, format or dims differ from frame %d", fi.inconsistent))
    end
    if h.kind == KIND_REQUEST then
      if m.response_in then tree:add(pf.response_in, m.response_in):set_generated() end
    elseif fi.peer then
      tree:add(pf.request_in, fi.peer.first):set_generated()
    end
  end

  if h.captured > 0 then
    local data = tvb(HEADER_SIZE)
    local dt = tree:add(pf.data, data)
    if #problems == 0 then
      -- Result formats of one fixed size must be whole in one datagram.
      if h.format == FMT_CRC32 and h.kind == KIND_RESPONSE and h.fraglen ~= 8 then
        problem(it_bytes, ef.result_size, string.format("result_crc32 of %d bytes in this datagram, want 8", h.fraglen))
      else
        info = info .. decode_payload(tvb, dt, h, data)
      end
    end
  end

  if trusted then
    tree:append_text(string.format(", %s %s, id %s, fragment %d of %d", kname, fname, id_text, h.index, h.count))
  else
    -- Its kind, format and fragment fields mean nothing: say so rather than describe them.
    info = "malformed, not decoded"
    tree:append_text(", malformed")
  end
  if #problems > 0 then info = info .. " [" .. table.concat(problems, "; ") .. "]" end
  pinfo.cols.info = info
  return len
end

function reefline.dissector(tvb, pinfo, root)
  return dissect(tvb, pinfo, root)
end

local function heuristic(tvb, pinfo, root)
  if not reefline.prefs.heuristic then return false end
  if tvb:len() < HEADER_SIZE then return false end
  if tvb(0, 4):uint() ~= MAGIC or tvb(4, 1):uint() ~= VERSION then return false end
  dissect(tvb, pinfo, root)
  return true
end

reefline:register_heuristic("udp", heuristic)
register_ports()
