#include "tools/reefgen/payload.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "tools/reefgen/packet.h"

namespace reefline::reefgen {
namespace {

// RNG streams of the newer generators: request n draws from stream tag + n. The tags sit far
// above the older 0x1000 + n style, so no two draws share a stream for any n below 2^48.
constexpr uint64_t stream_tensor_wave = uint64_t(1) << 48;
constexpr uint64_t stream_tensor_noise = uint64_t(2) << 48;
constexpr uint64_t stream_token_length = uint64_t(3) << 48;

std::vector<uint8_t> read_file(const std::string& path, const char* what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw usage_error(std::string(what) + ": cannot open '" + path + "'");
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    if (in.bad()) throw usage_error(std::string(what) + ": cannot read '" + path + "'");
    return bytes;
}

void check_total(uint64_t total, const std::string& what) {
    if (total == 0) throw usage_error(what + ": empty payload");
    if (total > wire::max_total_length)
        throw usage_error(what + ": payload of " + std::to_string(total) +
                          " bytes exceeds the protocol limit of " +
                          std::to_string(wire::max_total_length));
}

// Synthetic u8 HWC image: per-channel gradients (so a viewer shows structure and a model sees
// something image-like), shifted per request, plus a little noise so no two requests are equal.
void fill_image(std::vector<uint8_t>& out, const image_shape& s, uint64_t seed, uint64_t n) {
    rng noise(seed, 0x1000 + n);
    const uint32_t h1 = std::max<uint32_t>(s.height - 1, 1);
    const uint32_t w1 = std::max<uint32_t>(s.width - 1, 1);
    const uint32_t d1 = std::max<uint32_t>(s.height + s.width - 2, 1);
    const uint32_t shift = static_cast<uint32_t>((n * 37) & 0xff);
    size_t i = 0;
    for (uint32_t y = 0; y < s.height; ++y)
        for (uint32_t x = 0; x < s.width; ++x)
            for (uint32_t c = 0; c < s.channels; ++c) {
                uint32_t base;
                switch (c % 3) {
                case 0: base = x * 255 / w1; break;
                case 1: base = y * 255 / h1; break;
                default: base = (x + y) * 255 / d1; break;
                }
                const uint32_t jitter = static_cast<uint32_t>(noise.next() >> 60);  // 0..15
                out[i++] = static_cast<uint8_t>(base + shift + jitter - 8);
            }
}

void fill_random(std::vector<uint8_t>& out, uint64_t seed, uint64_t n) {
    rng r(seed, 0x2000 + n);
    size_t i = 0;
    for (; i + 8 <= out.size(); i += 8) {
        const uint64_t v = r.next();
        std::memcpy(out.data() + i, &v, 8);
    }
    const uint64_t v = r.next();
    std::memcpy(out.data() + i, &v, out.size() - i);
}

void fill_tokens(std::vector<uint8_t>& out, uint32_t vocab, uint64_t seed, uint64_t n) {
    rng r(seed, 0x3000 + n);
    for (size_t i = 0; i + 4 <= out.size(); i += 4)
        store_token(out.data() + i, static_cast<int32_t>(r.below(vocab)));
}

// Synthetic f32 tensor that looks like a window of standardised sensor readings: the last
// extent is the channels, the others (flattened) are time. Each channel of each request is
// an offset plus a slow and a fast sine of its own amplitude, frequency and phase, plus a
// little noise: values O(1), so a model trained on N(0, 1) features sees plausible input, and
// no two requests are alike.
void fill_tensor(std::vector<uint8_t>& out, const std::vector<uint16_t>& dims, uint64_t seed, uint64_t n) {
    constexpr double two_pi = 6.283185307179586;
    const size_t channels = dims.back();
    const size_t steps = out.size() / 4 / channels;
    struct wave {
        double offset, a1, f1, p1, a2, f2, p2;
    };
    rng shape(seed, stream_tensor_wave + n);
    std::vector<wave> waves(channels);
    for (wave& w : waves) {
        w.offset = 0.4 * shape.uniform() - 0.2;
        w.a1 = 0.5 + 0.5 * shape.uniform();
        w.f1 = 0.5 + 3.5 * shape.uniform();  // cycles per window
        w.p1 = two_pi * shape.uniform();
        w.a2 = 0.1 + 0.3 * shape.uniform();
        w.f2 = 4 + 8 * shape.uniform();
        w.p2 = two_pi * shape.uniform();
    }
    rng noise(seed, stream_tensor_noise + n);
    const double span = double(std::max<size_t>(steps, 1));
    size_t i = 0;
    for (size_t t = 0; t < steps; ++t)
        for (size_t c = 0; c < channels; ++c, i += 4) {
            const wave& w = waves[c];
            const double x = double(t) / span;
            const double v = w.offset + w.a1 * portable_sin(two_pi * w.f1 * x + w.p1) +
                             w.a2 * portable_sin(two_pi * w.f2 * x + w.p2) + 0.1 * (noise.uniform() - 0.5);
            store_f32(out.data() + i, float(v));
        }
}

// Netpbm header tokens are separated by whitespace, with '#' comments to end of line.
std::string next_netpbm_token(const std::vector<uint8_t>& b, size_t& pos) {
    for (;;) {
        while (pos < b.size() && std::isspace(b[pos])) ++pos;
        if (pos < b.size() && b[pos] == '#') {
            while (pos < b.size() && b[pos] != '\n') ++pos;
            continue;
        }
        break;
    }
    std::string t;
    while (pos < b.size() && !std::isspace(b[pos]) && b[pos] != '#') t += char(b[pos++]);
    return t;
}

}  // namespace

void store_token(uint8_t* out, int32_t token) { reefline_encode_i32(&token, 1, out); }

int32_t load_token(const uint8_t* in) {
    int32_t v;
    reefline_decode_i32(in, 1, &v);
    return v;
}

void store_f32(uint8_t* out, float v) { reefline_encode_f32(&v, 1, out); }

float load_f32(const uint8_t* in) {
    float v;
    reefline_decode_f32(in, 1, &v);
    return v;
}

double portable_sin(double x) {
    constexpr double two_pi = 6.283185307179586, pi = 3.141592653589793, half_pi = 1.5707963267948966;
    if (!std::isfinite(x)) return NAN;
    // To [-pi, pi], then by symmetry to [-pi/2, pi/2]; std::round and IEEE division, subtraction
    // and multiplication are exactly specified, so this reduction is the same everywhere.
    x -= two_pi * std::round(x / two_pi);
    if (x > half_pi) x = pi - x;
    else if (x < -half_pi) x = -pi - x;
    // Taylor series to x^17: below 1e-13 of error on [-pi/2, pi/2].
    const double x2 = x * x;
    double p = 1.0 / 355687428096000.0;
    for (const double c : {-1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0,
                           -1.0 / 6.0, 1.0})
        p = p * x2 + c;
    return x * p;
}

request_payload read_netpbm(const std::string& path) {
    const std::vector<uint8_t> b = read_file(path, "--image");
    size_t pos = 0;
    const std::string magic = next_netpbm_token(b, pos);
    if (magic != "P6" && magic != "P5")
        throw usage_error("--image: '" + path + "' is not a binary PPM (P6) or PGM (P5) file");
    uint32_t v[3];
    for (auto& x : v) {
        const std::string t = next_netpbm_token(b, pos);
        if (t.empty() || t.size() > 9 || !std::all_of(t.begin(), t.end(), ::isdigit))
            throw usage_error("--image: '" + path + "': malformed header");
        x = static_cast<uint32_t>(std::stoul(t));
    }
    const uint32_t width = v[0], height = v[1], maxval = v[2];
    if (width == 0 || height == 0 || width > 65535 || height > 65535)
        throw usage_error("--image: '" + path + "': dimensions must be 1..65535");
    if (maxval == 0 || maxval > 255)
        throw usage_error("--image: '" + path + "': only 8-bit images (maxval <= 255)");
    // Exactly one whitespace byte separates the header from the raster.
    if (pos >= b.size() || !std::isspace(b[pos]))
        throw usage_error("--image: '" + path + "': malformed header");
    ++pos;
    const uint32_t channels = magic == "P6" ? 3 : 1;
    const uint64_t size = uint64_t(width) * height * channels;
    check_total(size, "--image '" + path + "'");
    if (b.size() - pos < size)
        throw usage_error("--image: '" + path + "': truncated raster (" +
                          std::to_string(b.size() - pos) + " of " + std::to_string(size) +
                          " bytes)");
    request_payload p;
    p.format = wire::format::image_u8_hwc;
    p.dims[0] = uint16_t(height);
    p.dims[1] = uint16_t(width);
    p.dims[2] = uint16_t(channels);
    p.bytes.assign(b.begin() + pos, b.begin() + pos + size);
    return p;
}

payload_source::payload_source(const payload_options& o) : _options(o), _format(o.format) {
    if (!o.image_file.empty()) {
        if (_format != wire::format::image_u8_hwc)
            throw usage_error("--image: only with --format image");
        request_payload p = read_netpbm(o.image_file);
        std::copy(std::begin(p.dims), std::end(p.dims), _dims);
        _total_length = _min_total_length = static_cast<uint32_t>(p.bytes.size());
        _file_bytes = std::move(p.bytes);
        return;
    }
    if (!o.raw_file.empty()) _file_bytes = read_file(o.raw_file, "--raw");
    uint64_t total = 0, least = 0;
    std::string what = _file_bytes ? "--raw '" + o.raw_file + "'" : std::string("--shape");
    switch (_format) {
    case wire::format::image_u8_hwc:
        _dims[0] = o.shape.height;
        _dims[1] = o.shape.width;
        _dims[2] = o.shape.channels;
        total = o.shape.bytes();
        if (_file_bytes && _file_bytes->size() != total)
            throw usage_error("--raw: '" + o.raw_file + "' has " +
                              std::to_string(_file_bytes->size()) + " bytes, --shape needs " +
                              std::to_string(total));
        break;
    case wire::format::tokens_i32: {
        uint64_t count = o.tokens;
        const uint64_t most = std::max(o.tokens, o.tokens_max);
        if (o.tokens_max != 0 && o.tokens_max < o.tokens)
            throw usage_error("--tokens MIN-MAX: MAX (" + std::to_string(o.tokens_max) + ") is below MIN (" +
                              std::to_string(o.tokens) + ")");
        if (_file_bytes) {
            if (most != count)
                throw usage_error("--raw: a file has one length; --tokens MIN-MAX needs synthetic tokens");
            if (_file_bytes->size() % 4 != 0)
                throw usage_error("--raw: '" + o.raw_file +
                                  "' is not a whole number of i32 tokens");
            if (count != 0 && count * 4 != _file_bytes->size())
                throw usage_error("--raw: '" + o.raw_file + "' does not hold --tokens " +
                                  std::to_string(count) + " tokens");
            count = _file_bytes->size() / 4;
        }
        if (count == 0) throw usage_error("--format tokens needs --tokens L or MIN-MAX (L > 0)");
        if (std::max(count, most) > 65535) throw usage_error("--tokens: at most 65535 (dims are 16 bits)");
        if (o.vocab == 0 || o.vocab > uint32_t(INT32_MAX))
            throw usage_error("--vocab: must be 1..2147483647");
        _tokens_min = static_cast<uint32_t>(count);
        _tokens_max = static_cast<uint32_t>(std::max(count, most));
        _dims[0] = static_cast<uint16_t>(_tokens_max);
        total = uint64_t(_tokens_max) * 4;
        least = uint64_t(_tokens_min) * 4;
        if (!_file_bytes) what = "--tokens";
        break;
    }
    case wire::format::tensor_f32: {
        if (o.dims.empty() || o.dims.size() > 4)
            throw usage_error("--format tensor needs --dims D1[,D2[,D3[,D4]]] (1 to 4 extents)");
        total = 4;
        for (size_t d = 0; d < o.dims.size(); ++d) {
            if (o.dims[d] == 0) throw usage_error("--dims: extents must be 1..65535");
            _dims[d] = o.dims[d];
            total *= o.dims[d];
        }
        if (_file_bytes && _file_bytes->size() != total)
            throw usage_error("--raw: '" + o.raw_file + "' has " + std::to_string(_file_bytes->size()) +
                              " bytes, --dims needs " + std::to_string(total) + " (4 bytes per f32)");
        if (!_file_bytes) what = "--dims";
        break;
    }
    case wire::format::raw: total = _file_bytes ? _file_bytes->size() : o.shape.bytes(); break;
    default: throw usage_error("unsupported request format");
    }
    check_total(total, what);
    _total_length = static_cast<uint32_t>(total);
    _min_total_length = least ? static_cast<uint32_t>(least) : _total_length;
}

uint32_t payload_source::tokens_of(uint64_t n) const {
    if (_tokens_max == _tokens_min) return _tokens_max;
    // Its own stream: the length of request n depends on (seed, n) alone.
    rng r(_options.seed, stream_token_length + n);
    return _tokens_min + static_cast<uint32_t>(r.below(uint64_t(_tokens_max - _tokens_min) + 1));
}

request_payload payload_source::make(uint64_t n) const {
    request_payload p;
    p.format = _format;
    std::copy(std::begin(_dims), std::end(_dims), p.dims);
    if (_file_bytes) {
        p.bytes = *_file_bytes;
        return p;
    }
    p.bytes.resize(_total_length);
    switch (_format) {
    case wire::format::image_u8_hwc: fill_image(p.bytes, _options.shape, _options.seed, n); break;
    case wire::format::tokens_i32: {
        const uint32_t count = tokens_of(n);
        p.dims[0] = static_cast<uint16_t>(count);
        p.bytes.resize(size_t(count) * 4);
        fill_tokens(p.bytes, _options.vocab, _options.seed, n);
        break;
    }
    case wire::format::tensor_f32: fill_tensor(p.bytes, _options.dims, _options.seed, n); break;
    default: fill_random(p.bytes, _options.seed, n); break;
    }
    return p;
}

void check_fragment_plan(uint64_t total, uint32_t frag_size) {
    check_total(total, "request");
    uint32_t count = 0;
    switch (reefline_fragment_count(total, frag_size, &count)) {
    case REEFLINE_OK: return;
    case REEFLINE_E_INVALID_ARGUMENT:
        throw usage_error("--frag-size: must be 1.." + std::to_string(max_frag_size));
    default:
        throw usage_error("--frag-size " + std::to_string(frag_size) + " cuts a " +
                          std::to_string(total) + "-byte request into " + std::to_string(count) +
                          " fragments; the protocol allows " + std::to_string(wire::max_fragments) +
                          " (use a larger --frag-size)");
    }
}

std::vector<wire::fields> plan_fragments(const request_payload& payload, uint64_t request_id,
                                         uint32_t frag_size) {
    const uint64_t total = payload.bytes.size();
    check_fragment_plan(total, frag_size);
    uint32_t count = 0;
    reefline_fragment_count(total, frag_size, &count);
    std::vector<wire::fields> out(count);
    for (uint32_t i = 0; i < count; ++i) {
        reefline_header h;
        if (reefline_request_fragment_header(int(payload.format), payload.dims, total, request_id, frag_size, i, &h) !=
            REEFLINE_OK)
            throw usage_error(std::string("request: ") + reefline_last_error());
        out[i] = from_client(h);
    }
    return out;
}

uint32_t fragment_length(const wire::fields& f, uint32_t frag_size) {
    const reefline_header h = to_client(f);
    return reefline_fragment_length(&h, frag_size);
}

}  // namespace reefline::reefgen
