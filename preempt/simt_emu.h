// A software SIMT machine for the GPU kernel sources (gpu_vendor.h, REEFLINE_SIMT_EMU=1): the
// .cu files and the cuda device backend (preempt/gpu_device.cc) compiled by the host compiler
// and run on the CPU, so that the kernels' indexing, barriers, check points and completion
// accounting, and the backend's streams, events, counters and queues, are exercised on
// machines without a GPU (-Dgpu_emu=true; the GPU tests then run against it).
//
// The machine: `units` emulated SMs (REEFLINE_EMU_UNITS, default 1), each one OS thread per GPU
// thread of a block (up to 256) running the launch's blocks one after another as it claims
// them; blocks on different units run concurrently, and a kernel reads its unit's number as
// %smid. A block's shared memory is the dynamic shared memory of its launch (RL_DYNAMIC_SHARED:
// the kernels declare no static __shared__ arrays, which would be one copy for all units);
// __syncthreads is a barrier of the block's threads, the shuffles exchange through memory
// between the 32 lanes of a group. Streams are in-order queues, each with its own thread. A
// launch holds the units it runs on until its last block ends: every unit, or the units of its
// stream's mask (rlEmuStreamCreateWithCUMask, the emulation's counterpart of HIP's CU-mask
// streams, which the backend's spatial shares use); launches on disjoint sets of units run side
// by side, others wait, so streams interleave at launch boundaries, not block by block, and
// priorities are not modelled. Memory is host memory: device, pinned and
// host-mapped allocations are the same kind here. What it cannot show: timing, tensor-core
// code (WMMA is emulated by plain arithmetic), memory coherence across PCIe, and the
// hardware's own limits (registers, shared memory size: the attributes it reports are
// nominal).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#define RL_GPU_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

