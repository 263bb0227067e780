"""reefline wire protocol v1 (docs/protocol.md): the codec, without I/O.

The same operations as the C library's codec (clients/c/reefline_client.h), in pure Python:
header encoding, request fragmentation, response fragment checks, bounded reassembly and
validated result decoding. Nothing read from the network is trusted: a hostile or broken
datagram is refused with a verdict, never indexed out of bounds.
"""

from __future__ import annotations

import collections
import enum
import math
import struct
import sys
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

MAGIC = 0x52464C4E  # "RFLN"
VERSION = 1
HEADER_SIZE = 40
MAX_FRAGMENTS = 1024
MAX_TOTAL_LENGTH = 8 << 20
# Largest fragment that fits a 1500-byte MTU: 1500 - 20 (IPv4) - 8 (UDP) - 40 (header).
MTU_FRAGMENT_SIZE = 1500 - 20 - 8 - HEADER_SIZE
# Largest fragment a UDP/IPv4 datagram (and a pcap frame) can carry.
MAX_FRAGMENT_SIZE = 65535 - 14 - 20 - 8 - HEADER_SIZE


class Kind(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    ERROR = 3  # status != ok, payload is a UTF-8 message


class Format(enum.IntEnum):
    RAW = 0
    IMAGE_U8_HWC = 1  # dims H, W, C
    TENSOR_F32 = 2  # dims: 1..4 extents, little-endian f32
    TOKENS_I32 = 3  # dims N, little-endian i32
    RESULT_CRC32 = 16  # be32 length, be32 CRC32C
    RESULT_TOPK = 17  # dims k: k x (be32 class, be32 f32 bits)
    RESULT_TENSOR_F32 = 18  # dims: the output's extents, little-endian f32


REQUEST_FORMATS = (Format.RAW, Format.IMAGE_U8_HWC, Format.TENSOR_F32, Format.TOKENS_I32)


class Status(enum.IntEnum):
    OK = 0
    BAD_REQUEST = 1
    UNSUPPORTED_FORMAT = 2
    OVERLOADED = 3
    DEADLINE_EXCEEDED = 4
    INTERNAL_ERROR = 5
    SHUTTING_DOWN = 6


def status_name(status: int) -> str:
    """"ok", "bad_request", ... as the protocol names them; "unknown" for other values."""
    try:
        return Status(status).name.lower()
    except ValueError:
        return "unknown"


class ReeflineError(Exception):
    """Base of the package's errors."""


class ProtocolError(ReeflineError, ValueError):
    """A request that the protocol cannot express (bad arguments, dims that do not describe
    the payload); reefline would drop it without an answer, so it is refused before sending."""


class LimitError(ProtocolError):
    """Beyond the protocol's limits: an empty payload, over 8 MiB or over 1024 fragments."""


class MalformedResult(ReeflineError, ValueError):
    """An answer whose bytes do not match its kind, status, format or dims."""


class WrongFormat(ReeflineError, TypeError):
    """Decoding an answer as what it is not (top-k of a tensor, a result of an error)."""


# ---- header ---------------------------------------------------------------------------

# magic, version, kind, format, status, request_id, frag_index, frag_count, payload_offset,
# total_length, dims[4], reserved: all big-endian.
_HEADER = struct.Struct(">IBBBBQHHII4HI")
assert _HEADER.size == HEADER_SIZE


@dataclass
class Header:
    """The 40-byte header in host terms."""

    kind: int = 0
    format: int = 0
    status: int = 0
    request_id: int = 0
    frag_index: int = 0
    frag_count: int = 0
    payload_offset: int = 0
    total_length: int = 0
    dims: Tuple[int, int, int, int] = (0, 0, 0, 0)

    def encode(self) -> bytes:
        """The wire bytes: magic, version 1, reserved 0."""
        d = tuple(self.dims) + (0,) * (4 - len(self.dims))
        return _HEADER.pack(MAGIC, VERSION, self.kind, self.format, self.status, self.request_id,
                            self.frag_index, self.frag_count, self.payload_offset,
                            self.total_length, *d[:4], 0)

    @classmethod
    def decode(cls, data) -> "Header":
        """The fields of the first 40 bytes as they stand; checks nothing."""
        (_, _, kind, fmt, status, rid, index, count, offset, total, d0, d1, d2, d3,
         _) = _HEADER.unpack_from(data, 0)
        return cls(kind, fmt, status, rid, index, count, offset, total, (d0, d1, d2, d3))

    def same_message(self, other: "Header") -> bool:
        """Whether two fragments' headers describe the same message (ids aside)."""
        return (self.kind == other.kind and self.format == other.format
                and self.status == other.status and self.total_length == other.total_length
                and self.frag_count == other.frag_count and tuple(self.dims) == tuple(other.dims))


def _raw_header(data) -> Tuple[int, int, int, int]:
    """magic, version, kind, reserved of a header's bytes."""
    magic, version, kind = struct.unpack_from(">IBB", data, 0)
    (reserved,) = struct.unpack_from(">I", data, 36)
    return magic, version, kind, reserved


def _normal_dims(dims: Optional[Sequence[int]]) -> Tuple[int, int, int, int]:
    d = tuple(int(x) for x in (dims or ()))
    if len(d) > 4:
        raise ProtocolError(f"dims: at most 4 extents, got {len(d)}")
    for x in d:
        if not 0 <= x <= 65535:
            raise ProtocolError(f"dims: extents are 16 bits, got {x}")
    return d + (0,) * (4 - len(d))


def described_length(fmt: int, dims: Sequence[int]) -> int:
    """Payload bytes that `dims` describe for a request format (H*W*C, 4*product, 4*N), or 0
    for raw and for dims that describe nothing."""
    d = _normal_dims(dims)
    if fmt == Format.IMAGE_U8_HWC:
        return d[0] * d[1] * d[2]
    if fmt == Format.TENSOR_F32:
        used = [x for x in d if x]
        return 4 * math.prod(used) if used else 0
    if fmt == Format.TOKENS_I32:
        return 4 * d[0]
    return 0


# ---- elements and checksums ------------------------------------------------------------

def encode_i32(values: Iterable[int]) -> bytes:
    """tokens_i32 payload: little-endian i32 (as the device reads it in place)."""
    v = list(values)
    return struct.pack(f"<{len(v)}i", *v)


def encode_f32(values: Iterable[float]) -> bytes:
    """tensor_f32 payload: little-endian IEEE-754 binary32."""
    v = list(values)
    return struct.pack(f"<{len(v)}f", *v)


def decode_f32(data) -> List[float]:
    """Every whole little-endian f32 of `data`."""
    n = len(data) // 4
    return list(struct.unpack_from(f"<{n}f", data, 0))


def decode_i32(data) -> List[int]:
    n = len(data) // 4
    return list(struct.unpack_from(f"<{n}i", data, 0))


def _crc32c_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data, crc: int = 0) -> int:
    """CRC32C (Castagnoli), as the crc32 diagnostic IF answers it; `crc` continues an earlier
    value (crc32c(b, crc32c(a)) == crc32c(a + b)). zlib.crc32 is the other polynomial."""
    table = _CRC32C
    c = crc ^ 0xFFFFFFFF
    for b in bytes(data):
        c = (c >> 8) ^ table[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


# ---- fragmentation ----------------------------------------------------------------------

def fragment_count(total_length: int, fragment_size: int) -> int:
    """Fragments a payload takes at `fragment_size` bytes each (the last may be shorter)."""
    if not 1 <= fragment_size <= MAX_FRAGMENT_SIZE:
        raise ProtocolError(f"fragment size {fragment_size}: must be 1..{MAX_FRAGMENT_SIZE}")
    if total_length <= 0:
        raise LimitError("empty payload")
    if total_length > MAX_TOTAL_LENGTH:
        raise LimitError(f"payload of {total_length} bytes exceeds the protocol limit of "
                         f"{MAX_TOTAL_LENGTH}")
    n = -(-total_length // fragment_size)
    if n > MAX_FRAGMENTS:
        raise LimitError(f"fragment size {fragment_size} cuts a {total_length}-byte payload into "
                         f"{n} fragments; the protocol allows {MAX_FRAGMENTS}")
    return n


def request_headers(fmt: int, dims: Optional[Sequence[int]], total_length: int, request_id: int,
                    fragment_size: int) -> List[Header]:
    """The header of every fragment of a request, in index order."""
    if fmt not in REQUEST_FORMATS:
        raise ProtocolError(f"format {fmt} is not a request format")
    d = _normal_dims(dims)
    n = fragment_count(total_length, fragment_size)
    return [Header(Kind.REQUEST, int(fmt), 0, request_id, i, n, i * fragment_size, total_length, d)
            for i in range(n)]


def check_request(fmt: int, dims: Optional[Sequence[int]], payload) -> None:
    """Raises ProtocolError for what reefline would drop without an answer: a format that is
    not a request's, dims that do not describe the payload (raw: anything goes)."""
    if fmt not in REQUEST_FORMATS:
        raise ProtocolError(f"format {fmt} is not a request format")
    if fmt != Format.RAW:
        want = described_length(fmt, dims or ())
        if want != len(payload):
            d = _normal_dims(dims)
            raise ProtocolError(f"dims {d[0]},{d[1]},{d[2]},{d[3]} describe {want} bytes, "
                                f"the payload has {len(payload)}")


def encode_request(fmt: int, dims: Optional[Sequence[int]], payload, request_id: int,
                   fragment_size: int = MTU_FRAGMENT_SIZE) -> List[bytes]:
    """Every fragment of a request as a UDP payload: header + its slice of the payload. The
    bytes are what reefgen writes and the C library sends for the same request."""
    data = memoryview(bytes(payload))
    out = []
    for h in request_headers(fmt, dims, len(data), request_id, fragment_size):
        out.append(h.encode() + bytes(data[h.payload_offset:h.payload_offset + fragment_size]))
    return out


# ---- parsing what arrives ------------------------------------------------------------------

class Verdict(enum.IntEnum):
    """Verdict on one datagram read as a response or error fragment (the C library's
    reefline_fragment_verdict; str() gives the names reefgen reports)."""

    OK = 0
    REQUEST = 1  # a request fragment: not a response, ignore
    SHORT = 2  # shorter than the header
    BAD_HEADER = 3  # magic, version or reserved wrong
    BAD_KIND = 4  # neither response nor error
    TOO_MANY_FRAGMENTS = 5  # count 0 or > 1024, or index >= count
    TOO_LARGE = 6  # total_length > 8 MiB
    OFFSET_OUT_OF_RANGE = 7  # offset + fragment length > total_length

    def __str__(self) -> str:
        return "short_payload" if self is Verdict.SHORT else self.name.lower()


def parse_response(datagram) -> Tuple[Verdict, Optional[Header], Optional[bytes]]:
    """Checks a response/error datagram: (verdict, header, fragment bytes); header and
    fragment are None unless the verdict is OK."""
    data = bytes(datagram)
    if len(data) < HEADER_SIZE:
        return Verdict.SHORT, None, None
    magic, version, kind, reserved = _raw_header(data)
    # A capture of both directions holds requests too: they are not responses to judge.
    if magic == MAGIC and kind == Kind.REQUEST:
        return Verdict.REQUEST, None, None
    if magic != MAGIC or version != VERSION or reserved != 0:
        return Verdict.BAD_HEADER, None, None
    if kind not in (Kind.RESPONSE, Kind.ERROR):
        return Verdict.BAD_KIND, None, None
    h = Header.decode(data)
    if h.frag_count == 0 or h.frag_count > MAX_FRAGMENTS or h.frag_index >= h.frag_count:
        return Verdict.TOO_MANY_FRAGMENTS, None, None
    if h.total_length > MAX_TOTAL_LENGTH:
        return Verdict.TOO_LARGE, None, None
    fragment = data[HEADER_SIZE:]
    if h.payload_offset + len(fragment) > h.total_length:
        return Verdict.OFFSET_OUT_OF_RANGE, None, None
    return Verdict.OK, h, fragment


class RequestVerdict(enum.IntEnum):
    """reefline's per-packet checks on a request (its drop reasons), for responders."""

    OK = 0
    BAD_HEADER = 1
    ZERO_LENGTH = 2
    TOO_LARGE = 3
    TOO_MANY_FRAGMENTS = 4
    OFFSET_OUT_OF_RANGE = 5
    DIMS_MISMATCH = 6
    SHORT = 7


def parse_request(datagram) -> Tuple[RequestVerdict, Optional[Header], Optional[bytes]]:
    """Checks a request datagram as the data plane does (clients/c/wire/protocol.h)."""
    data = bytes(datagram)
    if len(data) < HEADER_SIZE:
        return RequestVerdict.SHORT, None, None
    magic, version, kind, reserved = _raw_header(data)
    h = Header.decode(data)
    fragment = data[HEADER_SIZE:]
    if (magic != MAGIC or version != VERSION or kind != Kind.REQUEST
            or h.format not in REQUEST_FORMATS or reserved != 0 or h.status != 0):
        return RequestVerdict.BAD_HEADER, None, None
    if h.total_length == 0 or not fragment:
        return RequestVerdict.ZERO_LENGTH, None, None
    if h.total_length > MAX_TOTAL_LENGTH:
        return RequestVerdict.TOO_LARGE, None, None
    if h.frag_count == 0 or h.frag_count > MAX_FRAGMENTS or h.frag_index >= h.frag_count:
        return RequestVerdict.TOO_MANY_FRAGMENTS, None, None
    if h.payload_offset + len(fragment) > h.total_length:
        return RequestVerdict.OFFSET_OUT_OF_RANGE, None, None
    if h.format != Format.RAW and described_length(h.format, h.dims) != h.total_length:
        return RequestVerdict.DIMS_MISMATCH, None, None
    return RequestVerdict.OK, h, fragment


# ---- reassembly ---------------------------------------------------------------------------

# Who a message belongs to: (peer ip, peer port, request id); (0, 0, id) on a client's
# connected socket.
Flow = Tuple[int, int, int]


class Outcome(enum.IntEnum):
    ACCEPTED = 0  # filed, message still incomplete
    COMPLETED = 1  # this fragment completed the message
    DUPLICATE = 2  # index already present: ignored (the first copy wins)
    INCONSISTENT = 3  # disagrees with the message's first fragment or the limits: ignored
    AFTER_COMPLETION = 4  # flow already completed (remember_completed only)
    TOO_LARGE = 5  # the message alone would exceed max_pending_bytes: dropped whole

    def __str__(self) -> str:
        return self.name.lower()


@dataclass
class Message:
    flow: Flow
    head: Header  # fields of the first fragment seen
    payload: bytes  # fragments concatenated in offset order
    tiles: bool  # offsets tile [0, total_length) exactly: no gap, no overlap


def _measure_overheads() -> Tuple[int, int, int, int, int]:
    """What the Assembler really allocates, besides fragment bytes, per incomplete message,
    per fragment it holds and per completed flow it remembers, and to complete a message
    (besides its bytes: fixed and per fragment): sys.getsizeof of the very objects it keeps,
    built here on this interpreter, each rounded up to the allocator's 16-byte blocks; for
    its dicts and lists the worst per-item growth (the table after a resize, OrderedDict's
    node and fast-lookup array included), twice for its two maps, so that the bound holds
    at the peak of an add too. Conservative where that is simpler: an instance's lazily
    made __dict__ counted as made, ints below 257 (shared) at full size, a flow at its
    largest (a dotted-quad string, a port, a 64-bit id). On CPython 3.11: 1636, 231, 452,
    416 and 23 bytes."""
    if not hasattr(sys, "getsizeof") or sys.implementation.name != "cpython":
        return 1636, 231, 452, 416, 23  # measured on CPython 3.11 (PyPy's getsizeof raises)
    size = lambda x: (sys.getsizeof(x) + 15) & ~15  # noqa: E731

    def worst_item(container, keys) -> int:
        # Beyond 8 items: a small table's fixed part is the container's own, a few hundred
        # bytes whatever it holds.
        empty, worst = sys.getsizeof(container), 0.0
        for n, k in enumerate(keys, 1):
            if isinstance(container, list):
                container.append(k)
            else:
                container[k] = None
            if n >= 8:
                worst = max(worst, (sys.getsizeof(container) - empty) / n)
        return int(math.ceil(worst))

    top = (1 << 64) - 1
    h = Header.decode(Header(Kind.RESPONSE, 255, 255, top, MAX_FRAGMENTS - 1, MAX_FRAGMENTS,
                             MAX_TOTAL_LENGTH - 1, MAX_TOTAL_LENGTH,
                             (65535, 65534, 65533, 65532)).encode())
    ip, port = "255.255.255.255", 65535
    flow = (ip, port, h.request_id)
    keys = range(1 << 20, (1 << 20) + 2048)
    # _entries, _completed: twice, as a resize holds the old table and the new one at once;
    # past 2**16 slots (21,846 items) a dict's index entries widen from 2 to 4 bytes: at most
    # 6 slots per item, 12 bytes more.
    map_slot = 2 * (worst_item(collections.OrderedDict(), keys) + 12)
    piece_slot = worst_item({}, keys[:MAX_FRAGMENTS])  # an entry's pieces
    flow_bytes = size(flow) + size(ip) + size(port) + size(h.request_id)
    e = _Entry(h)
    e.pieces[h.frag_index] = (h.payload_offset, b"")
    header_bytes = (size(h) + size(vars(h)) + size(h.dims) + sum(size(d) for d in h.dims)
                    + sum(size(getattr(h, f)) for f in ("kind", "format", "status", "request_id",
                                                        "frag_index", "frag_count",
                                                        "payload_offset", "total_length")))
    # The entry: its slot in _entries, flow, object, pieces dict, charge and bytes ints, header.
    entry = (map_slot + flow_bytes + size(e) + size(e.pieces) + 2 * size(MAX_TOTAL_LENGTH)
             + header_bytes)
    # The fragment's bytes object less its length (header, terminator, block rounding), the
    # (offset, bytes) tuple, the offset and index ints, its slot in the pieces dict.
    piece = (sys.getsizeof(b"") + 15 + size((0, b"")) + size(h.payload_offset)
             + size(h.frag_index) + piece_slot)
    completed = map_slot + flow_bytes
    # Completing: the payload's bytes object, joined from a list of the pieces sorted by
    # offset (8 bytes an item) and a list of their bytes (appended: over-allocated), each at
    # most 8 items' worth above its per-item growth.
    list_slot = worst_item([], keys[:MAX_FRAGMENTS])
    copy = sys.getsizeof(b"") + 15 + 2 * (size([]) + 8 * list_slot)
    copy_piece = 8 + list_slot
    return entry, piece, completed, copy, copy_piece


class _Entry:
    __slots__ = ("head", "pieces", "charge", "bytes")

    def __init__(self, head: Header):
        self.head = head  # fields of the first fragment seen
        self.pieces = {}  # index -> (offset, bytes)
        self.charge = 0  # bytes charged: ENTRY_OVERHEAD + per piece PIECE_OVERHEAD + length
        self.bytes = 0  # of which fragment bytes


# Bytes charged per incomplete message, per fragment besides its length, per remembered
# completed flow; room needed to complete a message besides its bytes, fixed and per
# fragment (_measure_overheads).
(ENTRY_OVERHEAD, PIECE_OVERHEAD, COMPLETED_OVERHEAD, COMPLETION_OVERHEAD,
 COMPLETION_PIECE_OVERHEAD) = _measure_overheads()
# Most recent completed flows an Assembler(remember_completed=True) keeps by default.
DEFAULT_MAX_COMPLETED = 4096


class Assembler:
    """Reassembly with the protocol's receiver rules: fragments in any order or twice, the
    first copy of an index wins, a fragment that disagrees with its message's first is
    ignored, complete when every index is present.

    Bounded: at most max_pending incomplete messages, and max_pending_bytes of memory (0:
    unbounded, for finite inputs). Memory is charged for what is really allocated: each
    fragment's bytes plus PIECE_OVERHEAD, ENTRY_OVERHEAD per incomplete message and
    COMPLETED_OVERHEAD per remembered completed flow; pending_bytes + completed_bytes never
    exceeds max_pending_bytes, nor does it with the copy that completing a message makes
    next to its pieces (its bytes, COMPLETION_OVERHEAD and COMPLETION_PIECE_OVERHEAD per
    fragment). Room is made by dropping the oldest other incomplete messages, then the
    oldest completed flows; a message that alone would not fit with that copy is dropped
    (TOO_LARGE). remember_completed keeps the max_completed most recent completed flows, so
    that late copies of their fragments are reported as AFTER_COMPLETION."""

    def __init__(self, max_pending: int = 0, max_pending_bytes: int = 0,
                 remember_completed: bool = False, max_completed: int = DEFAULT_MAX_COMPLETED):
        if max_pending < 0 or max_pending_bytes < 0 or max_completed < 1:
            raise ValueError("max_pending, max_pending_bytes >= 0 and max_completed >= 1")
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.remember_completed = remember_completed
        self.max_completed = max_completed
        self._entries: "collections.OrderedDict[Flow, _Entry]" = collections.OrderedDict()
        self._completed: "collections.OrderedDict[Flow, None]" = collections.OrderedDict()
        # Most items each map held since it was last rebuilt: a dict never shrinks its table,
        # so a map down to a quarter of that is rebuilt (the per-item charges assume a table
        # sized for the items it holds).
        self._entries_high = self._completed_high = 0
        self.pending_bytes = 0  # charged for incomplete messages
        self.completed_bytes = 0  # charged for remembered completed flows
        self.evicted = 0  # incomplete messages dropped by the bounds

    @property
    def memory_bytes(self) -> int:
        """Everything charged: pending_bytes + completed_bytes."""
        return self.pending_bytes + self.completed_bytes

    def _drop(self, flow: Flow) -> None:
        e = self._entries.pop(flow)
        self.pending_bytes -= e.charge
        n = len(self._entries)
        if self._entries_high >= 64 and 4 * n < self._entries_high:
            self._entries = collections.OrderedDict(self._entries)
            self._entries_high = n

    def _forget_oldest_completed(self) -> None:
        self._completed.popitem(last=False)
        self.completed_bytes -= COMPLETED_OVERHEAD
        n = len(self._completed)
        if self._completed_high >= 64 and 4 * n < self._completed_high:
            self._completed = collections.OrderedDict(self._completed)
            self._completed_high = n

    def add(self, flow: Flow, h: Header, fragment) -> Tuple[Outcome, Optional[Message]]:
        if self.remember_completed and flow in self._completed:
            return Outcome.AFTER_COMPLETION, None
        fragment = bytes(fragment)
        # The protocol limits bound what one entry may hold, whatever a sender claims.
        if (h.frag_count == 0 or h.frag_count > MAX_FRAGMENTS or h.frag_index >= h.frag_count
                or h.total_length > MAX_TOTAL_LENGTH
                or h.payload_offset + len(fragment) > h.total_length):
            return Outcome.INCONSISTENT, None
        e = self._entries.get(flow)
        if e is not None:
            if not e.head.same_message(h):
                return Outcome.INCONSISTENT, None
            if h.frag_index in e.pieces:
                return Outcome.DUPLICATE, None
        elif self.max_pending and len(self._entries) >= self.max_pending:
            self._drop(next(iter(self._entries)))
            self.evicted += 1
        charge = PIECE_OVERHEAD + len(fragment) + (0 if e is not None else ENTRY_OVERHEAD)
        if self.max_pending_bytes:
            # Completing it copies its pieces out while they are still held (and remembers
            # its flow): a message that cannot hold both will never be delivered, so it counts
            # from the start.
            pieces = (len(e.pieces) if e is not None else 0) + 1
            completion = (COMPLETION_OVERHEAD + COMPLETION_PIECE_OVERHEAD * pieces
                          + (e.bytes if e is not None else 0) + len(fragment)
                          + (COMPLETED_OVERHEAD if self.remember_completed else 0))
            if (e.charge if e is not None else 0) + charge + completion > self.max_pending_bytes:
                if e is not None:
                    self._drop(flow)
                self.evicted += 1
                return Outcome.TOO_LARGE, None
            need = charge + (completion if pieces == h.frag_count else 0)
            # The oldest other messages make room, then the oldest completed flows: this one
            # fits on its own, so while the total does not, there is something to drop.
            while self.pending_bytes + self.completed_bytes + need > self.max_pending_bytes:
                victim = next((f for f in self._entries if f != flow), None)
                if victim is None:
                    self._forget_oldest_completed()
                    continue
                self._drop(victim)
                self.evicted += 1
        if e is None:
            e = self._entries[flow] = _Entry(h)
            self._entries_high = max(self._entries_high, len(self._entries))
        e.pieces[h.frag_index] = (h.payload_offset, fragment)
        e.charge += charge
        e.bytes += len(fragment)
        self.pending_bytes += charge
        if len(e.pieces) < e.head.frag_count:
            return Outcome.ACCEPTED, None
        self._drop(flow)
        if self.remember_completed:
            self._completed[flow] = None
            self.completed_bytes += COMPLETED_OVERHEAD
            self._completed_high = max(self._completed_high, len(self._completed))
            while len(self._completed) > self.max_completed:
                self._forget_oldest_completed()
        tiles, at, parts = True, 0, []
        for offset, piece in sorted(e.pieces.values(), key=lambda p: p[0]):
            if offset != at:
                tiles = False
            parts.append(piece)
            at += len(piece)
        payload = b"".join(parts)
        if len(payload) != e.head.total_length:
            tiles = False
        return Outcome.COMPLETED, Message(flow, e.head, payload, tiles)

    def forget(self, flow: Flow) -> bool:
        """Drops the incomplete message of `flow`; whether there was one."""
        if flow not in self._entries:
            return False
        self._drop(flow)
        return True

    def pending(self) -> List[Tuple[Flow, Header, int]]:
        """Incomplete messages, oldest first: (flow, first header, fragments received)."""
        return [(f, e.head, len(e.pieces)) for f, e in self._entries.items()]

    def is_completed(self, flow: Flow) -> bool:
        """Whether `flow` is one of the remembered completed flows (remember_completed)."""
        return flow in self._completed


# ---- results ---------------------------------------------------------------------------

def _leading_extents(dims: Sequence[int]) -> Tuple[int, ...]:
    """1..4 non-zero extents followed only by zeros, else ()."""
    d = tuple(dims) + (0,) * (4 - len(dims))
    n = 0
    while n < 4 and d[n]:
        n += 1
    if any(d[n:]):
        return ()
    return d[:n]


@dataclass
class Result:
    """An answer: a reassembled response (kind response, status ok) or error (kind error)."""

    request_id: int
    kind: int
    status: int
    format: int
    dims: Tuple[int, int, int, int]
    payload: bytes
    attempts: int = 1  # times the client sent the request
    latency_us: float = 0.0  # first send to the answer's last fragment

    @property
    def is_error(self) -> bool:
        return self.kind == Kind.ERROR

    @property
    def status_name(self) -> str:
        return status_name(self.status)

    @property
    def error_message(self) -> str:
        """An error's message (bytes that are not UTF-8 become U+FFFD)."""
        if self.kind != Kind.ERROR:
            raise WrongFormat(f"kind {self.kind} is not an error answer")
        return self.payload.decode("utf-8", "replace")

    def _check_payload(self) -> None:
        n = len(self.payload)
        if self.format == Format.RESULT_CRC32 and n != 8:
            raise MalformedResult(f"result_crc32 of {n} bytes, expected 8")
        if self.format == Format.RESULT_TOPK:
            if n % 8:
                raise MalformedResult(f"result_topk of {n} bytes: not whole 8-byte entries")
            if tuple(self.dims) != (n // 8, 0, 0, 0):
                raise MalformedResult(f"result_topk of {n // 8} entries with dims {tuple(self.dims)}")
        if self.format == Format.RESULT_TENSOR_F32:
            ext = _leading_extents(self.dims)
            if not ext:
                raise MalformedResult(f"result_tensor_f32 with dims {tuple(self.dims)}: expected 1 to "
                                      "4 non-zero extents, then zeros")
            if n != 4 * math.prod(ext):
                raise MalformedResult(f"result_tensor_f32 of {n} bytes, its dims need "
                                      f"{4 * math.prod(ext)} (4 per f32)")

    def validate(self) -> None:
        """Raises MalformedResult unless the payload is what kind, status, format and dims say."""
        if self.kind == Kind.ERROR:
            if self.status == Status.OK:
                raise MalformedResult("an error answer with status ok")
            return
        if self.kind != Kind.RESPONSE:
            raise MalformedResult(f"kind {self.kind} is not an answer")
        if self.status != Status.OK:
            raise MalformedResult(f"a response with status {status_name(self.status)} "
                                  "(errors have kind 3)")
        self._check_payload()

    def _expect(self, fmt: Format) -> None:
        if self.kind != Kind.RESPONSE or self.format != fmt:
            raise WrongFormat(f"kind {self.kind} format {self.format} is not a "
                              f"{fmt.name.lower()} response")
        self._check_payload()

    def topk(self) -> List[Tuple[int, float]]:
        """(class, score) pairs, best first."""
        self._expect(Format.RESULT_TOPK)
        return [struct.unpack_from(">If", self.payload, i) for i in range(0, len(self.payload), 8)]

    def tensor(self) -> Tuple[Tuple[int, ...], List[float]]:
        """(extents, values in row-major order)."""
        self._expect(Format.RESULT_TENSOR_F32)
        return _leading_extents(self.dims), decode_f32(self.payload)

    def crc32(self) -> Tuple[int, int]:
        """The crc32 IF's answer: (payload length, CRC32C) it computed."""
        self._expect(Format.RESULT_CRC32)
        return struct.unpack(">II", self.payload)

    def describe(self) -> str:
        """One line for humans."""
        if self.is_error:
            return f"error {self.status_name}: {self.error_message}"
        try:
            if self.format == Format.RESULT_TOPK:
                return "top: " + ", ".join(f"class {c} ({s:.2f})" for c, s in self.topk())
            if self.format == Format.RESULT_TENSOR_F32:
                dims, values = self.tensor()
                head = ", ".join(f"{v:.4g}" for v in values[:4])
                return f"tensor {'x'.join(map(str, dims))} [{head}{', ...' if len(values) > 4 else ''}]"
            if self.format == Format.RESULT_CRC32:
                length, crc = self.crc32()
                return f"crc32c={crc:08x} over {length} bytes"
        except MalformedResult as e:
            return f"malformed: {e}"
        return f"format {self.format}, {len(self.payload)} bytes"
