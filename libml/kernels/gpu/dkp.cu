// Dynamic kernel padding on the GPU (REEF §5.1, preempt/gpu_kernels.h): the "dkp" kernel, one
// launch that runs an RT kernel's blocks and, on the compute units the RT kernel leaves idle,
// blocks of BE kernels (pads) at once.
//
// - Persistent blocks, `level` per unit; every block first takes the RT kernel's blocks from a
//   counter while any is left, so the RT kernel starts on all of them at once; blocks that run
//   on a unit numbered rt_units or above then take pad blocks, pad by pad, until the RT
//   kernel's last block ends and raises `cut`. Pad blocks check `cut` as their preemption flag
//   (at block start, and GEMM/conv per K chunk), so padding holds the GPU past the RT kernel
//   by one check-point interval at most.
// - A block runs any kernel of the library through a dispatch on its pad_kind: the kernels'
//   block functions, with the block index passed in and shared memory from the one dynamic
//   arena (the largest of the parts' needs).
// - Proxy kernels per occupancy level: dkp_kernel<Mode, Level> is compiled with
//   __launch_bounds__(256, Level), so the compiler caps its registers at what `Level` blocks per
//   unit allow. The host takes the highest level every part reaches (its own occupancy), which
//   is REEF's proxy with the fewest registers that still fits each candidate. (On AMD the bound
//   is waves per SIMD; a 256-thread block is one wave on each of a CU's four SIMDs, so the
//   numbers mean the same there.)
// - Accounting as the launches of each part would do on their own: the RT part's last block
//   advances its task's counter; a pad advances its task's counter only when every one of its
//   blocks ran; the launch's last exiting block releases the pads' tasks, adds to the device's
//   totals, zeroes the work words for the stream's next padded launch and stores the stream's
//   finished word.
#include "libml/kernels/gpu/common.cuh"

