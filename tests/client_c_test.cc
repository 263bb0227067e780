// libreefline-client (clients/c), through its public C API and the shared library: header
// bytes against the protocol's layout, fragmentation against reefgen's captures (the tool,
// found through REEFGEN), response checks, reassembly of fragmented, reordered, duplicated
// and hostile input within its bounds, result decoding, and the client end to end against a
// loopback responder that answers like the daemon (crc32, top-k, tensors, errors).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "clients/c/reefline_client.h"

// ---- live heap bytes ---------------------------------------------------------------------
// Every operator new and delete of the process goes through these (the shared library's
// too: the executable's definitions take its calls), adding or taking the block's usable
// size, so that the assembler's memory tests weigh what is really allocated against the
// bounds. The peak is what was live at most since heap_watch::start().
namespace heap_watch {

std::atomic<int64_t> live{0};
std::atomic<int64_t> peak{0};

void allocated(void* p) {
    if (!p) return;
    const auto n = int64_t(malloc_usable_size(p));
    const int64_t now = live.fetch_add(n, std::memory_order_relaxed) + n;
    int64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
}

void freed(void* p) {
    if (p) live.fetch_sub(int64_t(malloc_usable_size(p)), std::memory_order_relaxed);
}

// Starts a watch: returns the bytes live now, from which the peak is measured.
int64_t start() {
    const int64_t now = live.load();
    peak.store(now);
    return now;
}

void* allocate(size_t n, size_t alignment = 0) {
    void* p = alignment > alignof(std::max_align_t)
                  ? std::aligned_alloc(alignment, (std::max<size_t>(n, 1) + alignment - 1) / alignment * alignment)
                  : std::malloc(std::max<size_t>(n, 1));
    allocated(p);
    return p;
}

void release(void* p) {
    freed(p);
    std::free(p);
}

}  // namespace heap_watch

