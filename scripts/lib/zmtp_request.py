#!/usr/bin/env python3
"""Sends one message, byte for byte, to a ZeroMQ REP socket and prints the reply.

reefctl only ever sends well-formed requests; the soak also needs to send what a broken or
hostile client would (invalid JSON, unknown operations), and python3-zmq is not among the
packages the project installs. ZMTP 3.0 with the NULL mechanism is small enough to speak
directly over the ipc:// endpoint's Unix socket (RFC 23/ZMTP, RFC 37/ZMTP 3.0).

usage: zmtp_request.py ipc://PATH [--timeout S]   (the message is read from stdin)
Exit status: 0 a reply was printed; 2 bad usage; 3 no connection or no reply in time.
"""
import socket
import struct
import sys


def frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (0x01 if more else 0) | (0x04 if command else 0)
    if len(body) > 255:
        return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data


def read_frame(sock: socket.socket):
    """-> (flags, body)"""
    flags = read_exact(sock, 1)[0]
    size = struct.unpack(">Q", read_exact(sock, 8))[0] if flags & 0x02 else read_exact(sock, 1)[0]
    return flags, read_exact(sock, size)


def request(path: str, message: bytes, timeout: float) -> bytes:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    # Greeting: signature, version 3.0, mechanism NULL, as-server 0, filler.
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    sock.sendall(greeting)
    peer = read_exact(sock, 64)
    if peer[0] != 0xFF or peer[9] != 0x7F or peer[10] < 3:
        raise ConnectionError("the peer does not speak ZMTP 3")
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 3) + b"REQ"
    sock.sendall(frame(ready, command=True))
    while True:  # the peer's READY (and any other command) precedes messages
        flags, body = read_frame(sock)
        if flags & 0x04:
            if body[1:1 + body[0]] == b"ERROR":
                raise ConnectionError("the peer refused the handshake: " + body.decode(errors="replace"))
            if body[1:1 + body[0]] == b"READY":
                break
    # A REQ socket's message: an empty delimiter frame, then the body.
    sock.sendall(frame(b"", more=True) + frame(message))
    parts = []
    while True:
        flags, body = read_frame(sock)
        if flags & 0x04:
            continue
        parts.append(body)
        if not flags & 0x01:
            break
    sock.close()
    if parts and parts[0] == b"":
        parts = parts[1:]
    return b"".join(parts)


def main() -> int:
    args = sys.argv[1:]
    timeout = 10.0
    if "--timeout" in args:
        i = args.index("--timeout")
        try:
            timeout = float(args[i + 1])
        except (IndexError, ValueError):
            print("zmtp_request: --timeout needs a number of seconds", file=sys.stderr)
            return 2
        del args[i:i + 2]
    if len(args) != 1 or not args[0].startswith("ipc://"):
        print("usage: zmtp_request.py ipc://PATH [--timeout S] < message", file=sys.stderr)
        return 2
    message = sys.stdin.buffer.read()
    try:
        reply = request(args[0][len("ipc://"):], message, timeout)
    except (OSError, ConnectionError) as e:
        print(f"zmtp_request: {args[0]}: {e}", file=sys.stderr)
        return 3
    sys.stdout.buffer.write(reply + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
