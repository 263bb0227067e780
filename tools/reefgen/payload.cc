#include "tools/reefgen/payload.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>

namespace reefline::reefgen {
namespace {

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

void store_token(uint8_t* out, int32_t token) {
    const uint32_t v = static_cast<uint32_t>(token);
    out[0] = uint8_t(v);
    out[1] = uint8_t(v >> 8);
    out[2] = uint8_t(v >> 16);
    out[3] = uint8_t(v >> 24);
}

int32_t load_token(const uint8_t* in) {
    return static_cast<int32_t>(uint32_t(in[0]) | uint32_t(in[1]) << 8 | uint32_t(in[2]) << 16 |
                                uint32_t(in[3]) << 24);
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
        _total_length = static_cast<uint32_t>(p.bytes.size());
        _file_bytes = std::move(p.bytes);
        return;
    }
    if (!o.raw_file.empty()) _file_bytes = read_file(o.raw_file, "--raw");
    uint64_t total = 0;
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
        if (_file_bytes) {
            if (_file_bytes->size() % 4 != 0)
                throw usage_error("--raw: '" + o.raw_file +
                                  "' is not a whole number of i32 tokens");
            if (count != 0 && count * 4 != _file_bytes->size())
                throw usage_error("--raw: '" + o.raw_file + "' does not hold --tokens " +
                                  std::to_string(count) + " tokens");
            count = _file_bytes->size() / 4;
        }
        if (count == 0) throw usage_error("--format tokens needs --tokens L (L > 0)");
        if (count > 65535) throw usage_error("--tokens: at most 65535 (dims are 16 bits)");
        if (o.vocab == 0 || o.vocab > uint32_t(INT32_MAX))
            throw usage_error("--vocab: must be 1..2147483647");
        _dims[0] = static_cast<uint16_t>(count);
        total = count * 4;
        break;
    }
    case wire::format::raw: total = _file_bytes ? _file_bytes->size() : o.shape.bytes(); break;
    default: throw usage_error("unsupported request format");
    }
    check_total(total, _file_bytes                           ? "--raw '" + o.raw_file + "'"
                       : _format == wire::format::tokens_i32 ? std::string("--tokens")
                                                             : std::string("--shape"));
    _total_length = static_cast<uint32_t>(total);
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
    case wire::format::tokens_i32: fill_tokens(p.bytes, _options.vocab, _options.seed, n); break;
    default: fill_random(p.bytes, _options.seed, n); break;
    }
    return p;
}

std::vector<wire::fields> plan_fragments(const request_payload& payload, uint64_t request_id,
                                         uint32_t frag_size) {
    const uint64_t total = payload.bytes.size();
    check_total(total, "request");
    if (frag_size == 0 || frag_size > max_frag_size)
        throw usage_error("--frag-size: must be 1.." + std::to_string(max_frag_size));
    const uint64_t count = (total + frag_size - 1) / frag_size;
    if (count > wire::max_fragments)
        throw usage_error("--frag-size " + std::to_string(frag_size) + " cuts a " +
                          std::to_string(total) + "-byte request into " + std::to_string(count) +
                          " fragments; the protocol allows " + std::to_string(wire::max_fragments) +
                          " (use a larger --frag-size)");
    std::vector<wire::fields> out(count);
    for (uint64_t i = 0; i < count; ++i) {
        wire::fields& f = out[i];
        f.kind = static_cast<uint8_t>(wire::kind::request);
        f.format = static_cast<uint8_t>(payload.format);
        f.request_id = request_id;
        f.frag_index = static_cast<uint16_t>(i);
        f.frag_count = static_cast<uint16_t>(count);
        f.payload_offset = static_cast<uint32_t>(i * frag_size);
        f.total_length = static_cast<uint32_t>(total);
        std::copy(std::begin(payload.dims), std::end(payload.dims), f.dims);
    }
    return out;
}

}  // namespace reefline::reefgen