void* operator new(size_t n) {
    if (void* p = heap_watch::allocate(n)) return p;
    throw std::bad_alloc();
}
void* operator new[](size_t n) {
    if (void* p = heap_watch::allocate(n)) return p;
    throw std::bad_alloc();
}
void* operator new(size_t n, std::align_val_t a) {
    if (void* p = heap_watch::allocate(n, size_t(a))) return p;
    throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) {
    if (void* p = heap_watch::allocate(n, size_t(a))) return p;
    throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return heap_watch::allocate(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return heap_watch::allocate(n); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return heap_watch::allocate(n, size_t(a));
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return heap_watch::allocate(n, size_t(a));
}
void operator delete(void* p) noexcept { heap_watch::release(p); }
void operator delete[](void* p) noexcept { heap_watch::release(p); }
void operator delete(void* p, size_t) noexcept { heap_watch::release(p); }
void operator delete[](void* p, size_t) noexcept { heap_watch::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { heap_watch::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { heap_watch::release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { heap_watch::release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { heap_watch::release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { heap_watch::release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { heap_watch::release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { heap_watch::release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { heap_watch::release(p); }

namespace fs = std::filesystem;

namespace {

using bytes = std::vector<uint8_t>;

void put_be32(uint8_t* p, uint32_t v) {
    p[0] = uint8_t(v >> 24);
    p[1] = uint8_t(v >> 16);
    p[2] = uint8_t(v >> 8);
    p[3] = uint8_t(v);
}

reefline_header response_header(uint64_t id, uint16_t index, uint16_t count, uint32_t offset, uint32_t total,
                                 uint8_t format = REEFLINE_FORMAT_RAW, uint8_t kind = REEFLINE_KIND_RESPONSE) {
    reefline_header h{};
    h.kind = kind;
    h.format = format;
    h.request_id = id;
    h.frag_index = index;
    h.frag_count = count;
    h.payload_offset = offset;
    h.total_length = total;
    return h;
}

bytes datagram(const reefline_header& h, const bytes& fragment) {
    bytes d(REEFLINE_HEADER_SIZE + fragment.size());
    reefline_header_encode(&h, d.data());
    std::copy(fragment.begin(), fragment.end(), d.begin() + REEFLINE_HEADER_SIZE);
    return d;
}

// Every fragment of a request as the library encodes it.
std::vector<bytes> encode_request(int format, const uint16_t dims[4], const bytes& payload, uint64_t id,
                                  uint32_t frag) {
    uint32_t count = 0;
    EXPECT_EQ(reefline_fragment_count(payload.size(), frag, &count), REEFLINE_OK) << reefline_last_error();
    std::vector<bytes> out;
    for (uint32_t i = 0; i < count; ++i) {
        bytes d(REEFLINE_HEADER_SIZE + frag);
        size_t n = 0;
        EXPECT_EQ(reefline_encode_request_fragment(format, dims, payload.data(), payload.size(), id, frag, i, d.data(),
                                                   d.size(), &n),
                  REEFLINE_OK)
            << reefline_last_error();
        d.resize(n);
        out.push_back(d);
    }
    return out;
}

// UDP payloads of an Ethernet/IPv4/UDP pcap (what reefgen pcap writes: no VLAN, no options).
std::vector<bytes> pcap_udp_payloads(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    bytes all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<bytes> out;
    EXPECT_GE(all.size(), 24u);
    size_t at = 24;
    while (at + 16 <= all.size()) {
        uint32_t caplen;
        std::memcpy(&caplen, &all[at + 8], 4);  // written in host order by libpcap
        at += 16;
        if (at + caplen > all.size() || caplen < 42) break;
        out.emplace_back(all.begin() + long(at + 42), all.begin() + long(at + caplen));
        at += caplen;
    }
    return out;
}

class temp_dir {
public:
    temp_dir() {
        std::string t = (fs::temp_directory_path() / "client_c_test.XXXXXX").string();
        if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp");
        _path = t;
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(_path, ec);
    }
    std::string file(const std::string& n) const { return (_path / n).string(); }

private:
    fs::path _path;
};

}  // namespace

// ---- codec -------------------------------------------------------------------------------

TEST(ClientCodec, HeaderBytesFollowTheProtocolTable) {
    reefline_header h{};
    h.kind = REEFLINE_KIND_REQUEST;
    h.format = REEFLINE_FORMAT_IMAGE_U8_HWC;
    h.request_id = 0x0102030405060708ull;
    h.frag_index = 0x0a0b;
    h.frag_count = 0x0c0d;
    h.payload_offset = 0x11121314;
    h.total_length = 0x21222324;
    h.dims[0] = 224;
    h.dims[1] = 225;
    h.dims[2] = 3;
    uint8_t b[REEFLINE_HEADER_SIZE];
    reefline_header_encode(&h, b);
    const uint8_t want[40] = {'R',  'F',  'L',  'N',  1,    1,    1,    0,    1,    2,    3,    4,    5,    6,
                              7,    8,    0x0a, 0x0b, 0x0c, 0x0d, 0x11, 0x12, 0x13, 0x14, 0x21, 0x22, 0x23, 0x24,
                              0,    224,  0,    225,  0,    3,    0,    0,    0,    0,    0,    0};
    EXPECT_EQ(0, std::memcmp(b, want, 40));
    reefline_header back;
    reefline_header_decode(b, &back);
    EXPECT_EQ(back.request_id, h.request_id);
    EXPECT_EQ(back.payload_offset, h.payload_offset);
    EXPECT_EQ(back.dims[1], 225);
    EXPECT_STREQ(reefline_status_name(REEFLINE_STATUS_DEADLINE_EXCEEDED), "deadline_exceeded");
    EXPECT_STREQ(reefline_status_name(99), "unknown");
    EXPECT_STREQ(reefline_client_version(), "1.0.0");
}

TEST(ClientCodec, ElementsAreLittleEndianAndCrcIsCastagnoli) {
    const int32_t t[2] = {1, -2};
    uint8_t b[8];
    reefline_encode_i32(t, 2, b);
    const uint8_t want[8] = {1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff};
    EXPECT_EQ(0, std::memcmp(b, want, 8));
    const float f[1] = {1.0f};
    reefline_encode_f32(f, 1, b);
    const uint8_t one[4] = {0, 0, 0x80, 0x3f};
    EXPECT_EQ(0, std::memcmp(b, one, 4));
    float g;
    reefline_decode_f32(b, 1, &g);
    EXPECT_EQ(g, 1.0f);
    int32_t u[2];
    reefline_encode_i32(t, 2, b);
    reefline_decode_i32(b, 2, u);
    EXPECT_EQ(u[1], -2);
    // RFC 3720's check value of CRC32C.
    EXPECT_EQ(reefline_crc32c("123456789", 9), 0xe3069283u);
}

TEST(ClientCodec, FragmentPlansAndTheirLimits) {
    uint32_t n = 0;
    EXPECT_EQ(reefline_fragment_count(768, 100, &n), REEFLINE_OK);
    EXPECT_EQ(n, 8u);
    EXPECT_EQ(reefline_fragment_count(800, 100, &n), REEFLINE_OK);
    EXPECT_EQ(n, 8u);
    EXPECT_EQ(reefline_fragment_count(REEFLINE_MAX_TOTAL_LENGTH, 8192, &n), REEFLINE_OK);
    EXPECT_EQ(n, 1024u);
    EXPECT_EQ(reefline_fragment_count(REEFLINE_MAX_TOTAL_LENGTH, 8191, &n), REEFLINE_E_LIMIT);
    EXPECT_EQ(n, 1025u) << "still counted, for the message";
    EXPECT_NE(std::string(reefline_last_error()).find("1025 fragments"), std::string::npos) << reefline_last_error();
    EXPECT_EQ(reefline_fragment_count(REEFLINE_MAX_TOTAL_LENGTH + 1, 65000, &n), REEFLINE_E_LIMIT);
    EXPECT_EQ(reefline_fragment_count(0, 100, &n), REEFLINE_E_LIMIT);
    EXPECT_EQ(reefline_fragment_count(10, 0, &n), REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_EQ(reefline_fragment_count(10, REEFLINE_MAX_FRAGMENT_SIZE + 1, &n), REEFLINE_E_INVALID_ARGUMENT);

    const uint16_t dims[4] = {16, 16, 3, 0};
    reefline_header h;
    ASSERT_EQ(reefline_request_fragment_header(REEFLINE_FORMAT_IMAGE_U8_HWC, dims, 768, 42, 100, 7, &h), REEFLINE_OK);
    EXPECT_EQ(h.kind, REEFLINE_KIND_REQUEST);
    EXPECT_EQ(h.frag_index, 7);
    EXPECT_EQ(h.frag_count, 8);
    EXPECT_EQ(h.payload_offset, 700u);
    EXPECT_EQ(h.total_length, 768u);
    EXPECT_EQ(reefline_fragment_length(&h, 100), 68u);
    EXPECT_EQ(reefline_request_fragment_header(REEFLINE_FORMAT_IMAGE_U8_HWC, dims, 768, 42, 100, 8, &h),
              REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_EQ(reefline_request_fragment_header(REEFLINE_FORMAT_RESULT_TOPK, dims, 768, 42, 100, 0, &h),
              REEFLINE_E_INVALID_ARGUMENT);

    // The fragments tile the payload, and the data plane's own check accepts every one.
    bytes payload(768);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 13);
    const auto frags = encode_request(REEFLINE_FORMAT_IMAGE_U8_HWC, dims, payload, 42, 100);
    ASSERT_EQ(frags.size(), 8u);
    bytes joined;
    for (const bytes& d : frags) {
        reefline_header r;
        const uint8_t* f = nullptr;
        size_t len = 0;
        ASSERT_EQ(reefline_parse_request(d.data(), d.size(), &r, &f, &len), 0);
        EXPECT_EQ(r.payload_offset, joined.size());
        joined.insert(joined.end(), f, f + len);
    }
    EXPECT_EQ(joined, payload);
    // A buffer too small is refused, not overrun.
    uint8_t small[REEFLINE_HEADER_SIZE + 10];
    size_t written = 0;
    EXPECT_EQ(reefline_encode_request_fragment(REEFLINE_FORMAT_RAW, nullptr, payload.data(), payload.size(), 1, 100, 0,
                                               small, sizeof small, &written),
              REEFLINE_E_INVALID_ARGUMENT);
    // The data plane's drop reasons for requests, by number.
    bytes bad = frags[0];
    bad[0] ^= 1;
    EXPECT_EQ(reefline_parse_request(bad.data(), bad.size(), nullptr, nullptr, nullptr), 1);
    bad = frags[0];
    bad[29] = 17;  // dims[0] = 17: 17*16*3 != 768
    EXPECT_EQ(reefline_parse_request(bad.data(), bad.size(), nullptr, nullptr, nullptr), 6);
    EXPECT_EQ(reefline_parse_request(bad.data(), 39, nullptr, nullptr, nullptr), 7);
    EXPECT_EQ(reefline_described_length(REEFLINE_FORMAT_TENSOR_F32, dims), 4u * 768);
    EXPECT_EQ(reefline_described_length(REEFLINE_FORMAT_RAW, dims), 0u);
}

// reefgen writes its captures with this library; the bytes must also be exactly what the
// library makes for the same request, for every request format (no shuffle: in order).
TEST(ClientCodec, FragmentsEqualReefgenCaptures) {
    const char* reefgen = std::getenv("REEFGEN");
    if (!reefgen) GTEST_SKIP() << "REEFGEN not set (run through meson test)";
    temp_dir dir;
    struct case_t {
        const char* name;
        int format;
        uint16_t dims[4];
        size_t size;
        std::string args;
        uint32_t frag;
    };
    const std::vector<case_t> cases = {
        {"image", REEFLINE_FORMAT_IMAGE_U8_HWC, {20, 30, 3, 0}, 1800, "--format image --shape 20x30x3", 256},
        {"tokens", REEFLINE_FORMAT_TOKENS_I32, {77, 0, 0, 0}, 308, "--format tokens", 100},
        {"tensor", REEFLINE_FORMAT_TENSOR_F32, {16, 6, 0, 0}, 384, "--format tensor --dims 16,6", 1432},
        {"raw", REEFLINE_FORMAT_RAW, {0, 0, 0, 0}, 1001, "--format raw", 7},
    };
    for (const case_t& c : cases) {
        bytes payload(c.size);
        for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 31 + 7);
        const std::string raw = dir.file(std::string(c.name) + ".bin"), pcap = dir.file(std::string(c.name) + ".pcap");
        std::ofstream(raw, std::ios::binary).write(reinterpret_cast<const char*>(payload.data()), long(payload.size()));
        const std::string cmd = std::string(reefgen) + " pcap --out " + pcap + " --requests 3 --raw " + raw + " " +
                                c.args + " --frag-size " + std::to_string(c.frag) + " --seed 9 > /dev/null";
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        const std::vector<bytes> got = pcap_udp_payloads(pcap);
        ASSERT_FALSE(got.empty());
        reefline_header first;
        reefline_header_decode(got[0].data(), &first);
        std::vector<bytes> want;
        for (uint64_t r = 0; r < 3; ++r) {
            const auto frags = encode_request(c.format, c.dims, payload, first.request_id + r, c.frag);
            want.insert(want.end(), frags.begin(), frags.end());
        }
        ASSERT_EQ(got.size(), want.size()) << c.name;
        for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << c.name << " datagram " << i;
    }
}

TEST(ClientCodec, ResponseFragmentVerdicts) {
    const bytes ok = datagram(response_header(9, 0, 1, 0, 8, REEFLINE_FORMAT_RESULT_CRC32), bytes(8, 1));
    reefline_header h;
    const uint8_t* frag = nullptr;
    size_t len = 0;
    ASSERT_EQ(reefline_parse_response(ok.data(), ok.size(), &h, &frag, &len), REEFLINE_FRAGMENT_OK);
    EXPECT_EQ(h.request_id, 9u);
    EXPECT_EQ(len, 8u);
    EXPECT_EQ(frag, ok.data() + 40);
    const auto verdict = [](const bytes& d) {
        return reefline_parse_response(d.data(), d.size(), nullptr, nullptr, nullptr);
    };
    EXPECT_EQ(verdict(bytes(ok.begin(), ok.begin() + 39)), REEFLINE_FRAGMENT_SHORT);
    EXPECT_EQ(reefline_parse_response(nullptr, 100, nullptr, nullptr, nullptr), REEFLINE_FRAGMENT_SHORT);
    bytes b = ok;
    b[39] = 1;
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_BAD_HEADER);
    b = ok;
    b[4] = 2;
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_BAD_HEADER);
    b = ok;
    b[5] = 9;
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_BAD_KIND);
    b[5] = REEFLINE_KIND_REQUEST;
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_REQUEST);
    b = datagram(response_header(9, 1, 1, 0, 8), bytes(8));
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_TOO_MANY_FRAGMENTS);
    b = datagram(response_header(9, 0, 1025, 0, 8), bytes(8));
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_TOO_MANY_FRAGMENTS);
    b = datagram(response_header(9, 0, 1, 0, REEFLINE_MAX_TOTAL_LENGTH + 1), bytes(8));
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_TOO_LARGE);
    b = datagram(response_header(9, 0, 1, 0xfffffffcu, 8), bytes(8));  // offset + length overflows 32 bits
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_OFFSET_OUT_OF_RANGE);
    b = ok;
    b.push_back(0);
    EXPECT_EQ(verdict(b), REEFLINE_FRAGMENT_OFFSET_OUT_OF_RANGE);
    EXPECT_STREQ(reefline_fragment_verdict_name(REEFLINE_FRAGMENT_SHORT), "short_payload");
    EXPECT_STREQ(reefline_fragment_verdict_name(REEFLINE_FRAGMENT_OFFSET_OUT_OF_RANGE), "offset_out_of_range");
}

// ---- reassembly ------------------------------------------------------------------------

namespace {

struct assembler_ptr {
    explicit assembler_ptr(reefline_assembler_options o = {}) : a(reefline_assembler_create(&o)) {}
    ~assembler_ptr() { reefline_assembler_destroy(a); }
    reefline_assembler* a;
};

int add(reefline_assembler* a, uint64_t id, const reefline_header& h, const bytes& f, reefline_message* m,
        uint32_t ip = 0, uint16_t port = 0) {
    const reefline_flow flow{ip, port, id};
    return reefline_assembler_add(a, &flow, &h, f.data(), f.size(), m);
}

}  // namespace

TEST(ClientAssembler, OutOfOrderDuplicatesAndInconsistentFragments) {
    assembler_ptr asmb;
    reefline_message m{};
    bytes payload(250);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i);
    const auto piece = [&](uint16_t i) {
        return bytes(payload.begin() + i * 100, payload.begin() + std::min<size_t>(250, i * 100 + 100));
    };
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 2, 3, 200, 250), piece(2), &m), REEFLINE_ADD_ACCEPTED);
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 2, 3, 200, 250), piece(2), &m), REEFLINE_ADD_DUPLICATE);
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 0, 3, 0, 251), piece(0), &m), REEFLINE_ADD_INCONSISTENT);
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 0, 4, 0, 250), piece(0), &m), REEFLINE_ADD_INCONSISTENT);
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 0, 3, 0, 250, REEFLINE_FORMAT_RESULT_TOPK), piece(0), &m),
              REEFLINE_ADD_INCONSISTENT);
    // Another peer with the same id is another message.
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 0, 3, 0, 250), piece(0), &m, 0x7f000001, 5), REEFLINE_ADD_ACCEPTED);
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 0, 3, 0, 250), piece(0), &m), REEFLINE_ADD_ACCEPTED);
    reefline_pending p[4];
    ASSERT_EQ(reefline_assembler_pending(asmb.a, p, 4), 2u);
    EXPECT_EQ(p[0].flow.port, 0);  // oldest first
    EXPECT_EQ(p[0].received, 2u);
    EXPECT_EQ(p[1].flow.port, 5);
    ASSERT_EQ(add(asmb.a, 1, response_header(1, 1, 3, 100, 250), piece(1), &m), REEFLINE_ADD_COMPLETED);
    EXPECT_TRUE(m.tiles);
    ASSERT_EQ(m.length, 250u);
    EXPECT_EQ(bytes(m.payload, m.payload + m.length), payload);
    EXPECT_EQ(m.payload[m.length], 0) << "NUL after the payload";
    EXPECT_EQ(reefline_assembler_pending(asmb.a, nullptr, 0), 1u);
    EXPECT_EQ(reefline_assembler_forget(asmb.a, &p[1].flow), 1);
    EXPECT_EQ(reefline_assembler_pending(asmb.a, nullptr, 0), 0u);
    EXPECT_EQ(reefline_assembler_pending_bytes(asmb.a), 0u);
    // Without remember_completed, a late copy opens a new message.
    EXPECT_EQ(add(asmb.a, 1, response_header(1, 1, 3, 100, 250), piece(1), &m), REEFLINE_ADD_ACCEPTED);
    EXPECT_EQ(reefline_assembler_is_completed(asmb.a, &p[0].flow), 0);
}