using std::isnan;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct rl_emu_uint3 {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local rl_emu_uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

namespace rl_emu {

constexpr unsigned kMaxThreads = 256;
constexpr unsigned kLanes = 32;

// A barrier whose waiters sleep on a futex at once: hundreds of emulated threads on a few cores
// must not spin.
class barrier {
public:
    explicit barrier(unsigned n) : _n(n) {}
    void arrive_and_wait() {
        const uint32_t g = _generation.load(std::memory_order_acquire);
        if (_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == _n) {
            _arrived.store(0, std::memory_order_relaxed);
            _generation.fetch_add(1, std::memory_order_release);
            syscall(SYS_futex, reinterpret_cast<uint32_t*>(&_generation), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
                    nullptr, 0);
            return;
        }
        while (_generation.load(std::memory_order_acquire) == g)
            syscall(SYS_futex, reinterpret_cast<uint32_t*>(&_generation), FUTEX_WAIT_PRIVATE, g, nullptr, nullptr, 0);
    }

private:
    const unsigned _n;
    std::atomic<uint32_t> _arrived{0};
    std::atomic<uint32_t> _generation{0};
};

// One block slot of the machine (an emulated SM) during a launch: the block barrier, the lane
// groups' barriers and exchange, the block's dynamic shared memory and the block it runs.
struct launch_state {
    unsigned threads;
    barrier block;
    std::vector<std::unique_ptr<barrier>> groups;
    std::atomic<int> vote{0};
    double exchange[kMaxThreads] = {};
    std::vector<unsigned char> shared;  // extern __shared__ (RL_DYNAMIC_SHARED)
    unsigned current_block = 0;
    launch_state(unsigned t, size_t shared_bytes) : threads(t), block(t), shared(std::max<size_t>(shared_bytes, 16)) {
        for (unsigned g = 0; g < (t + kLanes - 1) / kLanes; ++g)
            groups.push_back(std::make_unique<barrier>(std::min(kLanes, t - g * kLanes)));
    }
};
inline thread_local launch_state* current = nullptr;
inline thread_local unsigned current_unit = 0;

// The machine: `units` block slots (emulated SMs, REEFLINE_EMU_UNITS, default 1) of
// kMaxThreads threads each. A launch takes a set of units (every unit, or the unit mask of its
// stream: rlEmuStreamCreateWithCUMask) and each of them takes the launch's blocks one after
// another from a shared counter, so with several units blocks run concurrently, on units a
// kernel can tell apart (%smid: rl_emu::current_unit). Launches whose sets are disjoint run side
// by side; one that needs a unit in use waits for it, in arrival order among the launches that
// want that unit (a launch on every unit is not starved by a stream of bound ones).
class machine {
public:
    static machine& get() {
        static machine m;
        return m;
    }
    unsigned units() const { return _units; }
    uint64_t all_units() const { return _units >= 64 ? ~uint64_t{0} : (uint64_t{1} << _units) - 1; }
    // Runs every block of a launch on the units of `mask` (none of the machine's: every unit);
    // returns when all are done.
    void run(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body,
             uint64_t mask = ~uint64_t{0}) {
        mask &= all_units();
        if (mask == 0) mask = all_units();
        job j;
        j.threads = std::min(block.x, kMaxThreads);
        j.grid = grid;
        j.block = block;
        j.body = &body;
        for (unsigned u = 0; u < _units; ++u)
            if (mask >> u & 1) j.slots[u] = std::make_unique<launch_state>(j.threads, shared_bytes);
        std::unique_lock lk(_mu);
        const uint64_t ticket = _tickets++;
        _waiting.push_back({ticket, mask});
        _free_cv.wait(lk, [&] {
            if (_busy & mask) return false;
            for (const waiter& w : _waiting) {
                if (w.ticket == ticket) break;
                if (w.mask & mask) return false;  // an earlier launch wants one of these units
            }
            return true;
        });
        for (auto it = _waiting.begin(); it != _waiting.end(); ++it)
            if (it->ticket == ticket) {
                _waiting.erase(it);
                break;
            }
        _busy |= mask;
        j.left = j.threads * unsigned(std::popcount(mask));
        for (unsigned u = 0; u < _units; ++u)
            if (mask >> u & 1) {
                _unit[u].current = &j;
                ++_unit[u].generation;
            }
        _cv.notify_all();
        _done_cv.wait(lk, [&] { return j.left == 0; });
        for (unsigned u = 0; u < _units; ++u)
            if (mask >> u & 1) _unit[u].current = nullptr;
        _busy &= ~mask;
        _free_cv.notify_all();  // launches waiting for these units; the next in line may start
    }
    ~machine() {
        {
            std::lock_guard lk(_mu);
            _stop = true;
        }
        _cv.notify_all();
        for (auto& t : _threads) t.join();
    }

private:
    static constexpr unsigned kMaxUnits = 16;
    // One launch as its units run it.
    struct job {
        unsigned threads = 0;
        dim3 grid, block;
        const std::function<void()>* body = nullptr;
        std::unique_ptr<launch_state> slots[kMaxUnits];
        std::atomic<unsigned> next{0};
        unsigned left = 0;  // threads still in it (under _mu)
    };
    struct unit_state {
        job* current = nullptr;
        uint64_t generation = 0;
    };
    struct waiter {
        uint64_t ticket;
        uint64_t mask;
    };

    machine() {
        if (const char* e = std::getenv("REEFLINE_EMU_UNITS")) _units = std::clamp(std::atoi(e), 1, int(kMaxUnits));
        for (unsigned w = 0; w < kMaxThreads * _units; ++w) _threads.emplace_back([this, w] { worker(w); });
    }
    void worker(unsigned w) {
        const unsigned unit = w / kMaxThreads, t = w % kMaxThreads;
        uint64_t seen = 0;
        for (;;) {
            job* j;
            {
                std::unique_lock lk(_mu);
                _cv.wait(lk, [&] { return _stop || _unit[unit].generation != seen; });
                if (_stop) return;
                seen = _unit[unit].generation;
                j = _unit[unit].current;
                // Threads the launch does not use leave it here: it may end (and its job go)
                // as soon as the others are done.
                if (!j || t >= j->threads) continue;
            }
            launch_state* st = j->slots[unit].get();
            current = st;
            current_unit = unit;
            threadIdx = {t, 0, 0};
            blockDim = j->block;
            gridDim = j->grid;
            for (;;) {
                if (t == 0) st->current_block = j->next.fetch_add(1);
                st->block.arrive_and_wait();
                const unsigned b = st->current_block;
                if (b >= j->grid.x) break;
                blockIdx = {b, 0, 0};
                (*j->body)();
                st->block.arrive_and_wait();  // the slot's next block reuses its shared memory
            }
            current = nullptr;
            std::lock_guard lk(_mu);
            if (--j->left == 0) _done_cv.notify_all();
        }
    }
    unsigned _units = 1;
    std::mutex _mu;
    std::condition_variable _cv, _done_cv, _free_cv;
    bool _stop = false;
    unit_state _unit[kMaxUnits];
    uint64_t _busy = 0;  // units running a launch
    uint64_t _tickets = 0;
    std::deque<waiter> _waiting;
    std::vector<std::thread> _threads;
};

// ---- streams and events -----------------------------------------------------------------------
// A stream is an in-order queue with a thread of its own; its launches run on the units of its
// mask (every unit unless made by rlEmuStreamCreateWithCUMask). Owned through shared pointers:
// an event recorded on a stream keeps the stream's counters readable after cudaStreamDestroy,
// as a CUDA event stays valid when its stream goes.
struct stream_t : std::enable_shared_from_this<stream_t> {
    int priority = 0;
    uint64_t units = ~uint64_t{0};
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> work;
    uint64_t enqueued = 0, completed = 0;
    bool stop = false;
    std::thread thread;
    stream_t() {
        thread = std::thread([this] {
            for (;;) {
                std::function<void()> f;
                {
                    std::unique_lock lk(mu);
                    cv.wait(lk, [&] { return stop || !work.empty(); });
                    if (work.empty()) return;
                    f = std::move(work.front());
                    work.pop_front();
                }
                f();
                std::lock_guard lk(mu);
                ++completed;
                cv.notify_all();
            }
        });
    }
    ~stream_t() { halt(); }
    // Runs what is queued, then ends the stream's thread.
    void halt() {
        {
            std::lock_guard lk(mu);
            stop = true;
        }
        cv.notify_all();
        if (thread.joinable()) thread.join();
    }
    void push(std::function<void()> f) {
        std::lock_guard lk(mu);
        work.push_back(std::move(f));
        ++enqueued;
        cv.notify_all();
    }
    void wait_until(uint64_t n) {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return completed >= n; });
    }
    uint64_t done() {
        std::lock_guard lk(mu);
        return completed;
    }
    uint64_t ticket() {
        std::lock_guard lk(mu);
        return enqueued;
    }
};

