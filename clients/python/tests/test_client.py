"""reefline.Client against a loopback responder that answers like the daemon's IFs: crc32,
top-k, tensors and errors, in several fragments, reordered and duplicated; retries, timeouts,
pacing, hostile traffic and the client's bounds."""

import os
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import reefline  # noqa: E402
from reefline import protocol as p  # noqa: E402


def topk_bytes(entries):
    return b"".join(struct.pack(">If", c, s) for c, s in entries)


class Responder:
    """reefline in miniature on 127.0.0.1 (the package's own request checks and assembler):
    raw and images get result_crc32 (images a top-5 with topk_images); tokens a top-3, or an
    error naming the first negative id; tensors their values doubled. Answers are cut at
    `fragment` bytes, sent last fragment first with the first one twice. drop_first leaves
    every request's first completion unanswered; noise sends garbage before each answer."""

    def __init__(self, fragment=1432, topk_images=False, drop_first=False, noise=False, silent=False):
        self.fragment, self.topk_images = fragment, topk_images
        self.drop_first, self.noise, self.silent = drop_first, noise, silent
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.01)
        self.port = self.sock.getsockname()[1]
        self.completions = 0
        self.arrivals = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self):
        self._stop = True
        self._thread.join()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _answer(self, to, rid, kind, status, fmt, dims, payload):
        frag = self.fragment
        count = max(1, -(-len(payload) // frag))
        out = [p.Header(kind, fmt, status, rid, i, count, i * frag, len(payload),
                        tuple(dims) + (0,) * (4 - len(dims))).encode() + payload[i * frag:(i + 1) * frag]
               for i in range(count)]
        out.reverse()
        out.append(out[-1])
        if self.noise:
            fake_big = p.Header(p.Kind.RESPONSE, 0, 0, rid, 0, 1, 0, 4000000, (0, 0, 0, 0)).encode() + bytes(10)
            other = p.Header(p.Kind.RESPONSE, 0, 0, rid + 1000000, 0, 1, 0, 4, (0, 0, 0, 0)).encode() + bytes(4)
            bad_kind = bytearray(other)
            bad_kind[5] = 7
            out = [b"\x01\x02\x03", bytes(bad_kind), other, fake_big] + out
        for d in out:
            self.sock.sendto(d, to)

    def _run(self):
        asm = p.Assembler()
        seen = {}
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            self.arrivals.append(time.monotonic())
            verdict, h, frag = p.parse_request(data)
            if verdict != p.RequestVerdict.OK:
                continue
            outcome, m = asm.add((peer[0], peer[1], h.request_id), h, frag)
            if outcome != p.Outcome.COMPLETED or not m.tiles:
                continue
            self.completions += 1
            if self.silent:
                continue
            key = (h.request_id, peer)
            seen[key] = seen.get(key, 0) + 1
            if self.drop_first and seen[key] == 1:
                continue
            fmt = m.head.format
            if fmt == p.Format.TOKENS_I32:
                ids = p.decode_i32(m.payload)
                bad = [i for i, t in enumerate(ids) if t < 0]
                if bad:
                    msg = f"token {ids[bad[0]]} at position {bad[0]} is outside the vocabulary"
                    self._answer(peer, h.request_id, p.Kind.ERROR, p.Status.BAD_REQUEST, p.Format.RAW, (),
                                 msg.encode())
                else:
                    self._answer(peer, h.request_id, p.Kind.RESPONSE, 0, p.Format.RESULT_TOPK, (3,),
                                 topk_bytes([(ids[0], 0.5), (1, 0.25), (2, 0.125)]))
            elif fmt == p.Format.TENSOR_F32:
                values = [2 * v for v in p.decode_f32(m.payload)]
                self._answer(peer, h.request_id, p.Kind.RESPONSE, 0, p.Format.RESULT_TENSOR_F32, m.head.dims,
                             p.encode_f32(values))
            elif fmt == p.Format.IMAGE_U8_HWC and self.topk_images:
                self._answer(peer, h.request_id, p.Kind.RESPONSE, 0, p.Format.RESULT_TOPK, (5,),
                             topk_bytes([((m.payload[0] + k) % 1000, 1 / (k + 1)) for k in range(5)]))
            else:
                self._answer(peer, h.request_id, p.Kind.RESPONSE, 0, p.Format.RESULT_CRC32, (),
                             struct.pack(">II", len(m.payload), p.crc32c(m.payload)))


class Flood:
    """A broken or hostile peer on 127.0.0.1: from the first request datagram on, it streams
    as fast as it can fragments of that request that never complete it (frag_count 1024,
    index 1023 never sent, the others again and again, some disagreeing with the first), a
    request id's worth of fragments of ids the client never used, and garbage. With
    answer_after, the first request's own fragments are left out (the first fragment filed
    for a request decides what its answer is: the real one would disagree), and that many
    seconds into the stream the real answer (the crc32 IF's, of the first request's payload)
    is mixed in every 64 datagrams; the stream goes on. It stops after `limit` seconds, so
    that a client that never returns cannot hang the tests. `arrivals`: (time, request id)
    of every request datagram, resends included."""

    def __init__(self, answer_after=None, limit=8.0):
        self.answer_after, self.limit = answer_after, limit
        self.own = answer_after is None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.arrivals = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _take_requests(self):
        """Every request datagram waiting: the first one's (peer, header, fragment)."""
        first = None
        while True:
            try:
                data, peer = self.sock.recvfrom(65536)
            except BlockingIOError:
                return first
            verdict, h, frag = p.parse_request(data)
            if verdict == p.RequestVerdict.OK:
                self.arrivals.append((time.monotonic(), h.request_id))
                first = first or (peer, h, frag)

    def _run(self):
        first = None
        while first is None and not self._stop.wait(0.0005):
            first = self._take_requests()
        if first is None:
            return
        peer, h, payload = first
        rid, mix = h.request_id, []
        for i in range(1023):
            if self.own:
                mix.append(p.Header(p.Kind.RESPONSE, p.Format.RESULT_TENSOR_F32, 0, rid, i, 1024, 4 * i,
                                    4096, (1024, 0, 0, 0)).encode() + b"\x01\x02\x03\x04")
            mix.append(p.Header(p.Kind.RESPONSE, p.Format.RAW, 0, rid + 1000 + i, 0, 1024, 0, 1024,
                                (0, 0, 0, 0)).encode() + b"\x05")
            if i % 8 == 0:
                if self.own:  # disagrees with the first
                    mix.append(p.Header(p.Kind.RESPONSE, p.Format.RAW, 0, rid, i, 1024, 0, 999,
                                        (0, 0, 0, 0)).encode() + b"\x06")
                mix.append(b"\x52\x46" + bytes(50))  # not a header
        answer = (p.Header(p.Kind.RESPONSE, p.Format.RESULT_CRC32, 0, rid, 0, 1, 0, 8, (0, 0, 0, 0)).encode()
                  + struct.pack(">II", len(payload), p.crc32c(payload)))
        start = time.monotonic()
        send = self.sock.sendto
        while not self._stop.is_set():
            now = time.monotonic()
            if now - start > self.limit:
                return
            answering = self.answer_after is not None and now - start >= self.answer_after
            for k in range(0, len(mix), 64):
                for d in mix[k:k + 64] + ([answer] if answering else []):
                    try:
                        send(d, peer)
                        self.sent += 1
                    except OSError:  # the client's socket buffer is full, or it is closed
                        pass
                self._take_requests()


def client(port, **kw):
    kw.setdefault("bind_address", "127.0.0.1")
    kw.setdefault("fragment_size", 512)
    return reefline.Client("127.0.0.1", port, **kw)


def pixels(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


class Live(unittest.TestCase):
    def test_every_request_format_is_answered(self):
        with Responder(fragment=16) as r, client(r.port) as c:
            self.assertEqual(c.local_address[0], "127.0.0.1")
            img = pixels(32 * 32 * 3, 1)
            ids = [c.send_image(img, 32, 32, 3) for _ in range(5)]
            self.assertEqual(ids, list(range(ids[0], ids[0] + 5)))
            self.assertEqual(c.outstanding, 5)
            for _ in range(5):
                a = c.receive(timeout=2)
                self.assertIn(a.request_id, ids)
                self.assertEqual(a.crc32(), (len(img), p.crc32c(img)))
                self.assertEqual(a.attempts, 1)
                self.assertGreater(a.latency_us, 0)
            self.assertEqual(c.outstanding, 0)

            a = c.request_tokens([42, 1, 2, 3], timeout=2)
            self.assertEqual(a.topk(), [(42, 0.5), (1, 0.25), (2, 0.125)])
            a = c.request_tokens([5, -7, 1], timeout=2)
            self.assertTrue(a.is_error)
            self.assertEqual(a.status, p.Status.BAD_REQUEST)
            self.assertEqual(a.error_message, "token -7 at position 1 is outside the vocabulary")
            with self.assertRaises(reefline.WrongFormat):
                a.topk()

            values = [i * 0.25 - 3 for i in range(64 * 6)]
            a = c.request_tensor(values, (64, 6), timeout=2)
            dims, back = a.tensor()
            self.assertEqual(dims, (64, 6))
            self.assertEqual(back, [2 * v for v in values])

            raw = pixels(5000, 9)
            a = c.request(p.Format.RAW, None, raw, timeout=2)
            self.assertEqual(a.crc32()[1], p.crc32c(raw))
            s = c.stats
            self.assertEqual((s.requests_sent, s.answers, s.errors, s.resends), (9, 9, 1, 0))
            self.assertGreater(s.duplicates, 0)

    def test_retries_resend_with_the_same_id_then_give_up(self):
        with Responder(drop_first=True) as r, client(r.port, retries=2, retry_timeout=0.1) as c:
            img = pixels(3000, 4)
            a = c.request_image(img, 10, 100, 3, timeout=2)
            self.assertEqual(a.attempts, 2)
            self.assertGreaterEqual(a.latency_us, 90e3)
            self.assertEqual(a.crc32()[1], p.crc32c(img))
            self.assertEqual(r.completions, 2)
            self.assertEqual((c.stats.resends, c.stats.datagrams_sent), (1, 12))
        with Responder(silent=True) as q, client(q.port, retries=2, retry_timeout=0.05) as c:
            start = time.monotonic()
            with self.assertRaisesRegex(reefline.RequestTimeout, "after 3 attempts"):
                c.request_image(img, 10, 100, 3, timeout=5)
            self.assertGreaterEqual(time.monotonic() - start, 0.14)
            self.assertEqual((c.stats.resends, c.stats.gave_up, c.outstanding), (2, 1, 0))
            self.assertEqual(q.completions, 3)

    def test_timeouts_and_unknown_requests(self):
        with Responder(silent=True) as q, client(q.port, receive_timeout=0.03, retry_timeout=0) as c:
            with self.assertRaises(reefline.RequestTimeout):
                c.receive(timeout=0)
            start = time.monotonic()
            with self.assertRaises(TimeoutError):  # RequestTimeout is one
                c.receive()
            self.assertGreaterEqual(time.monotonic() - start, 0.025)
            with self.assertRaises(reefline.NotOutstanding):
                c.wait(12345, timeout=0)
            rid = c.send_raw(b"x" * 10)
            with self.assertRaises(reefline.RequestTimeout):
                c.wait(rid, timeout=0.02)
            self.assertEqual(c.outstanding, 1)
            self.assertTrue(c.abandon(rid))
            with self.assertRaises(reefline.NotOutstanding):
                c.wait(rid, timeout=0.02)

    def test_pacing_spaces_datagrams(self):
        with Responder() as r, client(r.port, fragment_size=100, pace_packets_per_s=500) as c:
            start = time.monotonic()
            c.request_raw(pixels(3000, 2), timeout=2)  # 30 fragments, 2 ms apart
            self.assertGreaterEqual(time.monotonic() - start, 0.057)
        with Responder() as r, client(r.port, fragment_size=100, pace_bytes_per_s=70e3) as c:
            start = time.monotonic()
            c.request_raw(pixels(3000, 2), timeout=2)  # 30 datagrams of 140 bytes at 70 kB/s
            self.assertGreaterEqual(time.monotonic() - start, 0.057)

    def test_hostile_traffic_is_counted_and_ignored(self):
        with Responder(noise=True, fragment=4) as r, client(r.port) as c:
            for i in range(20):
                img = pixels(600, i)
                a = c.request_image(img, 10, 20, 3, timeout=2)
                self.assertEqual(a.crc32(), (600, p.crc32c(img)))
            s = c.stats
            self.assertEqual(s.answers, 20)
            self.assertGreaterEqual(s.rejected, 40)
            self.assertGreaterEqual(s.inconsistent, 20)
            self.assertGreaterEqual(s.duplicates, 20)

    def test_bounds_and_argument_checks(self):
        with Responder(silent=True) as q, client(q.port, max_outstanding=4) as c:
            first = c.send_raw(b"x" * 10)
            for _ in range(9):
                c.send_raw(b"x" * 10)
            self.assertEqual((c.outstanding, c.stats.abandoned), (4, 6))
            with self.assertRaises(reefline.NotOutstanding):
                c.wait(first, timeout=0)
            with self.assertRaisesRegex(reefline.ProtocolError, "describe 300 bytes"):
                c.send(p.Format.IMAGE_U8_HWC, (10, 10, 3), b"x" * 10)
            with self.assertRaises(reefline.ProtocolError):
                c.send(p.Format.RESULT_CRC32, None, b"x")
            with self.assertRaises(reefline.LimitError):
                c.send_raw(b"")
            with self.assertRaises(reefline.LimitError):
                c.send_raw(bytes(p.MAX_TOTAL_LENGTH + 1))
            with self.assertRaises(reefline.ProtocolError):
                c.send_image(b"", 0, 10, 3)
            with self.assertRaises(reefline.ProtocolError):
                c.send_tensor([0.0] * 4, (4, 0))
            with self.assertRaises(reefline.ProtocolError):
                c.send_tokens([])
        with client(9, max_pending_bytes=0) as c:  # never unbounded: whoever sends chooses what it holds
            self.assertEqual(c._assembler.max_pending_bytes, 64 << 20)
        for kw in ({"fragment_size": 0}, {"pace_packets_per_s": -1}, {"max_outstanding": 0},
                   {"max_pending_bytes": -1}):
            with self.assertRaises(reefline.ProtocolError, msg=str(kw)):
                reefline.Client("127.0.0.1", 9, **kw)
        with self.assertRaises(reefline.ProtocolError):
            reefline.Client("not-an-address", 9)
        with self.assertRaises(OSError):
            reefline.Client("127.0.0.1", 9, bind_address="192.0.2.1")  # not ours


class Flooded(unittest.TestCase):
    """Every call that waits returns within its timeout (and resends go out on time) whatever
    the peer sends, however fast: the receive loop looks at the clock, not only at an empty
    socket."""

    SLACK = 0.25  # scheduling on a loaded machine; the client itself is late by ~2 ms at most

    def assert_times_out(self, call, timeout=0.3):
        start = time.monotonic()
        with self.assertRaises(reefline.RequestTimeout):
            call()
        took = time.monotonic() - start
        self.assertGreaterEqual(took, timeout - 0.01)
        self.assertLess(took, timeout + self.SLACK)
        return took

    def test_wait_and_receive_return_on_time_under_a_stream(self):
        for how in ("wait", "receive", "receive_now"):
            with Flood() as f, client(f.port, retry_timeout=0) as c:
                rid = c.send_raw(b"stream me")
                start = time.monotonic()
                while f.sent < 20000 and time.monotonic() - start < 5:
                    time.sleep(0.005)
                self.assertGreaterEqual(f.sent, 20000)  # the stream is on: more than the socket holds
                if how == "wait":
                    self.assert_times_out(lambda: c.wait(rid, timeout=0.3))
                elif how == "receive":
                    self.assert_times_out(lambda: c.receive(timeout=0.3))
                else:
                    self.assert_times_out(lambda: c.receive(timeout=0), 0)
                self.assertEqual(c.outstanding, 1, how)
                self.assertLessEqual(c._assembler.memory_bytes, 64 << 20)
                # Filed what it could meanwhile (timeout 0: what _MIN_READ_S allows, one at least).
                filed = c.stats.duplicates + c.stats.rejected
                self.assertGreaterEqual(filed, 1000 if how != "receive_now" else 1, how)

    def test_requests_return_on_time_under_a_stream(self):
        calls = {
            "request_raw": lambda c: c.request_raw(b"abc", timeout=0.3),
            "request_image": lambda c: c.request_image(pixels(12, 1), 2, 2, 3, timeout=0.3),
            "request_tokens": lambda c: c.request_tokens([1, 2, 3], timeout=0.3),
            "request_tensor": lambda c: c.request_tensor([0.5, 1.5], (2,), timeout=0.3),
            "request": lambda c: c.request(p.Format.RAW, None, b"xyz", timeout=0.3),
        }
        for name, call in calls.items():
            with Flood() as f, client(f.port, retry_timeout=0) as c:
                self.assert_times_out(lambda: call(c))
                self.assertEqual(c.outstanding, 0, name)  # abandoned
                self.assertGreater(c.stats.duplicates, 100, name)

    def test_resends_and_give_up_on_time_under_a_stream(self):
        with Flood() as f, client(f.port, retries=2, retry_timeout=0.1) as c:
            start = time.monotonic()
            with self.assertRaisesRegex(reefline.RequestTimeout, "after 3 attempts"):
                c.request_raw(b"resend me", timeout=5)
            took = time.monotonic() - start
            self.assertGreaterEqual(took, 0.29)
            self.assertLess(took, 0.3 + self.SLACK)
            self.assertEqual((c.stats.resends, c.stats.gave_up), (2, 1))
            time.sleep(0.05)  # the last resend reaches the flood's socket
            f._stop.set()
            times = [t for t, _ in f.arrivals]
            self.assertEqual(len(times), 3)
            for gap in (times[1] - times[0], times[2] - times[1]):
                # The flood notes arrivals between bursts of 64 datagrams: a few ms late.
                self.assertGreaterEqual(gap, 0.05)
                self.assertLess(gap, 0.1 + self.SLACK)

    def test_the_answer_is_found_in_the_stream(self):
        with Flood(answer_after=0.3) as f, client(f.port, retry_timeout=0) as c:
            start = time.monotonic()
            a = c.request_raw(b"find me", timeout=3)
            took = time.monotonic() - start
            self.assertEqual(a.crc32(), (7, p.crc32c(b"find me")))
            self.assertGreaterEqual(took, 0.29)
            self.assertLess(took, 0.3 + self.SLACK)  # returned as soon as it was read
            self.assertGreater(c.stats.duplicates, 1000)
        with Flood(answer_after=0.2) as f, client(f.port, retry_timeout=0) as c:
            rid = c.send_raw(b"and me")
            other = c.send_raw(b"not answered")
            a = c.receive(timeout=3)
            self.assertEqual((a.request_id, a.crc32()[1]), (rid, p.crc32c(b"and me")))
            self.assertEqual(c.outstanding, 1)
            c.abandon(other)


if __name__ == "__main__":
    unittest.main()