TEST(ClientAssembler, OverlapsAndGapsDoNotTile) {
    assembler_ptr asmb;
    reefline_message m{};
    // Two fragments claiming offset 0 of a 20-byte message: complete by index, but overlapping.
    EXPECT_EQ(add(asmb.a, 2, response_header(2, 0, 2, 0, 20), bytes(10, 1), &m), REEFLINE_ADD_ACCEPTED);
    ASSERT_EQ(add(asmb.a, 2, response_header(2, 1, 2, 0, 20), bytes(10, 2), &m), REEFLINE_ADD_COMPLETED);
    EXPECT_FALSE(m.tiles);
    // A single fragment short of its total: a gap.
    ASSERT_EQ(add(asmb.a, 3, response_header(3, 0, 1, 0, 8000000), bytes(1, 1), &m), REEFLINE_ADD_COMPLETED);
    EXPECT_FALSE(m.tiles);
    EXPECT_EQ(m.length, 1u) << "holds what arrived, not what was claimed";
}

TEST(ClientAssembler, RememberCompletedReportsLateDuplicates) {
    reefline_assembler_options o{};
    o.remember_completed = 1;
    assembler_ptr asmb(o);
    reefline_message m{};
    ASSERT_EQ(add(asmb.a, 4, response_header(4, 0, 1, 0, 3), bytes(3, 9), &m), REEFLINE_ADD_COMPLETED);
    EXPECT_EQ(add(asmb.a, 4, response_header(4, 0, 1, 0, 3), bytes(3, 9), &m), REEFLINE_ADD_AFTER_COMPLETION);
    const reefline_flow f{0, 0, 4};
    EXPECT_EQ(reefline_assembler_is_completed(asmb.a, &f), 1);
    EXPECT_STREQ(reefline_add_outcome_name(REEFLINE_ADD_AFTER_COMPLETION), "after_completion");
}

TEST(ClientAssembler, BoundsDropTheOldest) {
    reefline_assembler_options o{};
    o.max_pending = 2;
    assembler_ptr by_count(o);
    reefline_message m{};
    const bytes piece(100, 0x5a);
    for (uint64_t id = 1; id <= 3; ++id)
        EXPECT_EQ(add(by_count.a, id, response_header(id, 0, 2, 0, 200), piece, &m), REEFLINE_ADD_ACCEPTED);
    EXPECT_EQ(reefline_assembler_evicted(by_count.a), 1u);
    reefline_pending p[2];
    ASSERT_EQ(reefline_assembler_pending(by_count.a, p, 2), 2u);
    EXPECT_EQ(p[0].flow.request_id, 2u);

    // max_pending_bytes counts what is allocated: pieces of 10,000 bytes cost a little more,
    // and a message must also be able to hold its reassembled copy (30,000 bytes for three).
    o = {};
    o.max_pending_bytes = 50000;
    assembler_ptr by_bytes(o);
    const bytes big(10000, 0x5a);
    EXPECT_EQ(add(by_bytes.a, 1, response_header(1, 0, 3, 0, 30000), big, &m), REEFLINE_ADD_ACCEPTED);
    EXPECT_GT(reefline_assembler_pending_bytes(by_bytes.a), 10000u);
    EXPECT_LT(reefline_assembler_pending_bytes(by_bytes.a), 10600u);
    EXPECT_EQ(add(by_bytes.a, 2, response_header(2, 0, 3, 0, 30000), big, &m), REEFLINE_ADD_ACCEPTED);
    EXPECT_EQ(reefline_assembler_evicted(by_bytes.a), 0u);
    // Two pieces and their 20,000-byte copy fit alone, not beside message 1.
    EXPECT_EQ(add(by_bytes.a, 2, response_header(2, 1, 3, 10000, 30000), big, &m), REEFLINE_ADD_ACCEPTED);
    EXPECT_EQ(reefline_assembler_evicted(by_bytes.a), 1u);
    ASSERT_EQ(reefline_assembler_pending(by_bytes.a, p, 2), 1u);
    EXPECT_EQ(p[0].flow.request_id, 2u);
    EXPECT_LE(reefline_assembler_pending_bytes(by_bytes.a), 50000u);
    // Three pieces and a 30,000-byte copy do not fit at all.
    EXPECT_EQ(add(by_bytes.a, 2, response_header(2, 2, 3, 20000, 30000), big, &m), REEFLINE_ADD_TOO_LARGE);
    EXPECT_EQ(reefline_assembler_evicted(by_bytes.a), 2u);
    EXPECT_EQ(reefline_assembler_pending(by_bytes.a, nullptr, 0), 0u);
    EXPECT_EQ(reefline_assembler_pending_bytes(by_bytes.a), 0u);

    // With room for both, the message completes; its copy is held until the next add.
    o.max_pending_bytes = 70000;
    assembler_ptr roomy(o);
    for (uint16_t i = 0; i < 2; ++i)
        EXPECT_EQ(add(roomy.a, 3, response_header(3, i, 3, i * 10000u, 30000), big, &m), REEFLINE_ADD_ACCEPTED);
    ASSERT_EQ(add(roomy.a, 3, response_header(3, 2, 3, 20000, 30000), big, &m), REEFLINE_ADD_COMPLETED);
    EXPECT_TRUE(m.tiles);
    EXPECT_EQ(m.length, 30000u);
    EXPECT_GT(reefline_assembler_pending_bytes(roomy.a), 30000u);
    EXPECT_LT(reefline_assembler_pending_bytes(roomy.a), 30100u);
    const reefline_flow three{0, 0, 3};
    EXPECT_EQ(reefline_assembler_forget(roomy.a, &three), 0);
    EXPECT_EQ(reefline_assembler_pending_bytes(roomy.a), 0u) << "forget releases the copy too";
}

