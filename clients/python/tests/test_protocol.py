"""The Python codec: header bytes, fragmentation (equal to reefgen's captures and to the C
library's encoding), response checks, bounded reassembly under hostile input, result decoding.

REEFGEN (the reefgen binary) and REEFLINE_CLIENT_LIB (libreefline-client.so) enable the
cross-checks against the C side; without them those tests skip.
"""

import ctypes
import gc
import os
import random
import struct
import subprocess
import sys
import tempfile
import tracemalloc
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import reefline  # noqa: E402
from reefline import protocol as p  # noqa: E402


def pcap_udp_payloads(path):
    """UDP payloads of an Ethernet/IPv4/UDP capture as reefgen writes it."""
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack_from("<I", data, 0)[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    out, at = [], 24
    while at + 16 <= len(data):
        caplen = struct.unpack_from(endian + "I", data, at + 8)[0]
        at += 16
        frame = data[at:at + caplen]
        at += caplen
        ihl = (frame[14] & 0x0F) * 4
        out.append(frame[14 + ihl + 8:])
    return out


class HeaderAndElements(unittest.TestCase):
    def test_header_bytes_follow_the_protocol_table(self):
        h = p.Header(p.Kind.REQUEST, p.Format.IMAGE_U8_HWC, 0, 0x0102030405060708, 0x0A0B, 0x0C0D,
                     0x11121314, 0x21222324, (224, 225, 3, 0))
        want = bytes([0x52, 0x46, 0x4C, 0x4E, 1, 1, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x0A, 0x0B, 0x0C, 0x0D,
                      0x11, 0x12, 0x13, 0x14, 0x21, 0x22, 0x23, 0x24, 0, 224, 0, 225, 0, 3, 0, 0, 0, 0, 0, 0])
        self.assertEqual(h.encode(), want)
        self.assertEqual(p.Header.decode(want), h)

    def test_elements_are_little_endian_and_crc_is_castagnoli(self):
        self.assertEqual(p.encode_i32([1, -2]), bytes([1, 0, 0, 0, 0xFE, 0xFF, 0xFF, 0xFF]))
        self.assertEqual(p.encode_f32([1.0]), bytes([0, 0, 0x80, 0x3F]))
        self.assertEqual(p.decode_f32(p.encode_f32([0.5, -3.25])), [0.5, -3.25])
        self.assertEqual(p.decode_i32(p.encode_i32([7, -7])), [7, -7])
        self.assertEqual(p.crc32c(b"123456789"), 0xE3069283)  # RFC 3720's check value
        self.assertEqual(p.crc32c(b"6789", p.crc32c(b"12345")), 0xE3069283)
        self.assertEqual(p.status_name(4), "deadline_exceeded")
        self.assertEqual(p.status_name(99), "unknown")


class Fragmentation(unittest.TestCase):
    def test_plans_and_limits(self):
        self.assertEqual(p.fragment_count(768, 100), 8)
        self.assertEqual(p.fragment_count(800, 100), 8)
        self.assertEqual(p.fragment_count(p.MAX_TOTAL_LENGTH, 8192), 1024)
        with self.assertRaisesRegex(p.LimitError, "1025 fragments"):
            p.fragment_count(p.MAX_TOTAL_LENGTH, 8191)
        for total, frag in ((0, 100), (p.MAX_TOTAL_LENGTH + 1, 65000)):
            with self.assertRaises(p.LimitError):
                p.fragment_count(total, frag)
        for frag in (0, p.MAX_FRAGMENT_SIZE + 1):
            with self.assertRaises(p.ProtocolError):
                p.fragment_count(10, frag)
        with self.assertRaises(p.ProtocolError):
            p.request_headers(p.Format.RESULT_TOPK, None, 10, 1, 100)
        with self.assertRaisesRegex(p.ProtocolError, "describe 300 bytes"):
            p.check_request(p.Format.IMAGE_U8_HWC, (10, 10, 3), b"x" * 10)

    def test_fragments_tile_and_pass_the_data_planes_checks(self):
        payload = bytes((i * 13) & 0xFF for i in range(768))
        frags = p.encode_request(p.Format.IMAGE_U8_HWC, (16, 16, 3), payload, 42, 100)
        self.assertEqual(len(frags), 8)
        joined = b""
        for d in frags:
            verdict, h, frag = p.parse_request(d)
            self.assertEqual(verdict, p.RequestVerdict.OK)
            self.assertEqual(h.payload_offset, len(joined))
            self.assertEqual(h.request_id, 42)
            joined += frag
        self.assertEqual(joined, payload)
        self.assertEqual(len(frags[-1]), 40 + 68)
        bad = bytearray(frags[0])
        bad[29] = 17
        self.assertEqual(p.parse_request(bytes(bad))[0], p.RequestVerdict.DIMS_MISMATCH)
        self.assertEqual(p.parse_request(frags[0][:39])[0], p.RequestVerdict.SHORT)
        self.assertEqual(p.parse_request(frags[0][:40])[0], p.RequestVerdict.ZERO_LENGTH)

    @unittest.skipUnless(os.environ.get("REEFGEN"), "REEFGEN not set")
    def test_fragments_equal_reefgen_captures(self):
        """Every datagram of reefgen's captures, re-encoded by this package from its own
        reassembly of the capture, for every request format and a shuffled capture; and for
        files sent as they are, the capture in order."""
        reefgen = os.environ["REEFGEN"]
        cases = [
            (["--shape", "20x30x3"], 256),
            (["--tokens", "8-300"], 100),
            (["--dims", "64,6"], 333),
            (["--format", "raw", "--shape", "10x10x10"], 7),
            (["--shape", "32x32x3", "--shuffle", "--sources", "3"], 1432),
        ]
        with tempfile.TemporaryDirectory() as tmp:
            for args, frag in cases:
                pcap = os.path.join(tmp, "req.pcap")
                subprocess.run([reefgen, "pcap", "--out", pcap, "--requests", "20", "--frag-size", str(frag),
                                "--seed", "5", *args], check=True, stdout=subprocess.DEVNULL)
                got = pcap_udp_payloads(pcap)
                by_id, asm = {}, p.Assembler(remember_completed=True)
                done = []
                for d in got:
                    verdict, h, fragment = p.parse_request(d)
                    self.assertEqual(verdict, p.RequestVerdict.OK)
                    by_id.setdefault(h.request_id, []).append(d)
                    outcome, m = asm.add((0, 0, h.request_id), h, fragment)
                    if outcome == p.Outcome.COMPLETED:
                        self.assertTrue(m.tiles)
                        done.append(m)
                self.assertEqual(len(done), 20, args)
                for m in done:
                    mine = p.encode_request(m.head.format, m.head.dims, m.payload, m.flow[2], frag)
                    self.assertEqual(sorted(mine), sorted(by_id[m.flow[2]]), args)

            payload = bytes((i * 31 + 7) & 0xFF for i in range(1800))
            raw = os.path.join(tmp, "img.bin")
            with open(raw, "wb") as f:
                f.write(payload)
            pcap = os.path.join(tmp, "raw.pcap")
            subprocess.run([reefgen, "pcap", "--out", pcap, "--requests", "3", "--raw", raw, "--format", "image",
                            "--shape", "20x30x3", "--frag-size", "256", "--seed", "9"], check=True,
                           stdout=subprocess.DEVNULL)
            got = pcap_udp_payloads(pcap)
            first = p.Header.decode(got[0]).request_id
            want = [d for r in range(3)
                    for d in p.encode_request(p.Format.IMAGE_U8_HWC, (20, 30, 3), payload, first + r, 256)]
            self.assertEqual(got, want)

    @unittest.skipUnless(os.environ.get("REEFLINE_CLIENT_LIB"), "REEFLINE_CLIENT_LIB not set")
    def test_same_bytes_as_the_c_library(self):
        lib = ctypes.CDLL(os.environ["REEFLINE_CLIENT_LIB"])
        lib.reefline_crc32c.restype = ctypes.c_uint32
        lib.reefline_crc32c.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.reefline_encode_request_fragment.argtypes = [
            ctypes.c_int, ctypes.POINTER(ctypes.c_uint16), ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64,
            ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        rng = random.Random(3)
        for fmt, dims in ((p.Format.RAW, (0, 0, 0, 0)), (p.Format.IMAGE_U8_HWC, (7, 9, 3, 0)),
                          (p.Format.TOKENS_I32, (50, 0, 0, 0)), (p.Format.TENSOR_F32, (5, 2, 3, 0))):
            size = p.described_length(fmt, dims) or 999
            payload = bytes(rng.randrange(256) for _ in range(size))
            self.assertEqual(lib.reefline_crc32c(payload, len(payload)), p.crc32c(payload))
            frag = rng.randrange(1, 200)
            mine = p.encode_request(fmt, dims, payload, 0x1234567890, frag)
            cdims = (ctypes.c_uint16 * 4)(*dims)
            for i, d in enumerate(mine):
                buf = ctypes.create_string_buffer(40 + frag)
                n = ctypes.c_size_t()
                rc = lib.reefline_encode_request_fragment(int(fmt), cdims, payload, len(payload), 0x1234567890,
                                                          frag, i, buf, len(buf), ctypes.byref(n))
                self.assertEqual(rc, 0)
                self.assertEqual(buf.raw[:n.value], d)


def response(rid, index, count, offset, total, payload, fmt=p.Format.RAW, kind=p.Kind.RESPONSE, status=0,
             dims=(0, 0, 0, 0)):
    return p.Header(kind, fmt, status, rid, index, count, offset, total, dims).encode() + payload


class ResponseChecks(unittest.TestCase):
    def test_verdicts(self):
        ok = response(9, 0, 1, 0, 8, b"\x01" * 8, p.Format.RESULT_CRC32)
        verdict, h, frag = p.parse_response(ok)
        self.assertEqual(verdict, p.Verdict.OK)
        self.assertEqual((h.request_id, frag), (9, b"\x01" * 8))

        def v(d):
            return p.parse_response(bytes(d))[0]

        self.assertEqual(v(ok[:39]), p.Verdict.SHORT)
        self.assertEqual(str(p.Verdict.SHORT), "short_payload")
        for at, value, want in ((39, 1, p.Verdict.BAD_HEADER), (4, 2, p.Verdict.BAD_HEADER),
                                (0, 0, p.Verdict.BAD_HEADER), (5, 9, p.Verdict.BAD_KIND),
                                (5, 1, p.Verdict.REQUEST)):
            bad = bytearray(ok)
            bad[at] = value
            self.assertEqual(v(bad), want, (at, value))
        self.assertEqual(v(response(9, 1, 1, 0, 8, b"x" * 8)), p.Verdict.TOO_MANY_FRAGMENTS)
        self.assertEqual(v(response(9, 0, 1025, 0, 8, b"x" * 8)), p.Verdict.TOO_MANY_FRAGMENTS)
        self.assertEqual(v(response(9, 0, 1, 0, p.MAX_TOTAL_LENGTH + 1, b"x")), p.Verdict.TOO_LARGE)
        self.assertEqual(v(response(9, 0, 1, 0xFFFFFFFC, 8, b"x" * 8)), p.Verdict.OFFSET_OUT_OF_RANGE)
        self.assertEqual(v(ok + b"\x00"), p.Verdict.OFFSET_OUT_OF_RANGE)
        self.assertEqual(str(p.Verdict.OFFSET_OUT_OF_RANGE), "offset_out_of_range")


def hdr(rid, index, count, offset, total, fmt=p.Format.RAW):
    return p.Header(p.Kind.RESPONSE, fmt, 0, rid, index, count, offset, total, (0, 0, 0, 0))


class Reassembly(unittest.TestCase):
    def test_out_of_order_duplicates_and_inconsistent(self):
        a = p.Assembler()
        payload = bytes(range(250))
        piece = [payload[0:100], payload[100:200], payload[200:250]]
        self.assertEqual(a.add((0, 0, 1), hdr(1, 2, 3, 200, 250), piece[2])[0], p.Outcome.ACCEPTED)
        self.assertEqual(a.add((0, 0, 1), hdr(1, 2, 3, 200, 250), piece[2])[0], p.Outcome.DUPLICATE)
        self.assertEqual(a.add((0, 0, 1), hdr(1, 0, 3, 0, 251), piece[0])[0], p.Outcome.INCONSISTENT)
        self.assertEqual(a.add((0, 0, 1), hdr(1, 0, 3, 0, 250, p.Format.RESULT_TOPK), piece[0])[0],
                         p.Outcome.INCONSISTENT)
        self.assertEqual(a.add((1, 5, 1), hdr(1, 0, 3, 0, 250), piece[0])[0], p.Outcome.ACCEPTED)
        self.assertEqual(a.add((0, 0, 1), hdr(1, 0, 3, 0, 250), piece[0])[0], p.Outcome.ACCEPTED)
        self.assertEqual([(f, n) for f, _, n in a.pending()], [((0, 0, 1), 2), ((1, 5, 1), 1)])
        outcome, m = a.add((0, 0, 1), hdr(1, 1, 3, 100, 250), piece[1])
        self.assertEqual(outcome, p.Outcome.COMPLETED)
        self.assertTrue(m.tiles)
        self.assertEqual(m.payload, payload)
        self.assertTrue(a.forget((1, 5, 1)))
        self.assertEqual((a.pending(), a.pending_bytes), ([], 0))

    def test_overlaps_and_gaps_do_not_tile(self):
        a = p.Assembler()
        a.add((0, 0, 2), hdr(2, 0, 2, 0, 20), b"\x01" * 10)
        outcome, m = a.add((0, 0, 2), hdr(2, 1, 2, 0, 20), b"\x02" * 10)
        self.assertEqual(outcome, p.Outcome.COMPLETED)
        self.assertFalse(m.tiles)
        outcome, m = a.add((0, 0, 3), hdr(3, 0, 1, 0, 8000000), b"\x01")
        self.assertFalse(m.tiles)
        self.assertEqual(len(m.payload), 1)

    def test_remember_completed_and_bounds(self):
        a = p.Assembler(remember_completed=True)
        self.assertEqual(a.add((0, 0, 4), hdr(4, 0, 1, 0, 3), b"abc")[0], p.Outcome.COMPLETED)
        self.assertEqual(a.add((0, 0, 4), hdr(4, 0, 1, 0, 3), b"abc")[0], p.Outcome.AFTER_COMPLETION)
        by_count = p.Assembler(max_pending=2)
        for rid in (1, 2, 3):
            self.assertEqual(by_count.add((0, 0, rid), hdr(rid, 0, 2, 0, 200), b"x" * 100)[0], p.Outcome.ACCEPTED)
        self.assertEqual(by_count.evicted, 1)
        self.assertEqual(by_count.pending()[0][0], (0, 0, 2))
        # Each message is charged ENTRY_OVERHEAD, each piece PIECE_OVERHEAD and its bytes, and
        # a message must leave room for the copy that completes it (copy(k) for k pieces):
        # room for two messages of one piece, or one of two pieces, not one of three.
        n, entry = 700, p.ENTRY_OVERHEAD
        piece, one = b"x" * n, p.PIECE_OVERHEAD + n

        def copy(k):
            return p.COMPLETION_OVERHEAD + k * (p.COMPLETION_PIECE_OVERHEAD + n)

        low, high = max(2 * entry + 2 * one, entry + 2 * one + copy(2)), min(2 * entry + 3 * one, entry + 3 * one + copy(3))
        self.assertLess(low, high)
        by_bytes = p.Assembler(max_pending_bytes=(low + high) // 2)
        self.assertEqual(by_bytes.add((0, 0, 1), hdr(1, 0, 3, 0, 3 * n), piece)[0], p.Outcome.ACCEPTED)
        by_bytes.add((0, 0, 2), hdr(2, 0, 3, 0, 3 * n), piece)
        self.assertEqual((by_bytes.pending_bytes, by_bytes.evicted), (2 * entry + 2 * one, 0))
        by_bytes.add((0, 0, 2), hdr(2, 1, 3, n, 3 * n), piece)
        self.assertEqual(by_bytes.evicted, 1)
        self.assertEqual(by_bytes.pending_bytes, entry + 2 * one)
        self.assertEqual(by_bytes.add((0, 0, 2), hdr(2, 2, 3, 2 * n, 3 * n), piece)[0], p.Outcome.TOO_LARGE)
        self.assertEqual((by_bytes.pending(), by_bytes.pending_bytes), ([], 0))
        # Its pieces alone would fit, not with the copy: refused from the first.
        tight = p.Assembler(max_pending_bytes=entry + one + copy(1) - 1)
        self.assertEqual(tight.add((0, 0, 1), hdr(1, 0, 1, 0, n), piece)[0], p.Outcome.TOO_LARGE)
        tight.max_pending_bytes += 1
        self.assertEqual(tight.add((0, 0, 1), hdr(1, 0, 1, 0, n), piece)[0], p.Outcome.COMPLETED)
        # Completed flows: the most recent max_completed, charged.
        few = p.Assembler(remember_completed=True, max_completed=2)
        for rid in (5, 6, 7):
            self.assertEqual(few.add((0, 0, rid), hdr(rid, 0, 1, 0, 3), b"abc")[0], p.Outcome.COMPLETED)
        self.assertEqual([few.is_completed((0, 0, rid)) for rid in (5, 6, 7)], [False, True, True])
        self.assertEqual(few.completed_bytes, 2 * p.COMPLETED_OVERHEAD)
        self.assertEqual(few.add((0, 0, 7), hdr(7, 0, 1, 0, 3), b"abc")[0], p.Outcome.AFTER_COMPLETION)
        self.assertEqual(few.add((0, 0, 5), hdr(5, 0, 1, 0, 3), b"abc")[0], p.Outcome.COMPLETED)
        # Within max_pending_bytes, completed flows give way to what is pending, the oldest
        # first, when no other incomplete message is left to drop.
        budget = 64 << 10
        both = p.Assembler(remember_completed=True, max_pending_bytes=budget)
        for rid in range(1, 201):
            self.assertEqual(both.add((0, 0, rid), hdr(rid, 0, 1, 0, 1), b"z")[0], p.Outcome.COMPLETED)
            self.assertLessEqual(both.memory_bytes, budget)
        kept = both.completed_bytes // p.COMPLETED_OVERHEAD
        self.assertGreater(kept, 100)
        big = budget // 3
        self.assertEqual(both.add((0, 0, 999), hdr(999, 0, 2, 0, 2 * big), b"y" * big)[0], p.Outcome.ACCEPTED)
        self.assertLessEqual(both.memory_bytes, budget)
        left = both.completed_bytes // p.COMPLETED_OVERHEAD
        self.assertLess(left, kept)
        self.assertEqual([both.is_completed((0, 0, rid)) for rid in (200 - left, 201 - left, 200)],
                         [False, True, True])
        self.assertEqual(both.evicted, 0)

    def test_hostile_datagrams_stay_within_bounds(self):
        """Random and mutated datagrams through the parser into a bounded assembler: no
        exception but the package's own, the bounds hold, completions are consistent."""
        rng = random.Random(12345)
        a = p.Assembler(max_pending=16, max_pending_bytes=64 << 10)
        good = response(77, 0, 3, 0, 3000, b"\x03" * 1000, p.Format.RESULT_TENSOR_F32)
        accepted = completed = 0
        for _ in range(30000):
            kind = rng.randrange(3)
            if kind == 0:
                d = bytearray(rng.randrange(256) for _ in range(rng.randrange(120)))
                if len(d) >= 40 and rng.randrange(2):
                    d[0:6] = struct.pack(">IBB", p.MAGIC, 1, rng.choice((2, 3)))
                    d[36:40] = b"\0\0\0\0"
            elif kind == 1:
                d = bytearray(good)
                for _ in range(3):
                    d[8 + rng.randrange(32)] = rng.randrange(256)
                d = d[:40 + rng.randrange(1100)]
            else:
                count = 1 + rng.randrange(8)
                total = 800 if rng.randrange(2) else rng.randrange(p.MAX_TOTAL_LENGTH)
                d = response(rng.randrange(64), rng.randrange(count), count, rng.randrange(1000), total,
                             bytes(rng.randrange(300)))
            verdict, h, frag = p.parse_response(bytes(d))
            if verdict != p.Verdict.OK:
                continue
            self.assertLessEqual(h.payload_offset + len(frag), h.total_length)
            outcome, m = a.add((0, 0, h.request_id), h, frag)
            accepted += outcome == p.Outcome.ACCEPTED
            if outcome == p.Outcome.COMPLETED:
                completed += 1
                self.assertLessEqual(len(m.payload), m.head.total_length)
                if m.tiles:
                    self.assertEqual(len(m.payload), m.head.total_length)
            self.assertLessEqual(a.pending_bytes, 64 << 10)
            self.assertLessEqual(len(a.pending()), 16)
        self.assertGreater(accepted, 500)
        self.assertGreater(completed, 50)

    def traced_growth(self, assembler, datagrams, parsed=False):
        """Peak of the memory traced while `datagrams` go through parse_response (unless
        already `parsed`) into `assembler`, above what was traced before (tracemalloc: every
        allocation of the interpreter, whatever object holds it)."""
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for d in datagrams:
                verdict, h, frag = d if parsed else p.parse_response(d)
                assembler.add((0, 0, h.request_id), h, frag)
            return tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()

    # Allocated but charged to no message or completed flow: the maps' own headers and
    # tables while they hold under 8 items (the charges count their per-item growth), the
    # Assembler and one datagram's parse (a Header, its ints): at most 2.4 KiB measured.
    SLACK = 16 << 10

    def test_memory_is_charged_for_what_is_allocated(self):
        """Fragments of 1 byte cost their message and piece far more than that byte: the bound
        holds for the memory really allocated, not only for fragment bytes."""
        budget, big = 1 << 20, (1 << 63) + 12345
        # 20,000 flows of one fragment each, each declaring 1024.
        a = p.Assembler(max_pending_bytes=budget)
        flows = [response(big + i, 5, 1024, 5 * 1432, 1024 * 1432, b"\x01") for i in range(20000)]
        self.assertLessEqual(self.traced_growth(a, flows), budget + self.SLACK)
        self.assertLessEqual(a.pending_bytes, budget)
        self.assertGreater(a.evicted, 15000)
        del a, flows
        # One flow, 1023 distinct indices: dropped whole (too large) once it reaches the bound.
        small = 64 << 10
        a = p.Assembler(max_pending_bytes=small)
        one = [response(7, i, 1024, i * 8192, 1024 * 8192, b"\x02") for i in range(1023)]
        self.assertLessEqual(self.traced_growth(a, one), small + self.SLACK)
        self.assertGreater(a.evicted, 0)
        del a, one
        # 6 flows of 1023 distinct indices, interleaved; 10 of 1000-byte fragments.
        a = p.Assembler(max_pending_bytes=budget)
        many = [response(r, i, 1024, i * 8192, 1024 * 8192, b"\x03") for i in range(1023) for r in range(6)]
        self.assertLessEqual(self.traced_growth(a, many), budget + self.SLACK)
        self.assertGreater(a.evicted, 0)
        del a, many
        a = p.Assembler(max_pending_bytes=budget)
        fat = [response(r, i, 1024, i * 1000, 1024 * 1000, bytes([i & 0xFF]) * 1000)
               for i in range(200) for r in range(10)]
        self.assertLessEqual(self.traced_growth(a, fat), budget + self.SLACK)
        self.assertLessEqual(a.pending_bytes, budget)
        del a, fat
        # Messages of 128 KiB that complete, 9 under way at once, in 4 rounds: each
        # completion's copy sits next to the pieces it is made of.
        a = p.Assembler(max_pending_bytes=budget)
        done = [response(k * 100 + r, i, 8, i * 16384, 8 * 16384, bytes([r]) * 16384)
                for k in range(4) for i in range(8) for r in range(9)]
        self.assertLessEqual(self.traced_growth(a, done), budget + self.SLACK)
        self.assertGreater(a.evicted, 0)

    def test_random_streams_keep_the_bound_and_the_receiver_rules(self):
        """A seeded fuzz of the assembler: hostile and honest fragments mixed (claims of many
        fragments, duplicates, disagreeing fragments, completions), checked after every add:
        the charged memory never passes the bound, a completed message that tiles has its
        declared length and the bytes its fragments carried."""
        rng = random.Random(20261207)
        for bound in (4 << 10, 64 << 10, 1 << 20):
            a = p.Assembler(max_pending_bytes=bound, remember_completed=True, max_completed=64)
            truth = {}  # rid -> (count, size, payload) of honest messages
            ids = list(range(40))  # 40 senders' current request ids; a new message gets a new id
            completed = 0
            for step in range(6000):
                slot = rng.randrange(40)
                if rng.random() < 0.02:
                    ids[slot] += 40
                rid = ids[slot]
                if rid not in truth:
                    count = rng.choice((1, 2, 3, 8, 1024))
                    size = rng.choice((1, 7, 100, 1000))
                    truth[rid] = (count, size, bytes(rng.randrange(256) for _ in range(count * size)) if count < 64 else b"")
                count, size, payload = truth[rid]
                i = rng.randrange(count)
                piece = payload[i * size:(i + 1) * size] if payload else bytes([i & 0xFF]) * size
                total = count * size
                if rng.random() < 0.05:  # disagrees with the message's first fragment
                    total += 1
                datagram = response(rid, i, count, i * size, total, piece)
                verdict, h, frag = p.parse_response(datagram)
                if verdict != p.Verdict.OK:
                    continue
                outcome, message = a.add((1, 2, rid), h, frag)
                self.assertLessEqual(a.memory_bytes, bound, f"step {step}")
                if message is not None and message.tiles:
                    completed += 1
                    self.assertEqual(len(message.payload), message.head.total_length)
                    if payload and message.head.total_length == len(payload):
                        self.assertEqual(message.payload, payload)
            self.assertGreater(completed, 50, f"bound {bound}: the stream completes messages")
            if bound < (1 << 20):
                self.assertGreater(a.evicted, 0, f"bound {bound}: and overflows the bound")

    def test_completed_flows_are_bounded(self):
        done = [p.parse_response(response((1 << 63) + i, 0, 1, 0, 1, b"\x04")) for i in range(100000)]
        a = p.Assembler(remember_completed=True)
        for _, h, frag in done:
            a.add((0, 0, h.request_id), h, frag)
        self.assertEqual(len(a._completed), p.DEFAULT_MAX_COMPLETED)
        self.assertEqual(a.completed_bytes, p.DEFAULT_MAX_COMPLETED * p.COMPLETED_OVERHEAD)
        self.assertLess(sys.getsizeof(a._completed), a.completed_bytes)
        self.assertTrue(a.is_completed((0, 0, (1 << 63) + 99999)))
        self.assertFalse(a.is_completed((0, 0, 1 << 63)))
        _, h, frag = done[-1]
        self.assertEqual(a.add((0, 0, h.request_id), h, frag)[0], p.Outcome.AFTER_COMPLETION)
        # What they really hold (tracemalloc is slow: fewer of them, about as many generations).
        a = p.Assembler(remember_completed=True, max_completed=250)
        grew = self.traced_growth(a, done[:6000], parsed=True)
        self.assertLessEqual(grew, 250 * p.COMPLETED_OVERHEAD + self.SLACK)
        # Within max_pending_bytes, with it.
        budget = 64 << 10
        a = p.Assembler(remember_completed=True, max_pending_bytes=budget)
        self.assertLessEqual(self.traced_growth(a, done[:6000], parsed=True), budget + self.SLACK)
        self.assertLessEqual(a.memory_bytes, budget)

def topk_bytes(entries):
    return b"".join(struct.pack(">If", c, s) for c, s in entries)


class Results(unittest.TestCase):
    def result(self, kind, status, fmt, dims, payload):
        return p.Result(1, kind, status, fmt, tuple(dims) + (0,) * (4 - len(dims)), payload)

    def test_decoders_and_refusals(self):
        r = self.result(p.Kind.RESPONSE, 0, p.Format.RESULT_TOPK, (2,), topk_bytes([(7, 0.75), (3, 0.125)]))
        r.validate()
        self.assertEqual(r.topk(), [(7, 0.75), (3, 0.125)])
        self.assertEqual(r.describe(), "top: class 7 (0.75), class 3 (0.12)")
        r.dims = (3, 0, 0, 0)
        with self.assertRaises(p.MalformedResult):
            r.topk()
        r = self.result(p.Kind.RESPONSE, 0, p.Format.RESULT_TOPK, (1,), topk_bytes([(7, 0.75)])[:-1])
        with self.assertRaises(p.MalformedResult):
            r.topk()
        with self.assertRaises(p.WrongFormat):
            r.crc32()

        t = p.encode_f32([0.5, -1, 2, 3, 4, 5])
        r = self.result(p.Kind.RESPONSE, 0, p.Format.RESULT_TENSOR_F32, (2, 3), t)
        self.assertEqual(r.tensor(), ((2, 3), [0.5, -1, 2, 3, 4, 5]))
        self.assertEqual(r.describe(), "tensor 2x3 [0.5, -1, 2, 3, ...]")
        for dims in ((3, 3), (6, 0, 1), ()):
            with self.assertRaises(p.MalformedResult, msg=str(dims)):
                self.result(p.Kind.RESPONSE, 0, p.Format.RESULT_TENSOR_F32, dims, t).tensor()

        r = self.result(p.Kind.RESPONSE, 0, p.Format.RESULT_CRC32, (), struct.pack(">II", 100, 0xDEADBEEF))
        self.assertEqual(r.crc32(), (100, 0xDEADBEEF))
        r.payload = r.payload[:7]
        with self.assertRaises(p.MalformedResult):
            r.crc32()

        msg = "token 5000 at position 4 is outside the vocabulary [0, 1024)"
        r = self.result(p.Kind.ERROR, p.Status.BAD_REQUEST, p.Format.RAW, (), msg.encode())
        r.validate()
        self.assertTrue(r.is_error)
        self.assertEqual(r.error_message, msg)
        self.assertEqual(r.status_name, "bad_request")
        with self.assertRaises(p.WrongFormat):
            r.topk()
        r.status = 0
        with self.assertRaises(p.MalformedResult):
            r.validate()
        r = self.result(p.Kind.ERROR, p.Status.INTERNAL_ERROR, p.Format.RAW, (), b"\xff\xfeoops")
        self.assertEqual(r.error_message, "\ufffd\ufffdoops")
        r = self.result(p.Kind.RESPONSE, p.Status.OVERLOADED, p.Format.RESULT_CRC32, (), b"\0" * 8)
        with self.assertRaises(p.MalformedResult):
            r.validate()
        with self.assertRaises(p.WrongFormat):
            r.error_message

    def test_package_exports(self):
        for name in reefline.__all__:
            self.assertTrue(hasattr(reefline, name), name)


if __name__ == "__main__":
    unittest.main()