namespace reefline::ml::kernels::gpu_impl {

namespace {

static_assert(sizeof(gemm_args) <= gpu::kGpuPadArgsBytes && sizeof(conv2d_args) <= gpu::kGpuPadArgsBytes &&
                  sizeof(gather_args) <= gpu::kGpuPadArgsBytes && sizeof(token_gather_args) <= gpu::kGpuPadArgsBytes &&
                  sizeof(tensor_gather_args) <= gpu::kGpuPadArgsBytes && sizeof(copy_args) <= gpu::kGpuPadArgsBytes &&
                  sizeof(binary_args) <= gpu::kGpuPadArgsBytes && sizeof(unary_args) <= gpu::kGpuPadArgsBytes &&
                  sizeof(where_args) <= gpu::kGpuPadArgsBytes && sizeof(row_args) <= gpu::kGpuPadArgsBytes &&
                  sizeof(pool2d_args) <= gpu::kGpuPadArgsBytes && sizeof(lrn_args) <= gpu::kGpuPadArgsBytes &&
                  sizeof(batchnorm_args) <= gpu::kGpuPadArgsBytes && sizeof(gather_axis_args) <= gpu::kGpuPadArgsBytes &&
                  sizeof(gpu_spin_args) <= gpu::kGpuPadArgsBytes,
              "every kernel's argument struct fits a DKP part");
static_assert(sizeof(gpu::gpu_pad_work) % 4 == 0, "the work words are zeroed word by word");

constexpr uint32_t kControlBytes = 64;  // the kernel's own shared words, before the parts' arena
constexpr uint32_t kNoPart = 0xffffffffu;
constexpr uint32_t kPadUndecided = 0, kPadRuns = 1, kPadSkipped = 2, kPadReleased = 3;
constexpr uint32_t kLevels[] = {1, 2, 4};

__device__ __forceinline__ uint32_t load_word(const uint32_t* p) { return *reinterpret_cast<const volatile uint32_t*>(p); }

template <typename Args>
__device__ __forceinline__ const Args& part_args(const gpu::gpu_pad_part& part) {
    return *reinterpret_cast<const Args*>(part.args);
}

// One block of a part's kernel, by every thread of the block.
template <int Mode>
__device__ bool run_block(const gpu::gpu_pad_part& part, const launch_ctx& c, int64_t block, unsigned char* smem) {
    switch (part.kind) {
    case pad_gemm: return gemm_block_gpu<Mode>(part_args<gemm_args>(part), c, block, smem);
    case pad_conv2d: return conv2d_block_gpu<Mode>(part_args<conv2d_args>(part), c, block, smem);
    case pad_gather: return gather_block_gpu(part_args<gather_args>(part), block, smem);
    case pad_token_gather: return token_gather_block_gpu(part_args<token_gather_args>(part), block, smem);
    case pad_tensor_gather: return tensor_gather_block_gpu(part_args<tensor_gather_args>(part), block);
    case pad_copy: return copy_block_gpu(part_args<copy_args>(part), block);
    case pad_binary: return binary_block_gpu(part_args<binary_args>(part), block);
    case pad_unary: return unary_block_gpu(part_args<unary_args>(part), block);
    case pad_where: return where_block_gpu(part_args<where_args>(part), block);
    case pad_row: return row_block_gpu(part_args<row_args>(part), block);
    case pad_pool2d: return pool2d_block_gpu(part_args<pool2d_args>(part), block);
    case pad_lrn: return lrn_block_gpu(part_args<lrn_args>(part), block);
    case pad_batchnorm: return batchnorm_block_gpu(part_args<batchnorm_args>(part), block);
    case pad_gather_axis: return gather_axis_block_gpu(part_args<gather_axis_args>(part), block);
    case pad_spin: return spin_block_gpu(part_args<gpu_spin_args>(part), c, block);
    default: return true;  // the host admits only known kinds
    }
}

// Thread 0: claims a block of the first pad that can give one (kNoPart: none). The first
// claim of a pad decides whether it runs at all: its task must be at its kernel, and no other
// pad of the task may be running (the owner's running word, taken with an atomic add).
__device__ void claim_pad(const gpu::gpu_padded_params& p, gpu::gpu_pad_work* w, uint32_t& part, uint32_t& block) {
    for (uint32_t i = 0; i < p.n_pads; ++i) {
        if (load_word(&w->cut)) return;
        const gpu::gpu_pad_part& pp = p.pads[i];
        const uint32_t n = pp.block_count ? pp.block_count : 1;
        uint32_t st = load_word(&w->pad_state[i]);
        if (st == kPadSkipped || load_word(&w->pad_next[i]) >= n) continue;
        const uint32_t b = atomicAdd(&w->pad_next[i], 1u);
        if (b >= n) continue;
        if (b == 0) {
            bool run = load_word(pp.task + 1) == pp.kernel_index;
            if (run && atomicAdd(pp.owner_running, 1u) != 0) {
                atomicSub(pp.owner_running, 1u);
                run = false;
            }
            __threadfence();
            atomicExch(&w->pad_state[i], run ? kPadRuns : kPadSkipped);
            if (!run) continue;
        } else {
            while ((st = load_word(&w->pad_state[i])) == kPadUndecided) {
            }
            if (st == kPadSkipped) continue;
        }
        part = 1 + i;
        block = b;
        return;
    }
}

template <int Mode>
__device__ void run_rt(const gpu::gpu_padded_params& p, gpu::gpu_pad_work* w, uint32_t b, unsigned char* smem) {
    launch_ctx c;
    c.offset = p.rt.block_offset;
    c.count = p.rt.block_count ? p.rt.block_count : 1;
    c.kernel_index = p.rt.kernel_index;
    c.sequence = 0;
    c.preempt = p.rt.flag;
    c.completed = p.rt.task ? p.rt.task + 1 : nullptr;
    c.counter = w->rt_counter;
    c.stream_done = &w->dummy_done;
    bool ok = block_begin(c);
    if (ok && p.rt.block_count) ok = run_block<Mode>(p.rt, c, int64_t(b) + c.offset, smem);
    if (block_end(c, ok) != 0) {
        atomicExch(&w->cut, 1u);  // the RT kernel ended: the pads end with it
        __threadfence();
    }
}

template <int Mode>
__device__ void run_pad(const gpu::gpu_padded_params& p, gpu::gpu_pad_work* w, uint32_t i, uint32_t b,
                        unsigned char* smem) {
    const gpu::gpu_pad_part& pp = p.pads[i];
    launch_ctx c;
    c.offset = pp.block_offset;
    c.count = pp.block_count ? pp.block_count : 1;
    c.kernel_index = pp.kernel_index;
    c.sequence = 0;
    c.preempt = &w->cut;
    c.completed = pp.task + 1;
    c.counter = w->pad_counter[i];
    c.stream_done = &w->dummy_done;
    bool ok = block_begin(c);
    if (ok && pp.block_count) ok = run_block<Mode>(pp, c, int64_t(b) + c.offset, smem);
    const int last = block_end(c, ok);
    if (threadIdx.x == 0) {
        if (ok) atomicAdd(&w->pad_blocks[i], 1u);
        if (last == 1) {  // every block ran: the counter moved; the task's next pad may start
            atomicSub(pp.owner_running, 1u);
            atomicExch(&w->pad_state[i], kPadReleased);
        }
    }
}

// Thread 0 of the launch's last block to leave.
__device__ void finish(const gpu::gpu_padded_params& p, gpu::gpu_pad_work* w) {
    __threadfence();
    unsigned long long completed = 0, cut = 0, skipped = 0, blocks = 0;
    for (uint32_t i = 0; i < p.n_pads; ++i) {
        const uint32_t st = load_word(&w->pad_state[i]);
        if (st == kPadRuns) {  // started, then cut: the task restores from this kernel
            atomicSub(p.pads[i].owner_running, 1u);
            ++cut;
        } else if (st == kPadReleased) {
            ++completed;
        } else {
            // Skipped, or never reached: the RT kernel ended before a unit came to it (every
            // block has left, so no claim is deciding it now). Either way it did not run.
            ++skipped;
        }
        blocks += load_word(&w->pad_blocks[i]);
    }
    if (p.totals) {
        atomicAdd(&p.totals->pads_completed, completed);
        atomicAdd(&p.totals->pads_cut, cut);
        atomicAdd(&p.totals->pads_skipped, skipped);
        atomicAdd(&p.totals->pad_blocks, blocks);
    }
    uint32_t* words = reinterpret_cast<uint32_t*>(w);
    for (uint32_t i = 0; i < sizeof(gpu::gpu_pad_work) / 4; ++i) words[i] = 0;
    __threadfence_system();
    *reinterpret_cast<volatile uint32_t*>(p.stream_done) = p.sequence;
    __threadfence_system();
}

template <int Mode, int Level>
__global__ void __launch_bounds__(kThreads, Level) dkp_kernel(const gpu::gpu_padded_params* params) {
    RL_DYNAMIC_SHARED(smem);
    uint32_t* control = reinterpret_cast<uint32_t*>(smem);
    unsigned char* arena = smem + kControlBytes;
    const gpu::gpu_padded_params& p = *params;
    gpu::gpu_pad_work* w = p.work;
    const bool may_pad = unit_id() >= p.rt_units;
    const uint32_t rt_blocks = p.rt.block_count ? p.rt.block_count : 1;
    for (;;) {
        if (threadIdx.x == 0) {
            uint32_t part = kNoPart, b = 0;
            if (load_word(&w->rt_next) < rt_blocks) {
                b = atomicAdd(&w->rt_next, 1u);
                if (b < rt_blocks) part = 0;
            }
            if (part == kNoPart && may_pad) claim_pad(p, w, part, b);
            control[0] = part;
            control[1] = b;
        }
        __syncthreads();
        const uint32_t part = control[0], b = control[1];
        __syncthreads();  // read by all before thread 0 claims again
        if (part == kNoPart) break;
        if (part == 0) run_rt<Mode>(p, w, b, arena);
        else run_pad<Mode>(p, w, part - 1, b, arena);
    }
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&w->exited, 1u) + 1 == gridDim.x) finish(p, w);
    }
}