// Live heap bytes against max_pending_bytes (heap_watch counts every operator new of the
// process): what the issue measured, 20,000 one-byte fragments of distinct messages that each
// claim 1024 fragments of 8 MiB, took 555 MiB under a 1 MiB bound when entries were sized by
// the claims.
namespace {

constexpr size_t memory_bound = size_t(1) << 20;
// The assembler object itself, outside the bound, and what gtest may keep.
constexpr int64_t memory_slack = 4096;

}  // namespace

TEST(ClientAssemblerMemory, ClaimsOfManyFragmentsCostOnlyWhatArrived) {
    const int64_t base = heap_watch::start();
    {
        reefline_assembler_options o{};
        o.max_pending_bytes = memory_bound;
        assembler_ptr asmb(o);
        const uint8_t one = 0x42;
        for (uint64_t i = 0; i < 20000; ++i) {
            const uint16_t index = uint16_t(i % 1024);
            const reefline_header h = response_header(i, index, 1024, index * 8192u, 8u << 20);
            const reefline_flow flow{0x0a000001, uint16_t(40000 + i % 7), i};
            reefline_message m;
            ASSERT_EQ(reefline_assembler_add(asmb.a, &flow, &h, &one, 1, &m), REEFLINE_ADD_ACCEPTED) << i;
            ASSERT_LE(reefline_assembler_pending_bytes(asmb.a), memory_bound);
            ASSERT_LE(heap_watch::live.load() - base, int64_t(memory_bound) + memory_slack) << i;
        }
        const size_t pending = reefline_assembler_pending(asmb.a, nullptr, 0);
        EXPECT_GT(pending, 2000u) << "the bound holds thousands of such fragments";
        EXPECT_EQ(reefline_assembler_evicted(asmb.a), 20000u - pending);
        std::printf("20000 one-byte fragments claiming 1024: peak %lld live bytes, %zu pending, bound %zu\n",
                    static_cast<long long>(heap_watch::peak.load() - base), pending, memory_bound);
    }
    EXPECT_LE(heap_watch::peak.load() - base, int64_t(memory_bound) + memory_slack);
    EXPECT_EQ(heap_watch::live.load(), base) << "everything freed";
}

TEST(ClientAssemblerMemory, AHostileStreamOfOneFlowStaysWithinTheBound) {
    uint64_t outcomes[REEFLINE_ADD_TOO_LARGE + 1] = {};
    const int64_t base = heap_watch::start();
    {
        reefline_assembler_options o{};
        o.max_pending_bytes = memory_bound;
        assembler_ptr asmb(o);
        std::mt19937_64 rng(99);
        const bytes chunk(REEFLINE_MTU_FRAGMENT_SIZE, 0x17);
        for (int i = 0; i < 50000; ++i) {
            // Mostly 1024 fragments of 8 MiB, sometimes another claim (inconsistent), sometimes
            // the whole message in one piece after all.
            const uint16_t count = rng() % 50 == 0 ? uint16_t(1 + rng() % 1024) : 1024;
            const uint16_t index = uint16_t(rng() % count);
            const size_t length = rng() % 4 == 0 ? 1 : chunk.size();
            const reefline_header h =
                response_header(7, index, count, uint32_t(index) * REEFLINE_MTU_FRAGMENT_SIZE, 8u << 20);
            const reefline_flow flow{0x0a000001, 40000, 7};
            reefline_message m;
            const int rc = reefline_assembler_add(asmb.a, &flow, &h, chunk.data(), length, &m);
            ASSERT_GE(rc, 0);
            ASSERT_LE(rc, REEFLINE_ADD_TOO_LARGE);
            ++outcomes[rc];
            ASSERT_LE(reefline_assembler_pending_bytes(asmb.a), memory_bound);
            ASSERT_LE(heap_watch::peak.load() - base, int64_t(memory_bound) + memory_slack) << i;
        }
        std::printf("50000 fragments of one flow: peak %lld live bytes, bound %zu\n",
                    static_cast<long long>(heap_watch::peak.load() - base), memory_bound);
    }
    EXPECT_GT(outcomes[REEFLINE_ADD_TOO_LARGE], 10u) << "the message outgrows the bound again and again";
    EXPECT_GT(outcomes[REEFLINE_ADD_ACCEPTED], 10000u);
    EXPECT_GT(outcomes[REEFLINE_ADD_DUPLICATE], 0u);
    EXPECT_GT(outcomes[REEFLINE_ADD_INCONSISTENT], 0u);
    EXPECT_EQ(heap_watch::live.load(), base);
}

TEST(ClientAssemblerMemory, RememberedCompletionsAreBoundedAndCounted) {
    const auto complete_all = [](reefline_assembler* a, uint64_t n) {
        const bytes payload(16, 3);
        for (uint64_t id = 0; id < n; ++id) {
            reefline_message m;
            ASSERT_EQ(add(a, id, response_header(id, 0, 1, 0, 16), payload, &m), REEFLINE_ADD_COMPLETED) << id;
            ASSERT_EQ(m.length, 16u);
        }
    };
    const auto remembered = [](reefline_assembler* a, uint64_t id) {
        const reefline_flow f{0, 0, id};
        return reefline_assembler_is_completed(a, &f) == 1;
    };
    constexpr uint64_t n = 300000;
    const bytes payload(16, 3);
    reefline_message m;

    // Within a bound: a quarter of it for the most recent completed flows.
    int64_t base = heap_watch::start();
    {
        reefline_assembler_options o{};
        o.max_pending_bytes = memory_bound;
        o.remember_completed = 1;
        assembler_ptr asmb(o);
        complete_all(asmb.a, n);
        EXPECT_LE(reefline_assembler_pending_bytes(asmb.a), memory_bound / 4 + 64);
        uint64_t kept = 0;
        while (kept < n && remembered(asmb.a, n - 1 - kept)) ++kept;
        EXPECT_GT(kept, 5000u) << "about 28 bytes a flow";
        EXPECT_LT(kept, memory_bound / 4 / 24);
        EXPECT_FALSE(remembered(asmb.a, 0));
        EXPECT_EQ(add(asmb.a, n - 1, response_header(n - 1, 0, 1, 0, 16), payload, &m), REEFLINE_ADD_AFTER_COMPLETION);
        // Forgotten: a late copy is a message again.
        EXPECT_EQ(add(asmb.a, 0, response_header(0, 0, 1, 0, 16), payload, &m), REEFLINE_ADD_COMPLETED);
        std::printf("%llu completions, bound %zu: %llu remembered, peak %lld live bytes\n",
                    static_cast<unsigned long long>(n), memory_bound, static_cast<unsigned long long>(kept),
                    static_cast<long long>(heap_watch::peak.load() - base));
    }
    EXPECT_LE(heap_watch::peak.load() - base, int64_t(memory_bound) + memory_slack);
    EXPECT_EQ(heap_watch::live.load(), base);

    // Without a byte bound: 65536 flows at most (28 bytes each; 1.5 times that while the ring
    // doubles, the old one beside the new).
    base = heap_watch::start();
    {
        reefline_assembler_options o{};
        o.remember_completed = 1;
        assembler_ptr asmb(o);
        complete_all(asmb.a, n);
        EXPECT_TRUE(remembered(asmb.a, n - 65536));
        EXPECT_FALSE(remembered(asmb.a, n - 65537));
        EXPECT_LE(reefline_assembler_pending_bytes(asmb.a), size_t(65536) * 32);
    }
    EXPECT_LE(heap_watch::peak.load() - base, int64_t(65536) * 28 * 3 / 2 + 65536);

    // As many as asked for.
    {
        reefline_assembler_options o{};
        o.remember_completed = 1000;
        o.max_pending_bytes = memory_bound;
        assembler_ptr asmb(o);
        complete_all(asmb.a, 5000);
        EXPECT_TRUE(remembered(asmb.a, 4000));
        EXPECT_FALSE(remembered(asmb.a, 3999));
    }
}

