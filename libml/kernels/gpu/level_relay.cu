// The relay of preemption levels (preempt/gpu_device.h, gpu_level_path::relay): one block that
// lives as long as the device and copies each change of a host-mapped line of epochs into the
// device line BE kernels check. A raise is then a store by the host into mapped memory: no
// runtime call, no stream, no copy engine on the RT submitter's path. What it costs: one block
// slot on one unit, and a PCIe read per poll while the device lives.
#include "libml/kernels/gpu/common.cuh"

#if defined(RL_GPU_EMU)
#include <thread>
#endif

namespace reefline::ml::kernels::gpu_impl {

namespace {

constexpr uint32_t kRelayMaxWords = 16;

// Thread 0 polls; the line's words only grow (epochs), so a change is written as read. The
// fence orders each write before the next poll, so the kernels that read the device line see
// the epochs in the order the host raised them.
__global__ void level_relay_kernel(gpu::gpu_level_relay_params p) {
    if (threadIdx.x != 0) return;
    const volatile uint32_t* mapped = p.mapped;
    volatile uint32_t* line = p.line;
    const volatile uint32_t* stop = p.stop;
    uint32_t seen[kRelayMaxWords];
    for (uint32_t i = 0; i < p.words; ++i) seen[i] = line[i];
    while (*stop == 0) {
        for (uint32_t i = 0; i < p.words; ++i) {
            const uint32_t v = mapped[i];
            if (v != seen[i]) {
                line[i] = v;
                seen[i] = v;
                __threadfence();
            }
        }
#if defined(RL_GPU_EMU)
        std::this_thread::yield();  // an emulated unit is a host thread
#endif
    }
}

int launch_level_relay(const gpu::gpu_level_relay_params& p) {
    if (!p.mapped || !p.line || !p.stop || p.words == 0 || p.words > kRelayMaxWords) return int(cudaErrorInvalidValue);
#if defined(RL_GPU_EMU)
    // The emulation's launches hold every unit they run on until they end, so a resident block
    // would stop every other launch, where on a GPU it holds one block slot. Here it runs as
    // thread 0 of a block on the relay stream's own thread, beside the units: the same code
    // on the same memory.
    auto* params = new gpu::gpu_level_relay_params(p);
    return int(cudaStreamAddCallback(
        static_cast<cudaStream_t>(p.stream),
        [](cudaStream_t, cudaError_t, void* user) {
            auto* q = static_cast<gpu::gpu_level_relay_params*>(user);
            level_relay_kernel(*q);
            delete q;
        },
        params, 0));
#else
    RL_LAUNCH(level_relay_kernel, dim3(1), dim3(kLanes), 0, static_cast<cudaStream_t>(p.stream), p);
    return int(cudaGetLastError());
#endif
}

struct relay_registration {
    relay_registration() { gpu::register_gpu_level_relay(launch_level_relay); }
};
const relay_registration relay_registered;

}  // namespace

}  // namespace reefline::ml::kernels::gpu_impl
