"""reefline: a pure-Python client of the reefline network inference appliance.

Wire protocol v1 (docs/protocol.md), the same operations as the C library
(clients/c/reefline_client.h): send images, token sequences, tensors and raw bytes to an IF
(fragmented, paced, resent when unanswered), and receive reassembled, validated answers:
top-k classes, output tensors, the crc32 IF's checksum, or an error.

    import reefline
    with reefline.Client("198.18.0.2", 9100, retries=2) as c:
        answer = c.request_image(pixels, 224, 224, 3, timeout=2.0)
        for cls, score in answer.topk():
            print(cls, score)
"""

from .client import DEFAULT, Client, NotOutstanding, RequestTimeout, Stats
from .protocol import (HEADER_SIZE, MAGIC, MAX_FRAGMENT_SIZE, MAX_FRAGMENTS, MAX_TOTAL_LENGTH,
                       MTU_FRAGMENT_SIZE, VERSION, Assembler, Format, Header, Kind, LimitError,
                       MalformedResult, Message, Outcome, ProtocolError, ReeflineError,
                       RequestVerdict, Result, Status, Verdict, WrongFormat, check_request,
                       crc32c, decode_f32, decode_i32, described_length, encode_f32, encode_i32,
                       encode_request, fragment_count, parse_request, parse_response,
                       request_headers, status_name)

__version__ = "1.0.0"

__all__ = [
    "Assembler", "Client", "DEFAULT", "Format", "HEADER_SIZE", "Header", "Kind", "LimitError",
    "MAGIC", "MAX_FRAGMENTS", "MAX_FRAGMENT_SIZE", "MAX_TOTAL_LENGTH", "MTU_FRAGMENT_SIZE",
    "MalformedResult", "Message", "NotOutstanding", "Outcome", "ProtocolError", "ReeflineError",
    "RequestTimeout", "RequestVerdict", "Result", "Stats", "Status", "VERSION", "Verdict",
    "WrongFormat", "check_request", "crc32c", "decode_f32", "decode_i32", "described_length",
    "encode_f32", "encode_i32", "encode_request", "fragment_count", "parse_request",
    "parse_response", "request_headers", "status_name",
]
