"""Images for image_u8_hwc requests, with the standard library alone: binary PPM/PGM and PNG
(8-bit gray, gray+alpha, RGB, RGBA; non-interlaced) decoding, nearest-neighbour resizing and
channel conversion. Pixels are bytes, row-major, channels last (H x W x C), as the wire wants.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass


class ImageError(ValueError):
    """An image this module cannot read."""


@dataclass
class Image:
    height: int
    width: int
    channels: int
    pixels: bytes  # height * width * channels bytes


def read_netpbm(data: bytes) -> Image:
    """A binary PPM (P6, 3 channels) or PGM (P5, 1 channel) with maxval <= 255."""
    pos = 0

    def token() -> bytes:
        nonlocal pos
        while True:  # whitespace and '#' comments to the end of the line
            while pos < len(data) and data[pos:pos + 1].isspace():
                pos += 1
            if data[pos:pos + 1] == b"#":
                while pos < len(data) and data[pos] != 0x0A:
                    pos += 1
                continue
            break
        start = pos
        while pos < len(data) and not data[pos:pos + 1].isspace() and data[pos:pos + 1] != b"#":
            pos += 1
        return data[start:pos]

    magic = token()
    if magic not in (b"P6", b"P5"):
        raise ImageError("not a binary PPM (P6) or PGM (P5) image")
    try:
        width, height, maxval = (int(token()) for _ in range(3))
    except ValueError as e:
        raise ImageError("malformed netpbm header") from e
    if not (1 <= width <= 65535 and 1 <= height <= 65535):
        raise ImageError("dimensions must be 1..65535")
    if not 1 <= maxval <= 255:
        raise ImageError("only 8-bit images (maxval <= 255)")
    if pos >= len(data) or not data[pos:pos + 1].isspace():
        raise ImageError("malformed netpbm header")
    pos += 1  # exactly one whitespace byte before the raster
    channels = 3 if magic == b"P6" else 1
    size = width * height * channels
    if len(data) - pos < size:
        raise ImageError(f"truncated raster ({len(data) - pos} of {size} bytes)")
    return Image(height, width, channels, bytes(data[pos:pos + size]))


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> channels (8-bit, no palette)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read_png(data: bytes) -> Image:
    """An 8-bit, non-interlaced PNG: gray, gray+alpha, RGB or RGBA (as many channels)."""
    if not data.startswith(_PNG_SIGNATURE):
        raise ImageError("not a PNG image")
    pos = len(_PNG_SIGNATURE)
    ihdr = None
    idat = []
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length or pos + 12 + length > len(data):
            raise ImageError("truncated PNG chunk")
        (crc,) = struct.unpack_from(">I", data, pos + 8 + length)
        if zlib.crc32(kind + body) != crc:
            raise ImageError(f"PNG chunk {kind!r}: bad CRC")
        pos += 12 + length
        if kind == b"IHDR":
            if length != 13:
                raise ImageError("malformed IHDR")
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if ihdr is None:
        raise ImageError("PNG without IHDR")
    width, height, depth, colour, compression, filtering, interlace = ihdr
    if depth != 8 or colour not in _PNG_CHANNELS:
        raise ImageError(f"PNG of bit depth {depth}, colour type {colour}: only 8-bit gray, "
                         "gray+alpha, RGB and RGBA")
    if compression != 0 or filtering != 0 or interlace != 0:
        raise ImageError("interlaced or non-standard PNG")
    if not (1 <= width <= 65535 and 1 <= height <= 65535):
        raise ImageError("dimensions must be 1..65535")
    channels = _PNG_CHANNELS[colour]
    stride = width * channels
    # Bounded inflation: a decompression bomb stops at the size the header announces.
    d = zlib.decompressobj()
    try:
        raw = d.decompress(b"".join(idat), height * (stride + 1) + 1)
    except zlib.error as e:
        raise ImageError(f"PNG data: {e}") from e
    if len(raw) < height * (stride + 1):
        raise ImageError("truncated PNG image data")
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        row_start = y * (stride + 1)
        kind = raw[row_start]
        line = bytearray(raw[row_start + 1:row_start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:  # Up
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xFF
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                up_left = prev[i - channels] if i >= channels else 0
                line[i] = (line[i] + _paeth(left, prev[i], up_left)) & 0xFF
        elif kind != 0:
            raise ImageError(f"PNG row {y}: unknown filter {kind}")
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return Image(height, width, channels, bytes(out))


def read_image(path: str) -> Image:
    """A PNG or binary PPM/PGM file, by its signature."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(_PNG_SIGNATURE):
        return read_png(data)
    return read_netpbm(data)


def to_channels(image: Image, channels: int) -> Image:
    """Gray <-> RGB: gray is replicated; colour becomes its mean (ITU-R BT.601 weights would
    need floats for little gain); an alpha channel is dropped."""
    c = image.channels
    if c == channels:
        return image
    src = image.pixels
    colour = c >= 3
    out = bytearray(image.height * image.width * channels)
    for i in range(image.height * image.width):
        px = src[i * c:(i + 1) * c]
        if channels == 1:
            out[i] = (px[0] + px[1] + px[2]) // 3 if colour else px[0]
        else:
            rgb = px[:3] if colour else bytes([px[0]] * 3)
            out[i * channels:i * channels + 3] = rgb
            if channels == 4:
                out[i * 4 + 3] = px[-1] if c in (2, 4) else 255
    return Image(image.height, image.width, channels, bytes(out))


def resize_nearest(image: Image, height: int, width: int) -> Image:
    """Nearest-neighbour resize to height x width."""
    c = image.channels
    src = image.pixels
    out = bytearray(height * width * c)
    cols = [(x * image.width // width) * c for x in range(width)]
    for y in range(height):
        row = (y * image.height // height) * image.width * c
        base = y * width * c
        for x, sx in enumerate(cols):
            out[base + x * c:base + x * c + c] = src[row + sx:row + sx + c]
    return Image(height, width, c, bytes(out))


def write_png(image: Image) -> bytes:
    """An 8-bit PNG of the image (filter 0 rows), for tests and round trips."""
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[image.channels]
    stride = image.width * image.channels
    raw = b"".join(b"\x00" + image.pixels[y * stride:(y + 1) * stride] for y in range(image.height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (_PNG_SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", image.width, image.height, 8, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def write_ppm(image: Image) -> bytes:
    """A binary PPM (3 channels) or PGM (1 channel)."""
    magic = {3: b"P6", 1: b"P5"}[image.channels]
    return magic + f"\n{image.width} {image.height}\n255\n".encode() + image.pixels
