// reefgen: pcap generation (checksums, reassembly, determinism, shuffle/drop/dup/corrupt),
// the response checker, and live sending against an in-test UDP responder on loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pcap/pcap.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "clients/c/wire/crc32c.h"
#include "clients/c/wire/protocol.h"
#include "tools/reefgen/check.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/pcap_file.h"
#include "tools/reefgen/send.h"

namespace fs = std::filesystem;
using namespace reefline;
using namespace reefline::reefgen;

namespace {

// A scratch directory removed at the end of each test.
class temp_dir {
public:
    temp_dir() {
        std::string tmpl = (fs::temp_directory_path() / "reefgen_test.XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        _path = tmpl;
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(_path, ec);
    }
    std::string file(const std::string& name) const { return (_path / name).string(); }

private:
    fs::path _path;
};

pcap_options small_options(const std::string& out, uint64_t requests) {
    pcap_options o;
    o.out = out;
    o.requests = requests;
    o.frag_size = 100;
    o.payload.format = wire::format::image_u8_hwc;
    o.payload.shape = image_shape{16, 16, 3};  // 768 bytes: 8 fragments, the last of 68
    o.payload.seed = 7;
    o.seed = 7;
    o.addresses.src_ip = 0xc6120001;  // 198.18.0.1
    o.addresses.dst_ip = 0xc6120002;
    o.addresses.src_port = 40000;
    o.addresses.dst_port = 9000;
    o.addresses.src_mac = parse_mac("02:00:00:00:00:01", "src");
    o.addresses.dst_mac = parse_mac("02:00:00:00:00:02", "dst");
    return o;
}

std::vector<std::vector<uint8_t>> read_frames(const std::string& path) {
    std::vector<std::vector<uint8_t>> frames;
    char err[PCAP_ERRBUF_SIZE];
    pcap_t* p = pcap_open_offline(path.c_str(), err);
    EXPECT_NE(p, nullptr) << err;
    if (!p) return frames;
    EXPECT_EQ(pcap_datalink(p), DLT_EN10MB);
    pcap_pkthdr* h;
    const u_char* d;
    while (pcap_next_ex(p, &h, &d) == 1) {
        EXPECT_EQ(h->caplen, h->len);
        frames.emplace_back(d, d + h->caplen);
    }
    pcap_close(p);
    return frames;
}

// Checksum code independent of packet.cc, straight from RFC 1071.
uint32_t rfc1071_sum(const uint8_t* p, size_t n, uint32_t acc = 0) {
    for (size_t i = 0; i + 1 < n; i += 2) acc += uint32_t(p[i]) << 8 | p[i + 1];
    if (n & 1) acc += uint32_t(p[n - 1]) << 8;
    return acc;
}
uint16_t rfc1071_fold(uint32_t acc) {
    while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
    return uint16_t(acc);
}

struct frame_view {
    uint32_t src_ip, dst_ip;
    uint16_t sport, dport;
    wire::header header;
    std::vector<uint8_t> fragment;
};

// Verifies Ethernet/IPv4/UDP of a generated frame by hand and returns its contents.
frame_view check_frame(const std::vector<uint8_t>& f) {
    frame_view v{};
    EXPECT_GE(f.size(), 42u + wire::header_size);
    EXPECT_EQ(load_be16(&f[12]), 0x0800);
    const uint8_t* ip = &f[14];
    EXPECT_EQ(ip[0], 0x45);
    EXPECT_EQ(load_be16(ip + 2), f.size() - 14);
    EXPECT_EQ(load_be16(ip + 6) & 0x3fff, 0) << "never IP-fragmented";
    EXPECT_EQ(ip[9], 17);
    EXPECT_EQ(rfc1071_fold(rfc1071_sum(ip, 20)), 0xffff) << "IPv4 header checksum";
    const uint8_t* udp = ip + 20;
    const uint16_t ulen = load_be16(udp + 4);
    EXPECT_EQ(ulen, f.size() - 34);
    EXPECT_NE(load_be16(udp + 6), 0) << "generator always fills the UDP checksum";
    uint32_t acc = rfc1071_sum(ip + 12, 8) + 17 + ulen;
    EXPECT_EQ(rfc1071_fold(rfc1071_sum(udp, ulen, acc)), 0xffff) << "UDP checksum";
    v.src_ip = load_be32(ip + 12);
    v.dst_ip = load_be32(ip + 16);
    v.sport = load_be16(udp);
    v.dport = load_be16(udp + 2);
    std::memcpy(&v.header, udp + 8, wire::header_size);
    v.fragment.assign(udp + 8 + wire::header_size, udp + ulen);
    return v;
}

// The crc32 diagnostic IF's answer to a payload: one response fragment.
std::vector<uint8_t> crc32_response(uint64_t request_id, std::span<const uint8_t> payload) {
    wire::fields f;
    f.kind = uint8_t(wire::kind::response);
    f.format = uint8_t(wire::format::result_crc32);
    f.status = uint8_t(wire::status::ok);
    f.request_id = request_id;
    f.frag_index = 0;
    f.frag_count = 1;
    f.total_length = 8;
    uint8_t result[8];
    store_be32(result, uint32_t(payload.size()));
    store_be32(result + 4, crc32c(payload.data(), payload.size()));
    std::vector<uint8_t> out;
    append_udp_payload(out, f, result);
    return out;
}

// What reefline would capture on its way out: responses to every complete request of
// `requests_pcap`, addresses swapped. `edit` may alter or drop (return false) a response.
using response_edit = std::function<bool(size_t index, std::vector<uint8_t>& udp_payload)>;
void write_responses(const std::string& requests_pcap, const std::string& out,
                     const response_edit& edit = {}) {
    std::vector<assembled_message> messages;
    const request_capture cap = read_request_capture(requests_pcap, &messages);
    std::map<std::pair<uint32_t, uint16_t>, const request_record*> dst_of;
    for (const auto& r : cap.requests) dst_of[{r.key.ip, r.key.port}] = &r;
    pcap_t* dead = pcap_open_dead(DLT_EN10MB, 65535);
    pcap_dumper_t* d = pcap_dump_open(dead, out.c_str());
    ASSERT_NE(d, nullptr);
    uint16_t ip_id = 0;
    for (size_t i = 0; i < messages.size(); ++i) {
        const assembled_message& m = messages[i];
        std::vector<uint8_t> udp = crc32_response(m.key.request_id, m.payload);
        if (edit && !edit(i, udp)) continue;
        const request_record* req = dst_of.at({m.key.ip, m.key.port});
        frame_addresses a;
        a.src_ip = req->dst_ip;
        a.src_port = req->dst_port;
        a.dst_ip = m.key.ip;
        a.dst_port = m.key.port;
        const std::vector<uint8_t> frame = build_frame(a, ip_id++, udp);
        pcap_pkthdr h{};
        h.caplen = h.len = bpf_u_int32(frame.size());
        pcap_dump(reinterpret_cast<u_char*>(d), &h, frame.data());
    }
    pcap_dump_close(d);
    pcap_close(dead);
}

check_result check_files(const std::string& req, const std::string& resp,
                         std::string* log = nullptr) {
    std::ostringstream out;
    check_options o;
    o.requests = req;
    o.responses = resp;
    const check_result r = run_check(o, out);
    if (log) *log = out.str();
    return r;
}

}  // namespace

TEST(ReefgenPcap, FramesAreValidAndReassembleToTheGeneratedPayloads) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("req.pcap"), 5);
    o.sources = 2;
    const pcap_summary s = write_request_pcap(o);
    EXPECT_EQ(s.requests, 5u);
    EXPECT_EQ(s.fragments, 40u);
    EXPECT_EQ(s.packets, 40u);

    const payload_source source(o.payload);
    std::map<uint64_t, std::vector<uint8_t>> rebuilt;
    std::map<uint64_t, std::set<uint16_t>> indices;
    for (const auto& frame : read_frames(o.out)) {
        const frame_view v = check_frame(frame);
        ASSERT_EQ(wire::validate_request(v.header, uint32_t(v.fragment.size())),
                  wire::header_error::none);
        const wire::fields f = wire::decode(&v.header);
        const uint64_t n = f.request_id - s.first_request_id;
        ASSERT_LT(n, 5u);
        EXPECT_EQ(v.src_ip, o.addresses.src_ip);
        EXPECT_EQ(v.dst_ip, o.addresses.dst_ip);
        EXPECT_EQ(v.sport, 40000 + n % 2) << "round-robin over sources";
        EXPECT_EQ(v.dport, 9000);
        EXPECT_EQ(f.format, uint8_t(wire::format::image_u8_hwc));
        EXPECT_EQ(f.dims[0], 16);
        EXPECT_EQ(f.dims[1], 16);
        EXPECT_EQ(f.dims[2], 3);
        EXPECT_EQ(f.dims[3], 0);
        EXPECT_EQ(f.frag_count, 8);
        EXPECT_EQ(f.total_length, 768u);
        EXPECT_EQ(f.payload_offset, f.frag_index * 100u);
        EXPECT_EQ(v.fragment.size(), f.frag_index == 7 ? 68u : 100u);
        auto& buf = rebuilt[n];
        buf.resize(f.total_length);
        std::copy(v.fragment.begin(), v.fragment.end(), buf.begin() + f.payload_offset);
        indices[n].insert(f.frag_index);
    }
    ASSERT_EQ(rebuilt.size(), 5u);
    for (auto& [n, bytes] : rebuilt) {
        EXPECT_EQ(indices[n].size(), 8u);
        const request_payload expected = source.make(n);
        EXPECT_EQ(bytes, expected.bytes) << "request " << n;
    }
    EXPECT_NE(rebuilt[0], rebuilt[1]) << "requests differ";

    // The checker's reassembly agrees, CRCs included.
    std::vector<assembled_message> messages;
    const request_capture cap = read_request_capture(o.out, &messages);
    EXPECT_EQ(cap.good, 40u);
    ASSERT_EQ(messages.size(), 5u);
    for (const auto& r : cap.requests) {
        EXPECT_TRUE(r.complete);
        const auto& bytes = rebuilt[r.key.request_id - s.first_request_id];
        EXPECT_EQ(r.crc, crc32c(bytes.data(), bytes.size()));
    }
}