struct event_t {
    std::mutex mu;
    std::shared_ptr<stream_t> s;
    uint64_t ticket = 0;
};

struct registry {
    std::mutex mu;
    std::map<stream_t*, std::shared_ptr<stream_t>> streams;
    std::set<void*> registered;
    static registry& get() {
        static registry r;
        return r;
    }
};

inline void enqueue(void* stream, dim3 grid, dim3 block, size_t shared_bytes, std::function<void()> body) {
    auto* s = static_cast<stream_t*>(stream);
    const uint64_t units = s ? s->units : ~uint64_t{0};
    auto job = [grid, block, shared_bytes, units, body = std::move(body)] {
        machine::get().run(grid, block, shared_bytes, body, units);
    };
    if (s) s->push(std::move(job));
    else job();
}

}  // namespace rl_emu

// ---- device functions -------------------------------------------------------------------------
inline void __syncthreads() { rl_emu::current->block.arrive_and_wait(); }

inline int __syncthreads_or(int p) {
    rl_emu::launch_state& st = *rl_emu::current;
    st.block.arrive_and_wait();
    if (p) st.vote.fetch_or(1);
    st.block.arrive_and_wait();
    const int r = st.vote.load();
    st.block.arrive_and_wait();
    if (threadIdx.x == 0) st.vote.store(0);
    return r;
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask, int = 32) {
    rl_emu::launch_state& st = *rl_emu::current;
    const unsigned t = threadIdx.x, g = t / rl_emu::kLanes;
    st.exchange[t] = double(v);
    st.groups[g]->arrive_and_wait();
    const T r = T(st.exchange[(t ^ unsigned(mask)) % rl_emu::kMaxThreads]);
    st.groups[g]->arrive_and_wait();
    return r;
}

inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned atomicSub(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_sub(v); }
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
    std::atomic_ref<unsigned>(*p).compare_exchange_strong(expected, desired);
    return expected;
}
// The block's dynamic shared memory (RL_DYNAMIC_SHARED) and the unit it runs on (%smid).
namespace rl_emu {
inline unsigned char* dynamic_shared() { return current->shared.data(); }
inline unsigned smid() { return current_unit; }
}  // namespace rl_emu
inline unsigned atomicOr(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_or(v); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).exchange(v); }
inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned cur = a.load();
    while (v < cur && !a.compare_exchange_weak(cur, v)) {
    }
    return cur;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned cur = a.load();
    while (v > cur && !a.compare_exchange_weak(cur, v)) {
    }
    return cur;
}
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }

// ---- 16-bit inputs and WMMA, for the tensor-core path -------------------------------------------
// __half and __nv_bfloat16 keep a float rounded (to nearest even) to the type's precision and
// range; a WMMA fragment is the whole 16 x 16 tile in every lane (each lane computes the same
// product; stores write the same values), which is enough to check the kernels' tiling and
// layouts, not the hardware's order of accumulation.
namespace rl_emu {
inline float round_mantissa(float f, int drop_bits) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;  // inf, nan
    const uint32_t half = 1u << (drop_bits - 1), mask = (1u << drop_bits) - 1;
    const uint32_t rem = u & mask;
    u &= ~mask;
    if (rem > half || (rem == half && (u & (1u << drop_bits)))) u += 1u << drop_bits;
    return std::bit_cast<float>(u);
}
}  // namespace rl_emu
struct __half {
    float v = 0;
};
struct __nv_bfloat16 {
    float v = 0;
};
inline __half __float2half_rn(float f) {
    // fp16: 10 mantissa bits, largest finite 65504, subnormals below 2^-14 (steps of 2^-24).
    float r;
    if (std::fabs(f) < 6.103515625e-05f) r = std::nearbyint(f * 16777216.0f) / 16777216.0f;
    else r = rl_emu::round_mantissa(f, 13);
    if (std::fabs(r) > 65504.0f) r = std::copysign(INFINITY, f);
    return __half{r};
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{rl_emu::round_mantissa(f, 16)}; }
inline float rl_emu_value(const __half& h) { return h.v; }
inline float rl_emu_value(const __nv_bfloat16& h) { return h.v; }
inline float rl_emu_value(float f) { return f; }

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
enum layout_t { mem_row_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    T x[M * N];
};
template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, float v) {
    for (auto& e : f.x) e = T(v);
}
template <typename Use, int M, int N, int K, typename T, typename L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = p[r * ldm + c];
}
template <int M, int N, int K, typename T>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t) {
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) std::atomic_ref<float>(p[r * ldm + c]).store(f.x[r * 16 + c]);
}
template <typename TA, typename TB, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, TB, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
    fragment<accumulator, 16, 16, 16, float> r;
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
            float s = c.x[i * 16 + j];
            for (int k = 0; k < 16; ++k) s += rl_emu_value(a.x[i * 16 + k]) * rl_emu_value(b.x[k * 16 + j]);
            r.x[i * 16 + j] = s;
        }
    d = r;
}
}  // namespace nvcuda::wmma