// Random and mutated datagrams through the parser into a bounded assembler: nothing crashes
// (ASan/UBSan builds make this stricter), the bounds hold, and every completed message holds
// exactly the bytes its fragments brought.
TEST(ClientAssembler, HostileDatagramsStayWithinBounds) {
    reefline_assembler_options o{};
    o.max_pending = 16;
    o.max_pending_bytes = 64 << 10;
    assembler_ptr asmb(o);
    std::mt19937_64 rng(12345);
    const bytes good = datagram(response_header(77, 0, 3, 0, 3000, REEFLINE_FORMAT_RESULT_TENSOR_F32), bytes(1000, 3));
    uint64_t completed = 0, accepted = 0;
    for (int i = 0; i < 200000; ++i) {
        bytes d;
        switch (rng() % 3) {
        case 0: {  // random bytes, sometimes with a valid magic and version
            d.resize(rng() % 200);
            for (auto& b : d) b = uint8_t(rng());
            if (d.size() >= 6 && rng() % 2) {
                put_be32(d.data(), REEFLINE_MAGIC);
                d[4] = 1;
                d[5] = uint8_t(2 + rng() % 2);
                if (d.size() >= 40) std::fill(d.begin() + 36, d.begin() + 40, 0);
            }
            break;
        }
        case 1: {  // a good fragment with header fields randomised
            d = good;
            for (int k = 0; k < 3; ++k) d[8 + rng() % 32] = uint8_t(rng());
            d.resize(40 + rng() % 1100);
            break;
        }
        default: {  // plausible fragments of many messages, some lying about their sizes
            const uint16_t count = uint16_t(1 + rng() % 8);
            const uint16_t index = uint16_t(rng() % count);
            const uint32_t total = uint32_t(rng() % 2 ? 800 : rng() % REEFLINE_MAX_TOTAL_LENGTH);
            const uint32_t len = uint32_t(rng() % 300);
            reefline_header h = response_header(rng() % 64, index, count, uint32_t(rng() % 1000), total);
            d = datagram(h, bytes(len, uint8_t(index)));
        }
        }
        reefline_header h;
        const uint8_t* frag = nullptr;
        size_t len = 0;
        if (reefline_parse_response(d.data(), d.size(), &h, &frag, &len) != REEFLINE_FRAGMENT_OK) continue;
        ASSERT_LE(frag + len, d.data() + d.size());
        ASSERT_LE(uint64_t(h.payload_offset) + len, h.total_length);
        const reefline_flow flow{0, 0, h.request_id};
        reefline_message m;
        const int rc = reefline_assembler_add(asmb.a, &flow, &h, frag, len, &m);
        ASSERT_GE(rc, 0);
        if (rc == REEFLINE_ADD_ACCEPTED) ++accepted;
        if (rc == REEFLINE_ADD_COMPLETED) {
            ++completed;
            ASSERT_LE(m.length, size_t(m.head.total_length));
            if (m.tiles) {
                ASSERT_EQ(m.length, m.head.total_length);
            }
        }
        ASSERT_LE(reefline_assembler_pending_bytes(asmb.a), o.max_pending_bytes);
        ASSERT_LE(reefline_assembler_pending(asmb.a, nullptr, 0), o.max_pending);
    }
    EXPECT_GT(accepted, 1000u);
    EXPECT_GT(completed, 100u);
}

// ---- results -----------------------------------------------------------------------------

namespace {

reefline_result view(uint8_t kind, uint8_t status, uint8_t format, std::vector<uint16_t> dims, const bytes& payload) {
    reefline_result r{};
    r.kind = kind;
    r.status = status;
    r.format = format;
    std::copy(dims.begin(), dims.end(), r.dims);
    r.payload = payload.data();
    r.payload_length = payload.size();
    return r;
}

bytes topk_bytes(const std::vector<std::pair<uint32_t, float>>& entries) {
    bytes b(entries.size() * 8);
    for (size_t i = 0; i < entries.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &entries[i].second, 4);
        put_be32(&b[i * 8], entries[i].first);
        put_be32(&b[i * 8 + 4], bits);
    }
    return b;
}

}  // namespace

TEST(ClientResults, TopKTensorCrcAndErrorsDecodeOrAreRefused) {
    const bytes tk = topk_bytes({{7, 0.75f}, {3, 0.125f}});
    reefline_result r = view(REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TOPK, {2}, tk);
    EXPECT_EQ(reefline_result_validate(&r), REEFLINE_OK);
    reefline_topk_entry e[4];
    size_t n = 0;
    ASSERT_EQ(reefline_result_topk(&r, e, 4, &n), REEFLINE_OK);
    ASSERT_EQ(n, 2u);
    EXPECT_EQ(e[0].class_index, 7u);
    EXPECT_EQ(e[0].score, 0.75f);
    EXPECT_EQ(e[1].score, 0.125f);
    ASSERT_EQ(reefline_result_topk(&r, nullptr, 0, &n), REEFLINE_OK);  // asking how many
    EXPECT_EQ(n, 2u);
    ASSERT_EQ(reefline_result_topk(&r, e, 1, &n), REEFLINE_OK);  // truncated to the capacity
    EXPECT_EQ(n, 2u);
    r.dims[0] = 3;
    EXPECT_EQ(reefline_result_topk(&r, e, 4, &n), REEFLINE_E_MALFORMED);
    const bytes odd(tk.begin(), tk.end() - 1);
    r = view(REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TOPK, {1}, odd);
    EXPECT_EQ(reefline_result_topk(&r, e, 4, &n), REEFLINE_E_MALFORMED);
    EXPECT_EQ(reefline_result_crc32(&r, nullptr, nullptr), REEFLINE_E_WRONG_FORMAT);

    bytes t(24);
    const float v[6] = {0.5f, -1, 2, 3, 4, 5};
    reefline_encode_f32(v, 6, t.data());
    r = view(REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TENSOR_F32, {2, 3}, t);
    float out[8];
    uint32_t dims[4];
    size_t nd = 0;
    ASSERT_EQ(reefline_result_tensor(&r, out, 8, &n, dims, &nd), REEFLINE_OK);
    EXPECT_EQ(n, 6u);
    EXPECT_EQ(nd, 2u);
    EXPECT_EQ(dims[1], 3u);
    EXPECT_EQ(out[1], -1.0f);
    r.dims[0] = 3;  // 36 bytes claimed
    EXPECT_EQ(reefline_result_tensor(&r, out, 8, &n, dims, &nd), REEFLINE_E_MALFORMED);
    EXPECT_EQ(reefline_result_validate(&r), REEFLINE_E_MALFORMED);
    r = view(REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TENSOR_F32, {6, 0, 1}, t);
    EXPECT_EQ(reefline_result_tensor_dims(&r, dims, &nd), REEFLINE_E_MALFORMED);
    r = view(REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TENSOR_F32, {}, t);
    EXPECT_EQ(reefline_result_tensor(&r, out, 8, &n, dims, &nd), REEFLINE_E_MALFORMED);

    bytes c(8);
    put_be32(c.data(), 100);
    put_be32(c.data() + 4, 0xdeadbeef);
    r = view(REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_CRC32, {}, c);
    uint32_t len = 0, crc = 0;
    ASSERT_EQ(reefline_result_crc32(&r, &len, &crc), REEFLINE_OK);
    EXPECT_EQ(len, 100u);
    EXPECT_EQ(crc, 0xdeadbeefu);
    r.payload_length = 7;
    EXPECT_EQ(reefline_result_crc32(&r, &len, &crc), REEFLINE_E_MALFORMED);

    const std::string msg = "token 5000 at position 4 is outside the vocabulary [0, 1024)";
    const bytes mb(msg.begin(), msg.end());
    r = view(REEFLINE_KIND_ERROR, REEFLINE_STATUS_BAD_REQUEST, REEFLINE_FORMAT_RAW, {}, mb);
    EXPECT_EQ(reefline_result_validate(&r), REEFLINE_OK);
    char text[128];
    EXPECT_EQ(reefline_result_error_message(&r, text, sizeof text), int(msg.size()));
    EXPECT_EQ(std::string(text), msg);
    EXPECT_EQ(reefline_result_error_message(&r, text, 6), int(msg.size()));
    EXPECT_STREQ(text, "token");
    EXPECT_EQ(reefline_result_topk(&r, e, 4, &n), REEFLINE_E_WRONG_FORMAT) << "an error has no result";
    r.status = 0;
    EXPECT_EQ(reefline_result_validate(&r), REEFLINE_E_MALFORMED);
    r = view(REEFLINE_KIND_RESPONSE, REEFLINE_STATUS_OVERLOADED, REEFLINE_FORMAT_RESULT_CRC32, {}, c);
    EXPECT_EQ(reefline_result_validate(&r), REEFLINE_E_MALFORMED);
    EXPECT_EQ(reefline_result_error_message(&r, text, sizeof text), REEFLINE_E_WRONG_FORMAT);
}

