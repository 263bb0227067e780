#!/usr/bin/env bash
# The Python client (clients/python, package `reefline`):
#  1. its unit tests: codec (header bytes, fragments equal to reefgen's captures and, with
#     REEFLINE_CLIENT_LIB set, to the C library's bytes; hostile response bytes), images (PNG,
#     PPM), the client against a loopback responder (retries, timeouts, pacing, bounds);
#  2. `pip install` of the package into a scratch directory, and its import from there;
#  3. against the real daemon in a network namespace "camera" joined by a veth pair (as
#     tests/live_test.sh): reefline on net_af_packet with the crc32 IF and three model IFs
#     from the tiny zoo (an image classifier, a token sequence model, a sensor model answering
#     tensors); Python sends images, tokens, tensors and raw bytes from the namespace, checks
#     every crc32 answer against its own CRC32C, that top-k and tensor answers are well formed,
#     that bad requests get errors naming the problem, and runs examples/classify_image.py on a
#     PNG and a PPM. Part 3 needs root (namespaces); without it the test skips (77) after 1-2.
# Arguments: reefgen, reefline, zoo binaries. PYTHON overrides the interpreter.
set -euo pipefail
reefgen=$1
reefline=$2
zoo=$3
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree
tmp=$(mktemp -d)
ns=reefpy$$
host_if=rph$$
cam_if=rpc$$
pid=
netns_made=
source "$root/scripts/lib/camera-netns.sh"
cleanup() {
  [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  [ -n "$netns_made" ] && camera_netns_down "$ns" "$host_if"
  rm -rf "$tmp"
}
trap cleanup EXIT

# 1. Unit tests.
REEFGEN="$reefgen" "$py" -m unittest discover -s "$root/clients/python/tests" -t "$root/clients/python/tests" \
  || { echo "FAIL: python unit tests"; exit 1; }

# 2. Installable with pip (no network: the system's setuptools builds it). From a copy: the
# build writes build/ and *.egg-info beside the sources, which may not be writable.
if "$py" -m pip --version >/dev/null 2>&1 && "$py" -c "import setuptools" 2>/dev/null; then
  cp -r "$root/clients/python" "$tmp/src"
  "$py" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$tmp/site" \
    "$tmp/src" > "$tmp/pip.txt" 2>&1 || { cat "$tmp/pip.txt"; echo "FAIL: pip install"; exit 1; }
  (cd "$tmp" && PYTHONPATH="$tmp/site" "$py" -c '
import os, sys, reefline
assert reefline.__file__.startswith(os.path.join(sys.argv[1], "site")), reefline.__file__
assert reefline.crc32c(b"123456789") == 0xE3069283
print("pip install: ok,", reefline.__file__)' "$tmp") || { echo "FAIL: import after pip install"; exit 1; }
else
  echo "pip install: not checked (no pip or setuptools for $py)"
fi

# 3. The real daemon.
[ "$(id -u)" -eq 0 ] || { echo "skip: the live part needs root"; exit 77; }
command -v ip >/dev/null || { echo "skip: needs iproute2"; exit 77; }
camera_netns_up "$ns" "$host_if" "$cam_if" || { echo "skip: cannot create network namespaces here"; exit 77; }
netns_made=1

"$zoo" --out "$tmp/zoo" --tiny --only resnet50_tiny,distilbert_tiny,sensor_tcn_tiny -q
"$reefline" --eal "-l 0 --no-pci --no-shconf --no-huge -m 512 --no-telemetry --log-level lib.eal:error --vdev=net_af_packet0,iface=$host_if,framecnt=16384" \
  --control "ipc://$tmp/control.sock" --repo "$tmp/repo" --metrics off --ip 198.18.0.2 --age-ms 500 \
  --builtin crc32:9000 \
  --model "cam:9100:$tmp/zoo/resnet50_tiny.onnx:rt:1000" \
  --model "text:9300:$tmp/zoo/distilbert_tiny.onnx:be:1000" \
  --model "imu:9400:$tmp/zoo/sensor_tcn_tiny.onnx:be:1000:tensor" \
  > "$tmp/reefline.out" 2> "$tmp/reefline.err" &
pid=$!
for _ in $(seq 300); do
  grep -q "reefline: serving" "$tmp/reefline.err" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/reefline.err"; echo "FAIL: reefline did not start"; exit 1; }
  sleep 0.1
done
grep -q "reefline: serving" "$tmp/reefline.err" || { cat "$tmp/reefline.err"; echo "FAIL: reefline did not start within 30 s"; exit 1; }

cat > "$tmp/live.py" <<'PY'
import math, os, re, subprocess, sys
root, tmp = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "clients", "python"))
import reefline
from reefline import images

APPLIANCE, CAMERA = "198.18.0.2", "198.18.0.1"

def client(port, **kw):
    kw.setdefault("retries", 3)
    kw.setdefault("retry_timeout", 0.5)
    return reefline.Client(APPLIANCE, port, bind_address=CAMERA, **kw)

def pattern(n, seed):
    return bytes(((i * 31) ^ (i >> 7) ^ seed) & 0xFF for i in range(n))

def well_formed_topk(answer, what):
    answer.validate()
    top = answer.topk()
    assert top, what
    scores = [s for _, s in top]
    assert all(math.isfinite(s) for s in scores), (what, top)
    assert scores == sorted(scores, reverse=True), (what, top)
    assert all(c >= 0 for c, _ in top), (what, top)
    return top

