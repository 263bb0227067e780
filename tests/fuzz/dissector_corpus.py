#!/usr/bin/env python3
"""Captures for fuzzing the Wireshark dissector (tools/wireshark/reefline.lua).

    dissector_corpus.py write [DIR]            the seed corpus (default tests/fuzz/corpus/dissector)
    dissector_corpus.py mutate OUT.pcap SEED COUNT CORPUS.pcap...
                                               COUNT seeded mutants of the corpus frames

`write` builds small classic pcap files (Ethernet/IPv4/UDP, to the dissector's default port 9000
unless a file says otherwise) with python3 struct alone, byte for byte the same on every run, so
the committed corpus can be checked against this script. The name says what a file holds:

    valid_*      well-formed requests and answers of every format: no Error or Warning expert
    dims_*       tensor and image dims whose product passes 2^53 / 2^64 (or wraps to total_length
                 modulo 2^32 or 2^64): every reefline frame must carry reefline.expert.dims
    (others)     hostile datagrams: must be dissected without a Lua error

`mutate` takes the IPv4/UDP datagrams of the given captures and writes COUNT mutants of them
(bit flips; boundary values 0, 1, 0x7f, 0x80, 0xff, 0xffff, 0xffffffff ... over header fields and
dims; truncated, extended and snaplen-cut datagrams; wrong UDP or IPv4 lengths; duplicated
frames), with random.Random(SEED): the same arguments always give the same file.
"""
import os
import random
import struct
import sys

MAGIC = 0x52464C4E
PORT = 9000
MIB8 = 8 << 20
REQUEST, RESPONSE, ERROR = 1, 2, 3
RAW, IMAGE, TENSOR, TOKENS, CRC32, TOPK, RTENSOR = 0, 1, 2, 3, 16, 17, 18

SENSOR = bytes([198, 18, 0, 1])
IF_ADDR = bytes([198, 18, 0, 2])
OTHER = bytes([198, 18, 0, 77])


