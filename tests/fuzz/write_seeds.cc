// Writes the seed corpora of fuzz_dataplane and fuzz_reefgen_response with reefgen's packet
// builder (regression inputs found by fuzzing sit beside them and are not rewritten):
//  - corpus/dataplane/: requests whole and in fragments, shuffled and duplicated, tagged, for
//    both IFs, ARP, partial requests that age out or exceed the watermarks, a full table,
//    sources that must not be answered, NIC checksum flags and chained mbufs;
//  - corpus/reefgen_response/: crc32, top-k and error responses, whole and in fragments, as
//    frames and as datagrams, with a duplicate and a fragment that disagrees.
//   build-fuzz/tests/fuzz/write_seeds tests/fuzz/corpus
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/dataplane_input.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace fz = reefline::fuzz;
namespace gen = reefline::reefgen;
namespace wire = reefline::wire;

namespace {

using frame = std::vector<uint8_t>;

gen::frame_addresses camera(uint16_t dst_port = 9000) {
    gen::frame_addresses a;
    a.src_mac = {{0x02, 0, 0, 0, 0, 0x01}};
    a.dst_mac = {{0x02, 0, 0, 0, 0, 0x02}};
    a.src_ip = 0xc6120001;
    a.dst_ip = 0xc6120002;
    a.src_port = 40000;
    a.dst_port = dst_port;
    return a;
}

// Fragments of `frag` bytes of a request of `total` bytes (raw unless `payload` says).
std::vector<frame> request(uint64_t id, uint32_t total, uint32_t frag, const gen::frame_addresses& a = camera(),
                           gen::request_payload payload = {}) {
    if (payload.bytes.empty())
        for (uint32_t i = 0; i < total; ++i) payload.bytes.push_back(uint8_t(i * 7 + id));
    std::vector<frame> out;
    for (const wire::fields& h : gen::plan_fragments(payload, id, frag)) {
        std::vector<uint8_t> udp;
        gen::append_udp_payload(udp, h, {payload.bytes.data() + h.payload_offset, gen::fragment_length(h, frag)});
        out.push_back(gen::build_frame(a, uint16_t(id), udp));
    }
    return out;
}

frame tagged(frame f, uint16_t tci) {
    const uint8_t tag[4] = {0x81, 0x00, uint8_t(tci >> 8), uint8_t(tci)};
    f.insert(f.begin() + 12, tag, tag + 4);
    return f;
}

frame arp_request(uint32_t target) { return gen::build_arp_request(camera().src_mac, camera().src_ip, target); }

struct seed {
    std::vector<uint8_t> bytes;
    void add(const frame& f, uint8_t flags = 0) { fz::append_frame(bytes, flags, f); }
    void add_all(const std::vector<frame>& fs, uint8_t flags = 0) {
        for (const frame& f : fs) add(f, flags);
    }
};

// A response's fragments of at most `per` result bytes, as fuzz_reefgen_response records: an
// Ethernet frame (flags 0) or, with `datagram`, the UDP payload alone (flags 1). `only`: just
// these fragment indices, in this order.
void add_response(seed& s, uint64_t id, wire::kind kind, wire::format format, wire::status status,
                  std::span<const uint8_t> result, uint32_t per, bool datagram,
                  const std::vector<uint32_t>& only = {}) {
    gen::frame_addresses a = camera();
    std::swap(a.src_ip, a.dst_ip);
    std::swap(a.src_port, a.dst_port);
    std::swap(a.src_mac, a.dst_mac);
    const uint32_t count = std::max<uint32_t>(1, uint32_t((result.size() + per - 1) / per));
    std::vector<uint32_t> order = only;
    for (uint32_t i = 0; only.empty() && i < count; ++i) order.push_back(i);
    for (const uint32_t i : order) {
        wire::fields h;
        h.kind = uint8_t(kind);
        h.format = uint8_t(format);
        h.status = uint8_t(status);
        h.request_id = id;
        h.frag_index = uint16_t(i);
        h.frag_count = uint16_t(count);
        h.payload_offset = i * per;
        h.total_length = uint32_t(result.size());
        if (format == wire::format::result_topk) h.dims[0] = uint16_t(result.size() / 8);
        if (format == wire::format::result_tensor_f32) {  // [n / 8, 2]
            h.dims[0] = uint16_t(result.size() / 8);
            h.dims[1] = 2;
        }
        std::vector<uint8_t> udp;
        gen::append_udp_payload(udp, h, result.subspan(i * per, std::min<size_t>(per, result.size() - i * per)));
        if (datagram) s.add(udp, 1);
        else s.add(gen::build_frame(a, 1, udp), 0);
    }
}

void write_response_seeds(const std::string& dir, const auto& write) {
    const uint8_t crc[8] = {0, 0, 0, 48, 0xde, 0xad, 0xbe, 0xef};
    std::vector<uint8_t> topk;
    for (uint32_t k = 0; k < 5; ++k) {
        const float score = 1.0f / float(k + 1);
        uint32_t bits;
        std::memcpy(&bits, &score, 4);
        for (const uint32_t v : {k * 100, bits})
            for (int b = 3; b >= 0; --b) topk.push_back(uint8_t(v >> (8 * b)));
    }
    std::vector<uint8_t> tensor;  // 24 little-endian f32: dims [12, 2]
    for (uint32_t i = 0; i < 24; ++i) {
        const float v = float(i) * 0.25f - 3.0f;
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        for (int b = 0; b < 4; ++b) tensor.push_back(uint8_t(bits >> (8 * b)));
    }
    const std::string message = "bad_request: payload is not 224x224x3";
    const std::span<const uint8_t> text(reinterpret_cast<const uint8_t*>(message.data()), message.size());
    for (const bool datagram : {false, true}) {
        const std::string as = datagram ? "_datagram" : "_frame";
        seed s;
        add_response(s, 1, wire::kind::response, wire::format::result_crc32, wire::status::ok, crc, 1024, datagram);
        write(dir, "crc32" + as, s);
        s = {};
        add_response(s, 2, wire::kind::response, wire::format::result_topk, wire::status::ok, topk, 16, datagram);
        write(dir, "topk_fragments" + as, s);
        s = {};
        add_response(s, 3, wire::kind::error, wire::format::raw, wire::status::bad_request, text, 1024, datagram);
        write(dir, "error" + as, s);
        s = {};
        add_response(s, 5, wire::kind::response, wire::format::result_tensor_f32, wire::status::ok, tensor, 40, datagram);
        write(dir, "tensor_fragments" + as, s);
    }
    seed s;  // fragments reordered and repeated, and one that disagrees with the first
    add_response(s, 4, wire::kind::response, wire::format::result_topk, wire::status::ok, topk, 8, false, {3, 1, 1});
    add_response(s, 4, wire::kind::response, wire::format::result_crc32, wire::status::ok, crc, 8, false);
    add_response(s, 4, wire::kind::response, wire::format::result_topk, wire::status::ok, topk, 8, false, {0, 4, 2, 3});
    write(dir, "duplicates_and_disagreement", s);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR (the directory of dataplane/ and reefgen_response/)\n", argv[0]);
        return 2;
    }
    const auto write_in = [](const std::string& dir, const std::string& name, const seed& s) {
        std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(s.bytes.data()),
                                                                 std::streamsize(s.bytes.size()));
    };
    write_response_seeds(std::string(argv[1]) + "/reefgen_response", write_in);
    const std::string dir = std::string(argv[1]) + "/dataplane";
    auto write = [&](const std::string& name, const seed& s) { write_in(dir, name, s); };
    {
        seed s;
        s.add(request(1, 32, 32)[0], fz::end_of_burst);
        write("single_crc32", s);
    }
    {
        seed s;
        s.add_all(request(2, 72, 24, camera(9001)));
        write("gather_in_order", s);
    }
    {
        auto fs = request(3, 100, 25);
        seed s;
        for (int i : {2, 0, 3, 0, 1}) s.add(tagged(fs[size_t(i)], 5));
        write("shuffled_duplicate_vlan", s);
    }
    {
        seed s;
        s.add(tagged(request(4, 16, 16)[0], 0), fz::end_of_burst);
        write("priority_tag", s);
    }
    {
        seed s;
        s.add(arp_request(0xc6120002));
        s.add(arp_request(0xc6120003), fz::end_of_burst);
        write("arp", s);
    }
    for (const bool oldest : {false, true}) {
        // Three partial requests of 20 fragments of 21: 60 mbufs held, watermarks 48/24.
        seed s;
        for (uint64_t id = 10; id < 13; ++id) {
            auto fs = request(id, 21 * 8, 8);
            fs.pop_back();
            s.add_all(fs);
        }
        if (oldest) s.bytes[0] |= fz::oldest_first;
        s.add(request(13, 8, 8)[0], fz::end_of_burst);
        write(oldest ? "evict_oldest" : "evict_largest", s);
    }
    {
        auto fs = request(20, 48, 16);
        seed s;
        s.add(fs[0], fz::end_of_burst);
        fz::append_advance(s.bytes, 200);  // 2 ms: past the 1 ms age limit
        s.add(fs[1]);
        s.add(fs[2], fz::end_of_burst);
        write("ageing", s);
    }
    {
        seed s;
        for (uint64_t id = 30; id < 50; ++id) s.add(request(id, 32, 16)[0]);
        s.add(request(30, 32, 16)[1], fz::end_of_burst);
        write("table_full", s);
    }
    {
        seed s;
        uint64_t id = 60;
        auto from = [&](auto edit) {
            gen::frame_addresses a = camera();
            edit(a);
            s.add(request(id++, 16, 16, a)[0]);
        };
        from([](auto& a) { a.src_mac = {{0x01, 0, 0x5e, 0, 0, 1}}; });
        from([](auto& a) { a.src_port = 0; });
        from([](auto& a) { a.dst_ip = 0xffffffff; });
        from([](auto& a) { a.src_ip = 0xc61200ff; });  // the subnet's broadcast (198.18.0.2/24)
        from([](auto& a) { a.dst_ip = 0xe0000001; });
        fz::append_advance(s.bytes, 0);
        write("unanswerable", s);
    }
    {
        seed s;
        gen::request_payload image;
        image.format = wire::format::image_u8_hwc;
        image.dims[0] = 4;
        image.dims[1] = 4;
        image.dims[2] = 3;
        image.bytes.assign(48, 0x11);
        s.add_all(request(70, 48, 20, camera(), image));
        gen::request_payload tokens;
        tokens.format = wire::format::tokens_i32;
        tokens.dims[0] = 6;
        tokens.bytes.assign(24, 0x01);
        s.add_all(request(71, 24, 12, camera(9001), tokens));
        write("image_and_tokens", s);
    }
    {
        seed s;
        const auto fs = request(80, 64, 16);
        s.add(fs[0], fz::ip_good);
        s.add(fs[1], fz::ip_good | fz::l4_good);
        s.add(fs[2], fz::two_segments);
        s.add(fs[2], fz::ip_bad);
        s.add(fs[3], fz::l4_bad);
        s.add(fs[2], fz::end_of_burst);
        s.add(fs[3], fz::end_of_burst);
        write("nic_flags", s);
    }
    {
        seed s;
        auto f = request(90, 16, 16)[0];
        s.add(frame(f.begin(), f.begin() + 20));  // inside the IPv4 header
        auto g = f;
        g[gen::ipv4_offset + 2] ^= 0x01;  // IPv4 total length, checksum left wrong
        s.add(g);
        s.add(g, fz::fix_ip_checksum);  // checksum fixed: a length mismatch
        g = f;
        g[gen::wire_offset] ^= 0xff;  // magic
        s.add(g, fz::end_of_burst);
        write("malformed", s);
    }
    return 0;
}
