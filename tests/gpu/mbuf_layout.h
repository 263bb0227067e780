// Host memory laid out like the data plane's mbuf pool, for the GPU gather test and benchmark:
// fixed-size pool elements (mempool object header, struct rte_mbuf, headroom, data room), each
// packet's payload after its Ethernet, IPv4, UDP and reefline headers (docs/protocol.md), and
// images fragmented into such payloads in an order other than the pool's (packets arrive and
// mbufs are allocated in any order). Backed by 2 MiB hugepages when some are reserved, as
// DPDK's pools are, else by ordinary pages. No DPDK: the GPU sees the same kind of memory
// (registered host pages) at the same kind of addresses.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "libml/kernels/decomp.h"

namespace gpu_test {

class mbuf_arena {
public:
    static constexpr size_t element = 64 + 128 + 128 + 2048;           // header, rte_mbuf, headroom, data room
    static constexpr size_t payload_offset = 64 + 128 + 128 + 14 + 20 + 8 + 40;  // + Ethernet, IPv4, UDP, reefline
    static constexpr size_t max_payload = 1432;                        // 1500-byte MTU

    explicit mbuf_arena(size_t mbufs) : _count(mbufs) {
        const size_t huge = size_t(2) << 20;
        _bytes = (mbufs * element + huge - 1) / huge * huge;
        void* p = mmap(nullptr, _bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        _huge = p != MAP_FAILED;
        if (!_huge) p = mmap(nullptr, _bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::runtime_error("mbuf_arena: mmap failed");
        _base = static_cast<uint8_t*>(p);
        std::memset(_base, 0x5a, _bytes);  // touch every page (and make stray reads visible)
    }
    ~mbuf_arena() { munmap(_base, _bytes); }
    mbuf_arena(const mbuf_arena&) = delete;
    mbuf_arena& operator=(const mbuf_arena&) = delete;

    void* base() const { return _base; }
    size_t bytes() const { return _bytes; }
    bool hugepages() const { return _huge; }
    size_t count() const { return _count; }
    uint8_t* payload(size_t i) const { return _base + i * element + payload_offset; }

private:
    uint8_t* _base = nullptr;
    size_t _bytes = 0, _count = 0;
    bool _huge = false;
};

struct gather_list {
    std::vector<reefline::ml::kernels::gather_segment> segments;
    std::vector<uint32_t> first{0};
    size_t bytes = 0;  // payload bytes in all
};

// Fragments each image into payloads of up to `fragment` bytes, each in its own mbuf, the
// mbufs taken from the arena in a shuffled order. Segments are in offset order per image.
inline gather_list scatter_images(const mbuf_arena& arena, const std::vector<std::vector<uint8_t>>& images,
                                  size_t fragment, uint32_t seed) {
    fragment = std::min(fragment, mbuf_arena::max_payload);
    size_t needed = 0;
    for (const auto& im : images) needed += (im.size() + fragment - 1) / fragment;
    if (needed > arena.count()) throw std::runtime_error("scatter_images: arena too small");
    std::vector<size_t> order(arena.count());
    std::iota(order.begin(), order.end(), size_t(0));
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    gather_list g;
    size_t next = 0;
    for (const auto& im : images) {
        for (size_t off = 0; off < im.size(); off += fragment) {
            const size_t n = std::min(fragment, im.size() - off);
            uint8_t* p = arena.payload(order[next++]);
            std::memcpy(p, im.data() + off, n);
            g.segments.push_back({p, uint32_t(n), uint32_t(off)});
            g.bytes += n;
        }
        g.first.push_back(uint32_t(g.segments.size()));
    }
    return g;
}

}  // namespace gpu_test