// ---- the runtime API subset the backend uses ----------------------------------------------------
enum cudaError_t : int {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotReady = 600,
    cudaErrorHostMemoryAlreadyRegistered = 712,
};
using cudaStream_t = void*;
using cudaEvent_t = rl_emu::event_t*;
struct cudaDeviceProp {
    char name[256];
    int multiProcessorCount;
};
struct cudaFuncAttributes {
    size_t sharedSizeBytes;
    int maxThreadsPerBlock;
    int numRegs;
};
enum cudaMemcpyKind : int { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDefault = 4 };
constexpr unsigned cudaHostAllocPortable = 1, cudaHostAllocMapped = 2;
constexpr unsigned cudaHostRegisterPortable = 1, cudaHostRegisterMapped = 2;
constexpr unsigned cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2;

inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    }
    return "unknown error";
}
inline cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    std::snprintf(p->name, sizeof p->name, "SIMT emulation");
    p->multiProcessorCount = int(rl_emu::machine::get().units());
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    *least = 0;
    *greatest = -5;
    return cudaSuccess;
}
// The emulated device's memory is the host's: what /proc/meminfo says is available of it.
inline cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
    *free = *total = 0;
    if (FILE* f = std::fopen("/proc/meminfo", "r")) {
        char key[64];
        unsigned long long kib = 0;
        while (std::fscanf(f, "%63s %llu kB", key, &kib) == 2) {
            if (std::strcmp(key, "MemTotal:") == 0) *total = size_t(kib) * 1024;
            if (std::strcmp(key, "MemAvailable:") == 0) *free = size_t(kib) * 1024;
        }
        std::fclose(f);
    }
    return *total ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaMalloc(void** p, size_t n) {
    if (n > (size_t(1) << 40)) return cudaErrorMemoryAllocation;
    *p = std::aligned_alloc(256, (std::max<size_t>(n, 1) + 255) / 256 * 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
    std::free(p);
    return cudaSuccess;
}
inline cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
inline cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
    *d = h;
    return cudaSuccess;
}
inline cudaError_t cudaHostRegister(void* p, size_t, unsigned) {
    auto& r = rl_emu::registry::get();
    std::lock_guard lk(r.mu);
    return r.registered.insert(p).second ? cudaSuccess : cudaErrorHostMemoryAlreadyRegistered;
}
inline cudaError_t cudaHostUnregister(void* p) {
    auto& r = rl_emu::registry::get();
    std::lock_guard lk(r.mu);
    return r.registered.erase(p) ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    std::memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
    std::memmove(d, s, n);
    return cudaSuccess;
}
// In stream order, like the runtime's: the bytes are read when the copy runs.
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t stream) {
    if (auto* st = static_cast<rl_emu::stream_t*>(stream)) st->push([d, s, n] { std::memmove(d, s, n); });
    else std::memmove(d, s, n);
    return cudaSuccess;
}
namespace rl_emu {
inline cudaError_t stream_create(cudaStream_t* s, int priority, uint64_t units) {
    auto st = std::make_shared<stream_t>();
    st->priority = priority;
    st->units = units;
    auto& r = registry::get();
    std::lock_guard lk(r.mu);
    r.streams.emplace(st.get(), st);
    *s = st.get();
    return cudaSuccess;
}
}  // namespace rl_emu
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int priority) {
    return rl_emu::stream_create(s, priority, ~uint64_t{0});
}
// The emulation's extension, shaped like HIP's hipExtStreamCreateWithCUMask: a stream whose
// launches run their blocks only on the emulated units set in the mask (cuMaskSize 32-bit words;
// bit u of the whole mask is unit u; units the machine lacks are ignored). A mask that names no
// unit of the machine is refused. The stream has the default priority, as HIP's has.
inline cudaError_t rlEmuStreamCreateWithCUMask(cudaStream_t* s, uint32_t cuMaskSize, const uint32_t* cuMask) {
    if (!s || (cuMaskSize && !cuMask)) return cudaErrorInvalidValue;
    uint64_t units = 0;
    for (uint32_t i = 0; i < cuMaskSize && i < 2; ++i) units |= uint64_t{cuMask[i]} << (32 * i);
    units &= rl_emu::machine::get().all_units();
    if (units == 0) return cudaErrorInvalidValue;
    return rl_emu::stream_create(s, 0, units);
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    auto* st = static_cast<rl_emu::stream_t*>(s);
    std::shared_ptr<rl_emu::stream_t> owner;
    {
        auto& r = rl_emu::registry::get();
        std::lock_guard lk(r.mu);
        auto it = r.streams.find(st);
        if (it == r.streams.end()) return cudaErrorInvalidValue;
        owner = std::move(it->second);
        r.streams.erase(it);
    }
    owner->wait_until(owner->ticket());
    owner->halt();  // events recorded on it may keep the counters a while
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    auto* st = static_cast<rl_emu::stream_t*>(s);
    st->wait_until(st->ticket());
    return cudaSuccess;
}
inline cudaError_t cudaStreamQuery(cudaStream_t s) {
    auto* st = static_cast<rl_emu::stream_t*>(s);
    return st->done() >= st->ticket() ? cudaSuccess : cudaErrorNotReady;
}
inline cudaError_t cudaDeviceSynchronize() {
    std::vector<std::shared_ptr<rl_emu::stream_t>> all;
    {
        auto& r = rl_emu::registry::get();
        std::lock_guard lk(r.mu);
        for (auto& [p, st] : r.streams) all.push_back(st);
    }
    for (auto& s : all) s->wait_until(s->ticket());
    return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
    *e = new rl_emu::event_t;
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    auto* st = static_cast<rl_emu::stream_t*>(s);
    if (!st) return cudaErrorInvalidValue;  // the legacy stream is not emulated
    std::lock_guard lk(e->mu);
    e->s = st->shared_from_this();
    e->ticket = st->ticket();
    return cudaSuccess;
}
// Work queued on `stream` after this waits for what the event recorded.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned = 0) {
    std::shared_ptr<rl_emu::stream_t> s;
    uint64_t t;
    {
        std::lock_guard lk(e->mu);
        s = e->s;
        t = e->ticket;
    }
    auto* st = static_cast<rl_emu::stream_t*>(stream);
    if (!s || s.get() == st) return cudaSuccess;
    if (st) st->push([s, t] { s->wait_until(t); });
    else s->wait_until(t);
    return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard lk(e->mu);
    return !e->s || e->s->done() >= e->ticket ? cudaSuccess : cudaErrorNotReady;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::shared_ptr<rl_emu::stream_t> s;
    uint64_t t;
    {
        std::lock_guard lk(e->mu);
        s = e->s;
        t = e->ticket;
    }
    if (s) s->wait_until(t);
    return cudaSuccess;
}
// A host function in stream order (it runs on the stream's thread, as the runtime's does on
// one of its own).
using cudaStreamCallback_t = void (*)(cudaStream_t, cudaError_t, void*);
inline cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t fn, void* user, unsigned) {
    if (auto* st = static_cast<rl_emu::stream_t*>(stream)) st->push([stream, fn, user] { fn(stream, cudaSuccess, user); });
    else fn(stream, cudaSuccess, user);
    return cudaSuccess;
}
// The emulation has no registers or shared-memory limits of its own: it reports those of a
// typical GPU kernel (32 registers; 64 KiB of shared memory per unit) so that occupancy-driven
// code takes the paths it takes on hardware.
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void*) {
    a->sharedSizeBytes = 0;
    a->maxThreadsPerBlock = int(rl_emu::kMaxThreads);
    a->numRegs = 32;
    return cudaSuccess;
}
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void*, int threads, size_t shared) {
    int b = 2048 / std::max(threads, 1);
    if (shared) b = std::min<int>(b, int((64u << 10) / shared));
    *n = std::clamp(b, 1, 8);
    return cudaSuccess;
}
