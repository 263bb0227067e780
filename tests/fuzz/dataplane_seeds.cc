// Writes the seed corpus of fuzz_dataplane (tests/fuzz/corpus/dataplane/) with reefgen's packet
// builder: requests whole and in fragments, shuffled and duplicated, tagged, for both IFs,
// ARP, partial requests that age out or exceed the watermarks, a full table, sources that
// must not be answered, NIC checksum flags and chained mbufs.
//   build-fuzz/tests/fuzz/dataplane_seeds tests/fuzz/corpus/dataplane
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

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    auto write = [&](const std::string& name, const seed& s) {
        std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(s.bytes.data()),
                                                                 std::streamsize(s.bytes.size()));
    };
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
