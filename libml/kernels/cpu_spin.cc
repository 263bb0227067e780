// "gpu_spin" on the cpu backend: the same contract as spin.cu (gpu/launcher.h, gpu_spin_args),
// so that a kernel of known length, with check points, runs by one name on every backend and
// the device contract (tests/backend_contract_test.cc) can hold each backend to it.
#include <atomic>
#include <chrono>

#include "libml/kernels/gpu/launcher.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

// Host-mapped words are plain memory on the cpu backend; other threads read them while the
// block runs, hence atomic_ref.
void store(uint32_t* p, uint32_t v) { std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release); }

bool spin_block_cpu(const void* args, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const gpu_spin_args*>(args);
    if (a.started) store(a.started, 1);
    const uint32_t unit = 1 + ctx.worker;
    uint32_t* unit_word = a.units ? a.units + ctx.block : nullptr;
    if (unit_word) store(unit_word, unit);
    const uint64_t t0 = now_ns();
    if (a.block_start_ns) std::atomic_ref<uint64_t>(a.block_start_ns[ctx.block]).store(t0, std::memory_order_release);
    uint64_t next = t0 + a.check_ns;
    for (;;) {
        const uint64_t t = now_ns();
        if (t - t0 >= a.ns) break;
        if (a.hold_until &&
            std::atomic_ref<const uint32_t>(*a.hold_until).load(std::memory_order_acquire) >= a.hold_count)
            break;
        if (t >= next) {
            if (ctx.preempted()) {
                if (a.block_stop_ns)
                    std::atomic_ref<uint64_t>(a.block_stop_ns[ctx.block]).store(now_ns(), std::memory_order_release);
                return false;
            }
            next = t + a.check_ns;
        }
    }
    if (unit_word) store(unit_word, 0x80000000u | unit);
    if (a.finished) std::atomic_ref<uint32_t>(*a.finished).fetch_add(1, std::memory_order_acq_rel);
    return true;
}

}  // namespace

const gpu::kernel_info spin_kernel = {"gpu_spin", spin_block_cpu, 32, 0, 0, 0};

}  // namespace reefline::ml::kernels