TEST(ReefgenPcap, DeterministicForASeed) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("a.pcap"), 20);
    o.shuffle = true;
    o.drop = 0.1;
    o.dup = 0.1;
    o.corrupt = 0.1;
    write_request_pcap(o);
    o.out = dir.file("b.pcap");
    write_request_pcap(o);
    EXPECT_EQ(read_frames(dir.file("a.pcap")), read_frames(dir.file("b.pcap")));
    o.out = dir.file("c.pcap");
    o.seed = o.payload.seed = 8;
    write_request_pcap(o);
    EXPECT_NE(read_frames(dir.file("a.pcap")), read_frames(dir.file("c.pcap")));
}

TEST(ReefgenPcap, TokensAndRawFormats) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("t.pcap"), 3);
    o.payload.format = wire::format::tokens_i32;
    o.payload.tokens = 128;
    o.payload.vocab = 1000;
    write_request_pcap(o);
    std::vector<assembled_message> messages;
    read_request_capture(o.out, &messages);
    ASSERT_EQ(messages.size(), 3u);
    for (const auto& m : messages) {
        EXPECT_EQ(m.head.format, uint8_t(wire::format::tokens_i32));
        EXPECT_EQ(m.head.dims[0], 128);
        ASSERT_EQ(m.payload.size(), 512u);
        for (size_t i = 0; i < m.payload.size(); i += 4) {
            const int32_t t = load_token(&m.payload[i]);
            EXPECT_GE(t, 0);
            EXPECT_LT(t, 1000);
        }
    }

    // --raw FILE in format raw: every request carries the file's bytes.
    const std::string raw = dir.file("blob.bin");
    {
        std::ofstream f(raw, std::ios::binary);
        for (int i = 0; i < 333; ++i) f.put(char(i * 7));
    }
    o = small_options(dir.file("r.pcap"), 2);
    o.payload.format = wire::format::raw;
    o.payload.raw_file = raw;
    write_request_pcap(o);
    messages.clear();
    read_request_capture(o.out, &messages);
    ASSERT_EQ(messages.size(), 2u);
    for (const auto& m : messages) {
        EXPECT_EQ(m.head.format, uint8_t(wire::format::raw));
        ASSERT_EQ(m.payload.size(), 333u);
        EXPECT_EQ(m.payload[10], uint8_t(70));
    }

    // --image FILE: a PGM with a comment in its header.
    const std::string pgm = dir.file("img.pgm");
    {
        std::ofstream f(pgm, std::ios::binary);
        f << "P5\n# a comment\n5 4\n255\n";
        for (int i = 0; i < 20; ++i) f.put(char(i));
    }
    o = small_options(dir.file("i.pcap"), 1);
    o.payload.image_file = pgm;
    write_request_pcap(o);
    messages.clear();
    read_request_capture(o.out, &messages);
    ASSERT_EQ(messages.size(), 1u);
    EXPECT_EQ(messages[0].head.dims[0], 4);
    EXPECT_EQ(messages[0].head.dims[1], 5);
    EXPECT_EQ(messages[0].head.dims[2], 1);
    EXPECT_EQ(messages[0].payload[19], 19);

    o.payload.image_file = dir.file("missing.ppm");
    EXPECT_THROW(write_request_pcap(o), usage_error);
}

