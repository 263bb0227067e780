// Helpers shared by the GPU tests: the device under test, device copies of host vectors, and
// running a kernel's blocks on the cpu (the reference) and on the GPU device.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "libml/kernels/gpu/launcher.h"
#include "libml/kernels/kernels.h"
#include "preempt/device.h"
#include "preempt/gpu_device.h"
#include "preempt/scheduler.h"
#include "tests/gpu/gpu_test.h"

namespace gpu_test {

namespace gpu = reefline::gpu;
namespace k = reefline::ml::kernels;

// The library's spin kernel (launcher.h): blocks of a known length with flag checks.
inline const gpu::kernel_info& spin_info = k::spin_kernel;

// The software SIMT machine (-Dgpu_emu=true): one launch at a time, no stream priorities, a GEMM
// ~10^4 times slower than on a GPU. Timing bounds are a GPU's; under emulation they only log.
inline bool emulated() { return std::string(k::gpu_runtime_name()) == "SIMT emulation"; }

inline double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Polls `pred` until it holds (true) or `ms` have passed (false).
template <typename P>
bool eventually(P pred, double ms = 5000) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!pred()) {
        if (ms_since(t0) > ms) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
}

// A spin kernel of `grid` blocks of `us` each (flag checks every 50 us) that records, per
// block, the unit it ran on (+1; the top bit once it ran to its end) in host-mapped words.
struct spin_kernel {
    gpu::device& d;
    uint32_t grid;
    uint32_t* units;
    k::gpu_spin_args args;
    spin_kernel(gpu::device& dev, uint32_t g, double us) : d(dev), grid(g) {
        // One word per block, then the word the first block to start sets and the count of
        // blocks that ran to their end.
        units = static_cast<uint32_t*>(d.alloc((g + 2) * 4, gpu::memory_kind::host_mapped));
        REQUIRE(units != nullptr);
        std::memset(units, 0, (g + 2) * 4);
        args = k::gpu_spin_args{uint64_t(us * 1000), 50'000, units + g, units};
        args.finished = units + g + 1;
    }
    // Its blocks end as soon as a block of `other` has started, or `blocks` of them have
    // run to their end (`us` is then the longest they wait): what a test needs to happen
    // during this kernel happens, however slowly the host schedules it.
    void hold_until_started(const spin_kernel& other) {
        args.hold_until = other.units + other.grid;
        args.hold_count = 1;
    }
    void hold_until_finished(const spin_kernel& other, uint32_t blocks) {
        args.hold_until = other.units + other.grid + 1;
        args.hold_count = blocks;
    }
    ~spin_kernel() { d.free(units); }
    spin_kernel(const spin_kernel&) = delete;
    spin_kernel& operator=(const spin_kernel&) = delete;
    gpu::launch at(gpu::task_words* w, uint32_t index) const {
        return gpu::launch{&spin_info, &args, uint32_t(sizeof args), grid, 0, grid, w, index};
    }
    uint32_t word(uint32_t b) const { return reinterpret_cast<const volatile uint32_t*>(units)[b]; }
    uint32_t started() const {
        uint32_t n = 0;
        for (uint32_t b = 0; b < grid; ++b) n += word(b) != 0;
        return n;
    }
    uint32_t finished() const {
        uint32_t n = 0;
        for (uint32_t b = 0; b < grid; ++b) n += (word(b) & 0x80000000u) != 0;
        return n;
    }
    // Blocks that ran on unit `u`.
    uint32_t on_unit(uint32_t u) const {
        uint32_t n = 0;
        for (uint32_t b = 0; b < grid; ++b) n += word(b) != 0 && ((word(b) & 0x7fffffffu) - 1) == u;
        return n;
    }
    // The unit set its started blocks ran on: bit u for units [u * group, (u + 1) * group) (a
    // device's gpu::unit_group; past 64 groups as the 64th).
    uint64_t used(uint32_t group = 1) const {
        uint64_t m = 0;
        for (uint32_t b = 0; b < grid; ++b)
            if (word(b) != 0) m |= uint64_t{1} << std::min<uint32_t>(((word(b) & 0x7fffffffu) - 1) / group, 63);
        return m;
    }
    // How many distinct units its started blocks ran on.
    uint32_t units_used() const {
        std::vector<bool> seen;
        uint32_t n = 0;
        for (uint32_t b = 0; b < grid; ++b) {
            if (word(b) == 0) continue;
            const uint32_t u = (word(b) & 0x7fffffffu) - 1;
            if (u >= seen.size()) seen.resize(u + 1);
            n += !seen[u];
            seen[u] = true;
        }
        return n;
    }
    // Blocks that started outside the unit set `units` (of groups of `group` units).
    uint32_t outside(uint64_t units, uint32_t group = 1) const {
        uint32_t n = 0;
        for (uint32_t b = 0; b < grid; ++b) {
            if (word(b) == 0) continue;
            const uint32_t u = ((word(b) & 0x7fffffffu) - 1) / group;
            n += u >= 64 || !(units >> u & 1);
        }
        return n;
    }
};

// The device every test uses (fp32 math); made once by main().
inline std::unique_ptr<gpu::device>& the_device() {
    static std::unique_ptr<gpu::device> d;
    return d;
}

// Creates the_device(); false (after printing why) when there is no GPU.
inline bool make_the_device() {
    try {
        the_device() = gpu::make_gpu_device();
        at_end().push_back([] { the_device().reset(); });
    } catch (const gpu::no_device_error& e) {
        std::printf("SKIP: %s\n", e.what());
        return false;
    }
    const auto c = the_device()->caps();
    std::printf("device: %s (%s backend), %u compute units, priorities %d..%d\n", c.name.c_str(),
                gpu::gpu_backend_name(), c.compute_units, c.lowest_priority, c.highest_priority);
    return true;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// Device memory holding a copy of a host vector (or `bytes` of garbage-initialised memory).
class dev_buffer {
public:
    dev_buffer(gpu::device& d, size_t bytes) : _d(&d), _bytes(bytes) {
        _p = d.alloc(std::max<size_t>(bytes, 4));
        REQUIRE(_p != nullptr) << "device allocation of " << bytes << " bytes";
        // A recognisable pattern (NaN bits for f32): outputs a kernel forgets to write show.
        std::vector<unsigned char> fill(std::max<size_t>(bytes, 4), 0xff);
        d.copy_to_device(_p, fill.data(), fill.size());
    }
    template <typename T>
    dev_buffer(gpu::device& d, const std::vector<T>& host) : dev_buffer(d, host.size() * sizeof(T)) {
        if (!host.empty()) d.copy_to_device(_p, host.data(), host.size() * sizeof(T));
    }
    ~dev_buffer() {
        if (_p) _d->free(_p);
    }
    dev_buffer(const dev_buffer&) = delete;
    dev_buffer& operator=(const dev_buffer&) = delete;

    template <typename T = float>
    T* get() const { return static_cast<T*>(_p); }
    template <typename T>
    std::vector<T> read() const {
        std::vector<T> v(_bytes / sizeof(T));
        if (!v.empty()) _d->copy_to_host(v.data(), _p, v.size() * sizeof(T));
        return v;
    }

private:
    gpu::device* _d;
    void* _p = nullptr;
    size_t _bytes;
};

// Runs blocks [first, first + count) of a kernel on this thread with its cpu implementation.
inline bool run_cpu(const gpu::kernel_info& ki, const void* args, int64_t grid, size_t scratch = 64u << 20) {
    static std::vector<float> buf;
    buf.resize(scratch / sizeof(float) + 1);
    bool ok = true;
    for (int64_t b = 0; b < grid; ++b) {
        gpu::block_context ctx{uint32_t(b), uint32_t(grid), 0, nullptr, buf.data(), scratch};
        ok &= ki.cpu(args, ctx);
    }
    return ok;
}

// Task words and a stream of a device, released with it.
struct gpu_runner {
    gpu::device& d;
    gpu::stream* s;
    gpu::task_words* w;
    uint32_t next_index = 0;
    explicit gpu_runner(gpu::device& dev, int priority = 0)
        : d(dev), s(dev.create_stream(priority)), w(dev.task_words_create()) {}
    ~gpu_runner() {
        d.synchronize(s);
        d.stream_destroy(s);
        d.task_words_destroy(w);
    }
    // Launches a whole grid (or a slice) as the next kernel of the task and waits for it.
    // True when it completed (the counter advanced to its index + 1).
    template <typename A>
    bool run(const gpu::kernel_info& ki, const A& args, int64_t grid, int64_t offset = 0, int64_t count = -1) {
        if (count < 0) count = grid - offset;
        const uint32_t index = next_index++;
        d.launch(s, gpu::launch{&ki, &args, uint32_t(sizeof args), uint32_t(grid), uint32_t(offset),
                                uint32_t(count), w, index});
        d.synchronize(s);
        return w->completed.load() == index + 1;
    }
};

// The kernel_info a GPU launch names. Builds without OpenBLAS (gpu_core) lack the cpu
// GEMM/conv kernels; the GPU device finds kernels by name alone.
#if defined(REEFLINE_NO_CPU_GEMM)
inline const gpu::kernel_info gemm_info = {"gemm", nullptr, 256, 0, 0, 0};
inline const gpu::kernel_info conv2d_info = {"conv2d", nullptr, 256, 0, 0, 0};
#else
inline const gpu::kernel_info& gemm_info = k::gemm_kernel;
inline const gpu::kernel_info& conv2d_info = k::conv2d_kernel;
#endif

// A task as a chain of GEMMs, y[i+1] = alpha * y[i] x W (n x n): each kernel reads a buffer no
// later kernel writes, so restore may re-run any of them and a cut pad re-runs from its start.
struct gemm_chain {
    gpu::device& d;
    const int64_t n;
    std::vector<std::unique_ptr<dev_buffer>> y;
    std::unique_ptr<dev_buffer> wt;
    std::vector<k::gemm_args> args;
    gemm_chain(gpu::device& dev, int count, int64_t size, uint32_t seed, int64_t tile_k) : d(dev), n(size) {
        wt = std::make_unique<dev_buffer>(d, random_floats(size_t(n * n), seed));
        y.push_back(std::make_unique<dev_buffer>(d, random_floats(size_t(n * n), seed + 1)));
        for (int i = 0; i < count; ++i) {
            y.push_back(std::make_unique<dev_buffer>(d, size_t(n * n) * 4));
            k::gemm_args g{};
            g.a = y[size_t(i)]->get(); g.b = wt->get(); g.c = y[size_t(i) + 1]->get();
            g.batch = 1; g.m = n; g.n = n; g.k = n; g.lda = n; g.ldb = n; g.ldc = n;
            g.alpha = std::sqrt(3.0f / float(n)); g.beta = 1;
            g.tile_m = 64; g.tile_n = 64; g.tile_k = tile_k;
            args.push_back(g);
        }
    }
    // est_us and occupancy: a profile's figures for each GEMM (0: none).
    gpu::task task(gpu::task_class cls, float est_us = 0, uint32_t occupancy = 0) const {
        gpu::task t;
        t.cls = cls;
        for (const auto& g : args) {
            t.launches.push_back(gpu::task_launch::make(&gemm_info, g, uint32_t(k::gemm_grid(g))));
            t.launches.back().est_us = est_us;
            t.launches.back().occupancy = occupancy;
        }
        return t;
    }
    std::vector<float> output() const { return y.back()->read<float>(); }
    void clear_outputs() {
        const std::vector<float> junk(size_t(n * n), -1.0f);
        for (size_t i = 1; i < y.size(); ++i) d.copy_to_device(y[i]->get(), junk.data(), junk.size() * 4);
    }
};

}  // namespace gpu_test