// ---- the client, against a loopback responder ---------------------------------------------

namespace {

// reefline in miniature on 127.0.0.1: reassembles requests with the library's assembler
// (checked as the data plane checks them) and answers like the daemon's IFs, fragmenting
// answers at `response_fragment` bytes, last fragment first and the first one twice.
//   raw, image: result_crc32 (the crc32 IF); with topk_images, images get a top-5 instead
//   tokens:     an error (bad_request) naming the first negative token, else a top-3
//   tensor:     result_tensor_f32, the request's values doubled, its dims
// `drop_first` leaves each request's first completion unanswered (for retries); `noise`
// sends garbage datagrams before every answer; `silent` answers nothing.
class responder {
public:
    struct config {
        bool topk_images = false;
        bool drop_first = false;
        bool noise = false;
        bool silent = false;
        uint32_t response_fragment = 1432;
    };
    explicit responder(config c) : _c(c) {
        _fd = ::socket(AF_INET, SOCK_DGRAM, 0);
        const int big = 8 << 20, on = 1;
        setsockopt(_fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
        setsockopt(_fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind");
        socklen_t len = sizeof a;
        getsockname(_fd, reinterpret_cast<sockaddr*>(&a), &len);
        _port = ntohs(a.sin_port);
        _thread = std::thread([this] { run(); });
    }
    ~responder() {
        _stop = true;
        _thread.join();
        ::close(_fd);
    }
    uint16_t port() const { return _port; }
    int completions() const { return _completions; }
    std::vector<int64_t> arrivals_ns() {
        std::lock_guard g(_mu);
        return _arrivals;
    }

private:
    void answer(const sockaddr_in& to, uint64_t id, uint8_t kind, uint8_t status, uint8_t format,
                std::vector<uint16_t> dims, const bytes& payload) {
        std::vector<bytes> out;
        const uint32_t frag = _c.response_fragment;
        const uint32_t count = uint32_t(std::max<size_t>(1, (payload.size() + frag - 1) / frag));
        for (uint32_t i = 0; i < count; ++i) {
            reefline_header h = response_header(id, uint16_t(i), uint16_t(count), i * frag, uint32_t(payload.size()),
                                                format, kind);
            h.status = status;
            std::copy(dims.begin(), dims.end(), h.dims);
            const size_t n = std::min<size_t>(frag, payload.size() - i * frag);
            out.push_back(datagram(h, bytes(payload.begin() + long(i) * frag, payload.begin() + long(i * frag + n))));
        }
        std::reverse(out.begin(), out.end());
        out.push_back(out.back());  // the original first fragment, twice
        if (_c.noise) {
            out.insert(out.begin(), bytes{1, 2, 3});
            bytes fake = out.front();
            out.insert(out.begin(), datagram(response_header(id, 0, 1, 0, 4000000), bytes(10, 0)));
            out.insert(out.begin(), datagram(response_header(id + 1000000, 0, 1, 0, 4), bytes(4, 0)));
            bytes bad_kind = datagram(response_header(id, 0, 1, 0, 4), bytes(4, 0));
            bad_kind[5] = 7;
            out.insert(out.begin(), bad_kind);
        }
        for (const bytes& d : out)
            ::sendto(_fd, d.data(), d.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    }

    void run() {
        reefline_assembler* asmb = reefline_assembler_create(nullptr);
        bytes buf(65536);
        std::map<std::pair<uint64_t, uint16_t>, int> seen;  // (id, port) -> completions
        while (!_stop) {
            pollfd p{_fd, POLLIN, 0};
            if (::poll(&p, 1, 10) <= 0) continue;
            sockaddr_in from{};
            iovec iov{buf.data(), buf.size()};
            alignas(cmsghdr) char control[64];
            msghdr mh{};
            mh.msg_name = &from;
            mh.msg_namelen = sizeof from;
            mh.msg_iov = &iov;
            mh.msg_iovlen = 1;
            mh.msg_control = control;
            mh.msg_controllen = sizeof control;
            const ssize_t n = ::recvmsg(_fd, &mh, 0);
            if (n <= 0) continue;
            // The kernel's arrival time (on loopback, the moment of sending), not when this
            // thread got to read it: the pacing check must not depend on scheduling here.
            for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                    timespec ts;
                    std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
                    std::lock_guard g(_mu);
                    _arrivals.push_back(int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
                }
            reefline_header h;
            const uint8_t* frag = nullptr;
            size_t len = 0;
            if (reefline_parse_request(buf.data(), size_t(n), &h, &frag, &len) != 0) continue;
            const reefline_flow flow{ntohl(from.sin_addr.s_addr), ntohs(from.sin_port), h.request_id};
            reefline_message m;
            if (reefline_assembler_add(asmb, &flow, &h, frag, len, &m) != REEFLINE_ADD_COMPLETED || !m.tiles) continue;
            ++_completions;
            const bytes payload(m.payload, m.payload + m.length);
            if (_c.silent) continue;
            if (_c.drop_first && seen[{h.request_id, flow.port}]++ == 0) continue;
            if (m.head.format == REEFLINE_FORMAT_TOKENS_I32) {
                std::vector<int32_t> t(payload.size() / 4);
                reefline_decode_i32(payload.data(), t.size(), t.data());
                const auto bad = std::find_if(t.begin(), t.end(), [](int32_t v) { return v < 0; });
                if (bad != t.end()) {
                    const std::string msg = "token " + std::to_string(*bad) + " at position " +
                                            std::to_string(bad - t.begin()) + " is outside the vocabulary";
                    answer(from, h.request_id, REEFLINE_KIND_ERROR, REEFLINE_STATUS_BAD_REQUEST, REEFLINE_FORMAT_RAW, {},
                           bytes(msg.begin(), msg.end()));
                } else {
                    answer(from, h.request_id, REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TOPK, {3},
                           topk_bytes({{uint32_t(t[0]), 0.5f}, {1, 0.25f}, {2, 0.125f}}));
                }
            } else if (m.head.format == REEFLINE_FORMAT_TENSOR_F32) {
                std::vector<float> v(payload.size() / 4);
                reefline_decode_f32(payload.data(), v.size(), v.data());
                for (float& x : v) x *= 2;
                bytes out(payload.size());
                reefline_encode_f32(v.data(), v.size(), out.data());
                answer(from, h.request_id, REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TENSOR_F32,
                       {m.head.dims[0], m.head.dims[1], m.head.dims[2], m.head.dims[3]}, out);
            } else if (m.head.format == REEFLINE_FORMAT_IMAGE_U8_HWC && _c.topk_images) {
                std::vector<std::pair<uint32_t, float>> top;
                for (uint32_t k = 0; k < 5; ++k) top.push_back({(payload[0] + k) % 1000, 1.0f / float(k + 1)});
                answer(from, h.request_id, REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_TOPK, {5}, topk_bytes(top));
            } else {
                bytes c(8);
                put_be32(c.data(), uint32_t(payload.size()));
                put_be32(c.data() + 4, reefline_crc32c(payload.data(), payload.size()));
                answer(from, h.request_id, REEFLINE_KIND_RESPONSE, 0, REEFLINE_FORMAT_RESULT_CRC32, {}, c);
            }
        }
        reefline_assembler_destroy(asmb);
    }

    config _c;
    int _fd = -1;
    uint16_t _port = 0;
    std::atomic<bool> _stop{false};
    std::atomic<int> _completions{0};
    std::mutex _mu;
    std::vector<int64_t> _arrivals;
    std::thread _thread;
};

struct client_ptr {
    explicit client_ptr(reefline_client_options o) {
        EXPECT_EQ(reefline_client_create(&o, &c), REEFLINE_OK) << reefline_last_error();
    }
    ~client_ptr() { reefline_client_destroy(c); }
    reefline_client* c = nullptr;
};

reefline_client_options loopback(uint16_t port) {
    reefline_client_options o;
    reefline_client_options_init(&o);
    o.address = "127.0.0.1";
    o.bind_address = "127.0.0.1";
    o.port = port;
    o.fragment_size = 512;
    return o;
}

bytes image_bytes(size_t n, uint8_t seed) {
    bytes b(n);
    for (size_t i = 0; i < n; ++i) b[i] = uint8_t(i * 7 + seed);
    return b;
}

}  // namespace

TEST(ClientLive, ImagesTokensTensorsAndRawAreAnswered) {
    responder::config rc;
    rc.response_fragment = 16;  // tensors and top-k come back in several fragments
    responder r(rc);
    client_ptr cl(loopback(r.port()));
    ASSERT_NE(cl.c, nullptr);
    uint32_t ip = 0;
    uint16_t port = 0;
    ASSERT_EQ(reefline_client_local_address(cl.c, &ip, &port), REEFLINE_OK);
    EXPECT_EQ(ip, INADDR_LOOPBACK);
    EXPECT_NE(port, 0);
    EXPECT_GE(reefline_client_fd(cl.c), 0);

    // Several in flight at once, collected in any order.
    const bytes img = image_bytes(32 * 32 * 3, 1);
    std::vector<uint64_t> ids;
    for (int i = 0; i < 5; ++i) {
        uint64_t id = 0;
        ASSERT_EQ(reefline_client_send_image(cl.c, 32, 32, 3, img.data(), &id), REEFLINE_OK) << reefline_last_error();
        if (!ids.empty()) {
            EXPECT_EQ(id, ids.back() + 1);
        }
        ids.push_back(id);
    }
    EXPECT_EQ(reefline_client_outstanding(cl.c), 5u);
    for (int i = 0; i < 5; ++i) {
        reefline_result res{};
        ASSERT_EQ(reefline_client_receive(cl.c, 2000, &res), REEFLINE_OK) << reefline_last_error();
        EXPECT_NE(std::find(ids.begin(), ids.end(), res.request_id), ids.end());
        uint32_t len = 0, crc = 0;
        ASSERT_EQ(reefline_result_crc32(&res, &len, &crc), REEFLINE_OK);
        EXPECT_EQ(len, img.size());
        EXPECT_EQ(crc, reefline_crc32c(img.data(), img.size()));
        EXPECT_EQ(res.attempts, 1u);
        EXPECT_GT(res.latency_us, 0);
        reefline_result_clear(&res);
    }
    EXPECT_EQ(reefline_client_outstanding(cl.c), 0u);

    // Tokens: a top-3, or the error naming the bad token.
    const int32_t good[4] = {42, 1, 2, 3};
    uint64_t id = 0;
    ASSERT_EQ(reefline_client_send_tokens(cl.c, good, 4, &id), REEFLINE_OK);
    reefline_result res{};
    ASSERT_EQ(reefline_client_wait(cl.c, id, 2000, &res), REEFLINE_OK) << reefline_last_error();
    reefline_topk_entry top[8];
    size_t k = 0;
    ASSERT_EQ(reefline_result_topk(&res, top, 8, &k), REEFLINE_OK) << reefline_last_error();
    ASSERT_EQ(k, 3u);
    EXPECT_EQ(top[0].class_index, 42u);
    EXPECT_EQ(top[0].score, 0.5f);
    reefline_result_clear(&res);
    const int32_t bad[3] = {5, -7, 1};
    ASSERT_EQ(reefline_client_send_tokens(cl.c, bad, 3, &id), REEFLINE_OK);
    ASSERT_EQ(reefline_client_wait(cl.c, id, 2000, &res), REEFLINE_OK);
    EXPECT_EQ(res.kind, REEFLINE_KIND_ERROR);
    EXPECT_EQ(res.status, REEFLINE_STATUS_BAD_REQUEST);
    EXPECT_STREQ(reinterpret_cast<const char*>(res.payload), "token -7 at position 1 is outside the vocabulary");
    EXPECT_EQ(reefline_result_topk(&res, top, 8, &k), REEFLINE_E_WRONG_FORMAT);
    reefline_result_clear(&res);

    // Tensors: the request's values doubled, in its dims; several fragments each way.
    const uint16_t dims[2] = {64, 6};
    std::vector<float> v(64 * 6);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.25f - 3;
    ASSERT_EQ(reefline_client_send_tensor(cl.c, dims, 2, v.data(), &id), REEFLINE_OK);
    ASSERT_EQ(reefline_client_wait(cl.c, id, 2000, &res), REEFLINE_OK) << reefline_last_error();
    std::vector<float> back(v.size());
    uint32_t d[4];
    size_t n = 0, nd = 0;
    ASSERT_EQ(reefline_result_tensor(&res, back.data(), back.size(), &n, d, &nd), REEFLINE_OK) << reefline_last_error();
    ASSERT_EQ(n, v.size());
    EXPECT_EQ(nd, 2u);
    EXPECT_EQ(d[0], 64u);
    EXPECT_EQ(d[1], 6u);
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(back[i], 2 * v[i]);
    reefline_result_clear(&res);

    // Raw bytes, and the synchronous call.
    const bytes raw = image_bytes(5000, 9);
    ASSERT_EQ(reefline_client_request(cl.c, REEFLINE_FORMAT_RAW, nullptr, raw.data(), raw.size(), 2000, &res),
              REEFLINE_OK)
        << reefline_last_error();
    uint32_t len = 0, crc = 0;
    ASSERT_EQ(reefline_result_crc32(&res, &len, &crc), REEFLINE_OK);
    EXPECT_EQ(crc, reefline_crc32c(raw.data(), raw.size()));
    reefline_result_clear(&res);

    reefline_client_stats s;
    reefline_client_get_stats(cl.c, &s);
    EXPECT_EQ(s.requests_sent, 9u);
    EXPECT_EQ(s.answers, 9u);
    EXPECT_EQ(s.errors, 1u);
    EXPECT_EQ(s.resends, 0u);
    EXPECT_GT(s.duplicates, 0u) << "every answer's first fragment came twice; the copy of a completed one is late";
}

TEST(ClientLive, RetriesResendWithTheSameIdAndGiveUpAfterThem) {
    responder::config rc;
    rc.drop_first = true;  // every request's first completion goes unanswered
    responder r(rc);
    reefline_client_options o = loopback(r.port());
    o.retries = 2;
    o.retry_timeout_ms = 100;
    client_ptr cl(o);
    const bytes img = image_bytes(3000, 4);
    const uint16_t dims[4] = {10, 100, 3, 0};
    reefline_result res{};
    ASSERT_EQ(reefline_client_request(cl.c, REEFLINE_FORMAT_IMAGE_U8_HWC, dims, img.data(), img.size(), 2000, &res),
              REEFLINE_OK)
        << reefline_last_error();
    EXPECT_EQ(res.attempts, 2u);
    EXPECT_GE(res.latency_us, 90e3);
    uint32_t len = 0, crc = 0;
    ASSERT_EQ(reefline_result_crc32(&res, &len, &crc), REEFLINE_OK);
    EXPECT_EQ(crc, reefline_crc32c(img.data(), img.size()));
    reefline_result_clear(&res);
    EXPECT_EQ(r.completions(), 2) << "the resend is the same request again";
    reefline_client_stats s;
    reefline_client_get_stats(cl.c, &s);
    EXPECT_EQ(s.resends, 1u);
    EXPECT_EQ(s.datagrams_sent, 12u);  // 6 fragments, twice

    // Nobody answers: three attempts, then the client gives up and says so.
    responder::config quiet;
    quiet.silent = true;
    responder q(quiet);
    reefline_client_options qo = loopback(q.port());
    qo.retries = 2;
    qo.retry_timeout_ms = 50;
    client_ptr qc(qo);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(reefline_client_request(qc.c, REEFLINE_FORMAT_IMAGE_U8_HWC, dims, img.data(), img.size(), 5000, &res),
              REEFLINE_E_TIMEOUT);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(std::string(reefline_last_error()).find("after 3 attempts"), std::string::npos) << reefline_last_error();
    EXPECT_GE(ms, 140);
    EXPECT_LT(ms, 2000);
    reefline_client_get_stats(qc.c, &s);
    EXPECT_EQ(s.resends, 2u);
    EXPECT_EQ(s.gave_up, 1u);
    EXPECT_EQ(reefline_client_outstanding(qc.c), 0u);
    EXPECT_EQ(q.completions(), 3);
    EXPECT_EQ(res.payload, nullptr);
}

TEST(ClientLive, TimeoutsAndUnknownRequests) {
    responder::config quiet;
    quiet.silent = true;
    responder q(quiet);
    reefline_client_options o = loopback(q.port());
    o.receive_timeout_ms = 30;
    o.retry_timeout_ms = 0;  // never give up
    client_ptr cl(o);
    reefline_result res{};
    EXPECT_EQ(reefline_client_receive(cl.c, 0, &res), REEFLINE_E_TIMEOUT);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(reefline_client_receive(cl.c, REEFLINE_TIMEOUT_DEFAULT, &res), REEFLINE_E_TIMEOUT);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(ms, 25);
    EXPECT_LT(ms, 1000);
    EXPECT_EQ(reefline_client_wait(cl.c, 12345, 0, &res), REEFLINE_E_NOT_FOUND);
    uint64_t id = 0;
    const bytes b(10, 1);
    ASSERT_EQ(reefline_client_send_raw(cl.c, b.data(), b.size(), &id), REEFLINE_OK);
    EXPECT_EQ(reefline_client_wait(cl.c, id, 20, &res), REEFLINE_E_TIMEOUT);
    EXPECT_EQ(reefline_client_outstanding(cl.c), 1u) << "a wait that times out leaves the request waiting";
    EXPECT_EQ(reefline_client_abandon(cl.c, id), 1);
    EXPECT_EQ(reefline_client_wait(cl.c, id, 20, &res), REEFLINE_E_NOT_FOUND);
}

TEST(ClientLive, PacingSpacesDatagrams) {
    responder r({});
    reefline_client_options o = loopback(r.port());
    o.fragment_size = 100;
    o.pace_packets_per_s = 1000;  // 1 ms apart
    client_ptr cl(o);
    const bytes raw = image_bytes(3000, 2);  // 30 fragments
    reefline_result res{};
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(reefline_client_request(cl.c, REEFLINE_FORMAT_RAW, nullptr, raw.data(), raw.size(), 2000, &res),
              REEFLINE_OK)
        << reefline_last_error();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    reefline_result_clear(&res);
    EXPECT_GE(ms, 28.5);
    // The gaps as the kernel saw the datagrams arrive: about 1 ms each, falling behind never
    // makes a burst. (A preemption between the client's clock and the send call can shorten
    // one gap as measured here, hence the tolerance of two.)
    const auto t = r.arrivals_ns();
    ASSERT_EQ(t.size(), 30u);
    EXPECT_GE(double(t.back() - t.front()) / 1e6, 28.0);
    int short_gaps = 0;
    for (size_t i = 1; i < t.size(); ++i) short_gaps += double(t[i] - t[i - 1]) / 1e6 < 0.8;
    EXPECT_LE(short_gaps, 2);

    // Bytes per second: 30 datagrams of 140 bytes at 140 kB/s take ~29 ms as well.
    reefline_client_options ob = loopback(r.port());
    ob.fragment_size = 100;
    ob.pace_bytes_per_s = 140e3;
    client_ptr cb(ob);
    const auto start_b = std::chrono::steady_clock::now();
    ASSERT_EQ(reefline_client_request(cb.c, REEFLINE_FORMAT_RAW, nullptr, raw.data(), raw.size(), 2000, &res),
              REEFLINE_OK);
    reefline_result_clear(&res);
    const double ms_b = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_b).count();
    EXPECT_GE(ms_b, 28.5);
}

TEST(ClientLive, HostileTrafficIsCountedAndIgnored) {
    responder::config rc;
    rc.noise = true;
    rc.response_fragment = 4;
    responder r(rc);
    client_ptr cl(loopback(r.port()));
    for (int i = 0; i < 20; ++i) {
        const bytes img = image_bytes(600, uint8_t(i));
        const uint16_t dims[4] = {10, 20, 3, 0};
        reefline_result res{};
        ASSERT_EQ(reefline_client_request(cl.c, REEFLINE_FORMAT_IMAGE_U8_HWC, dims, img.data(), img.size(), 2000, &res),
                  REEFLINE_OK)
            << reefline_last_error();
        uint32_t len = 0, crc = 0;
        ASSERT_EQ(reefline_result_crc32(&res, &len, &crc), REEFLINE_OK);
        EXPECT_EQ(crc, reefline_crc32c(img.data(), img.size()));
        reefline_result_clear(&res);
    }
    reefline_client_stats s;
    reefline_client_get_stats(cl.c, &s);
    EXPECT_EQ(s.answers, 20u);
    EXPECT_GE(s.rejected, 40u);      // 3-byte datagrams and bad kinds
    EXPECT_GE(s.inconsistent, 20u);  // the 4 MB claim disagrees with the real answer's fragments
    EXPECT_GE(s.duplicates, 20u);    // answers for ids never sent
}

TEST(ClientLive, BoundsAndArgumentChecks) {
    responder::config quiet;
    quiet.silent = true;
    responder q(quiet);
    reefline_client_options o = loopback(q.port());
    o.max_outstanding = 4;
    client_ptr cl(o);
    const bytes b(10, 1);
    uint64_t first = 0, id = 0;
    ASSERT_EQ(reefline_client_send_raw(cl.c, b.data(), b.size(), &first), REEFLINE_OK);
    for (int i = 0; i < 9; ++i) ASSERT_EQ(reefline_client_send_raw(cl.c, b.data(), b.size(), &id), REEFLINE_OK);
    EXPECT_EQ(reefline_client_outstanding(cl.c), 4u);
    reefline_client_stats s;
    reefline_client_get_stats(cl.c, &s);
    EXPECT_EQ(s.abandoned, 6u);
    reefline_result res{};
    EXPECT_EQ(reefline_client_wait(cl.c, first, 0, &res), REEFLINE_E_NOT_FOUND) << "the oldest were pushed out";

    // What reefline would drop without an answer is refused before it is sent.
    const uint16_t dims[4] = {10, 10, 3, 0};
    EXPECT_EQ(reefline_client_send(cl.c, REEFLINE_FORMAT_IMAGE_U8_HWC, dims, b.data(), b.size(), &id),
              REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_NE(std::string(reefline_last_error()).find("describe 300 bytes"), std::string::npos) << reefline_last_error();
    EXPECT_EQ(reefline_client_send(cl.c, REEFLINE_FORMAT_RESULT_CRC32, nullptr, b.data(), b.size(), &id),
              REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_EQ(reefline_client_send_raw(cl.c, b.data(), 0, &id), REEFLINE_E_LIMIT);
    const bytes huge(REEFLINE_MAX_TOTAL_LENGTH + 1);
    EXPECT_EQ(reefline_client_send_raw(cl.c, huge.data(), huge.size(), &id), REEFLINE_E_LIMIT);
    EXPECT_EQ(reefline_client_send_image(cl.c, 0, 10, 3, b.data(), &id), REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_EQ(reefline_client_send_image(cl.c, 4000, 4000, 3, b.data(), &id), REEFLINE_E_LIMIT);
    const uint16_t zero[2] = {4, 0};
    const float f[4] = {0, 0, 0, 0};
    EXPECT_EQ(reefline_client_send_tensor(cl.c, zero, 2, f, &id), REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_EQ(reefline_client_send_tensor(cl.c, zero, 5, f, &id), REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_EQ(reefline_client_send_tokens(cl.c, nullptr, 3, &id), REEFLINE_E_INVALID_ARGUMENT);

    reefline_client* c = nullptr;
    reefline_client_options bad = loopback(q.port());
    bad.address = "not-an-address";
    EXPECT_EQ(reefline_client_create(&bad, &c), REEFLINE_E_INVALID_ARGUMENT);
    EXPECT_EQ(c, nullptr);
    bad = loopback(0);
    EXPECT_EQ(reefline_client_create(&bad, &c), REEFLINE_E_INVALID_ARGUMENT);
    bad = loopback(q.port());
    bad.fragment_size = REEFLINE_MAX_FRAGMENT_SIZE + 1;
    EXPECT_EQ(reefline_client_create(&bad, &c), REEFLINE_E_INVALID_ARGUMENT);
    bad = loopback(q.port());
    bad.pace_packets_per_s = -1;
    EXPECT_EQ(reefline_client_create(&bad, &c), REEFLINE_E_INVALID_ARGUMENT);
    bad = loopback(q.port());
    bad.bind_address = "192.0.2.1";  // not ours: bind fails with the system's reason
    EXPECT_EQ(reefline_client_create(&bad, &c), REEFLINE_E_SYSTEM);
    EXPECT_NE(std::string(reefline_last_error()).find("bind 192.0.2.1"), std::string::npos) << reefline_last_error();
    EXPECT_STREQ(reefline_strerror(REEFLINE_E_TIMEOUT), "timed out");
    reefline_client_destroy(nullptr);
    reefline_result_clear(nullptr);
}