// Reads little-endian f32 byte by byte, independently of payload.cc.
float le_f32(const uint8_t* p) {
    const uint32_t bits = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

TEST(ReefgenPayload, TensorsLookLikeSensorWindowsAndAreDeterministic) {
    payload_options o;
    o.format = wire::format::tensor_f32;
    o.dims = {64, 6};
    o.seed = 4;
    const payload_source source(o);
    EXPECT_EQ(source.total_length(), 64u * 6 * 4);
    EXPECT_EQ(source.min_total_length(), source.total_length());
    const request_payload a = source.make(0), b = source.make(1);
    EXPECT_EQ(a.format, wire::format::tensor_f32);
    EXPECT_EQ(a.dims[0], 64);
    EXPECT_EQ(a.dims[1], 6);
    EXPECT_EQ(a.dims[2], 0);
    EXPECT_EQ(a.dims[3], 0);
    ASSERT_EQ(a.bytes.size(), 64u * 6 * 4);
    EXPECT_EQ(wire::described_length(uint8_t(a.format), a.dims), a.bytes.size());
    // Little-endian f32 values of order 1, no two requests or channels alike, each channel
    // varying over time (a sine, not a constant).
    double sum = 0, squares = 0;
    for (size_t c = 0; c < 6; ++c) {
        float lo = INFINITY, hi = -INFINITY;
        for (size_t t = 0; t < 64; ++t) {
            const float v = le_f32(&a.bytes[(t * 6 + c) * 4]);
            ASSERT_TRUE(std::isfinite(v));
            EXPECT_LT(std::fabs(v), 3.0f);
            EXPECT_EQ(v, load_f32(&a.bytes[(t * 6 + c) * 4]));
            lo = std::min(lo, v);
            hi = std::max(hi, v);
            sum += v;
            squares += double(v) * v;
        }
        EXPECT_GT(hi - lo, 0.5f) << "channel " << c;
        EXPECT_NE(le_f32(&a.bytes[c * 4]), le_f32(&a.bytes[((c + 1) % 6) * 4]));
    }
    const double mean = sum / 384, rms = std::sqrt(squares / 384);
    EXPECT_LT(std::fabs(mean), 0.5);
    EXPECT_GT(rms, 0.3);
    EXPECT_LT(rms, 1.5);
    EXPECT_NE(a.bytes, b.bytes);
    // Deterministic in (seed, request number) alone.
    const payload_source again(o);
    EXPECT_EQ(again.make(1).bytes, b.bytes);
    EXPECT_EQ(again.make(0).bytes, a.bytes);
    o.seed = 5;
    EXPECT_NE(payload_source(o).make(0).bytes, a.bytes);
    // One extent: a single channel over time; four extents.
    o.dims = {100};
    EXPECT_EQ(payload_source(o).make(3).bytes.size(), 400u);
    o.dims = {2, 3, 4, 5};
    const request_payload four = payload_source(o).make(0);
    EXPECT_EQ(four.bytes.size(), 2u * 3 * 4 * 5 * 4);
    EXPECT_EQ(four.dims[3], 5);
    // Limits: 1..4 extents, each 1..65535, at most 8 MiB.
    o.dims = {};
    EXPECT_THROW(payload_source{o}, usage_error);
    o.dims = {4096, 1024};
    EXPECT_THROW(payload_source{o}, usage_error);
    o.dims = {1024, 2048};  // exactly 8 MiB
    EXPECT_EQ(payload_source(o).total_length(), wire::max_total_length);
}

TEST(ReefgenPayload, PortableSineIsASine) {
    for (double x = -50; x <= 50; x += 0.137) EXPECT_NEAR(portable_sin(x), std::sin(x), 1e-12) << x;
    EXPECT_EQ(portable_sin(0), 0.0);
}

TEST(ReefgenPayload, ARawTensorFileIsSentAsIs) {
    temp_dir dir;
    const std::string raw = dir.file("window.f32");
    {
        std::ofstream f(raw, std::ios::binary);
        for (int i = 0; i < 12; ++i) {
            uint8_t b[4];
            store_f32(b, float(i) * 0.5f - 1);
            f.write(reinterpret_cast<const char*>(b), 4);
        }
    }
    payload_options o;
    o.format = wire::format::tensor_f32;
    o.dims = {4, 3};
    o.raw_file = raw;
    const request_payload p = payload_source(o).make(7);
    ASSERT_EQ(p.bytes.size(), 48u);
    EXPECT_EQ(le_f32(&p.bytes[5 * 4]), 1.5f);
    EXPECT_EQ(p.dims[0], 4);
    o.dims = {4, 4};  // 64 bytes needed, the file has 48
    try {
        payload_source{o};
        FAIL() << "a file of the wrong size was accepted";
    } catch (const usage_error& e) {
        EXPECT_NE(std::string(e.what()).find("has 48 bytes, --dims needs 64"), std::string::npos) << e.what();
    }
}

TEST(ReefgenPayload, TokenLengthsVaryWithinTheRangeDeterministically) {
    payload_options o;
    o.format = wire::format::tokens_i32;
    o.tokens = 8;
    o.tokens_max = 64;
    o.seed = 9;
    const payload_source source(o);
    EXPECT_EQ(source.total_length(), 64u * 4) << "the largest request";
    EXPECT_EQ(source.min_total_length(), 8u * 4);
    std::set<uint32_t> lengths;
    for (uint64_t n = 0; n < 200; ++n) {
        const request_payload p = source.make(n);
        ASSERT_GE(p.dims[0], 8);
        ASSERT_LE(p.dims[0], 64);
        EXPECT_EQ(p.dims[0], source.tokens_of(n));
        ASSERT_EQ(p.bytes.size(), size_t(p.dims[0]) * 4);
        EXPECT_EQ(wire::described_length(uint8_t(p.format), p.dims), p.bytes.size());
        for (size_t i = 0; i < p.bytes.size(); i += 4) {
            EXPECT_GE(load_token(&p.bytes[i]), 0);
            EXPECT_LT(load_token(&p.bytes[i]), int32_t(default_vocab));
        }
        lengths.insert(p.dims[0]);
    }
    EXPECT_TRUE(lengths.count(8) && lengths.count(64)) << "both ends of the range are drawn";
    EXPECT_GT(lengths.size(), 40u);
    // The same lengths and tokens for the same seed, whatever else differs (the vocabulary
    // changes the ids, not the lengths); another seed draws other lengths.
    payload_options v = o;
    v.vocab = 30522;
    const payload_source again(o), other_vocab(v);
    for (uint64_t n = 0; n < 20; ++n) {
        EXPECT_EQ(again.make(n).bytes, source.make(n).bytes);
        EXPECT_EQ(other_vocab.tokens_of(n), source.tokens_of(n));
    }
    o.seed = 10;
    const payload_source reseeded(o);
    uint32_t differ = 0;
    for (uint64_t n = 0; n < 20; ++n) differ += reseeded.tokens_of(n) != source.tokens_of(n);
    EXPECT_GT(differ, 10u);
    // A fixed length stays fixed; a range with MAX below MIN, or with a file, is refused.
    o.tokens_max = 0;
    EXPECT_EQ(payload_source(o).make(5).dims[0], 8);
    o.tokens_max = 7;
    EXPECT_THROW(payload_source{o}, usage_error);
    temp_dir dir;
    {
        std::ofstream(dir.file("t.bin"), std::ios::binary).write("\1\0\0\0\2\0\0\0", 8);
    }
    o.tokens = 0;
    o.tokens_max = 0;
    o.raw_file = dir.file("t.bin");
    EXPECT_EQ(payload_source(o).make(0).dims[0], 2);
    o.tokens = 1;
    o.tokens_max = 2;
    EXPECT_THROW(payload_source{o}, usage_error);
}

TEST(ReefgenPayload, TheDefaultVocabularyIsValidEverywhere) {
    EXPECT_EQ(payload_options{}.vocab, 1000u);
    EXPECT_EQ(default_vocab, 1000u);
}

TEST(ReefgenPayload, TokenRangesAndDimsParse) {
    EXPECT_EQ(parse_token_range("16").min, 16u);
    EXPECT_EQ(parse_token_range("16").max, 16u);
    EXPECT_EQ(parse_token_range("8-64").min, 8u);
    EXPECT_EQ(parse_token_range("8-64").max, 64u);
    EXPECT_EQ(parse_token_range("1-65535").max, 65535u);
    for (const char* bad : {"", "0", "8-", "-8", "64-8", "8-65536", "8--9", "a", "8-64x", " 8"})
        EXPECT_THROW(parse_token_range(bad), usage_error) << bad;
    EXPECT_EQ(parse_dims("64,6"), (std::vector<uint16_t>{64, 6}));
    EXPECT_EQ(parse_dims("5"), (std::vector<uint16_t>{5}));
    EXPECT_EQ(parse_dims("1,2,3,65535"), (std::vector<uint16_t>{1, 2, 3, 65535}));
    for (const char* bad : {"", "0", "64,", ",6", "1,2,3,4,5", "65536", "64x6", "6,-1"})
        EXPECT_THROW(parse_dims(bad), usage_error) << bad;
}

TEST(ReefgenPcap, TensorAndVariableTokenRequestsOnTheWire) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("tensor.pcap"), 4);
    o.payload.format = wire::format::tensor_f32;
    o.payload.dims = {64, 6};
    o.frag_size = 1000;  // 1536 bytes: 2 fragments
    write_request_pcap(o);
    std::vector<assembled_message> messages;
    const request_capture cap = read_request_capture(o.out, &messages);
    EXPECT_EQ(cap.rejected.size(), 0u);
    ASSERT_EQ(messages.size(), 4u);
    const payload_source source(o.payload);
    const uint64_t base = request_id_base(o.seed);
    for (const auto& m : messages) {
        EXPECT_EQ(m.head.format, uint8_t(wire::format::tensor_f32));
        EXPECT_EQ(m.head.dims[0], 64);
        EXPECT_EQ(m.head.dims[1], 6);
        EXPECT_EQ(m.head.frag_count, 2);
        EXPECT_EQ(m.payload, source.make(m.key.request_id - base).bytes);
    }

    o = small_options(dir.file("tokens.pcap"), 30);
    o.payload.format = wire::format::tokens_i32;
    o.payload.tokens = 8;
    o.payload.tokens_max = 64;
    o.frag_size = 100;
    write_request_pcap(o);
    messages.clear();
    read_request_capture(o.out, &messages);
    ASSERT_EQ(messages.size(), 30u);
    const payload_source tokens(o.payload);
    std::set<uint16_t> lengths;
    for (const auto& m : messages) {
        const uint64_t n = m.key.request_id - base;
        EXPECT_EQ(m.head.dims[0], tokens.tokens_of(n));
        EXPECT_EQ(m.head.total_length, 4u * m.head.dims[0]);
        EXPECT_EQ(m.payload, tokens.make(n).bytes);
        lengths.insert(m.head.dims[0]);
    }
    EXPECT_GT(lengths.size(), 5u);

    // The fragment limit is checked for the longest request before anything is written.
    o = small_options(dir.file("long.pcap"), 2);
    o.payload.format = wire::format::tokens_i32;
    o.payload.tokens = 1;
    o.payload.tokens_max = 65535;
    o.frag_size = 100;
    EXPECT_THROW(write_request_pcap(o), usage_error);
    EXPECT_FALSE(fs::exists(o.out));
}

TEST(ReefgenPcap, ShuffleInterleavesWithinWindowsAndKeepsEveryFragment) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("plain.pcap"), 40);
    write_request_pcap(o);
    o.out = dir.file("shuffled.pcap");
    o.shuffle = true;
    write_request_pcap(o);
    auto plain = read_frames(dir.file("plain.pcap"));
    auto shuffled = read_frames(dir.file("shuffled.pcap"));
    ASSERT_EQ(plain.size(), shuffled.size());
    EXPECT_NE(plain, shuffled);
    // Same fragments (ignoring the IP id, which follows emission order), and each window's
    // fragments stay in that window.
    const auto key = [](const std::vector<uint8_t>& f) {
        const frame_view v = check_frame(f);
        const wire::fields h = wire::decode(&v.header);
        return std::pair<uint64_t, uint16_t>(h.request_id, h.frag_index);
    };
    const uint64_t base = request_id_base(o.seed);
    std::set<std::pair<uint64_t, uint16_t>> a, b;
    for (size_t i = 0; i < plain.size(); ++i) {
        a.insert(key(plain[i]));
        const auto k = key(shuffled[i]);
        b.insert(k);
        EXPECT_EQ((k.first - base) / window_requests,
                  (key(plain[i]).first - base) / window_requests);
    }
    EXPECT_EQ(a, b);
    const request_capture cap = read_request_capture(o.out);
    EXPECT_EQ(cap.requests.size(), 40u);
    for (const auto& r : cap.requests) EXPECT_TRUE(r.complete);
}

