-- reefline-load: a MoonGen userscript that loads a reefline appliance with camera-like request
-- traffic at line rate or a set request rate, and counts the answers.
--
--   MoonGen tools/moongen/reefline-load.lua 0 --dst 198.18.0.2 --dst-mac 3c:fd:fe:aa:bb:cc \
--       --format image --shape 224x224x3 --fragment-size 1432 --cameras 8 --rate 2000
--
-- Requests are those reefgen would send with the same options (tools/moongen/README.md): the
-- plain-Lua module reefline_request.lua builds every UDP payload (header + fragment) and reefgen's
-- synthetic payloads bit for bit, so `--distinct N --requests N` puts the same UDP payloads on the
-- wire as `reefgen pcap --requests N` (tests/moongen_test.sh checks it with MoonGen stubbed out).
-- Past --distinct requests the payloads repeat with fresh request ids: generating images at line
-- rate in Lua would cost more than sending them.
--
-- The MoonGen-specific part is kept to a few calls (device.config, memory.createMemPool,
-- bufArray:allocN, queue:send/setRate, rxQueue:tryRecv, moongen.startTask/running/getTime):
-- frames are written into the mbufs byte by byte, not through libmoon's packet classes, so the
-- script depends on little of MoonGen's API and runs under stubs in the test.
local mg = require "moongen"
local memory = require "memory"
local device = require "device"
local ffi = require "ffi"

-- The request module sits next to this script; every MoonGen task loads the script afresh.
local script_dir = (debug.getinfo(1, "S").source:match("^@(.*[/\\])")) or "./"
package.path = script_dir .. "?.lua;" .. package.path
local R = require "reefline_request"

local ETH_IP_UDP = 14 + 20 + 8

function configure(parser)
  parser:description("Loads a reefline appliance with reefline protocol v1 requests and counts its answers.")
  parser:argument("txDev", "Port to send from (DPDK port id)."):convert(tonumber)
  parser:argument("rxDev", "Port that receives the answers (default: the tx port)."):args("?"):convert(tonumber)
  parser:option("--rate", "Requests per second over all cameras, paced in software (0: as fast as the port goes)."):default(100):convert(tonumber)
  parser:option("--mbit", "Also cap the tx queue at this rate in Mbit/s (queue:setRate, NIC rate limiter)."):convert(tonumber)
  parser:option("--requests", "Requests to send (0: until stopped)."):default(1000):convert(tonumber)
  parser:option("--cameras", "Source UDP ports --sport .. --sport+N-1, requests round-robin (reefgen --sources)."):default(1):convert(tonumber)
  parser:option("--format", "Payload format: image, tokens, tensor or raw."):default("image")
  parser:option("--shape", "Image shape HxWxC (also the size of synthetic raw payloads)."):default("224x224x3")
  parser:option("--tokens", "Tokens per request: L, or MIN-MAX (length drawn per request, as reefgen)."):default("")
  parser:option("--vocab", "Token ids are drawn below this."):default(R.DEFAULT_VOCAB):convert(tonumber)
  parser:option("--dims", "Tensor extents D1[,D2[,D3[,D4]]] (format tensor)."):default("")
  parser:option("--raw", "File whose bytes every request carries (in --format)."):default("")
  parser:option("--fragment-size", "Payload bytes per fragment; 1432 fills a 1500-byte MTU."):default(1024):convert(tonumber):target("fragmentSize")
  parser:option("--distinct", "Distinct payloads (requests 0..N-1 as reefgen makes them), then repeated with new ids."):default(16):convert(tonumber)
  parser:option("--seed", "reefgen's --seed: payloads and request ids follow from it."):default("1")
  parser:option("--src", "Source IPv4 address (the cameras)."):default("198.18.0.1")
  parser:option("--dst", "The appliance's address (reefline --ip)."):default("198.18.0.2")
  parser:option("--sport", "First source UDP port."):default(40000):convert(tonumber)
  parser:option("--dport", "The IF's UDP port."):default(9000):convert(tonumber)
  parser:option("--src-mac", "Source MAC (default: the tx port's)."):target("srcMac")
  parser:option("--dst-mac", "The appliance port's MAC (required: the script does not resolve it by ARP)."):target("dstMac")
  parser:flag("--offload", "Let the NIC fill IPv4 and UDP checksums (else IPv4 in software, UDP checksum 0).")
  parser:option("--drain-ms", "Keep counting answers this long after the last request."):default(1000):convert(tonumber):target("drainMs")
end

local function parse_ip(s)
  local a, b, c, d = s:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  assert(a, "not an IPv4 address: " .. tostring(s))
  return { tonumber(a), tonumber(b), tonumber(c), tonumber(d) }
end

