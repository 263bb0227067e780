// gather_bench (GPU builds): the gather kernel reading image bytes in place from registered
// host memory laid out as the data plane's mbuf payloads (fragments of 1432 bytes, in shuffled
// mbufs, 2 MiB hugepages when reserved), converting u8 HWC -> normalised f32 NCHW into the
// batch input tensor, against a cudaMemcpy of the same bytes from pinned memory (the copy a
// design without zero-copy gather would need first, before converting).
//
// gather bytes/s counts the payload bytes read (what the copy moves). Two destinations: device
// memory (where the input tensor belongs on a GPU), and host-mapped memory (where libml's
// runtime keeps an instance's inputs today, so the gather's 4-byte floats cross PCIe back).
// The gather list lives in host-mapped memory, as the runtime keeps it.
//
// Last line: gather_vs_memcpy=R (gather into device memory, batch 8 of 224x224x3, over the
// pinned copy's bytes/s; the target is >= 0.8).
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
    double gather_gbps_device = 0, gather_gbps_mapped = 0, memcpy_gbps = 0;
};

result run(gpu::device& d, int64_t batch, int64_t side, size_t fragment, int iterations) {
    const int64_t C = 3, bytes = side * side * C;
    gpu_test::mbuf_arena arena(size_t(batch) * size_t((bytes + int64_t(fragment) - 1) / int64_t(fragment)) + 16);
    if (!d.ops().register_host(&d, arena.base(), arena.bytes())) throw std::runtime_error("register_host failed");
    std::vector<std::vector<uint8_t>> images(static_cast<size_t>(batch));
    std::mt19937 rng(1);
    for (auto& im : images) {
        im.resize(size_t(bytes));
        for (auto& v : im) v = uint8_t(rng());
    }
    const gpu_test::gather_list gl = gpu_test::scatter_images(arena, images, fragment, 2);
    const size_t seg_bytes = gl.segments.size() * sizeof(k::gather_segment), first_bytes = gl.first.size() * 4;
    auto* list = static_cast<std::byte*>(d.alloc(seg_bytes + first_bytes, gpu::memory_kind::host_mapped));
    std::memcpy(list, gl.segments.data(), seg_bytes);
    std::memcpy(list + seg_bytes, gl.first.data(), first_bytes);
    const size_t out_bytes = size_t(batch * bytes) * sizeof(float);
    void* y_dev = d.alloc(out_bytes);
    void* y_mapped = d.alloc(out_bytes, gpu::memory_kind::host_mapped);
    void* pinned = d.alloc(gl.bytes, gpu::memory_kind::pinned);
    void* bytes_dev = d.alloc(gl.bytes);
    if (!list || !y_dev || !y_mapped || !pinned || !bytes_dev) throw std::bad_alloc();

    k::gather_args g{};
    g.segments = reinterpret_cast<const k::gather_segment*>(list);
    g.first = reinterpret_cast<const uint32_t*>(list + seg_bytes);
    g.batch = batch; g.h = side; g.w = side; g.c = C;
    g.bytes_per_block = (int64_t(1) << 12) / C * C;  // the runtime's GPU block size
    for (int i = 0; i < 3; ++i) { g.mean[i] = 120; g.inv_std[i] = 1.0f / 60; }
    const uint32_t grid = uint32_t(k::gather_grid(g));
    gpu::stream* s = d.create_stream(0);
    gpu::task_words* w = d.ops().task_words_create(&d);

    // Correct first: the GPU's tensor against the cpu kernel's.
    {
        std::vector<float> want(size_t(batch * bytes)), got(want.size());
        k::gather_args h = g;
        h.segments = gl.segments.data(); h.first = gl.first.data(); h.y = want.data();
        for (uint32_t b = 0; b < grid; ++b) {
            gpu::block_context ctx{b, grid, 0, nullptr, nullptr, 0};
            k::gather_kernel.cpu(&h, ctx);
        }
        g.y = static_cast<float*>(y_dev);
        d.launch(s, gpu::launch{&k::gather_kernel, &g, sizeof g, grid, 0, grid, w, 0});
        d.synchronize(s);
        d.ops().copy_to_host(&d, got.data(), y_dev, out_bytes);
        if (std::memcmp(got.data(), want.data(), out_bytes) != 0) throw std::runtime_error("GPU gather differs from the cpu's");
    }
    auto time_gather = [&](void* y) {
        g.y = static_cast<float*>(y);
        for (int i = 0; i < 3; ++i) d.launch(s, gpu::launch{&k::gather_kernel, &g, sizeof g, grid, 0, grid, w, 0});
        d.synchronize(s);
        const auto t0 = clk::now();
        for (int i = 0; i < iterations; ++i)
            d.launch(s, gpu::launch{&k::gather_kernel, &g, sizeof g, grid, 0, grid, w, uint32_t(i)});
        d.synchronize(s);
        return double(gl.bytes) * iterations / seconds_since(t0) / 1e9;
    };
    result r;
    r.gather_gbps_device = time_gather(y_dev);
    r.gather_gbps_mapped = time_gather(y_mapped);
    std::memset(pinned, 1, gl.bytes);
    for (int i = 0; i < 3; ++i) d.ops().copy_to_device(&d, bytes_dev, pinned, gl.bytes);
    const auto t0 = clk::now();
    for (int i = 0; i < iterations; ++i) d.ops().copy_to_device(&d, bytes_dev, pinned, gl.bytes);
    r.memcpy_gbps = double(gl.bytes) * iterations / seconds_since(t0) / 1e9;

    d.ops().task_words_destroy(&d, w);
    d.ops().stream_destroy(&d, s);
    for (void* p : {static_cast<void*>(list), y_dev, y_mapped, pinned, bytes_dev}) d.free(p);
    d.ops().unregister_host(&d, arena.base());
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
    std::printf("%6s %6s %9s %14s %14s %12s %8s\n", "batch", "side", "fragment", "gather->dev", "gather->mapped",
                "pinned_copy", "ratio");
    double headline = 0;
    for (int64_t batch : {int64_t(1), int64_t(8), int64_t(32)})
        for (size_t fragment : {size_t(1432), size_t(512)}) {
            if (tiny && (batch == 32 || fragment == 512)) continue;
            const result r = run(*d, batch, side, fragment, iterations);
            const double ratio = r.memcpy_gbps > 0 ? r.gather_gbps_device / r.memcpy_gbps : 0;
            std::printf("%6lld %6lld %9zu %14.2f %14.2f %12.2f %8.2f\n", (long long)batch, (long long)side, fragment,
                        r.gather_gbps_device, r.gather_gbps_mapped, r.memcpy_gbps, ratio);
            if (batch == 8 && fragment == 1432) headline = ratio;
        }
    std::printf("gather_vs_memcpy=%.2f\n", headline);
    return 0;
}