TEST(ReefgenPcap, EveryCorruptionIsDetectableFromThePacketAlone) {
    rng r(1);
    frame_addresses a;
    a.src_ip = 0xc6120001;
    a.dst_ip = 0xc6120002;
    a.src_port = 40000;
    a.dst_port = 9000;
    request_payload p;
    p.format = wire::format::image_u8_hwc;
    p.dims[0] = 10;
    p.dims[1] = 10;
    p.dims[2] = 3;
    p.bytes.assign(300, 0x5a);
    const auto plan = plan_fragments(p, 42, 128);
    ASSERT_EQ(plan.size(), 3u);
    for (size_t k = 0; k < corruption_kinds; ++k) {
        for (int trial = 0; trial < 50; ++trial) {
            const wire::fields& f = plan[trial % 3];
            std::vector<uint8_t> udp;
            append_udp_payload(udp, f,
                               std::span<const uint8_t>(p.bytes.data() + f.payload_offset,
                                                        fragment_length(f, 128)));
            std::vector<uint8_t> frame = build_frame(a, 1, udp);
            const auto kind = static_cast<corruption>(k);
            corrupt_frame(frame, kind, r);
            const parsed_frame pf = parse_frame(frame);
            switch (kind) {
            case corruption::ip_checksum: EXPECT_EQ(pf.error, frame_error::bad_ip_checksum); break;
            case corruption::udp_length: EXPECT_EQ(pf.error, frame_error::bad_udp_length); break;
            default: {
                ASSERT_EQ(pf.error, frame_error::none)
                    << to_string(kind) << ": checksums stay valid";
                const auto e = wire::validate_request(pf.header, uint32_t(pf.fragment.size()));
                EXPECT_NE(e, wire::header_error::none) << to_string(kind);
                // Fields that identify the reassembly entry are untouched.
                const wire::fields got = wire::decode(&pf.header);
                EXPECT_EQ(got.total_length, f.total_length);
                EXPECT_EQ(got.frag_count, f.frag_count);
                EXPECT_EQ(got.format, f.format);
                EXPECT_EQ(got.request_id, f.request_id);
                break;
            }
            }
        }
    }
}

TEST(ReefgenPcap, CorruptDropDupAreCountedAndSeenByTheChecker) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("c.pcap"), 64);
    o.corrupt = 1.0;
    pcap_summary s = write_request_pcap(o);
    EXPECT_EQ(s.corrupted, s.packets);
    for (size_t k = 0; k < corruption_kinds; ++k) EXPECT_GT(s.by_corruption[k], 0u) << k;
    request_capture cap = read_request_capture(o.out);
    EXPECT_EQ(cap.good, 0u);
    EXPECT_EQ(cap.requests.size(), 0u);

    o.out = dir.file("d.pcap");
    o.corrupt = 0;
    o.drop = 0.2;
    s = write_request_pcap(o);
    EXPECT_GT(s.dropped, 0u);
    EXPECT_EQ(s.packets, s.fragments - s.dropped);
    cap = read_request_capture(o.out);
    uint64_t complete = 0;
    for (const auto& r : cap.requests) complete += r.complete;
    EXPECT_LT(complete, cap.requests.size()) << "some requests lost a fragment";
    EXPECT_GT(complete, 0u);
    write_responses(o.out, dir.file("d_resp.pcap"));
    const check_result cr = check_files(o.out, dir.file("d_resp.pcap"));
    EXPECT_EQ(cr.requests, cap.requests.size());
    EXPECT_EQ(cr.complete, complete);
    EXPECT_EQ(cr.ok, complete);
    EXPECT_TRUE(cr.passed());

    o.out = dir.file("u.pcap");
    o.drop = 0;
    o.dup = 0.3;
    o.shuffle = true;
    s = write_request_pcap(o);
    EXPECT_GT(s.duplicated, 0u);
    EXPECT_EQ(s.packets, s.fragments + s.duplicated);
    cap = read_request_capture(o.out);
    EXPECT_EQ(cap.duplicates, s.duplicated);
    EXPECT_EQ(cap.requests.size(), 64u);
    // A copy always follows its original, within the original's window.
    std::map<std::pair<uint64_t, uint16_t>, size_t> first_seen;
    const auto frames = read_frames(o.out);
    const uint64_t base = request_id_base(o.seed);
    uint64_t window_of_previous = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
        const frame_view v = check_frame(frames[i]);
        const wire::fields f = wire::decode(&v.header);
        const uint64_t window = (f.request_id - base) / window_requests;
        EXPECT_GE(window, window_of_previous) << "windows are emitted in order";
        window_of_previous = window;
        first_seen.try_emplace({f.request_id, f.frag_index}, i);
    }
    EXPECT_EQ(first_seen.size(), s.fragments);
}

TEST(ReefgenCheck, CorrectResponsesPassAndMistakesFail) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("req.pcap"), 10);
    o.sources = 3;
    o.shuffle = true;
    write_request_pcap(o);

    write_responses(o.out, dir.file("good.pcap"));
    check_result r = check_files(o.out, dir.file("good.pcap"));
    EXPECT_EQ(r.requests, 10u);
    EXPECT_EQ(r.complete, 10u);
    EXPECT_EQ(r.responses, 10u);
    EXPECT_EQ(r.ok, 10u);
    EXPECT_EQ(r.bad, 0u);
    EXPECT_TRUE(r.passed());

    // One wrong CRC.
    write_responses(o.out, dir.file("flip.pcap"), [](size_t i, std::vector<uint8_t>& udp) {
        if (i == 3) udp[wire::header_size + 7] ^= 1;
        return true;
    });
    std::string log;
    r = check_files(o.out, dir.file("flip.pcap"), &log);
    EXPECT_EQ(r.ok, 9u);
    EXPECT_EQ(r.bad, 1u);
    EXPECT_FALSE(r.passed());
    EXPECT_NE(log.find("crc="), std::string::npos) << log;
    EXPECT_NE(log.find("requests=10 complete=10 responses=10 ok=9 bad=1\n"), std::string::npos)
        << log;

    // One response missing.
    write_responses(o.out, dir.file("omit.pcap"),
                    [](size_t i, std::vector<uint8_t>&) { return i != 5; });
    r = check_files(o.out, dir.file("omit.pcap"), &log);
    EXPECT_EQ(r.responses, 9u);
    EXPECT_EQ(r.bad, 0u);
    EXPECT_EQ(r.missing, 1u);
    EXPECT_FALSE(r.passed());
    EXPECT_NE(log.find("missing:"), std::string::npos) << log;

    // An error status, and a response for a request that was never sent.
    write_responses(o.out, dir.file("err.pcap"), [](size_t i, std::vector<uint8_t>& udp) {
        if (i == 0) udp[7] = uint8_t(wire::status::overloaded), udp[5] = uint8_t(wire::kind::error);
        if (i == 1) udp[15] ^= 0x80;  // request id
        return true;
    });
    r = check_files(o.out, dir.file("err.pcap"), &log);
    EXPECT_EQ(r.bad, 2u) << log;
    EXPECT_EQ(r.missing, 1u) << "the renamed response leaves its request unanswered";
    EXPECT_FALSE(r.passed());
}

TEST(ReefgenCheck, ReassemblesFragmentedResponses) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("req.pcap"), 3);
    write_request_pcap(o);
    std::vector<assembled_message> messages;
    const request_capture cap = read_request_capture(o.out, &messages);
    pcap_t* dead = pcap_open_dead(DLT_EN10MB, 65535);
    pcap_dumper_t* d = pcap_dump_open(dead, dir.file("resp.pcap").c_str());
    ASSERT_NE(d, nullptr);
    for (const auto& m : messages) {
        // The 8-byte result in two fragments of 4, last one first.
        std::vector<uint8_t> one = crc32_response(m.key.request_id, m.payload);
        for (int idx : {1, 0}) {
            wire::fields f = wire::decode(one.data());
            f.frag_index = uint16_t(idx);
            f.frag_count = 2;
            f.payload_offset = uint32_t(4 * idx);
            std::vector<uint8_t> udp;
            append_udp_payload(
                udp, f, std::span<const uint8_t>(one.data() + wire::header_size + 4 * idx, 4));
            frame_addresses a;
            a.src_ip = cap.requests[0].dst_ip;
            a.src_port = cap.requests[0].dst_port;
            a.dst_ip = m.key.ip;
            a.dst_port = m.key.port;
            const auto frame = build_frame(a, 0, udp);
            pcap_pkthdr h{};
            h.caplen = h.len = bpf_u_int32(frame.size());
            pcap_dump(reinterpret_cast<u_char*>(d), &h, frame.data());
        }
    }
    pcap_dump_close(d);
    pcap_close(dead);
    const check_result r = check_files(o.out, dir.file("resp.pcap"));
    EXPECT_EQ(r.responses, 3u);
    EXPECT_EQ(r.ok, 3u);
    EXPECT_TRUE(r.passed());
}