uint32_t part_shared_bytes(int32_t kind, uint32_t flags) {
    switch (kind) {
    case pad_gemm:
    case pad_conv2d: return gemm_shared_bytes(math_of(flags));
    case pad_gather: return gather_shared_bytes;
    case pad_token_gather: return token_gather_shared_bytes;
    default: return 0;
    }
}

using dkp_fn = void (*)(const gpu::gpu_padded_params*);

template <int Mode>
dkp_fn dkp_for_level(uint32_t level) {
    switch (level) {
    case 4: return dkp_kernel<Mode, 4>;
    case 2: return dkp_kernel<Mode, 2>;
    default: return dkp_kernel<Mode, 1>;
    }
}

dkp_fn dkp_for(uint32_t flags, uint32_t level) {
    switch (math_of(flags)) {
#if defined(RL_GPU_WMMA)
    case math_f16: return dkp_for_level<math_f16>(level);
    case math_bf16: return dkp_for_level<math_bf16>(level);
#endif
    default: return dkp_for_level<math_fp32>(level);
    }
}

int launch_padded(const gpu::gpu_padded_params& p, const gpu::gpu_padded_params* device_copy) {
    if (p.n_pads > gpu::kMaxGpuPads || p.units == 0 || !p.work || !p.stream_done || !device_copy)
        return int(cudaErrorInvalidValue);
    uint32_t shared = part_shared_bytes(p.rt.kind, p.flags);
    for (uint32_t i = 0; i < p.n_pads; ++i) {
        if (p.pads[i].kind < 0 || p.pads[i].kind >= pad_kinds || !p.pads[i].task || !p.pads[i].owner_running)
            return int(cudaErrorInvalidValue);
        const uint32_t s = part_shared_bytes(p.pads[i].kind, p.flags);
        shared = s > shared ? s : shared;
    }
    if (p.rt.kind < 0 || p.rt.kind >= pad_kinds) return int(cudaErrorInvalidValue);
    const uint32_t level = p.level >= 4 ? 4 : p.level >= 2 ? 2 : 1;
    const dkp_fn k = dkp_for(p.flags, level);
    RL_LAUNCH(k, dim3(p.units * level), dim3(kThreads), kControlBytes + shared, static_cast<cudaStream_t>(p.stream),
              device_copy);
    return int(cudaGetLastError());
}

}  // namespace

gpu::gpu_padded_library padded_library() {
    gpu::gpu_padded_library lib;
    lib.launch = launch_padded;
    lib.levels = kLevels;
    lib.n_levels = uint32_t(sizeof kLevels / sizeof kLevels[0]);
    lib.shared_bytes = part_shared_bytes;
    return lib;
}

}  // namespace reefline::ml::kernels::gpu_impl
