"""reefline.images: PNG decoding (every colour type the module takes, every row filter),
netpbm, channel conversion, resizing, and refusals of what it does not take."""

import os
import struct
import sys
import tempfile
import unittest
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reefline import images  # noqa: E402


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def png_with_filters(img, filters, colour, interlace=0, depth=8):
    """A PNG whose row y uses filter filters[y % len]: an encoder independent of the module's."""
    c = img.channels
    stride = img.width * c
    rows, prev = [], bytes(stride)
    for y in range(img.height):
        line = img.pixels[y * stride:(y + 1) * stride]
        f = filters[y % len(filters)]
        out = bytearray()
        for i, x in enumerate(line):
            left = line[i - c] if i >= c else 0
            up = prev[i]
            up_left = prev[i - c] if i >= c else 0
            pred = (0, left, up, (left + up) >> 1, paeth(left, up, up_left))[f]
            out.append((x - pred) & 0xFF)
        rows.append(bytes([f]) + bytes(out))
        prev = line

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", img.width, img.height, depth, colour, 0, 0, interlace)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"tEXt", b"Comment\0test")
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


def pattern(h, w, c):
    return images.Image(h, w, c, bytes(((y * 37 + x * 11 + k * 101) ^ (x * y)) & 0xFF
                                        for y in range(h) for x in range(w) for k in range(c)))


class Png(unittest.TestCase):
    def test_every_colour_type_and_filter(self):
        for channels, colour in ((1, 0), (2, 4), (3, 2), (4, 6)):
            img = pattern(9, 13, channels)
            data = png_with_filters(img, [0, 1, 2, 3, 4], colour)
            got = images.read_png(data)
            self.assertEqual((got.height, got.width, got.channels), (9, 13, channels))
            self.assertEqual(got.pixels, img.pixels, f"colour type {colour}")
            self.assertEqual(images.read_png(images.write_png(img)).pixels, img.pixels)

    def test_refusals(self):
        img = pattern(4, 4, 3)
        good = png_with_filters(img, [0], 2)
        for data, why in ((b"GIF89a", "not a PNG"), (png_with_filters(img, [0], 2, interlace=1), "interlaced"),
                          (png_with_filters(img, [0], 3), "colour type 3"), (good[:60], "truncated"),
                          (good[:17] + bytes([good[17] ^ 1]) + good[18:], "bad CRC")):
            with self.assertRaises(images.ImageError, msg=why):
                images.read_png(data)
        sixteen = bytearray(good)
        sixteen[24] = 16  # bit depth (CRC then wrong too: either refusal will do)
        with self.assertRaises(images.ImageError):
            images.read_png(bytes(sixteen))


class Netpbm(unittest.TestCase):
    def test_ppm_pgm_and_files(self):
        img = pattern(5, 7, 3)
        self.assertEqual(images.read_netpbm(images.write_ppm(img)).pixels, img.pixels)
        gray = pattern(5, 7, 1)
        commented = b"P5\n# made by hand\n7 5\n255\n" + gray.pixels
        got = images.read_netpbm(commented)
        self.assertEqual((got.height, got.width, got.channels, got.pixels), (5, 7, 1, gray.pixels))
        with self.assertRaises(images.ImageError):
            images.read_netpbm(b"P6\n7 5\n65535\n" + bytes(10))
        with self.assertRaises(images.ImageError):
            images.read_netpbm(b"P6\n7 5\n255\n" + bytes(10))
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in (("a.png", images.write_png(img)), ("a.ppm", images.write_ppm(img))):
                path = os.path.join(tmp, name)
                with open(path, "wb") as f:
                    f.write(data)
                self.assertEqual(images.read_image(path).pixels, img.pixels)


class Conversion(unittest.TestCase):
    def test_channels_and_resize(self):
        rgba = images.Image(1, 2, 4, bytes([10, 20, 30, 99, 40, 50, 60, 98]))
        self.assertEqual(images.to_channels(rgba, 3).pixels, bytes([10, 20, 30, 40, 50, 60]))
        self.assertEqual(images.to_channels(rgba, 1).pixels, bytes([20, 50]))
        gray = images.Image(1, 2, 1, bytes([7, 9]))
        self.assertEqual(images.to_channels(gray, 3).pixels, bytes([7, 7, 7, 9, 9, 9]))
        ga = images.Image(1, 1, 2, bytes([7, 200]))
        self.assertEqual(images.to_channels(ga, 4).pixels, bytes([7, 7, 7, 200]))
        img = pattern(4, 6, 3)
        up = images.resize_nearest(img, 8, 12)
        self.assertEqual((up.height, up.width, len(up.pixels)), (8, 12, 8 * 12 * 3))
        self.assertEqual(up.pixels[:3], img.pixels[:3])
        self.assertEqual(images.resize_nearest(up, 4, 6).pixels, img.pixels)
        self.assertEqual(images.resize_nearest(img, 4, 6).pixels, img.pixels)


if __name__ == "__main__":
    unittest.main()
