// gather_bench (GPU builds): the gather kernel reading image bytes in place from registered
// host memory laid out as the data plane's mbuf payloads (fragments of 1432 bytes, in shuffled
// mbufs, 2 MiB hugepages when reserved), converting u8 HWC -> normalised f32 NCHW into the
// batch input tensor, against a cudaMemcpy of the same bytes from pinned memory (the copy a
// design without zero-copy gather would need first, before converting).
//
// gather bytes/s counts the payload bytes read (what the copy moves). The kernel as the runtime
// runs it (version 2: per-block descriptors, loads before stores, 16-byte stores) and its first
// version (bench_version_1: a scan of the image's segment list, a store per byte), both into
// device memory, where libml's runtime keeps an instance's inputs; and version 2 into
// host-mapped memory, where the 4-byte floats cross PCIe back (for comparison). The gather
// list and the descriptors live in host-mapped memory, as the runtime keeps them.
//
// Last lines: gather_v2_vs_v1=S (version 2's bytes/s over version 1's, both into device memory,
// batch 8, 1432-byte fragments), then gather_vs_memcpy=R (version 2 into device memory, batch 8
// of 224x224x3, over the pinned copy's bytes/s; the target is >= 0.85).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "libml/kernels/kernels.h"
#include "preempt/gpu_device.h"
#include "tests/gpu/mbuf_layout.h"

namespace gpu = reefline::gpu;
namespace k = reefline::ml::kernels;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

struct result {
    double gather_gbps_device = 0, v1_gbps_device = 0, gather_gbps_mapped = 0, memcpy_gbps = 0;
};