# The crc32 IF: every answer is checkable against our own CRC32C.
with client(9000, fragment_size=1024) as c:
    img = pattern(224 * 224 * 3, 1)
    a = c.request_image(img, 224, 224, 3, timeout=5)  # 147 fragments
    assert a.crc32() == (len(img), reefline.crc32c(img)), a.describe()
    a = c.request_tokens(list(range(100)), timeout=5)
    assert a.crc32() == (400, reefline.crc32c(reefline.encode_i32(range(100))))
    values = [math.sin(i / 10) for i in range(64 * 6)]
    a = c.request_tensor(values, (64, 6), timeout=5)
    assert a.crc32() == (64 * 6 * 4, reefline.crc32c(reefline.encode_f32(values)))
    a = c.request_raw(b"x", timeout=5)
    assert a.crc32() == (1, reefline.crc32c(b"x"))
with client(9000, pace_packets_per_s=20000) as c:
    # Pipelined and paced: 40 requests of 3 fragments, collected in any order.
    sent = {}
    for i in range(40):
        data = pattern(3000 + i, i)
        sent[c.send_raw(data)] = data
    for _ in range(40):
        a = c.receive(timeout=5)
        data = sent.pop(a.request_id)
        assert a.crc32() == (len(data), reefline.crc32c(data)), a.describe()
    assert not sent and c.outstanding == 0
    print("crc32 IF: ok,", c.stats)

# The image classifier: its input's shape from the error a wrong one gets.
with client(9100) as c:
    a = c.request_image(b"\0\0\0", 1, 1, 3, timeout=5)
    assert a.is_error and a.status_name == "bad_request", a.describe()
    m = re.search(r"expected a (\d+)x(\d+)x(\d+) image, got 1x1x3", a.error_message)
    assert m, a.error_message
    h, w, ch = map(int, m.groups())
    print(f"cam: error for a 1x1x3 image: '{a.error_message}'")
    for seed in range(3):
        top = well_formed_topk(c.request_image(pattern(h * w * ch, seed), h, w, ch, timeout=5), "cam")
    print(f"cam: {h}x{w}x{ch} images -> {len(top)} classes, e.g. {top[:2]}")
    a = c.request_tokens([1, 2, 3], timeout=5)
    assert a.is_error and a.status_name == "unsupported_format", a.describe()

# examples/classify_image.py on a PNG and a PPM (another size: the example resizes them).
img = images.Image(50, 70, 3, pattern(50 * 70 * 3, 7))
for name, data in (("cat.png", images.write_png(img)), ("cat.ppm", images.write_ppm(img))):
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(data)
    out = subprocess.run([sys.executable, os.path.join(root, "clients/python/examples/classify_image.py"),
                          "--address", APPLIANCE, "--port", "9100", "--shape", f"{h}x{w}x{ch}", "--top", "3",
                          path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    lines = out.stdout.strip().splitlines()
    assert 1 <= len(lines) <= 3, out.stdout
    scores = []
    for i, line in enumerate(lines, 1):
        m = re.fullmatch(rf"{i}\. class (\d+) score (\S+)", line)
        assert m, line
        scores.append(float(m.group(2)))
    assert scores == sorted(scores, reverse=True), out.stdout
    print(f"classify_image.py {name}: {lines[0]}")

# The sequence model: tokens answered with a top-k; an id outside the vocabulary an error.
with client(9300) as c:
    top = well_formed_topk(c.request_tokens([5, 17, 99, 3, 250, 7, 1, 2], timeout=5), "text")
    print(f"text: 8 tokens -> {top[:2]}")
    a = c.request_tokens([1, 2, 3, 4, 5000], timeout=5)
    assert a.is_error and a.status_name == "bad_request", a.describe()
    assert "token 5000 at position 4" in a.error_message, a.error_message
    print(f"text: error '{a.error_message}'")

# The sensor model answers tensors; its input's dims from the error a wrong one gets.
with client(9400) as c:
    a = c.request_tensor([0.0], (1,), timeout=5)
    assert a.is_error, a.describe()
    m = re.search(r"expected a tensor of dims ([\dx]+), got 1", a.error_message)
    assert m, a.error_message
    dims = tuple(int(x) for x in m.group(1).split("x"))
    n = math.prod(dims)
    a = c.request_tensor([math.sin(i * 0.1) for i in range(n)], dims, timeout=5)
    a.validate()
    out_dims, values = a.tensor()
    assert out_dims and len(values) == math.prod(out_dims), (out_dims, len(values))
    assert all(math.isfinite(v) for v in values)
    print(f"imu: {'x'.join(map(str, dims))} in -> tensor {'x'.join(map(str, out_dims))} out")
print("live: ok")
PY
ip netns exec "$ns" "$py" "$tmp/live.py" "$root" "$tmp" || { tail -n 30 "$tmp/reefline.err"; echo "FAIL: python client against reefline"; exit 1; }

kill -INT "$pid"
wait "$pid" || { cat "$tmp/reefline.err"; echo "FAIL: reefline exit status"; exit 1; }
pid=
"$py" - "$(tail -n 1 "$tmp/reefline.out")" <<'PY'
import json, sys
c = json.loads(sys.argv[1])
assert c["mbufs_in_use_at_exit"] == 0, "mbufs leaked"
assert c["drop_bad_header"] == 0 and c["drop_dims_mismatch"] == 0 and c["drop_offset_out_of_range"] == 0, c
PY
echo "python client: ok"
