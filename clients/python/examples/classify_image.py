#!/usr/bin/env python3
"""Classify one image with a reefline model IF and print its top-k classes.

    classify_image.py --address 198.18.0.2 --port 9100 --shape 224x224x3 photo.png

Reads a PNG (8-bit gray, gray+alpha, RGB or RGBA, non-interlaced) or a binary PPM/PGM,
converts it to the IF's channels, resizes it to the IF's input (nearest neighbour; `reefctl
describe NAME` shows the input's shape), sends it as an image_u8_hwc request and prints the
answer: the top-k classes best first, or a tensor's dims and first values (an IF with
--output tensor), or the crc32 IF's checksum (compared with our own), or the IF's error.

Exit status: 0 answered, 1 an error answer or no answer, 2 bad usage or an unreadable image.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import reefline  # noqa: E402
from reefline import images  # noqa: E402


def parse_shape(text):
    try:
        h, w, c = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxWxC, got {text!r}")
    if not (1 <= h <= 65535 and 1 <= w <= 65535 and c in (1, 3)):
        raise argparse.ArgumentTypeError(f"extents 1..65535 and 1 or 3 channels, got {text!r}")
    return h, w, c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image", help="PNG, PPM (P6) or PGM (P5) file")
    ap.add_argument("--address", required=True, help="the appliance's IPv4 address")
    ap.add_argument("--port", type=int, required=True, help="the IF's UDP port")
    ap.add_argument("--shape", type=parse_shape, default=(224, 224, 3),
                    help="the IF's input HxWxC (default 224x224x3)")
    ap.add_argument("--top", type=int, default=5, help="classes to print (at most what the IF answers)")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the answer")
    ap.add_argument("--retries", type=int, default=2, help="resends of an unanswered request")
    ap.add_argument("--fragment-size", type=int, default=reefline.MTU_FRAGMENT_SIZE)
    args = ap.parse_args(argv)

    try:
        img = images.read_image(args.image)
    except (OSError, images.ImageError) as e:
        print(f"classify_image: {args.image}: {e}", file=sys.stderr)
        return 2
    h, w, c = args.shape
    img = images.resize_nearest(images.to_channels(img, c), h, w)

    try:
        with reefline.Client(args.address, args.port, fragment_size=args.fragment_size,
                             retries=args.retries, retry_timeout=max(args.timeout / (args.retries + 1), 0.05)) as client:
            answer = client.request_image(img.pixels, h, w, c, timeout=args.timeout)
    except reefline.RequestTimeout as e:
        print(f"classify_image: {e}", file=sys.stderr)
        return 1
    except (OSError, reefline.ProtocolError) as e:
        print(f"classify_image: {e}", file=sys.stderr)
        return 2

    if answer.is_error:
        print(f"error {answer.status_name}: {answer.error_message}")
        return 1
    try:
        if answer.format == reefline.Format.RESULT_TOPK:
            for rank, (cls, score) in enumerate(answer.topk()[:args.top], 1):
                print(f"{rank}. class {cls} score {score:.6f}")
        elif answer.format == reefline.Format.RESULT_TENSOR_F32:
            dims, values = answer.tensor()
            shown = " ".join(f"{v:.6g}" for v in values[:8])
            print(f"tensor {'x'.join(map(str, dims))}: {shown}{' ...' if len(values) > 8 else ''}")
        elif answer.format == reefline.Format.RESULT_CRC32:
            length, crc = answer.crc32()
            ok = length == len(img.pixels) and crc == reefline.crc32c(img.pixels)
            print(f"crc32c {crc:08x} over {length} bytes {'[matches]' if ok else '[WRONG]'}")
            return 0 if ok else 1
        else:
            print(answer.describe())
    except reefline.MalformedResult as e:
        print(f"classify_image: malformed answer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