result run(gpu::device& d, int64_t batch, int64_t side, size_t fragment, int iterations) {
    const int64_t C = 3, bytes = side * side * C;
    gpu_test::mbuf_arena arena(size_t(batch) * size_t((bytes + int64_t(fragment) - 1) / int64_t(fragment)) + 16);
    if (!d.register_host(arena.base(), arena.bytes())) throw std::runtime_error("register_host failed");
    std::vector<std::vector<uint8_t>> images(static_cast<size_t>(batch));
    std::mt19937 rng(1);
    for (auto& im : images) {
        im.resize(size_t(bytes));
        for (auto& v : im) v = uint8_t(rng());
    }
    const gpu_test::gather_list gl = gpu_test::scatter_images(arena, images, fragment, 2);
    k::gather_args g{};
    g.batch = batch; g.h = side; g.w = side; g.c = C;
    g.bytes_per_block = (int64_t(1) << 12) / C * C;  // the runtime's GPU block size
    for (int i = 0; i < 3; ++i) { g.mean[i] = 120; g.inv_std[i] = 1.0f / 60; }
    const uint32_t grid = uint32_t(k::gather_grid(g));
    // The list as the runtime lays it out: segments, offsets, then the descriptors 128-byte aligned.
    const size_t seg_bytes = gl.segments.size() * sizeof(k::gather_segment), first_bytes = gl.first.size() * 4;
    const size_t blocks_at = (seg_bytes + first_bytes + 127) / 128 * 128;
    const size_t list_bytes = blocks_at + size_t(grid) * sizeof(k::gather_block_desc);
    auto* list = static_cast<std::byte*>(d.alloc(list_bytes, gpu::memory_kind::host_mapped));
    if (!list) throw std::bad_alloc();
    std::memcpy(list, gl.segments.data(), seg_bytes);
    std::memcpy(list + seg_bytes, gl.first.data(), first_bytes);
    g.segments = reinterpret_cast<const k::gather_segment*>(list);
    g.first = reinterpret_cast<const uint32_t*>(list + seg_bytes);
    auto* blocks = reinterpret_cast<k::gather_block_desc*>(list + blocks_at);
    k::gather_describe_blocks(g, g.segments, g.first, blocks);
    g.blocks = blocks;
    k::gather_args v1 = g;
    v1.blocks = nullptr;
    v1.bench_version_1 = 1;
    const size_t out_bytes = size_t(batch * bytes) * sizeof(float);
    void* y_dev = d.alloc(out_bytes);
    void* y_mapped = d.alloc(out_bytes, gpu::memory_kind::host_mapped);
    void* pinned = d.alloc(gl.bytes, gpu::memory_kind::pinned);
    void* bytes_dev = d.alloc(gl.bytes);
    if (!y_dev || !y_mapped || !pinned || !bytes_dev) throw std::bad_alloc();
    gpu::stream* s = d.create_stream(0);
    gpu::task_words* w = d.task_words_create();

    // Correct first: each version's tensor against the cpu kernel's.
    {
        std::vector<float> want(size_t(batch * bytes)), got(want.size());
        k::gather_args h = g;
        h.segments = gl.segments.data(); h.first = gl.first.data(); h.y = want.data(); h.blocks = nullptr;
        for (uint32_t b = 0; b < grid; ++b) {
            gpu::block_context ctx{b, grid, 0, nullptr, nullptr, 0};
            k::gather_kernel.cpu(&h, ctx);
        }
        for (k::gather_args* a : {&g, &v1}) {
            a->y = static_cast<float*>(y_dev);
            std::vector<unsigned char> poison(out_bytes, 0xff);
            d.copy_to_device(y_dev, poison.data(), out_bytes);
            d.launch(s, gpu::launch{&k::gather_kernel, a, sizeof *a, grid, 0, grid, w, 0});
            d.synchronize(s);
            d.copy_to_host(got.data(), y_dev, out_bytes);
            if (std::memcmp(got.data(), want.data(), out_bytes) != 0)
                throw std::runtime_error(std::string("GPU gather (") + (a == &v1 ? "version 1" : "version 2") +
                                         ") differs from the cpu's");
        }
    }
    auto time_gather = [&](k::gather_args& a, void* y) {
        a.y = static_cast<float*>(y);
        for (int i = 0; i < 3; ++i) d.launch(s, gpu::launch{&k::gather_kernel, &a, sizeof a, grid, 0, grid, w, 0});
        d.synchronize(s);
        const auto t0 = clk::now();
        for (int i = 0; i < iterations; ++i)
            d.launch(s, gpu::launch{&k::gather_kernel, &a, sizeof a, grid, 0, grid, w, uint32_t(i)});
        d.synchronize(s);
        return double(gl.bytes) * iterations / seconds_since(t0) / 1e9;
    };
    result r;
    r.gather_gbps_device = time_gather(g, y_dev);
    r.v1_gbps_device = time_gather(v1, y_dev);
    r.gather_gbps_mapped = time_gather(g, y_mapped);
    std::memset(pinned, 1, gl.bytes);
    for (int i = 0; i < 3; ++i) d.copy_to_device(bytes_dev, pinned, gl.bytes);
    const auto t0 = clk::now();
    for (int i = 0; i < iterations; ++i) d.copy_to_device(bytes_dev, pinned, gl.bytes);
    r.memcpy_gbps = double(gl.bytes) * iterations / seconds_since(t0) / 1e9;

    d.task_words_destroy(w);
    d.stream_destroy(s);
    for (void* p : {static_cast<void*>(list), y_dev, y_mapped, pinned, bytes_dev}) d.free(p);
    d.unregister_host(arena.base());
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    int iterations = 200;
    int64_t side = 224;
    bool tiny = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick")) iterations = 50;
        else if (!std::strcmp(argv[i], "--tiny")) tiny = true;  // the SIMT emulation: 64x64 images, 2 passes
        else {
            std::fprintf(stderr, "usage: gather_bench [--quick] [--tiny]\n");
            return 2;
        }
    }
    if (tiny) {
        iterations = 2;
        side = 64;
    }
    std::unique_ptr<gpu::device> d;
    try {
        d = gpu::make_gpu_device();
    } catch (const gpu::no_device_error& e) {
        std::fprintf(stderr, "gather_bench: %s\n", e.what());
        return 77;
    }
    std::printf("gather_bench: %s (%s), payload bytes read per second (GB/s)\n", d->caps().name.c_str(),
                gpu::gpu_backend_name());
    std::printf("%6s %6s %9s %12s %12s %15s %12s %8s %9s\n", "batch", "side", "fragment", "v2->dev", "v1->dev",
                "v2->mapped", "pinned_copy", "ratio", "v1_ratio");
    double headline = 0, v2_over_v1 = 0;
    for (int64_t batch : {int64_t(1), int64_t(8), int64_t(32)})
        for (size_t fragment : {size_t(1432), size_t(512)}) {
            if (tiny && (batch == 32 || fragment == 512)) continue;
            const result r = run(*d, batch, side, fragment, iterations);
            const double ratio = r.memcpy_gbps > 0 ? r.gather_gbps_device / r.memcpy_gbps : 0;
            const double v1_ratio = r.memcpy_gbps > 0 ? r.v1_gbps_device / r.memcpy_gbps : 0;
            // %.4g: the SIMT emulation's rates are a few MB/s.
            std::printf("%6lld %6lld %9zu %12.4g %12.4g %15.4g %12.4g %8.2f %9.2f\n", (long long)batch, (long long)side,
                        fragment, r.gather_gbps_device, r.v1_gbps_device, r.gather_gbps_mapped, r.memcpy_gbps, ratio,
                        v1_ratio);
            if (batch == 8 && fragment == 1432) {
                headline = ratio;
                v2_over_v1 = r.v1_gbps_device > 0 ? r.gather_gbps_device / r.v1_gbps_device : 0;
            }
        }
    std::printf("gather_v2_vs_v1=%.2f\n", v2_over_v1);
    std::printf("gather_vs_memcpy=%.2f\n", headline);
    return 0;
}