# ---- frames -----------------------------------------------------------------------------------
def ip_checksum(h):
    s = sum(struct.unpack(">%dH" % (len(h) // 2), h))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return 0xffff - s


def ipv4(proto, body, src, dst, total=None, flags_frag=0x4000, ident=0):
    h = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(body) if total is None else total,
                              ident, flags_frag, 64, proto, 0, src, dst))
    h[10:12] = struct.pack(">H", ip_checksum(bytes(h)))
    return bytes(h) + body


def udp(payload, sport, dport, length=None):
    return struct.pack(">HHHH", sport, dport, 8 + len(payload) if length is None else length, 0) + payload


def eth(l3, ethertype=0x0800, vlan=None):
    tag = struct.pack(">HH", 0x8100, vlan) if vlan is not None else b""
    return bytes.fromhex("020000000002" "020000000001") + tag + struct.pack(">H", ethertype) + l3


def dgram(payload, sport=40000, dport=PORT, src=SENSOR, dst=IF_ADDR, udp_len=None, ip_total=None,
          vlan=None):
    """An Ethernet/IPv4/UDP frame carrying payload."""
    u = udp(payload, sport, dport, udp_len)
    return eth(ipv4(17, u, src, dst, ip_total), vlan=vlan)


def answer(payload, sport=PORT, dport=40000, src=IF_ADDR, dst=SENSOR, **kw):
    """A frame from the IF back to the sensor."""
    return dgram(payload, sport, dport, src, dst, **kw)


def ipv6_dgram(payload, sport=40000, dport=PORT):
    src, dst = b"\xfd" + bytes(14) + b"\x01", b"\xfd" + bytes(14) + b"\x02"
    u = bytearray(udp(payload, sport, dport))
    pseudo = src + dst + struct.pack(">IxxxB", len(u), 17) + bytes(u) + b"\0" * (len(u) % 2)
    u[6:8] = struct.pack(">H", ip_checksum(pseudo) or 0xFFFF)  # UDP over IPv6 needs a checksum
    h = struct.pack(">IHBB16s16s", 6 << 28, len(u), 17, 64, src, dst)
    return eth(h + bytes(u), ethertype=0x86DD)


def icmp_unreachable(quoted_frame):
    """An ICMP port unreachable from the IF quoting the IPv4 datagram of quoted_frame."""
    quoted = quoted_frame[14:14 + 20 + 8 + 48]  # IPv4 header, UDP header, header + 8 bytes
    body = bytearray(struct.pack(">BBHI", 3, 3, 0, 0) + quoted)
    body[2:4] = struct.pack(">H", ip_checksum(bytes(body) + (b"\0" if len(body) % 2 else b"")))
    return eth(ipv4(1, bytes(body), IF_ADDR, SENSOR))


def hdr(kind=REQUEST, fmt=RAW, status=0, rid=1, index=0, count=1, offset=0, total=4,
        dims=(0, 0, 0, 0), reserved=0, magic=MAGIC, version=1):
    return struct.pack(">IBBBBQHHII4HI", magic, version, kind, fmt, status, rid, index, count, offset,
                       total, *dims, reserved)


def message(kind, fmt, rid, payload, dims=(0, 0, 0, 0), frag=None, status=0):
    """The datagram payloads of one message, cut into fragments of frag bytes."""
    frag = frag or max(1, len(payload))
    cuts = list(range(0, len(payload), frag)) or [0]
    return [hdr(kind, fmt, status, rid, i, len(cuts), off, len(payload), dims) + payload[off:off + frag]
            for i, off in enumerate(cuts)]


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def pattern(n, seed):
    r = random.Random(seed)
    return bytes(r.randrange(256) for _ in range(n))


def f32s(values):
    return struct.pack("<%df" % len(values), *values)


def topk(entries):
    return b"".join(struct.pack(">If", c, s) for c, s in entries)


# ---- pcap -------------------------------------------------------------------------------------
def write_pcap(path, frames):
    """frames: bytes, or (bytes, captured length) for a frame cut by the snap length."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, fr in enumerate(frames):
            data, cap = (fr, len(fr)) if isinstance(fr, bytes) else fr
            f.write(struct.pack("<IIII", 1700000000 + i // 1000, (i % 1000) * 1000, cap, len(data)))
            f.write(data[:cap])


def read_pcap(path):
    d = open(path, "rb").read()
    e = "<" if d[:4] == b"\xd4\xc3\xb2\xa1" else ">"
    frames, pos = [], 24
    while pos + 16 <= len(d):
        _, _, incl, orig = struct.unpack(e + "IIII", d[pos:pos + 16])
        frames.append(d[pos + 16:pos + 16 + incl])
        pos += 16 + incl
    return frames


# ---- the corpus -------------------------------------------------------------------------------
def corpus():
    files = {}

    # Valid requests of every format, one datagram and several.
    files["valid_req_image"] = [dgram(p) for p in
                                message(REQUEST, IMAGE, 1, pattern(48, 1), (4, 4, 3, 0)) +
                                message(REQUEST, IMAGE, 2, pattern(192, 2), (8, 8, 3, 0), frag=64)]
    files["valid_req_tensor"] = [dgram(p) for p in
                                 message(REQUEST, TENSOR, 1, f32s([0.5 * i for i in range(6)]), (2, 3, 0, 0)) +
                                 message(REQUEST, TENSOR, 2, f32s([float(i) for i in range(96)]), (16, 6, 0, 0), frag=128) +
                                 message(REQUEST, TENSOR, 3, f32s([1.0] * 8), (1, 2, 2, 2)) +
                                 message(REQUEST, TENSOR, 4, f32s([float("nan"), float("inf"), -0.0, 1e-45]), (4, 0, 0, 0))]
    files["valid_req_tokens"] = [dgram(p) for p in
                                 message(REQUEST, TOKENS, 1, struct.pack("<5i", 101, 2, -5, 70000, 0), (5, 0, 0, 0)) +
                                 message(REQUEST, TOKENS, 2, struct.pack("<40i", *range(40)), (40, 0, 0, 0), frag=80) +
                                 message(REQUEST, TOKENS, 3, struct.pack("<2i", -2**31, 2**31 - 1), (2, 0, 0, 0))]
    files["valid_req_raw"] = [dgram(p) for p in
                              message(REQUEST, RAW, 1, pattern(100, 3)) +
                              message(REQUEST, RAW, 2, pattern(300, 4), frag=128)]
    # Heuristic: valid reefline on a port the preference does not name, and from 9000 to 9000.
    files["valid_heuristic_ports"] = ([dgram(p, dport=9123) for p in message(REQUEST, RAW, 5, pattern(20, 5))] +
                                      [dgram(p, sport=PORT) for p in message(REQUEST, RAW, 6, pattern(20, 6))] +
                                      [dgram(p, vlan=7) for p in message(REQUEST, RAW, 7, pattern(20, 7))] +
                                      [ipv6_dgram(p) for p in message(REQUEST, RAW, 8, pattern(20, 8))])

    # Valid answers of every format, after their requests (linked both ways).
    img = pattern(48, 9)
    files["valid_ans_topk"] = ([dgram(p) for p in message(REQUEST, IMAGE, 10, img, (4, 4, 3, 0))] +
                               [answer(p) for p in message(RESPONSE, TOPK, 10, topk([(7, 0.75), (3, 0.125), (0, -1.5), (999999, 0.0), (2**32 - 1, float("nan"))]), (5, 0, 0, 0))] +
                               [dgram(p) for p in message(REQUEST, IMAGE, 11, img, (4, 4, 3, 0))] +
                               [answer(p) for p in message(RESPONSE, TOPK, 11, topk([(i, 1.0 / (i + 1)) for i in range(200)]), (200, 0, 0, 0), frag=800)])
    out = f32s([0.25 * i for i in range(100)])
    files["valid_ans_tensor"] = ([dgram(p) for p in message(REQUEST, TENSOR, 20, f32s([1.0] * 6), (2, 3, 0, 0))] +
                                 [answer(p) for p in message(RESPONSE, RTENSOR, 20, out, (10, 10, 0, 0), frag=200)] +
                                 [dgram(p) for p in message(REQUEST, TENSOR, 21, f32s([1.0] * 6), (2, 3, 0, 0))] +
                                 [answer(p) for p in message(RESPONSE, RTENSOR, 21, out, (10, 10, 0, 0), frag=150)])
    raw = pattern(300, 10)
    files["valid_ans_crc32"] = ([dgram(p) for p in message(REQUEST, RAW, 30, raw, frag=128)] +
                                [answer(p) for p in message(RESPONSE, CRC32, 30, struct.pack(">II", len(raw), crc32c(raw)))])
    errs = []
    for status, text in enumerate([b"payload does not match", b"format 3 not taken", b"overloaded",
                                   b"deadline %d %s %n %%", b"internal \xff\xfe not utf-8 \x00 nul",
                                   "shutting down \u2013 bye".encode()], 1):
        errs += [dgram(p) for p in message(REQUEST, RAW, 40 + status, pattern(8, status))]
        errs += [answer(p) for p in message(ERROR, RAW, 40 + status, text, status=status)]
    errs += [answer(p) for p in message(ERROR, RAW, 47, b"a long message " * 20, status=1, frag=100)]
    files["valid_ans_error"] = errs

    # Dims whose product passes 2^53 and 2^64, or wraps to the total length.
    big = [(65535, 65535, 65535, 9),       # 4 * product just past 2^53
           (65535, 65535, 65535, 8),       # just under 2^53
           (65535, 65535, 65535, 32768),   # past 2^63: Lua 5.2 cannot %d it
           (65535, 65535, 65535, 65535),   # about 2^66
           (0, 65535, 65535, 65535),       # a zero extent is unused, not a factor
           (65535, 0, 65535, 65535)]
    frames = []
    for i, d in enumerate(big):
        frames += [dgram(p) for p in message(REQUEST, TENSOR, 100 + i, f32s([1.0] * 4), d)]
        frames += [answer(p) for p in message(RESPONSE, RTENSOR, 100 + i, f32s([2.0] * 4), d)]
    frames += [dgram(p) for p in message(REQUEST, TENSOR, 120, f32s([1.0] * 64), (65535,) * 4, frag=64)]
    frames += [dgram(p) for p in message(REQUEST, IMAGE, 121, pattern(48, 11), (65535, 65535, 65535, 0))]
    files["dims_past_2p53"] = frames
    # 4 * product past 2^64, and equal to total_length only after wrapping modulo 2^64 or 2^32.
    frames = []
    for i, d in enumerate([(65535, 65535, 65535, 16385),    # just past 2^64
                           (65535, 65535, 65535, 65535),    # about 2^66
                           (65535, 65535, 65535, 16384)]):  # just under 2^64, past 2^63
        frames += [dgram(p) for p in message(REQUEST, TENSOR, 200 + i, f32s([1.0]), d)]
    for i, (d, total, _) in enumerate(WRAPS):
        frames += [dgram(p) for p in message(REQUEST, TENSOR, 210 + i, f32s([1.0] * (total // 4)), d, frag=1024)]
        frames += [answer(p) for p in message(RESPONSE, RTENSOR, 210 + i, f32s([1.0] * (total // 4)), d, frag=1024)]
    for i, (d, total, _) in enumerate(IMAGE_WRAPS):
        frames += [dgram(p) for p in message(REQUEST, IMAGE, 230 + i, pattern(total, 12), d)]
    frames += [dgram(hdr(fmt=TENSOR, rid=240, total=MIB8, offset=MIB8 - 4, index=1023, count=1024,
                         dims=(65535,) * 4) + bytes(4))]
    files["dims_past_2p64"] = frames

    # Fragment counts and indexes.
    files["frag_count"] = [dgram(hdr(rid=300 + i, index=ix, count=c) + b"abcd") for i, (ix, c) in enumerate(
        [(0, 0), (5, 0), (0, 1025), (65534, 65535), (65535, 65535), (1023, 1024), (0, 32768)])]
    files["frag_index"] = [dgram(hdr(rid=310 + i, index=ix, count=c, total=4 * c, offset=4 * min(ix, c)) + b"abcd")
                           for i, (ix, c) in enumerate([(1, 1), (65535, 2), (1024, 1024), (2, 2)])]
    # Total lengths and offsets at and past the limits.
    files["total_length"] = [dgram(hdr(rid=320 + i, total=t, offset=o) + b"abcd") for i, (t, o) in enumerate(
        [(0, 0), (MIB8 + 1, 0), (MIB8, MIB8 - 4), (2**32 - 1, 0), (2**31, 2**31 - 4), (0x7FFFFFFF, 0)])]
    files["offset"] = ([dgram(hdr(rid=330 + i, total=t, offset=o) + b"abcd") for i, (t, o) in enumerate(
        [(4, 2**32 - 1), (4, 2**32 - 4), (8, 8), (8, 5), (MIB8, 2**31)])] +
        # Unaligned but in range: not decoded, no error.
        [dgram(hdr(rid=340, fmt=TOKENS, dims=(4, 0, 0, 0), total=16, index=1, count=2, offset=6) + bytes(10)),
         dgram(hdr(rid=341, fmt=TENSOR, dims=(4, 0, 0, 0), total=16, index=1, count=2, offset=1) + bytes(15)),
         answer(hdr(RESPONSE, TOPK, rid=342, dims=(4, 0, 0, 0), total=32, index=1, count=2, offset=12) + bytes(20)),
         answer(hdr(RESPONSE, TOPK, rid=343, dims=(4, 0, 0, 0), total=32, index=1, count=2, offset=16) + bytes(9))])

    # Truncated: short UDP payloads, snap-length cuts, lengths that disagree.
    full = dgram(hdr(fmt=TOKENS, rid=350, dims=(40, 0, 0, 0), total=160) + bytes(160))
    files["truncated"] = ([dgram(b""), dgram(b"R"), dgram(b"RFLN"), dgram(b"RFLN\x01"),
                           dgram(hdr()[:39]), dgram(hdr(rid=351)), dgram(hdr(kind=ERROR, status=1, rid=352)),
                           (full, 60), (full, 14 + 20 + 8 + 39), (full, 14 + 20 + 8 + 44),
                           dgram(hdr(rid=353) + b"abcd", udp_len=200),
                           dgram(hdr(rid=354) + b"abcd", udp_len=20),
                           dgram(hdr(rid=355) + b"abcd", ip_total=1500),
                           dgram(hdr(rid=356) + b"abcd", ip_total=30),
                           dgram(hdr(rid=357) + b"abcd", udp_len=0)])

    # Every header field wrong in turn (on port 9000, so even a bad magic is dissected).
    bad = [hdr(magic=0), hdr(magic=0xFFFFFFFF), hdr(magic=0x4E4C4652), hdr(version=0), hdr(version=2),
           hdr(version=255), hdr(kind=0), hdr(kind=4), hdr(kind=255), hdr(reserved=0xFFFFFFFF),
           hdr(reserved=1), hdr(kind=ERROR, status=0), hdr(kind=ERROR, status=7), hdr(kind=ERROR, status=255),
           hdr(kind=RESPONSE, fmt=CRC32, status=1, total=8), hdr(status=255)]
    for kind in (REQUEST, RESPONSE, ERROR):
        for fmt in (4, 15, 19, 127, 128, 255, RAW, IMAGE, TENSOR, TOKENS, CRC32, TOPK, RTENSOR):
            bad.append(hdr(kind=kind, fmt=fmt, status=1 if kind == ERROR else 0, total=8, dims=(2, 0, 0, 0)))
    files["bad_header"] = [dgram(h + b"abcdefgh"[:4 if i % 2 else 8]) for i, h in enumerate(bad)]
    # Results of the wrong size.
    files["result_size"] = [answer(p) for p in [
        hdr(RESPONSE, CRC32, rid=360, total=8, count=2) + bytes(4),
        hdr(RESPONSE, CRC32, rid=361, total=8, count=1) + bytes(4),
        hdr(RESPONSE, CRC32, rid=362, total=4) + bytes(4),
        hdr(RESPONSE, TOPK, rid=363, total=16, dims=(3, 0, 0, 0)) + bytes(16),
        hdr(RESPONSE, TOPK, rid=364, total=8 * 65535, dims=(65535, 0, 0, 0)) + bytes(8),
        hdr(RESPONSE, TOPK, rid=365, total=8, dims=(0, 0, 0, 0)) + bytes(8),
        hdr(RESPONSE, TOPK, rid=366, total=8, dims=(1, 65535, 65535, 65535)) + bytes(8)]]

    # Fragments of one message: duplicates, inconsistent and overlapping ones, more after completion.
    body = pattern(96, 13)
    parts = message(REQUEST, TOKENS, 400, body, (24, 0, 0, 0), frag=32)
    dup = [dgram(p) for p in parts[:2]] + [dgram(parts[0]), dgram(parts[1])]
    dup.append(dgram(hdr(fmt=TOKENS, rid=400, index=1, count=3, offset=0, total=96, dims=(24, 0, 0, 0)) + body[:32]))
    dup.append(dgram(hdr(fmt=TOKENS, rid=400, index=2, count=4, offset=64, total=96, dims=(24, 0, 0, 0)) + body[64:]))
    dup.append(dgram(hdr(fmt=TOKENS, rid=400, index=2, count=3, offset=64, total=100, dims=(25, 0, 0, 0)) + body[64:]))
    dup.append(dgram(hdr(fmt=TENSOR, rid=400, index=2, count=3, offset=64, total=96, dims=(24, 0, 0, 0)) + body[64:]))
    dup.append(dgram(hdr(fmt=TOKENS, rid=400, index=2, count=3, offset=16, total=96, dims=(24, 0, 0, 0)) + body[16:48]))
    dup += [dgram(parts[2]), dgram(parts[2]), dgram(parts[1])]
    # A message of 40 one-byte fragments sent twice over, and one whose count changes mid-way.
    many = message(REQUEST, RAW, 401, pattern(40, 14), frag=1)
    dup += [dgram(p) for p in many + many[::-1]]
    dup += [dgram(hdr(rid=402, index=i, count=2 + i, total=8, offset=4 * (i % 2)) + b"abcd") for i in range(6)]
    files["fragments"] = dup

    # Answers nobody asked for, answers before their requests, odd request ids.
    unk = []
    for i, (kind, fmt, status, payload, dims) in enumerate([
            (RESPONSE, CRC32, 0, struct.pack(">II", 3, 0xDEADBEEF), (0, 0, 0, 0)),
            (RESPONSE, TOPK, 0, topk([(1, 0.5)]), (1, 0, 0, 0)),
            (RESPONSE, RTENSOR, 0, f32s([1.0, 2.0]), (2, 0, 0, 0)),
            (ERROR, RAW, 3, b"overloaded", (0, 0, 0, 0)),
            (ERROR, CRC32, 1, b"", (0, 0, 0, 0))]):
        unk += [answer(p) for p in message(kind, fmt, 500 + i, payload or b"x", dims, status=status)]
    # The answer first, then its request, then a second answer.
    unk += [answer(p) for p in message(RESPONSE, CRC32, 510, struct.pack(">II", 4, crc32c(b"abcd")))]
    unk += [dgram(p) for p in message(REQUEST, RAW, 510, b"abcd")]
    unk += [answer(p) for p in message(RESPONSE, CRC32, 510, struct.pack(">II", 4, crc32c(b"abcd")))]
    # An answer from another address or port than the request went to.
    unk += [dgram(p) for p in message(REQUEST, RAW, 511, b"abcd")]
    unk += [answer(p, src=OTHER) for p in message(RESPONSE, CRC32, 511, struct.pack(">II", 4, crc32c(b"abcd")))]
    unk += [answer(p, dport=40001) for p in message(RESPONSE, CRC32, 511, struct.pack(">II", 4, crc32c(b"abcd")))]
    # A request answered by a request (kind 1 from the IF) and a response sent to the IF.
    unk += [answer(p) for p in message(REQUEST, RAW, 512, b"abcd")]
    unk += [dgram(p) for p in message(RESPONSE, CRC32, 512, struct.pack(">II", 4, 0))]
    for i, rid in enumerate([0, 2**64 - 1, 2**63, 2**63 - 1, 2**53 + 1, 2**32]):
        unk += [dgram(p) for p in message(REQUEST, RAW, rid, bytes([i]) * 4)]
        unk += [answer(p) for p in message(RESPONSE, CRC32, rid, struct.pack(">II", 4, crc32c(bytes([i]) * 4)))]
        unk += [answer(p) for p in message(ERROR, RAW, rid, b"again", status=6)]
    files["linking"] = unk

    # Elsewhere in the stack: an ICMP error quoting a request, an IPv4 fragment, a VLAN tag.
    req = dgram(message(REQUEST, RAW, 600, pattern(64, 15))[0])
    frag_ip = eth(ipv4(17, udp(hdr(rid=601, total=2000) + bytes(100), 40000, PORT, length=2048), SENSOR, IF_ADDR,
                       flags_frag=0x2000, ident=77))
    files["encapsulated"] = [req, icmp_unreachable(req), icmp_unreachable(req), frag_ip,
                             dgram(hdr(rid=602, fmt=TOKENS, dims=(1, 0, 0, 0)) + bytes(4), vlan=4095),
                             ipv6_dgram(hdr(rid=603, total=0) + b"abcd"),
                             ipv6_dgram(b"RFLN")]
    return files


# Dims whose described length wraps to a small total length: fmt_factor * product equals
# k * 2^width + total (found once by factoring; asserted where used).
WRAPS = [((61369, 46226, 41387, 39279), 1832, 64),  # 4 * product = 2^64 + 1832
         ((62515, 55495, 53565, 49633), 3268, 64),  # 4 * product = 2 * 2^64 + 3268
         ((54161, 19825, 1, 1), 4, 32)]             # 4 * product = 2^32 + 4
IMAGE_WRAPS = [((62571, 45761, 3, 0), 1, 32),       # product = 2 * 2^32 + 1
               ((31735, 24607, 11, 0), 3, 32)]      # product = 2 * 2^32 + 3


def _product(d):
    n = 1
    for x in d:
        n *= x or 1
    return n


for _d, _t, _w in WRAPS:
    assert (4 * _product(_d)) % 2**_w == _t and 4 * _product(_d) >= 2**_w
for _d, _t, _w in IMAGE_WRAPS:
    assert _product(_d) % 2**_w == _t and _product(_d) >= 2**_w


# ---- mutation ---------------------------------------------------------------------------------
BYTES = [0, 1, 0x7F, 0x80, 0xFF, 0xFE]
U16 = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x3FF, 0x400, 0x401, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF]
U32 = [0, 1, 3, 4, 7, 8, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, MIB8 - 1, MIB8, MIB8 + 1, 0x7FFFFFFF,
       0x80000000, 0xFFFFFFFC, 0xFFFFFFFF]
U64 = [0, 1, 2**32, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]


def split(frame):
    """(l3 offset, udp offset, payload) of an Ethernet[/VLAN]/IPv4/UDP frame, or None."""
    l3 = 14
    if frame[12:14] == b"\x81\x00":
        l3 = 18
    if len(frame) < l3 + 28 or frame[l3 - 2:l3] != b"\x08\x00" or frame[l3 + 9] != 17:
        return None
    u = l3 + (frame[l3] & 15) * 4
    return l3, u, frame[u + 8:]


def rebuild(frame, l3, u, payload, fix_udp=True, fix_ip=True):
    f = bytearray(frame[:u + 8] + payload)
    if fix_udp:
        f[u + 4:u + 6] = struct.pack(">H", min(0xFFFF, 8 + len(payload)))
    if fix_ip:
        f[l3 + 2:l3 + 4] = struct.pack(">H", min(0xFFFF, u - l3 + 8 + len(payload)))
    f[l3 + 10:l3 + 12] = b"\0\0"
    f[l3 + 10:l3 + 12] = struct.pack(">H", ip_checksum(bytes(f[l3:u])))
    return bytes(f)


def mutate_payload(r, p):
    p = bytearray(p)
    for _ in range(r.choice((1, 1, 1, 2, 3))):
        op = r.randrange(11)
        n = len(p)
        if op == 0 and n:  # one bit, mostly in the header
            i = r.randrange(min(n, 44)) if r.random() < 0.8 else r.randrange(n)
            p[i] ^= 1 << r.randrange(8)
        elif op == 1 and n:  # one byte of the header to a boundary value
            p[r.randrange(min(n, 40))] = r.choice(BYTES)
        elif op == 2 and n >= 36:  # one dim
            i = 28 + 2 * r.randrange(4)
            p[i:i + 2] = struct.pack(">H", r.choice(U16))
        elif op == 3 and n >= 36:  # every dim at once: huge products
            for i in range(28, 36, 2):
                p[i:i + 2] = struct.pack(">H", r.choice((0, 1, 0xFFFF, 0x8000, 0x7FFF, r.randrange(65536))))
        elif op == 4 and n >= 40:  # offset, total or reserved
            i = r.choice((20, 24, 36))
            v = r.choice(U32 + [n - 40, n - 39, n - 41])
            p[i:i + 4] = struct.pack(">I", v & 0xFFFFFFFF)
        elif op == 5 and n >= 20:  # index or count
            i = r.choice((16, 18))
            p[i:i + 2] = struct.pack(">H", r.choice(U16))
        elif op == 6 and n >= 16:  # request id
            p[8:16] = struct.pack(">Q", r.choice(U64))
        elif op == 7 and n >= 8:  # kind, format, status: any combination
            p[5] = r.choice((0, 1, 2, 3, 4, 255))
            p[6] = r.choice((0, 1, 2, 3, 4, 15, 16, 17, 18, 19, 255))
            p[7] = r.choice((0, 1, 6, 7, 255))
        elif op == 8:  # truncate
            del p[r.randrange(n + 1):]
        elif op == 9:  # extend
            p += bytes(r.randrange(256) for _ in range(r.choice((1, 3, 4, 8, 37))))
        elif op == 10 and n > 40:  # the fragment's bytes
            i = r.randrange(40, n)
            p[i] = r.choice(BYTES)
    return bytes(p)


def mutants(captures, seed, count):
    """captures: a list of frame lists; each capture is as likely to be picked, whatever its size."""
    r = random.Random(seed)
    pools = [[(fr,) + s for fr in frames for s in [split(fr)] if s and len(s[2]) >= 1] for frames in captures]
    pools = [p for p in pools if p]
    out = []
    while len(out) < count:
        fr, l3, u, p = r.choice(r.choice(pools))
        q = mutate_payload(r, p)
        way = r.random()
        if way < 0.85:
            m = rebuild(fr, l3, u, q)
        elif way < 0.92:  # UDP length left as it was: disagrees with IPv4
            m = rebuild(fr, l3, u, q, fix_udp=False)
        else:
            m = rebuild(fr, l3, u, q, fix_ip=False)
        if r.random() < 0.05:  # cut by the snap length
            out.append((m, r.randrange(l3 + 20, len(m) + 1)))
        else:
            out.append(m)
        if r.random() < 0.1:  # duplicated frame
            out.append(m)
        if r.random() < 0.1:  # the original beside it (links, duplicates, inconsistencies)
            out.append(fr)
    return out[:count]


def main(argv):
    if len(argv) >= 2 and argv[1] == "write":
        here = os.path.dirname(os.path.abspath(__file__))
        d = argv[2] if len(argv) > 2 else os.path.join(here, "corpus", "dissector")
        os.makedirs(d, exist_ok=True)
        for name, frames in sorted(corpus().items()):
            write_pcap(os.path.join(d, name + ".pcap"), frames)
        return 0
    if len(argv) >= 5 and argv[1] == "mutate":
        out, seed, count = argv[2], int(argv[3]), int(argv[4])
        write_pcap(out, mutants([read_pcap(path) for path in argv[5:]], seed, count))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