local function parse_mac(s)
  local m = {}
  for x in s:gmatch("%x%x") do m[#m + 1] = tonumber(x, 16) end
  assert(#m == 6, "not a MAC address: " .. tostring(s))
  return m
end

-- reefgen's payload options from the command line.
local function source_options(args)
  local o = { format = args.format, seed = args.seed, vocab = args.vocab }
  local h, w, c = args.shape:match("^(%d+)[xX](%d+)[xX](%d+)$")
  assert(h, "--shape: expected HxWxC")
  o.shape = { tonumber(h), tonumber(w), tonumber(c) }
  if args.tokens ~= "" then
    local lo, hi = args.tokens:match("^(%d+)-(%d+)$")
    if lo then o.tokens, o.tokens_max = tonumber(lo), tonumber(hi) else o.tokens = tonumber(args.tokens) end
  end
  if args.dims ~= "" then
    o.dims = {}
    for d in args.dims:gmatch("%d+") do o.dims[#o.dims + 1] = tonumber(d) end
  end
  if args.raw ~= "" then o.raw = R.read_file(args.raw) end
  return o
end

-- argparse versions differ on whether defaults pass through convert: make sure of numbers.
local function numbers(args)
  for _, k in ipairs({ "txDev", "rxDev", "rate", "mbit", "requests", "cameras", "vocab", "fragmentSize",
                       "distinct", "sport", "dport", "drainMs" }) do
    if args[k] ~= nil then args[k] = assert(tonumber(args[k]), "--" .. k .. ": not a number") end
  end
  args.seed = tostring(args.seed)
end

function master(args)
  numbers(args)
  -- Not broadcast by default: line-rate traffic to ff:ff:ff:ff:ff:ff floods every switch port.
  assert(args.dstMac, "--dst-mac: the appliance port's MAC address is required")
  local txDev = device.config{ port = args.txDev, rxQueues = 1, txQueues = 1 }
  local rxDev = txDev
  if args.rxDev and args.rxDev ~= args.txDev then
    rxDev = device.config{ port = args.rxDev, rxQueues = 1, txQueues = 1 }
  end
  device.waitForLinks()
  args.srcMac = args.srcMac or txDev:getMacString()
  if args.mbit then txDev:getTxQueue(0):setRate(args.mbit) end
  local tx = mg.startTask("txTask", txDev:getTxQueue(0), args)
  local rx = mg.startTask("rxTask", rxDev:getRxQueue(0), args)
  tx:wait()
  mg.sleepMillis(args.drainMs)
  mg.stop()
  rx:wait()
end

-- Ethernet + IPv4 + UDP header template; lengths, ports, id and checksums are set per packet.
local function frame_template(args)
  local t = ffi.new("uint8_t[?]", ETH_IP_UDP)
  local dmac, smac = parse_mac(args.dstMac), parse_mac(args.srcMac)
  for i = 1, 6 do t[i - 1], t[i + 5] = dmac[i], smac[i] end
  t[12], t[13] = 0x08, 0x00
  t[14], t[15] = 0x45, 0          -- IPv4, 5 words, DSCP 0
  t[20], t[21] = 0x40, 0          -- DF: reefline drops IP fragments (drop_ip_fragment)
  t[22], t[23] = 64, 17           -- TTL, UDP
  local s, d = parse_ip(args.src), parse_ip(args.dst)
  for i = 1, 4 do t[25 + i], t[29 + i] = s[i], d[i] end
  t[36], t[37] = math.floor(args.dport / 256), args.dport % 256
  return t
end

local function ipv4_checksum(p)
  local sum = 0
  for i = 14, 33, 2 do sum = sum + p[i] * 256 + p[i + 1] end
  while sum > 0xffff do sum = sum % 65536 + math.floor(sum / 65536) end
  return 65535 - sum
end

function txTask(queue, args)
  local src = R.source(source_options(args))
  local frag = args.fragmentSize
  if frag > R.MTU_FRAG_SIZE then
    print(("reefline-load: --fragment-size %d needs jumbo frames on the port and the appliance"):format(frag))
  end
  -- Requests 0..distinct-1 exactly as reefgen makes them.
  local distinct = math.max(1, args.distinct)
  if args.requests > 0 then distinct = math.min(distinct, args.requests) end
  local pre = {}
  for n = 0, distinct - 1 do pre[n + 1] = src:request(n, frag) end
  local tmpl = frame_template(args)
  local max_frame = ETH_IP_UDP + R.HEADER_SIZE + frag
  local mem = memory.createMemPool{ n = 8191, bufSize = math.max(2048, max_frame + 128) }
  local burst = 63
  local bufs = mem:bufArray(burst)
  local u64 = R.u64
  local cameras = math.max(1, args.cameras)

  local sent_requests, sent_packets, sent_bytes, ip_id = 0, 0, 0, 0
  local start = mg.getTime()
  local last_print, last_packets, last_requests = start, 0, 0
  local n = 0
  while mg.running() and (args.requests == 0 or n < args.requests) do
    if args.rate > 0 then
      local due = start + n / args.rate
      while mg.getTime() < due and mg.running() do end
    end
    local frags = pre[n % distinct + 1]
    local sport = args.sport + n % cameras
    -- Request n carries id base + n, as in reefgen's captures; repeated payloads get theirs here.
    local idb
    if n >= distinct then
      local id = u64.add(src.id_base, n)
      idb = {}
      for i = 0, 7 do idb[i] = u64.byte(id, 7 - i) end
    end
    local i = 1
    while i <= #frags do
      local k = math.min(burst, #frags - i + 1)
      bufs:allocN(max_frame, k)
      for j = 1, k do
        local payload = frags[i + j - 1]
        local buf = bufs[j]
        local p = buf:getBytes()
        ffi.copy(p, tmpl, ETH_IP_UDP)
        local udp_len = 8 + #payload
        local ip_len = 20 + udp_len
        p[16], p[17] = math.floor(ip_len / 256), ip_len % 256
        p[18], p[19] = math.floor(ip_id / 256), ip_id % 256
        p[34], p[35] = math.floor(sport / 256), sport % 256
        p[38], p[39] = math.floor(udp_len / 256), udp_len % 256
        ffi.copy(p + ETH_IP_UDP, payload, #payload)
        if idb then
          for b = 0, 7 do p[ETH_IP_UDP + 8 + b] = idb[b] end
        end
        if not args.offload then
          local c = ipv4_checksum(p)
          p[24], p[25] = math.floor(c / 256), c % 256
        end
        buf:setSize(ip_len + 14)
        ip_id = (ip_id + 1) % 65536
        sent_bytes = sent_bytes + ip_len + 14
      end
      if args.offload then bufs:offloadUdpChecksums() end
      queue:send(bufs)
      sent_packets = sent_packets + k
      i = i + k
    end
    n = n + 1
    sent_requests = n
    local now = mg.getTime()
    if now - last_print >= 1 then
      print(("reefline-load: tx %.0f requests/s, %.3f Mpps"):format((sent_requests - last_requests) / (now - last_print),
        (sent_packets - last_packets) / (now - last_print) / 1e6))
      last_print, last_packets, last_requests = now, sent_packets, sent_requests
    end
  end
  local elapsed = math.max(mg.getTime() - start, 1e-9)
  print(("reefline-load: sent requests=%d packets=%d bytes=%d seconds=%.3f requests_per_s=%.1f")
    :format(sent_requests, sent_packets, sent_bytes, elapsed, sent_requests / elapsed))
end

local status_names = {}
for name, v in pairs(R.STATUS) do status_names[v] = name end

function rxTask(queue, args)
  local bufs = memory.bufArray(63)
  local cameras = math.max(1, args.cameras)
  local fragments, responses, errors, foreign, malformed = 0, 0, 0, 0, 0
  local by_status = {}
  local pending, npending = {}, 0  -- fragments received per message not yet complete
  local last_print, last_responses = mg.getTime(), 0
  while mg.running() do
    local rx = queue:tryRecv(bufs, 1000)
    for b = 1, rx do
      local buf = bufs[b]
      local p, size = buf:getBytes(), buf:getSize()
      local l3, et = 14, p[12] * 256 + p[13]
      if et == 0x8100 then l3, et = 18, p[16] * 256 + p[17] end
      local u = l3 + (p[l3] % 16) * 4
      local dport = size >= u + 8 and et == 0x0800 and p[l3 + 9] == 17 and p[u + 2] * 256 + p[u + 3]
      if not dport or dport < args.sport or dport >= args.sport + cameras then
        foreign = foreign + 1  -- ARP and anything not for our cameras
      else
        local h = u + 8
        if size < h + R.HEADER_SIZE or p[h] ~= 0x52 or p[h + 1] ~= 0x46 or p[h + 2] ~= 0x4c or p[h + 3] ~= 0x4e
            or p[h + 4] ~= R.VERSION or (p[h + 5] ~= R.KIND.response and p[h + 5] ~= R.KIND.error) then
          malformed = malformed + 1
        else
          fragments = fragments + 1
          local count = p[h + 18] * 256 + p[h + 19]
          local key = ffi.string(p + h + 5, 1) .. ffi.string(p + h + 8, 8) .. dport
          local got = (pending[key] or 0) + 1
          if got >= count then
            if pending[key] then npending = npending - 1 end
            pending[key] = nil
            if p[h + 5] == R.KIND.error then
              errors = errors + 1
              local s = status_names[p[h + 7]] or tostring(p[h + 7])
              by_status[s] = (by_status[s] or 0) + 1
            else
              responses = responses + 1
            end
          else
            if not pending[key] then npending = npending + 1 end
            pending[key] = got
            -- Answers that never complete must not grow the table without bound.
            if npending > 65536 then pending, npending = {}, 0 end
          end
        end
      end
    end
    bufs:free(rx)
    local now = mg.getTime()
    if now - last_print >= 1 then
      print(("reefline-load: rx %.0f answers/s"):format((responses + errors - last_responses) / (now - last_print)))
      last_print, last_responses = now, responses + errors
    end
  end
  local s = {}
  for k, v in pairs(by_status) do s[#s + 1] = k .. "=" .. v end
  table.sort(s)
  print(("reefline-load: received fragments=%d responses=%d errors=%d%s incomplete=%d malformed=%d foreign=%d")
    :format(fragments, responses, errors, #s > 0 and " (" .. table.concat(s, " ") .. ")" or "", npending, malformed, foreign))
end
