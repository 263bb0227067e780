"""The reefline client: one UDP socket, bound locally and connected to one IF.

The same behaviour as the C library's client (clients/c/reefline_client.h): requests are
fragmented, encoded and sent paced; unanswered ones are resent with the same request id;
answers are reassembled, only for requests that await one, within fixed bounds. No threads:
answers are read, resends made and give-ups decided inside the calls that wait (receive,
wait, request). A Client is not thread-safe.
"""

from __future__ import annotations

import collections
import errno
import os
import select
import socket
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from . import protocol as p

DEFAULT = object()  # a timeout argument: use the client's receive_timeout
DEFAULT_MAX_PENDING_BYTES = 64 << 20  # as the C library's

# A read pass files what is waiting for at least this long, even when its deadline is nearer
# or already past: a call with timeout 0 still gets what is there, and resends due under a
# flood still let some datagrams in. Deadlines and resends are late by at most this (and the
# filing of one datagram).
_MIN_READ_S = 0.002


class RequestTimeout(p.ReeflineError, TimeoutError):
    """No answer in time, or none after every retry."""


class NotOutstanding(p.ReeflineError, KeyError):
    """Not a request that awaits an answer (never sent, already received, given up, abandoned)."""


@dataclass
class Stats:
    requests_sent: int = 0  # distinct requests
    resends: int = 0  # requests sent again by the retry policy
    datagrams_sent: int = 0
    bytes_sent: int = 0  # UDP payload bytes
    answers: int = 0  # answers delivered or waiting to be (responses and errors)
    errors: int = 0  # of which error answers (kind 3)
    gave_up: int = 0  # requests given up after their retries
    abandoned: int = 0  # requests pushed out by max_outstanding or abandoned
    duplicates: int = 0  # answers to requests already answered or no longer awaited
    rejected: int = 0  # datagrams that failed the fragment checks
    inconsistent: int = 0  # fragments that disagreed with their message's first
    evicted: int = 0  # partial responses dropped by max_pending_bytes


@dataclass
class _Outstanding:
    datagrams: List[bytes]  # kept while the request may be resent
    first_sent: float
    deadline: Optional[float]  # resend or give up then (monotonic seconds); None: never
    attempts: int = 1