namespace {

// The crc32 IF in miniature: a UDP socket on 127.0.0.1 that reassembles requests and answers
// each with its length and CRC32C. `wrong_every` > 0 corrupts every n-th answer's CRC,
// `ignore_every` > 0 leaves every n-th request unanswered. `answer`, when given, makes the
// answer datagram instead (a model IF's, say) from the request id and payload.
using answer_fn = std::function<std::vector<uint8_t>(uint64_t request_id, const std::vector<uint8_t>& payload)>;
class loopback_responder {
public:
    explicit loopback_responder(int wrong_every = 0, int ignore_every = 0, answer_fn answer = {})
            : _wrong_every(wrong_every), _ignore_every(ignore_every), _answer(std::move(answer)) {
        _fd = ::socket(AF_INET, SOCK_DGRAM, 0);
        const int big = 8 << 20;
        setsockopt(_fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
            throw std::runtime_error("bind");
        socklen_t len = sizeof a;
        getsockname(_fd, reinterpret_cast<sockaddr*>(&a), &len);
        _port = ntohs(a.sin_port);
        _thread = std::thread([this] { run(); });
    }
    ~loopback_responder() {
        _stop = true;
        _thread.join();
        ::close(_fd);
    }
    uint16_t port() const { return _port; }

private:
    void run() {
        message_assembler assembler(false);
        assembled_message m;
        std::vector<uint8_t> buf(65536);
        int completed = 0;
        while (!_stop) {
            pollfd p{_fd, POLLIN, 0};
            if (::poll(&p, 1, 10) <= 0) continue;
            sockaddr_in from{};
            socklen_t fl = sizeof from;
            const ssize_t n =
                ::recvfrom(_fd, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
            if (n < ssize_t(wire::header_size)) continue;
            wire::header h;
            std::memcpy(&h, buf.data(), sizeof h);
            const std::span<const uint8_t> frag(buf.data() + wire::header_size,
                                                size_t(n) - wire::header_size);
            if (wire::validate_request(h, uint32_t(frag.size())) != wire::header_error::none)
                continue;
            const wire::fields f = wire::decode(&h);
            const flow_key key{ntohl(from.sin_addr.s_addr), ntohs(from.sin_port), f.request_id};
            if (assembler.add(key, f, frag, m) != message_assembler::outcome::completed) continue;
            ++completed;
            if (_ignore_every && completed % _ignore_every == 0) continue;
            std::vector<uint8_t> out = _answer ? _answer(f.request_id, m.payload) : crc32_response(f.request_id, m.payload);
            if (_wrong_every && completed % _wrong_every == 0) out.back() ^= 0xff;
            ::sendto(_fd, out.data(), out.size(), 0, reinterpret_cast<sockaddr*>(&from), fl);
        }
    }

    int _wrong_every, _ignore_every;
    answer_fn _answer;
    int _fd = -1;
    uint16_t _port = 0;
    std::atomic<bool> _stop{false};
    std::thread _thread;
};

send_options loopback_options(uint16_t port) {
    send_options o;
    o.dst_ip = INADDR_LOOPBACK;
    o.dst_port = port;
    o.bind_ip = INADDR_LOOPBACK;
    o.requests = 50;
    o.payload.format = wire::format::image_u8_hwc;
    o.payload.shape = image_shape{32, 32, 3};  // 3072 bytes: 6 fragments of 512
    o.frag_size = 512;
    o.timeout_ms = 2000;  // ends as soon as everything is answered
    return o;
}

}  // namespace

wire::fields response_fields(uint64_t id, uint16_t index, uint16_t count, uint32_t total) {
    wire::fields f;
    f.kind = uint8_t(wire::kind::response);
    f.format = uint8_t(wire::format::raw);
    f.request_id = id;
    f.frag_index = index;
    f.frag_count = count;
    f.payload_offset = index * 100u;
    f.total_length = total;
    return f;
}

TEST(ReefgenAssembler, LimitsDropTheOldestIncompleteMessages) {
    const std::vector<uint8_t> piece(100, 0x5a);
    assembled_message done;
    // At most 2 incomplete messages: a third evicts the oldest.
    message_assembler by_count(false, assembler_limits{.max_pending = 2});
    for (uint64_t id = 1; id <= 3; ++id)
        EXPECT_EQ(by_count.add({0, 0, id}, response_fields(id, 0, 2, 200), piece, done),
                  message_assembler::outcome::accepted);
    EXPECT_EQ(by_count.evicted(), 1u);
    ASSERT_EQ(by_count.pending().size(), 2u);
    EXPECT_EQ(by_count.pending()[0].key.request_id, 2u);  // oldest first; 1 is gone
    EXPECT_EQ(by_count.add({0, 0, 3}, response_fields(3, 1, 2, 200), piece, done),
              message_assembler::outcome::completed);
    EXPECT_EQ(done.payload.size(), 200u);
    // Message 2's piece and its bookkeeping, and message 3's copy until the next add.
    EXPECT_GT(by_count.pending_bytes(), 300u);
    EXPECT_LT(by_count.pending_bytes(), 1024u);

    // At most 50,000 bytes of memory: pieces of 10,000 cost a little more, and a message must
    // be able to hold its reassembled copy beside them. The oldest others make room, a message
    // larger alone is dropped.
    const std::vector<uint8_t> big(10000, 0x5a);
    const auto big_fields = [](uint64_t id, uint16_t index) {
        wire::fields f = response_fields(id, index, 3, 30000);
        f.payload_offset = index * 10000u;
        return f;
    };
    message_assembler by_bytes(false, assembler_limits{.max_pending_bytes = 50000});
    EXPECT_EQ(by_bytes.add({0, 0, 1}, big_fields(1, 0), big, done), message_assembler::outcome::accepted);
    EXPECT_EQ(by_bytes.add({0, 0, 2}, big_fields(2, 0), big, done), message_assembler::outcome::accepted);
    EXPECT_EQ(by_bytes.add({0, 0, 2}, big_fields(2, 1), big, done), message_assembler::outcome::accepted);
    EXPECT_EQ(by_bytes.evicted(), 1u);  // message 1 made room for message 2's second piece
    EXPECT_LE(by_bytes.pending_bytes(), 50000u);
    EXPECT_EQ(by_bytes.add({0, 0, 2}, big_fields(2, 2), big, done), message_assembler::outcome::too_large);
    EXPECT_EQ(by_bytes.pending().size(), 0u);
    EXPECT_EQ(by_bytes.pending_bytes(), 0u);
}

namespace {

// What the issue measured (1.9 MB of such frames took 563 MiB to check): one-byte fragments
// of distinct messages that each claim 1024 fragments of 8 MiB, as requests (kind request,
// from the camera) or responses (to it).
void write_hostile_capture(const std::string& path, wire::kind kind, uint32_t frames) {
    pcap_t* dead = pcap_open_dead(DLT_EN10MB, 65535);
    pcap_dumper_t* d = pcap_dump_open(dead, path.c_str());
    ASSERT_NE(d, nullptr);
    const std::vector<uint8_t> one{0x42};
    for (uint32_t i = 0; i < frames; ++i) {
        wire::fields f;
        f.kind = uint8_t(kind);
        f.format = uint8_t(wire::format::raw);
        f.request_id = 1000 + i;
        f.frag_index = uint16_t(i % 1024);
        f.frag_count = 1024;
        f.payload_offset = f.frag_index * 8192u;
        f.total_length = 8u << 20;
        std::vector<uint8_t> udp;
        append_udp_payload(udp, f, one);
        frame_addresses a;
        a.src_ip = 0xc6120001;
        a.dst_ip = 0xc6120002;
        a.src_port = 40000;
        a.dst_port = 9000;
        if (kind != wire::kind::request) {
            std::swap(a.src_ip, a.dst_ip);
            std::swap(a.src_port, a.dst_port);
        }
        const std::vector<uint8_t> frame = build_frame(a, uint16_t(i), udp);
        pcap_pkthdr h{};
        h.caplen = h.len = bpf_u_int32(frame.size());
        pcap_dump(reinterpret_cast<u_char*>(d), &h, frame.data());
    }
    pcap_dump_close(d);
    pcap_close(dead);
}

}  // namespace

TEST(ReefgenCheck, AHostileCaptureIsCheckedInBoundedMemoryAndReported) {
    temp_dir dir;
    const std::string req = dir.file("req.pcap"), resp = dir.file("resp.pcap");
    write_hostile_capture(req, wire::kind::request, 20000);
    write_hostile_capture(resp, wire::kind::response, 20000);
    ASSERT_GT(fs::file_size(resp), 1900000u);

    // The default bound (64 MiB) in a child process, whose peak RSS is its own: what the
    // issue measured took 563 MiB for the responses alone.
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(fds[0]);
        rusage before{}, after{};
        ::getrusage(RUSAGE_SELF, &before);
        std::ostringstream log;
        check_options o;
        o.requests = req;
        o.responses = resp;
        const check_result r = run_check(o, log);
        ::getrusage(RUSAGE_SELF, &after);
        const long grown_kib = after.ru_maxrss - before.ru_maxrss;
        const long report[3] = {grown_kib, long(r.requests), long(r.evicted)};
        const bool sent = ::write(fds[1], report, sizeof report) == ssize_t(sizeof report);
        ::_exit(sent ? 0 : 3);
    }
    ::close(fds[1]);
    long report[3] = {-1, -1, -1};
    const ssize_t got = ::read(fds[0], report, sizeof report);
    ::close(fds[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    ASSERT_EQ(got, ssize_t(sizeof report));
    EXPECT_EQ(report[1], 20000) << "requests seen";
    EXPECT_EQ(report[2], 0) << "20,000 such fragments fit 64 MiB";
    EXPECT_LT(report[0], 48 << 10) << "peak RSS grew by " << report[0] << " KiB";
    std::printf("reefgen check of 2 x 20000 hostile fragments (%ju bytes of responses): peak RSS +%ld KiB\n",
                uintmax_t(fs::file_size(resp)), report[0]);

    // Within 1 MiB most of them are evicted, and the check says so and fails.
    std::ostringstream log;
    check_options o;
    o.requests = req;
    o.responses = resp;
    o.max_pending_bytes = 1 << 20;
    const check_result r = run_check(o, log);
    EXPECT_EQ(r.requests, 20000u);
    EXPECT_EQ(r.complete, 0u);
    EXPECT_GT(r.evicted, 2 * 10000u) << log.str();
    EXPECT_FALSE(r.passed());
    EXPECT_NE(log.str().find(" incomplete requests dropped to stay within --max-pending-bytes=1048576"),
              std::string::npos)
        << log.str();
    EXPECT_NE(log.str().find(" incomplete responses dropped to stay within --max-pending-bytes=1048576"),
              std::string::npos)
        << log.str();
    EXPECT_NE(log.str().find("requests: frames=20000 good=20000 duplicate=0 inconsistent=0 evicted="),
              std::string::npos)
        << log.str();
}

TEST(ReefgenResponses, DatagramsAndFramesAreCheckedAlike) {
    std::vector<uint8_t> datagram;
    const uint8_t result[8] = {0, 0, 0, 100, 1, 2, 3, 4};
    append_udp_payload(datagram, response_fields(9, 0, 1, 8), result);
    response_fragment rf = parse_response_datagram(datagram);
    ASSERT_TRUE(rf.acceptable()) << rf.problem;
    EXPECT_EQ(rf.fields.request_id, 9u);
    EXPECT_EQ(rf.fragment.size(), 8u);

    frame_addresses a;
    a.src_ip = 0xc6120002;
    a.dst_ip = 0xc6120001;
    a.src_port = 9000;
    a.dst_port = 40000;
    rf = parse_response_frame(build_frame(a, 1, datagram));
    ASSERT_TRUE(rf.acceptable()) << rf.problem;
    EXPECT_EQ(rf.dst_port, 40000);

    EXPECT_EQ(parse_response_datagram(std::span(datagram).first(39)).problem, "short_payload");
    auto bad = datagram;
    bad[39] = 1;  // reserved
    EXPECT_EQ(parse_response_datagram(bad).problem, "bad_header");
    bad = datagram;
    bad[5] = 9;  // kind
    EXPECT_EQ(parse_response_datagram(bad).problem, "bad_kind");
    bad = datagram;
    bad[5] = uint8_t(wire::kind::request);
    EXPECT_TRUE(parse_response_datagram(bad).ignored);
    bad = datagram;
    bad.push_back(0);  // one byte beyond total_length
    EXPECT_EQ(parse_response_datagram(bad).problem, "offset_out_of_range");
    auto frame = build_frame(a, 1, datagram);
    frame[ipv4_offset + 10] ^= 1;
    EXPECT_EQ(parse_response_frame(frame).problem, "bad_ip_checksum");
    frame[12] = 0x08;
    frame[13] = 0x06;  // ARP
    EXPECT_TRUE(parse_response_frame(frame).ignored);
}

// A result_tensor_f32 answer with these values and header dims, as one datagram.
std::vector<uint8_t> tensor_response(uint64_t id, const std::vector<float>& values, std::vector<uint16_t> dims,
                                     uint32_t extra_bytes = 0) {
    wire::fields f;
    f.kind = uint8_t(wire::kind::response);
    f.format = uint8_t(wire::format::result_tensor_f32);
    f.request_id = id;
    f.frag_count = 1;
    f.total_length = uint32_t(values.size() * 4 + extra_bytes);
    std::copy(dims.begin(), dims.end(), f.dims);
    std::vector<uint8_t> bytes(f.total_length, 0);
    for (size_t i = 0; i < values.size(); ++i) store_f32(bytes.data() + i * 4, values[i]);
    std::vector<uint8_t> out;
    append_udp_payload(out, f, bytes);
    return out;
}

assembled_message tensor_message(const std::vector<float>& values, std::vector<uint16_t> dims, uint32_t extra = 0) {
    const std::vector<uint8_t> d = tensor_response(5, values, dims, extra);
    assembled_message m;
    m.head = wire::decode(d.data());
    m.key.request_id = 5;
    m.payload.assign(d.begin() + wire::header_size, d.end());
    return m;
}

TEST(ReefgenResponses, TensorResultsMustHoldFourBytesPerElement) {
    const std::vector<float> v{0.5f, -1, 2, 3, 4, 5};
    EXPECT_EQ(response_problem(tensor_message(v, {2, 3}), 0, 0, false), "");
    EXPECT_EQ(response_problem(tensor_message(v, {6}), 0, 0, false), "");
    EXPECT_EQ(response_problem(tensor_message(v, {1, 2, 3, 1}), 0, 0, false), "");
    // One value short, one byte over, and a length that is no multiple of 4.
    std::string p = response_problem(tensor_message(v, {7}), 0, 0, false);
    EXPECT_EQ(p, "result_tensor_f32 of 24 bytes, dims 7 need 28 (4 per f32)");
    p = response_problem(tensor_message(v, {2, 3}, 4), 0, 0, false);
    EXPECT_EQ(p, "result_tensor_f32 of 28 bytes, dims 2x3 need 24 (4 per f32)");
    EXPECT_NE(response_problem(tensor_message(v, {2, 3}, 1), 0, 0, false), "");
    // Dims: at least one extent, and no extent after an unused (0) one.
    EXPECT_NE(response_problem(tensor_message(v, {}), 0, 0, false).find("expected 1 to 4 non-zero extents"),
              std::string::npos);
    EXPECT_NE(response_problem(tensor_message(v, {6, 0, 1}), 0, 0, false), "");
    // A crc32 IF must not answer with a tensor.
    EXPECT_NE(response_problem(tensor_message(v, {6}), 0, 0, true).find("expected result_crc32"), std::string::npos);
    // --show's description: dims and the first values.
    EXPECT_EQ(describe_answer(tensor_message(v, {2, 3})), "tensor 2x3 [0.5, -1, 2, 3, ...]");
    EXPECT_EQ(describe_answer(tensor_message({0.25f}, {1})), "tensor 1 [0.25]");
}

TEST(ReefgenResponses, ResultsLinesRecordEveryTensorValue) {
    answer_record a;
    a.request = 4;
    a.payload = 2;
    a.kind = uint8_t(wire::kind::response);
    a.format = uint8_t(wire::format::result_tensor_f32);
    a.dims[0] = 2;
    a.dims[1] = 2;
    for (float v : {0.1f, -2.5f, INFINITY, 3e-8f}) {
        uint8_t b[4];
        store_f32(b, v);
        a.payload_bytes.insert(a.payload_bytes.end(), b, b + 4);
    }
    a.latency_us = 7;
    std::ostringstream out;
    write_results(out, {a});
    EXPECT_EQ(out.str(),
              "{\"id\":4,\"payload\":2,\"kind\":\"response\",\"status\":0,\"format\":18,"
              "\"tensor\":{\"dims\":[2,2],\"data\":[0.100000001,-2.5,null,2.99999989e-08]},\"latency_us\":7.0}\n");
}

TEST(ReefgenCheck, ModelAnswersAsTensorsAreOkAndBadLengthsAreNot) {
    temp_dir dir;
    pcap_options o = small_options(dir.file("req.pcap"), 6);
    o.payload.format = wire::format::tensor_f32;
    o.payload.dims = {16, 4};
    write_request_pcap(o);
    // Each answer: the request's first 8 values as a tensor of dims [8]; request 2's claims 9.
    const auto answer = [](size_t i, std::vector<uint8_t>& udp) {
        const wire::fields f = wire::decode(udp.data());
        std::vector<float> v;
        for (int j = 0; j < 8; ++j) v.push_back(float(f.request_id % 100) + 0.125f * float(j));
        udp = tensor_response(f.request_id, v, {uint16_t(i == 2 ? 9 : 8)});
        return true;
    };
    write_responses(o.out, dir.file("resp.pcap"), answer);
    check_options co;
    co.requests = o.out;
    co.responses = dir.file("resp.pcap");
    co.expect = expectation::model;
    co.seed = o.seed;
    co.show = 2;
    co.results_file = dir.file("answers.jsonl");
    std::ostringstream log;
    const check_result r = run_check(co, log);
    EXPECT_EQ(r.responses, 6u) << log.str();
    EXPECT_EQ(r.ok, 5u) << log.str();
    EXPECT_EQ(r.bad, 1u) << log.str();
    EXPECT_NE(log.str().find("result_tensor_f32 of 32 bytes, dims 9 need 36"), std::string::npos) << log.str();
    EXPECT_NE(log.str().find("B -> ok tensor 8 ["), std::string::npos) << log.str();
    // The results file has every answer, with every value, in request order.
    const auto lines = [&] {
        std::ifstream in(co.results_file);
        std::vector<std::string> l;
        for (std::string t; std::getline(in, t);) l.push_back(t);
        return l;
    }();
    ASSERT_EQ(lines.size(), 6u);
    const uint64_t base = request_id_base(o.seed);
    char want[200];
    std::snprintf(want, sizeof want,
                  "{\"id\":0,\"payload\":0,\"kind\":\"response\",\"status\":0,\"format\":18,\"tensor\":{\"dims\":[8],"
                  "\"data\":[%g,%g,",
                  double(float(base % 100)), double(float(base % 100) + 0.125f));
    EXPECT_EQ(lines[0].rfind(want, 0), 0u) << lines[0];
    EXPECT_NE(lines[2].find("\"dims\":[9]"), std::string::npos) << lines[2];
    // crc32 expectations refuse tensor answers.
    co.expect = expectation::crc32;
    co.results_file.clear();
    EXPECT_EQ(run_check(co, log).bad, 6u);
}

TEST(ReefgenSend, ClosedLoopAgainstALoopbackResponder) {
    loopback_responder responder;
    send_options o = loopback_options(responder.port());
    o.closed_loop = 4;
    std::ostringstream log;
    const send_result r = run_send(o, log);
    EXPECT_EQ(r.sent, 50u);
    EXPECT_EQ(r.responses, 50u) << log.str();
    EXPECT_EQ(r.ok, 50u) << log.str();
    EXPECT_EQ(r.bad, 0u);
    EXPECT_EQ(r.lost, 0u);
    EXPECT_GT(r.p50_us, 0);
    EXPECT_LE(r.p50_us, r.p99_us);
    EXPECT_LE(r.p99_us, r.p999_us);
    const std::string line = format_send_result(r, false);
    EXPECT_EQ(line.rfind("sent=50 responses=50 ok=50 bad=0 lost=0 p50_us=", 0), 0u) << line;
    const std::string json = format_send_result(r, true);
    EXPECT_EQ(
        json.rfind("{\"sent\":50,\"responses\":50,\"ok\":50,\"bad\":0,\"lost\":0,\"p50_us\":", 0),
        0u)
        << json;
}

TEST(ReefgenSend, OpenLoopPoissonTokens) {
    loopback_responder responder;
    send_options o = loopback_options(responder.port());
    o.rate = 5000;
    o.poisson = true;
    o.payload.format = wire::format::tokens_i32;
    o.payload.tokens = 64;
    std::ostringstream log;
    const send_result r = run_send(o, log);
    EXPECT_EQ(r.ok, 50u) << log.str();
    EXPECT_EQ(r.lost, 0u);
}

TEST(ReefgenSend, WrongAndMissingAnswersAreReported) {
    loopback_responder responder(/*wrong_every=*/10, /*ignore_every=*/7);
    send_options o = loopback_options(responder.port());
    o.closed_loop = 8;
    o.timeout_ms = 200;
    std::ostringstream log;
    const send_result r = run_send(o, log);
    EXPECT_EQ(r.sent, 50u);
    EXPECT_GE(r.lost, 7u);  // the 7th, 14th, ..., 49th request the responder completes
    EXPECT_GT(r.bad, 0u);
    EXPECT_EQ(r.errors, 0u) << "a wrong result is not an error reply";
    EXPECT_EQ(r.ok + r.bad, r.responses);
    EXPECT_NE(log.str().find("bad: request id="), std::string::npos) << log.str();
}

// The appliance's own refusals (a shed request: kind error, status overloaded) are bad answers
// and also counted apart, so that a caller can tell them from wrong results.
TEST(ReefgenSend, ErrorRepliesAreCountedApart) {
    std::atomic<int> answered{0};
    loopback_responder responder(0, 0, [&](uint64_t id, const std::vector<uint8_t>& payload) {
        std::vector<uint8_t> out = crc32_response(id, payload);
        if (++answered % 4 == 0) out[5] = uint8_t(wire::kind::error), out[7] = uint8_t(wire::status::overloaded);
        return out;
    });
    send_options o = loopback_options(responder.port());
    o.requests = 20;
    o.closed_loop = 1;
    std::ostringstream log;
    const send_result r = run_send(o, log);
    EXPECT_EQ(r.responses, 20u) << log.str();
    EXPECT_EQ(r.ok, 15u) << log.str();
    EXPECT_EQ(r.bad, 5u) << log.str();
    EXPECT_EQ(r.errors, 5u) << log.str();
    EXPECT_NE(format_send_result(r, false).find(" errors=5"), std::string::npos);
    EXPECT_NE(format_send_result(r, true).find("\"errors\":5"), std::string::npos);
}

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// --results: one line per answered request, in request order, with the payload index that
// payload_source::make() built it from (the pool of 16 payloads wraps at request 16).
TEST(ReefgenSend, ResultsFileRecordsEveryAnswerInRequestOrder) {
    loopback_responder responder;
    temp_dir dir;
    send_options o = loopback_options(responder.port());
    o.requests = 20;
    o.closed_loop = 4;
    o.results_file = dir.file("answers.jsonl");
    std::ostringstream log;
    const send_result r = run_send(o, log);
    ASSERT_EQ(r.responses, 20u) << log.str();
    EXPECT_NE(log.str().find("results: 20 answers written to " + o.results_file), std::string::npos)
        << log.str();
    const std::vector<std::string> lines = read_lines(o.results_file);
    ASSERT_EQ(lines.size(), 20u);
    for (size_t i = 0; i < lines.size(); ++i) {
        // The responder answers crc32 results: no topk list, no message.
        const std::string head = "{\"id\":" + std::to_string(i) + ",\"payload\":" +
                                 std::to_string(i % 16) +
                                 ",\"kind\":\"response\",\"status\":0,\"format\":16,\"latency_us\":";
        EXPECT_EQ(lines[i].rfind(head, 0), 0u) << lines[i];
        EXPECT_EQ(lines[i].back(), '}') << lines[i];
    }
}

TEST(ReefgenSend, ResultsLinesForTopKAndErrors) {
    std::vector<answer_record> records(2);
    records[0].request = 3;
    records[0].payload = 3;
    records[0].kind = uint8_t(wire::kind::response);
    records[0].format = uint8_t(wire::format::result_topk);
    records[0].latency_us = 1234.56;
    const std::pair<uint32_t, float> topk[] = {{7, 0.1f}, {1000, -2.25f}, {2, NAN}};
    for (const auto& [cls, score] : topk) {
        uint8_t e[8];
        uint32_t bits;
        std::memcpy(&bits, &score, 4);
        store_be32(e, cls);
        store_be32(e + 4, bits);
        records[0].payload_bytes.insert(records[0].payload_bytes.end(), e, e + 8);
    }
    records[1].request = 20;
    records[1].payload = 4;
    records[1].kind = uint8_t(wire::kind::error);
    records[1].status = uint8_t(wire::status::overloaded);
    records[1].latency_us = 5;
    // A quote, a backslash, a newline, UTF-8 e-acute, and a lone byte that is not UTF-8.
    const std::string msg = "say \"no\"\\\n\xc3\xa9\xff";
    records[1].payload_bytes.assign(msg.begin(), msg.end());
    std::ostringstream out;
    write_results(out, records);
    EXPECT_EQ(out.str(),
              "{\"id\":3,\"payload\":3,\"kind\":\"response\",\"status\":0,\"format\":17,"
              "\"topk\":[[7,0.100000001],[1000,-2.25],[2,null]],\"latency_us\":1234.6}\n"
              "{\"id\":20,\"payload\":4,\"kind\":\"error\",\"status\":3,\"format\":0,"
              "\"message\":\"say \\\"no\\\"\\\\\\u000a\xc3\xa9\\ufffd\",\"latency_us\":5.0}\n");
}

// A model IF answering tensors: send checks each answer's form, --show prints it, and
// --results records its dims and every value.
TEST(ReefgenSend, TensorAnswersAreShownAndRecorded) {
    // The answer: the request's first 8 floats (tensor_f32 requests), dims [8]; every 5th
    // answer claims dims [9] for the same 32 bytes, which send must count as bad.
    std::atomic<int> answered{0};
    loopback_responder responder(0, 0, [&](uint64_t id, const std::vector<uint8_t>& payload) {
        std::vector<float> v;
        for (size_t j = 0; j < 8; ++j) v.push_back(load_f32(payload.data() + j * 4));
        return tensor_response(id, v, {uint16_t(++answered % 5 == 0 ? 9 : 8)});
    });
    temp_dir dir;
    send_options o = loopback_options(responder.port());
    o.requests = 10;
    o.closed_loop = 1;  // answers in request order, so the 5th and 10th are the bad ones
    o.payload.format = wire::format::tensor_f32;
    o.payload.dims = {64, 6};
    o.show = 3;
    o.results_file = dir.file("answers.jsonl");
    std::ostringstream log;
    const send_result r = run_send(o, log);
    EXPECT_EQ(r.responses, 10u) << log.str();
    EXPECT_EQ(r.ok, 8u) << log.str();
    EXPECT_EQ(r.bad, 2u) << log.str();
    EXPECT_NE(log.str().find("dims 9 need 36"), std::string::npos) << log.str();
    const payload_source source(o.payload);
    const request_payload first = source.make(0);
    char shown[64];
    std::snprintf(shown, sizeof shown, "-> ok tensor 8 [%.4g, ", double(load_f32(first.bytes.data())));
    EXPECT_NE(log.str().find(shown), std::string::npos) << log.str();
    const std::vector<std::string> lines = read_lines(o.results_file);
    ASSERT_EQ(lines.size(), 10u);
    for (size_t i = 0; i < lines.size(); ++i) {
        const request_payload p = source.make(i % 16);
        std::string data;
        char num[32];
        for (size_t j = 0; j < 8; ++j) {
            std::snprintf(num, sizeof num, "%s%.9g", j ? "," : "", double(load_f32(p.bytes.data() + j * 4)));
            data += num;
        }
        const std::string want = "\"format\":18,\"tensor\":{\"dims\":[" + std::string(i % 5 == 4 ? "9" : "8") +
                                 "],\"data\":[" + data + "]},\"latency_us\":";
        EXPECT_NE(lines[i].find(want), std::string::npos) << lines[i] << "\nwant " << want;
    }
}

TEST(ReefgenSend, AResultsFileThatCannotBeCreatedFailsBeforeSending) {
    loopback_responder responder;
    temp_dir dir;
    send_options o = loopback_options(responder.port());
    o.results_file = dir.file("no-such-dir/answers.jsonl");
    std::ostringstream log;
    try {
        run_send(o, log);
        FAIL() << "run_send accepted an uncreatable --results path";
    } catch (const usage_error& e) {
        EXPECT_NE(std::string(e.what()).find("--results: cannot create '" + o.results_file + "'"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_EQ(log.str(), "");  // nothing was sent: the "send:" line comes first
}

// The tool itself: exit statuses and --help, when the build tells us where it is.
namespace {

int run_tool(const std::string& args, std::string* output = nullptr) {
    const char* tool = std::getenv("REEFGEN");
    std::string cmd = std::string(tool) + " " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = ::pclose(p);
    if (output) *output = out;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST(ReefgenCli, ExitStatusesAndHelp) {
    if (!std::getenv("REEFGEN")) GTEST_SKIP() << "REEFGEN not set (run through meson test)";
    temp_dir dir;
    const std::string req = dir.file("req.pcap");
    std::string out;
    ASSERT_EQ(run_tool("pcap --out " + req +
                           " --requests 4 --shape 8x8x3 --frag-size 64 --seed 3 --shuffle",
                       &out),
              0)
        << out;
    EXPECT_NE(out.find("requests=4 fragments=12 packets=12 dropped=0 duplicated=0 corrupted=0"),
              std::string::npos)
        << out;
    write_responses(req, dir.file("good.pcap"));
    EXPECT_EQ(run_tool("check --requests " + req + " --responses " + dir.file("good.pcap"), &out),
              0)
        << out;
    EXPECT_NE(out.find("requests=4 complete=4 responses=4 ok=4 bad=0\n"), std::string::npos) << out;
    write_responses(req, dir.file("bad.pcap"), [](size_t i, std::vector<uint8_t>& udp) {
        if (i == 0) udp.back() ^= 1;
        return true;
    });
    EXPECT_EQ(run_tool("check --requests " + req + " --responses " + dir.file("bad.pcap"), &out), 1)
        << out;
    // A bound on reassembly that evicts fails the check and says why.
    const std::string hostile = dir.file("hostile.pcap");
    write_hostile_capture(hostile, wire::kind::response, 3000);
    EXPECT_EQ(run_tool("check --requests " + req + " --responses " + hostile + " --max-pending-bytes 64KiB", &out), 1)
        << out;
    EXPECT_NE(out.find("evicted: "), std::string::npos) << out;
    EXPECT_NE(out.find("--max-pending-bytes=65536"), std::string::npos) << out;
    EXPECT_EQ(run_tool("check --requests " + req + " --responses " + dir.file("good.pcap") + " --max-pending-bytes 64KiB",
                       &out),
              0)
        << out;
    EXPECT_EQ(run_tool("check --help", &out), 0) << out;
    EXPECT_NE(out.find("--max-pending-bytes"), std::string::npos) << out;

    for (const char* sub : {"", "pcap ", "check ", "send "})
        EXPECT_EQ(run_tool(std::string(sub) + "--help", &out), 0) << sub << out;
    EXPECT_EQ(run_tool("pcap --out " + dir.file("x.pcap") + " --requests 1 --shape 8x8", &out), 2)
        << out;
    EXPECT_NE(out.find("--shape"), std::string::npos) << out;
    EXPECT_EQ(run_tool("pcap --out " + dir.file("x.pcap") + " --requests 1 --drop 2", &out), 2)
        << out;
    EXPECT_EQ(run_tool("pcap --out " + dir.file("x.pcap") + " --requests 1 --frag-size 16", &out),
              2)
        << out;
    EXPECT_NE(out.find("fragments"), std::string::npos) << out;
    EXPECT_EQ(run_tool("check --requests " + dir.file("none.pcap") + " --responses " + req, &out),
              2)
        << out;
    EXPECT_NE(out.find("none.pcap"), std::string::npos) << out;
    EXPECT_EQ(run_tool("send --dst not-an-ip --requests 1", &out), 2) << out;
    EXPECT_EQ(run_tool("send --help", &out), 0) << out;
    EXPECT_NE(out.find("--results"), std::string::npos) << out;
    EXPECT_EQ(run_tool("send --dst 127.0.0.1 --requests 1 --results " + dir.file("none/r.jsonl"),
                       &out),
              2)
        << out;
    EXPECT_NE(out.find("--results: cannot create"), std::string::npos) << out;
    EXPECT_EQ(run_tool("bogus", &out), 2) << out;

    // Tensors and token ranges; --vocab defaults to 1000.
    EXPECT_EQ(run_tool("pcap --help", &out), 0) << out;
    EXPECT_NE(out.find("--dims"), std::string::npos) << out;
    EXPECT_NE(out.find("MIN-MAX"), std::string::npos) << out;
    EXPECT_NE(out.find("=1000"), std::string::npos) << out;
    const std::string tokens = dir.file("tokens.pcap");
    ASSERT_EQ(run_tool("pcap --out " + tokens + " --requests 20 --tokens 8-64 --seed 2", &out), 0) << out;
    std::vector<assembled_message> messages;
    read_request_capture(tokens, &messages);
    ASSERT_EQ(messages.size(), 20u);
    std::set<uint16_t> lengths;
    int32_t largest = 0;
    for (const auto& m : messages) {
        EXPECT_EQ(m.head.format, uint8_t(wire::format::tokens_i32));
        lengths.insert(m.head.dims[0]);
        for (size_t i = 0; i < m.payload.size(); i += 4) largest = std::max(largest, load_token(&m.payload[i]));
    }
    EXPECT_GT(lengths.size(), 5u);
    EXPECT_GE(*lengths.begin(), 8);
    EXPECT_LE(*lengths.rbegin(), 64);
    EXPECT_LT(largest, 1000) << "default --vocab";
    EXPECT_GT(largest, 900) << "ids span the vocabulary";
    ASSERT_EQ(run_tool("pcap --out " + dir.file("t.pcap") + " --requests 2 --dims 64,6 --frag-size 1400", &out), 0)
        << out;
    messages.clear();
    read_request_capture(dir.file("t.pcap"), &messages);
    ASSERT_EQ(messages.size(), 2u);
    EXPECT_EQ(messages[0].head.format, uint8_t(wire::format::tensor_f32));
    EXPECT_EQ(messages[0].payload.size(), 64u * 6 * 4);
    EXPECT_EQ(run_tool("pcap --out " + dir.file("x.pcap") + " --requests 1 --format tensor", &out), 2) << out;
    EXPECT_NE(out.find("--format tensor needs --dims"), std::string::npos) << out;
    EXPECT_EQ(run_tool("pcap --out " + dir.file("x.pcap") + " --requests 1 --format image --dims 4,4", &out), 2)
        << out;
    EXPECT_EQ(run_tool("pcap --out " + dir.file("x.pcap") + " --requests 1 --dims 4,4 --shape 2x2x1", &out), 2)
        << out;
    EXPECT_EQ(run_tool("pcap --out " + dir.file("x.pcap") + " --requests 1 --tokens 9-8", &out), 2) << out;
    EXPECT_NE(out.find("--tokens"), std::string::npos) << out;
    EXPECT_EQ(run_tool("send --dst 127.0.0.1 --requests 1 --dims 0,4", &out), 2) << out;
}

int main(int argc, char** argv) {
    testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