def _splitmix64(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


class Client:
    """A client of one IF.

    address, port: the appliance's IPv4 address and the IF's UDP port.
    bind_address, bind_port: the local end ("0.0.0.0" and 0: any, ephemeral).
    fragment_size: payload bytes per fragment (default: fits a 1500-byte MTU).
    pace_bytes_per_s, pace_packets_per_s: consecutive datagrams leave at least 1/pps and
        size/bps apart (size: header + fragment); 0: unpaced.
    retries, retry_timeout: a request unanswered after retry_timeout seconds is sent again,
        same id, up to `retries` times; then the client gives up on it. retry_timeout 0: never.
    receive_timeout: what receive/wait/request wait by default, seconds (None: forever).
    first_request_id: None: a fresh base from the clock, so restarts do not reuse ids.
    max_outstanding, max_pending_bytes: bounds on requests awaiting answers (the oldest is
        abandoned beyond it) and on the memory partial responses hold (their fragments and
        the bookkeeping of each, as protocol.Assembler charges it; 0: the default, 64 MiB:
        never unbounded, since whoever can send to the socket chooses what it holds).
    """

    def __init__(self, address: str, port: int, *, bind_address: str = "0.0.0.0",
                 bind_port: int = 0, fragment_size: int = p.MTU_FRAGMENT_SIZE,
                 pace_bytes_per_s: float = 0, pace_packets_per_s: float = 0, retries: int = 0,
                 retry_timeout: float = 1.0, receive_timeout: Optional[float] = 1.0,
                 first_request_id: Optional[int] = None, max_outstanding: int = 4096,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 socket_buffer_bytes: int = 4 << 20):
        if not 1 <= port <= 65535:
            raise p.ProtocolError("port: must be 1..65535")
        if not 1 <= fragment_size <= p.MAX_FRAGMENT_SIZE:
            raise p.ProtocolError(f"fragment size {fragment_size}: must be 1..{p.MAX_FRAGMENT_SIZE}")
        for rate in (pace_bytes_per_s, pace_packets_per_s):
            if not (rate >= 0 and rate != float("inf")):
                raise p.ProtocolError("pacing rates must be finite and >= 0")
        if retries < 0 or retry_timeout < 0 or max_outstanding < 1 or max_pending_bytes < 0:
            raise p.ProtocolError("retries, retry_timeout and max_pending_bytes >= 0, "
                                  "max_outstanding >= 1")
        try:  # inet_pton: dotted quads only (inet_aton would take "1" for 0.0.0.1)
            socket.inet_pton(socket.AF_INET, address)
            socket.inet_pton(socket.AF_INET, bind_address)
        except OSError as e:
            raise p.ProtocolError(f"not an IPv4 address: {address!r} / {bind_address!r}") from e
        self.address, self.port = address, port
        self.fragment_size = fragment_size
        self.pace_bytes_per_s = pace_bytes_per_s
        self.pace_packets_per_s = pace_packets_per_s
        self.retries, self.retry_timeout = retries, retry_timeout
        self.receive_timeout = receive_timeout
        self.max_outstanding = max_outstanding
        self.stats = Stats()
        self._assembler = p.Assembler(max_pending=max_outstanding,
                                      max_pending_bytes=max_pending_bytes or DEFAULT_MAX_PENDING_BYTES)
        self._outstanding: "collections.OrderedDict[int, _Outstanding]" = collections.OrderedDict()
        self._ready: "collections.OrderedDict[int, p.Result]" = collections.OrderedDict()
        self._next_send = 0.0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            if socket_buffer_bytes > 0:
                # A burst of response fragments must not overflow the kernel's default.
                for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                    self._sock.setsockopt(socket.SOL_SOCKET, opt, socket_buffer_bytes)
            self._sock.bind((bind_address, bind_port))
            # Connected: the kernel drops datagrams from anyone but the IF.
            self._sock.connect((address, port))
        except OSError:
            self._sock.close()
            raise
        if first_request_id is None:
            seed = _splitmix64(time.monotonic_ns() ^ _splitmix64(os.getpid() ^ id(self)))
            first_request_id = ((seed >> 24) << 16) + 1
        self._next_id = first_request_id

    # ---- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fileno(self) -> int:
        """The socket, for select/poll: readable when receive() has something to read."""
        return self._sock.fileno()

    @property
    def local_address(self) -> Tuple[str, int]:
        return self._sock.getsockname()

    @property
    def outstanding(self) -> int:
        """Requests awaiting an answer."""
        return len(self._outstanding)

    # ---- sending ----------------------------------------------------------------------------

    def send(self, fmt: int, dims: Optional[Sequence[int]], payload) -> int:
        """Any request format with an already encoded payload; returns the request id."""
        payload = bytes(payload)
        p.check_request(fmt, dims, payload)
        request_id = self._next_id
        datagrams = p.encode_request(fmt, dims, payload, request_id, self.fragment_size)
        self._next_id += 1
        # Room for it: the oldest request still waiting is abandoned.
        while len(self._outstanding) >= self.max_outstanding:
            self._forget(next(iter(self._outstanding)))
            self.stats.abandoned += 1
        first_sent = time.monotonic()
        self._transmit(datagrams)
        self.stats.requests_sent += 1
        deadline = time.monotonic() + self.retry_timeout if self.retry_timeout else None
        # Never resent: the datagrams need not be kept.
        self._outstanding[request_id] = _Outstanding(datagrams if self.retries else [], first_sent,
                                                     deadline)
        return request_id

    def send_image(self, pixels, height: int, width: int, channels: int) -> int:
        """An image_u8_hwc request: height x width x channels bytes, row-major, channels last."""
        for x in (height, width, channels):
            if not 1 <= x <= 65535:
                raise p.ProtocolError(f"image {height}x{width}x{channels}: extents must be 1..65535")
        return self.send(p.Format.IMAGE_U8_HWC, (height, width, channels), pixels)

    def send_tokens(self, tokens: Sequence[int]) -> int:
        """A tokens_i32 request (1..65535 ids, written little-endian)."""
        tokens = list(tokens)
        if not 1 <= len(tokens) <= 65535:
            raise p.ProtocolError(f"tokens: 1..65535 of them (dims are 16 bits), got {len(tokens)}")
        return self.send(p.Format.TOKENS_I32, (len(tokens),), p.encode_i32(tokens))

    def send_tensor(self, values: Sequence[float], dims: Sequence[int]) -> int:
        """A tensor_f32 request: 1..4 extents, product(dims) values (written little-endian)."""
        dims = tuple(dims)
        if not 1 <= len(dims) <= 4 or any(not 1 <= d <= 65535 for d in dims):
            raise p.ProtocolError(f"tensor dims {dims}: 1 to 4 extents of 1..65535")
        return self.send(p.Format.TENSOR_F32, dims, p.encode_f32(values))

    def send_raw(self, data) -> int:
        return self.send(p.Format.RAW, None, data)

    def _pace(self, size: int) -> None:
        pps, bps = self.pace_packets_per_s, self.pace_bytes_per_s
        if pps <= 0 and bps <= 0:
            return
        gap = max(1 / pps if pps > 0 else 0.0, size / bps if bps > 0 else 0.0)
        # Sleep most of the way, then spin for the exact time.
        wait = self._next_send - time.monotonic()
        if wait > 0.002:
            time.sleep(wait - 0.001)
        now = time.monotonic()
        while now < self._next_send:
            now = time.monotonic()
        # The gap counts from when this datagram actually leaves: a late wake-up is never
        # made up by a burst, and idle time earns no credit.
        self._next_send = now + gap

    def _transmit(self, datagrams: List[bytes]) -> None:
        refused = 0
        for d in datagrams:
            while True:
                self._pace(len(d))
                try:
                    self._sock.send(d)
                    break
                except InterruptedError:
                    continue
                except BlockingIOError:
                    time.sleep(50e-6)
                except ConnectionRefusedError:
                    # An ICMP error for an earlier datagram (nothing listened then), reported
                    # once on this send: sending again goes through.
                    refused += 1
                    if refused >= 16:
                        raise
                except OSError as e:
                    if e.errno != errno.ENOBUFS:
                        raise
                    time.sleep(50e-6)  # the device queue is full: back off briefly
            self.stats.datagrams_sent += 1
            self.stats.bytes_sent += len(d)

    # ---- receiving --------------------------------------------------------------------------

    def _forget(self, request_id: int) -> None:
        self._outstanding.pop(request_id, None)
        self._assembler.forget((0, 0, request_id))

    def _file(self, data: bytes) -> None:
        verdict, h, fragment = p.parse_response(data)
        if verdict != p.Verdict.OK:
            self.stats.rejected += 1
            return
        req = self._outstanding.get(h.request_id)
        if req is None:
            # Already answered, given up, abandoned or never ours: not filed, so such traffic
            # cannot hold memory.
            self.stats.duplicates += 1
            return
        outcome, m = self._assembler.add((0, 0, h.request_id), h, fragment)
        self.stats.evicted = self._assembler.evicted
        if outcome == p.Outcome.INCONSISTENT:
            self.stats.inconsistent += 1
        if outcome != p.Outcome.COMPLETED:
            return
        if not m.tiles:
            # Gaps or overlaps: nothing can be read from it; a resend may still get a good one.
            self.stats.inconsistent += 1
            return
        result = p.Result(h.request_id, m.head.kind, m.head.status, m.head.format,
                          tuple(m.head.dims), m.payload, req.attempts,
                          (time.monotonic() - req.first_sent) * 1e6)
        self._forget(h.request_id)
        self._ready[h.request_id] = result
        self.stats.answers += 1
        if result.is_error:
            self.stats.errors += 1
        while len(self._ready) > self.max_outstanding:
            self._ready.popitem(last=False)
            self.stats.abandoned += 1

    def _drain(self, until: float, done: Callable[[], bool]) -> None:
        """Files waiting datagrams until none is left, done() holds or the clock reaches
        `until`: a peer that sends faster than they can be filed (fragments that never complete
        a message, other requests' answers, garbage) must not hold the caller past its
        deadline or its resends."""
        recv, now = self._sock.recv, time.monotonic
        while True:
            try:
                data = recv(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                # An ICMP error for an earlier send; that request retries or times out.
                if now() >= until:
                    return
                continue
            self._file(data)
            if done() or now() >= until:
                return

    def _run_timers(self) -> None:
        now = time.monotonic()
        for request_id, req in list(self._outstanding.items()):
            if req.deadline is None or req.deadline > now:
                continue
            if req.attempts > self.retries:
                self._forget(request_id)
                self.stats.gave_up += 1
                continue
            # Every fragment again, same id: reefline files copies it already has as
            # duplicates, and answers a request it already answered once more.
            req.attempts += 1
            self.stats.resends += 1
            self._transmit(req.datagrams)
            req.deadline = time.monotonic() + self.retry_timeout

    def _next_event(self, deadline: Optional[float]) -> Optional[float]:
        """The earlier of `deadline` and the next resend or give-up; None: neither."""
        until = deadline
        for r in self._outstanding.values():
            if r.deadline is not None and (until is None or r.deadline < until):
                until = r.deadline
        return until

    def _pump(self, timeout, done: Callable[[], bool]) -> None:
        """Reads, resends and gives up until done(), or raises RequestTimeout once `timeout`
        seconds have passed, whatever the peer sends meanwhile."""
        if timeout is DEFAULT:
            timeout = self.receive_timeout
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            # What already arrived is filed before timers run, so that an answer that came in
            # time is not thrown away because it was read late. But a read pass ends at the
            # deadline or the next resend (having read for _MIN_READ_S at least): datagrams
            # that keep coming as fast as they are filed must delay neither.
            until = self._next_event(deadline)
            self._drain(float("inf") if until is None else max(until, time.monotonic() + _MIN_READ_S),
                        done)
            self._run_timers()
            if done():
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise RequestTimeout(f"no answer within {timeout} s")
            until = self._next_event(deadline)
            select.select([self._sock], [], [], None if until is None else max(until - now, 0))

    def receive(self, timeout=DEFAULT) -> p.Result:
        """The next answer to any outstanding request, in arrival order (timeout in seconds;
        0: only what is there; None: forever). Raises RequestTimeout."""
        self._pump(timeout, lambda: bool(self._ready))
        return self._ready.popitem(last=False)[1]

    def wait(self, request_id: int, timeout=DEFAULT) -> p.Result:
        """The answer to one request; answers to others are kept for receive(). Raises
        RequestTimeout when the timeout passes (the request stays outstanding) or the client
        gave up on it, NotOutstanding when it is not awaiting an answer."""
        if request_id in self._ready:
            return self._ready.pop(request_id)
        if request_id not in self._outstanding:
            raise NotOutstanding(request_id)
        self._pump(timeout, lambda: request_id in self._ready or request_id not in self._outstanding)
        if request_id not in self._ready:
            raise RequestTimeout(f"request {request_id}: no answer after {self.retries + 1} attempts")
        return self._ready.pop(request_id)

    def abandon(self, request_id: int) -> bool:
        """Stops waiting for a request: not resent, its answer dropped."""
        if request_id not in self._outstanding:
            return False
        self._forget(request_id)
        self.stats.abandoned += 1
        return True

    # ---- request and wait -----------------------------------------------------------------

    def request(self, fmt: int, dims: Optional[Sequence[int]], payload, timeout=DEFAULT) -> p.Result:
        """Send and wait. An error answer is a Result too (check .is_error); on timeout the
        request is abandoned, so a late answer is dropped."""
        return self._wait_or_abandon(self.send(fmt, dims, payload), timeout)

    def request_image(self, pixels, height: int, width: int, channels: int, timeout=DEFAULT) -> p.Result:
        return self._wait_or_abandon(self.send_image(pixels, height, width, channels), timeout)

    def request_tokens(self, tokens: Sequence[int], timeout=DEFAULT) -> p.Result:
        return self._wait_or_abandon(self.send_tokens(tokens), timeout)

    def request_tensor(self, values: Sequence[float], dims: Sequence[int], timeout=DEFAULT) -> p.Result:
        return self._wait_or_abandon(self.send_tensor(values, dims), timeout)

    def request_raw(self, data, timeout=DEFAULT) -> p.Result:
        return self._wait_or_abandon(self.send_raw(data), timeout)

    def _wait_or_abandon(self, request_id: int, timeout) -> p.Result:
        try:
            return self.wait(request_id, timeout)
        except RequestTimeout:
            self.abandon(request_id)
            raise
