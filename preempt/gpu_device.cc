// The cuda and hip device backends: preempt/device.h's table of functions on the CUDA or HIP
// runtime. One source for both: libml/kernels/gpu/vendor.h maps the CUDA names to HIP's when
// the build defines REEFLINE_HIP (then this file is make_hip_device, else make_cuda_device).
//
// Memory
// - device: a caching pool over cudaMalloc (cudaFree synchronises the whole device, so freed
//   blocks are kept for reuse up to gpu_device_options::pool_cache_bytes);
// - pinned: cudaHostAlloc (portable); host_mapped: cudaHostAlloc (mapped, portable), used by
//   host and kernels through the same address (unified addressing; checked per allocation);
// - register_host: cudaHostRegister (mapped, portable) of external memory, the data plane's
//   hugepage mbuf ranges (dataplane/port.h: memory_ranges()), so the gather kernel reads
//   payloads in place; refused when the GPU could not use the host addresses as they are.
//
// Task words and streams' finished words live in host-mapped memory (slabs of 64-byte cells,
// recycled and freed only with the device, like the cpu backend's, since a kernel may still
// read them): the host reads the completion counter without a copy. The preemption flag that
// kernels read is a device-memory twin of each cell (a device slab beside every host slab):
// kernels check it at block start and every K chunk, and a host-mapped read there is a PCIe
// round trip that stalls the block (ResNet-50 ran 6x slower on an H100 with it). task_flag_set
// writes the twin with a 4-byte copy from pinned memory on a stream of its own, the highest
// priority: the copy engine delivers it while every SM is busy with the kernels it stops.
//
// Streams are non-blocking CUDA streams with priorities (the scheduler gives its RT stream
// caps().highest_priority, the runtime's greatest priority). Each has a launch counter in
// device memory, which the kernel library's launches use to find their last block (see
// libml/kernels/gpu/launcher.h), and a finished word that the last block of every launch sets
// to the launch's sequence number: queued() and the bounded device queue (launch() blocks while
// queue_depth launches are outstanding) read it instead of querying events per launch.
//
// Kernels come from the GPU kernel library by name (kernel_info::name), resolved once per
// kernel_info; a kernel without a GPU implementation makes launch() throw, and the scheduler
// fails that task.
#include "preempt/gpu_device.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "libml/kernels/gpu/launcher.h"
#include "libml/kernels/gpu/vendor.h"

namespace reefline::gpu {
namespace {

namespace mk = reefline::ml::kernels;

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "kernels read and write the task words as plain 32-bit words");
static_assert(offsetof(task_words, preempt) == 0 && offsetof(task_words, completed) == 4,
              "the kernel library reads the flag at word 0 and writes the counter at word 1");

#if defined(RL_GPU_HIP)
constexpr const char* kBackend = "hip";
#else
constexpr const char* kBackend = "cuda";
#endif

constexpr size_t kCell = 64;               // one task_words, or one stream's finished word
constexpr size_t kSlabBytes = 64 * 1024;   // host-mapped cells per cudaHostAlloc
constexpr size_t kMaxSlabs = 1024;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

std::string runtime_error_text(cudaError_t e) { return cudaGetErrorString(e); }

[[noreturn]] void fail(const std::string& what, cudaError_t e) {
    throw std::runtime_error(std::string(kBackend) + " device: " + what + ": " + runtime_error_text(e));
}

struct gpu_stream {
    cudaStream_t s = nullptr;
    int priority = 0;
    std::mutex producer;                   // serialises launches and event records on it
    std::atomic<uint32_t> submitted{0};    // sequence number of the last launch submitted
    uint32_t* counter = nullptr;           // device memory: {blocks finished, flagged}
    std::atomic<uint32_t>* done = nullptr; // host-mapped: sequence of the last finished launch
    uint32_t* done_dev = nullptr;          // its device address
};

struct gpu_event {
    cudaEvent_t e = nullptr;
};

struct mapped_slab {
    std::byte* host = nullptr;
    std::byte* dev = nullptr;    // the host cells' device address
    std::byte* flags = nullptr;  // device memory: the flag twins, at the cells' offsets
};

struct gpu_device_state {
    gpu_device_options options;
    int ordinal = 0;
    device_caps caps;
    int least_priority = 0, greatest_priority = 0;

    // Host-mapped cells. Slabs are only appended (published through nslabs), so finding a
    // cell's device address needs no lock.
    std::array<mapped_slab, kMaxSlabs> slabs{};
    std::atomic<uint32_t> nslabs{0};
    // task_flag_set's copies: their stream, and the values they copy (pinned, so the copy is
    // asynchronous), one 64-byte cell each.
    cudaStream_t flag_stream = nullptr;
    uint32_t* flag_values = nullptr;
    cudaEvent_t flag_written = nullptr;
    std::mutex flag_mu;  // one flag copy at a time, in order (raise then lower of one task)

    std::mutex mu;  // everything below
    std::vector<std::byte*> free_cells;
    std::unordered_set<task_words*> words;
    std::unordered_set<gpu_stream*> streams;
    std::unordered_set<gpu_event*> events;
    std::unordered_map<void*, size_t> device_live;         // pool blocks in use: rounded size
    std::multimap<size_t, void*> device_cached;            // pool blocks free: by rounded size
    size_t cached_bytes = 0, live_bytes = 0;
    std::unordered_map<void*, memory_kind> host_allocs;    // pinned and host-mapped
    std::unordered_map<void*, size_t> registered;
    std::mutex launchers_mu;  // the launcher cache alone: launches do not wait for allocations
    std::unordered_map<const kernel_info*, mk::gpu_launcher> launchers;
    uint64_t pool_hits = 0, pool_misses = 0;
    std::atomic<uint64_t> launches{0};
};

gpu_device_state* state_of(const device* d) { return static_cast<gpu_device_state*>(d->state()); }
gpu_stream* as_gpu(stream* s) { return reinterpret_cast<gpu_stream*>(s); }
gpu_event* as_gpu(event* e) { return reinterpret_cast<gpu_event*>(e); }

// The runtime's current device is per thread; every entry point may come from a new thread.
void bind(const gpu_device_state* d) { (void)cudaSetDevice(d->ordinal); }

// ---- host-mapped cells --------------------------------------------------------------------

std::byte* cell_alloc(gpu_device_state* d) {  // d->mu held
    if (d->free_cells.empty()) {
        const uint32_t n = d->nslabs.load(std::memory_order_relaxed);
        if (n == kMaxSlabs) throw std::runtime_error(std::string(kBackend) + " device: out of task words");
        void* host = nullptr;
        cudaError_t e =
            cudaHostAlloc(&host, kSlabBytes, cudaHostAllocMapped | cudaHostAllocPortable | RL_HOST_COHERENT);
        if (e != cudaSuccess) fail("host-mapped allocation of task words", e);
        void* dev = nullptr;
        e = cudaHostGetDevicePointer(&dev, host, 0);
        if (e != cudaSuccess) {
            (void)cudaFreeHost(host);
            fail("device address of host-mapped memory", e);
        }
        void* flags = nullptr;
        e = cudaMalloc(&flags, kSlabBytes);
        if (e == cudaSuccess) e = cudaMemset(flags, 0, kSlabBytes);
        if (e != cudaSuccess) {
            (void)cudaFree(flags);
            (void)cudaFreeHost(host);
            fail("device memory for preemption flags", e);
        }
        std::memset(host, 0, kSlabBytes);
        d->slabs[n] = {static_cast<std::byte*>(host), static_cast<std::byte*>(dev), static_cast<std::byte*>(flags)};
        d->nslabs.store(n + 1, std::memory_order_release);
        for (size_t off = kSlabBytes; off >= kCell; off -= kCell)
            d->free_cells.push_back(static_cast<std::byte*>(host) + off - kCell);
    }
    std::byte* c = d->free_cells.back();
    d->free_cells.pop_back();
    return c;
}

// The slab holding a host-mapped cell and the cell's offset in it; null when `p` is in none.
const mapped_slab* cell_slab(const gpu_device_state* d, const void* p, size_t& offset) {
    const auto* b = static_cast<const std::byte*>(p);
    const uint32_t n = d->nslabs.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < n; ++i) {
        const mapped_slab& s = d->slabs[i];
        if (b >= s.host && b < s.host + kSlabBytes) {
            offset = size_t(b - s.host);
            return &s;
        }
    }
    return nullptr;
}

// Device address of a host-mapped cell, or null when `p` is not in one.
uint32_t* cell_device_address(const gpu_device_state* d, const void* p) {
    size_t off = 0;
    const mapped_slab* s = cell_slab(d, p, off);
    return s ? reinterpret_cast<uint32_t*>(s->dev + off) : nullptr;
}

// The device-memory flag twin of a task's words, or null when `w` is not in a cell.
uint32_t* cell_flag_address(const gpu_device_state* d, const task_words* w) {
    size_t off = 0;
    const mapped_slab* s = cell_slab(d, w, off);
    return s ? reinterpret_cast<uint32_t*>(s->flags + off) : nullptr;
}

// Writes a task's flag twin. Copies are queued in the order of the calls (the lock), each
// followed by a record of `flag_written`. Lowering waits until its copy has landed, outside the
// lock: a raise for an RT arrival never waits behind a lower's round trip. A launch of a task
// whose flag is up waits on the stream for the latest record (op_launch), so it sees the raise.
// (Another write may re-record the event meanwhile; waiting for the later record waits for
// ours too: stream order.)
void write_flag(gpu_device_state* d, uint32_t* flag, uint32_t value) {
    const uint32_t* src = d->flag_values + (value ? 16 : 0);
    cudaError_t e;
    {
        std::lock_guard lk(d->flag_mu);
        e = cudaMemcpyAsync(flag, src, sizeof(uint32_t), cudaMemcpyHostToDevice, d->flag_stream);
        if (e == cudaSuccess) e = cudaEventRecord(d->flag_written, d->flag_stream);
    }
    if (e == cudaSuccess && value == 0) e = cudaEventSynchronize(d->flag_written);
    if (e != cudaSuccess) fail(value ? "raising a preemption flag" : "lowering a preemption flag", e);
}

// ---- device memory pool -------------------------------------------------------------------

size_t pool_round(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    const size_t quantum = bytes < (size_t(1) << 20) ? 512 : (size_t(2) << 20);
    return (bytes + quantum - 1) / quantum * quantum;
}

void pool_release_cached(gpu_device_state* d) {  // d->mu held
    for (auto& [n, p] : d->device_cached) (void)cudaFree(p);
    d->device_cached.clear();
    d->cached_bytes = 0;
}

void* pool_alloc(gpu_device_state* d, size_t bytes) {
    const size_t want = pool_round(bytes);
    std::lock_guard lk(d->mu);
    // A cached block of at least the size, and not much more (large blocks are not split).
    auto it = d->device_cached.lower_bound(want);
    if (it != d->device_cached.end() && it->first <= want + want / 2) {
        void* p = it->second;
        const size_t n = it->first;
        d->device_cached.erase(it);
        d->cached_bytes -= n;
        d->device_live.emplace(p, n);
        d->live_bytes += n;
        ++d->pool_hits;
        return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  // an allocation failure is not sticky: clear it, free the cache, retry
        pool_release_cached(d);
        e = cudaMalloc(&p, want);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
    }
    d->device_live.emplace(p, want);
    d->live_bytes += want;
    ++d->pool_misses;
    return p;
}

bool pool_free(gpu_device_state* d, void* p) {
    std::lock_guard lk(d->mu);
    auto it = d->device_live.find(p);
    if (it == d->device_live.end()) return false;
    const size_t n = it->second;
    d->device_live.erase(it);
    d->live_bytes -= n;
    d->device_cached.emplace(n, p);
    d->cached_bytes += n;
    // Over the cache limit: give back the largest cached blocks.
    while (d->cached_bytes > d->options.pool_cache_bytes && !d->device_cached.empty()) {
        auto last = std::prev(d->device_cached.end());
        (void)cudaFree(last->second);
        d->cached_bytes -= last->first;
        d->device_cached.erase(last);
    }
    return true;
}

// ---- device_ops ---------------------------------------------------------------------------

void op_destroy(device* dev) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    (void)cudaDeviceSynchronize();
    {
        std::lock_guard lk(d->mu);
        for (gpu_event* e : d->events) {
            (void)cudaEventDestroy(e->e);
            delete e;
        }
        for (gpu_stream* s : d->streams) {
            (void)cudaStreamDestroy(s->s);
            (void)cudaFree(s->counter);
            delete s;
        }
        for (auto& [p, n] : d->device_live) (void)cudaFree(p);
        pool_release_cached(d);
        for (auto& [p, k] : d->host_allocs) (void)cudaFreeHost(p);
        for (auto& [p, n] : d->registered) (void)cudaHostUnregister(p);
        for (task_words* w : d->words) w->~task_words();
        for (uint32_t i = 0; i < d->nslabs.load(); ++i) {
            (void)cudaFreeHost(d->slabs[i].host);
            (void)cudaFree(d->slabs[i].flags);
        }
        (void)cudaEventDestroy(d->flag_written);
        (void)cudaStreamDestroy(d->flag_stream);
        (void)cudaFreeHost(d->flag_values);
    }
    delete d;
}

device_caps op_caps(const device* dev) { return state_of(dev)->caps; }

void* op_alloc(device* dev, size_t bytes, memory_kind kind) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    if (kind == memory_kind::device) return pool_alloc(d, bytes);
    void* p = nullptr;
    const unsigned flags = kind == memory_kind::host_mapped
                               ? cudaHostAllocMapped | cudaHostAllocPortable | RL_HOST_COHERENT
                               : cudaHostAllocPortable;
    if (cudaHostAlloc(&p, std::max<size_t>(bytes, 1), flags) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    if (kind == memory_kind::host_mapped) {
        // Host code and kernels use one pointer (libml binds it into kernel arguments).
        void* dp = nullptr;
        if (cudaHostGetDevicePointer(&dp, p, 0) != cudaSuccess || dp != p) {
            (void)cudaGetLastError();
            std::fprintf(stderr, "reefline %s device: host-mapped memory at %p has device address %p; "
                                 "unified addressing is required\n", kBackend, p, dp);
            (void)cudaFreeHost(p);
            return nullptr;
        }
    }
    std::lock_guard lk(d->mu);
    d->host_allocs.emplace(p, kind);
    return p;
}

void op_free(device* dev, void* p) {
    if (!p) return;
    gpu_device_state* d = state_of(dev);
    bind(d);
    if (pool_free(d, p)) return;
    std::lock_guard lk(d->mu);
    if (d->host_allocs.erase(p) == 0) {
        std::fprintf(stderr, "reefline %s device: free of %p, which it did not allocate\n", kBackend, p);
        std::abort();
    }
    (void)cudaFreeHost(p);
}

bool op_register_host(device* dev, void* p, size_t bytes) {
    if (!p || bytes == 0) return false;
    gpu_device_state* d = state_of(dev);
    bind(d);
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        // Already visible to the GPU (registered by someone else, or allocated pinned): usable
        // as it is; not recorded, so unregister_host leaves it alone.
        (void)cudaGetLastError();
        return true;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        std::fprintf(stderr, "reefline %s device: cannot register %zu bytes at %p: %s\n", kBackend, bytes, p,
                     runtime_error_text(e).c_str());
        return false;
    }
    // Kernels get the host's pointers (gather lists hold mbuf payload addresses): the GPU must
    // see the memory at the same address. True with unified addressing on every 64-bit system
    // the runtimes support, where the device can use host pointers for registered memory.
    void* dp = nullptr;
    e = cudaHostGetDevicePointer(&dp, p, 0);
    if (e != cudaSuccess || dp != p) {
        (void)cudaGetLastError();
        (void)cudaHostUnregister(p);
        std::fprintf(stderr, "reefline %s device: registered memory at %p has device address %p; "
                             "kernels cannot read it through host pointers\n", kBackend, p, dp);
        return false;
    }
    std::lock_guard lk(d->mu);
    d->registered[p] = bytes;
    return true;
}

void op_unregister_host(device* dev, void* p) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    std::lock_guard lk(d->mu);
    if (d->registered.erase(p)) (void)cudaHostUnregister(p);
}

void op_copy_to_device(device* dev, void* dst, const void* src, size_t bytes) {
    if (!bytes) return;
    bind(state_of(dev));
    const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess) fail("copy to device", e);
}

void op_copy_to_host(device* dev, void* dst, const void* src, size_t bytes) {
    if (!bytes) return;
    bind(state_of(dev));
    const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess) fail("copy to host", e);
}

stream* op_stream_create(device* dev, int priority) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    // CUDA's order: a lower number is a higher priority, greatest <= p <= least.
    priority = std::clamp(priority, d->greatest_priority, d->least_priority);
    auto s = std::make_unique<gpu_stream>();
    s->priority = priority;
    cudaError_t e = cudaStreamCreateWithPriority(&s->s, cudaStreamNonBlocking, priority);
    if (e != cudaSuccess) fail("stream creation", e);
    void* counter = nullptr;
    e = cudaMalloc(&counter, 2 * sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaMemset(counter, 0, 2 * sizeof(uint32_t));
    if (e != cudaSuccess) {
        (void)cudaStreamDestroy(s->s);
        fail("stream counter", e);
    }
    s->counter = static_cast<uint32_t*>(counter);
    std::lock_guard lk(d->mu);
    std::byte* cell = cell_alloc(d);
    s->done = new (cell) std::atomic<uint32_t>(0);
    s->done_dev = cell_device_address(d, cell);
    gpu_stream* raw = s.release();
    d->streams.insert(raw);
    return reinterpret_cast<stream*>(raw);
}

void op_synchronize(device* dev, stream* st) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    const cudaError_t e = cudaStreamSynchronize(as_gpu(st)->s);
    if (e != cudaSuccess)
        std::fprintf(stderr, "reefline %s device: synchronize: %s\n", kBackend, runtime_error_text(e).c_str());
}

void op_stream_destroy(device* dev, stream* st) {
    if (!st) return;
    gpu_device_state* d = state_of(dev);
    gpu_stream* s = as_gpu(st);
    op_synchronize(dev, st);
    std::lock_guard lk(d->mu);
    if (!d->streams.erase(s)) return;
    (void)cudaStreamDestroy(s->s);
    (void)cudaFree(s->counter);
    d->free_cells.push_back(reinterpret_cast<std::byte*>(s->done));
    delete s;
}

mk::gpu_launcher launcher_of(gpu_device_state* d, const kernel_info* k) {
    std::lock_guard lk(d->launchers_mu);
    auto it = d->launchers.find(k);
    if (it != d->launchers.end()) return it->second;
    const mk::gpu_launcher fn = mk::gpu_launcher_for(k->name);
    if (fn) d->launchers.emplace(k, fn);  // a miss is not cached: a test may register it later
    return fn;
}

uint32_t finished(const gpu_stream* s) { return s->done->load(std::memory_order_acquire); }

void op_launch(device* dev, stream* st, const launch& l) {
    gpu_device_state* d = state_of(dev);
    gpu_stream* s = as_gpu(st);
    if (!s || !l.kernel)
        throw std::invalid_argument(std::string(kBackend) + " device: launch without a stream or a kernel");
    const char* name = l.kernel->name ? l.kernel->name : "?";
    if (l.block_offset > l.grid || l.block_count > l.grid - l.block_offset)
        throw std::invalid_argument(std::string(kBackend) + " device: block slice outside the grid of " + name);
    if (l.args_size != 0 && !l.args)
        throw std::invalid_argument(std::string(kBackend) + " device: args_size without args");
    const mk::gpu_launcher fn = launcher_of(d, l.kernel);
    if (!fn)
        throw std::runtime_error(std::string(kBackend) + " device: kernel '" + name +
                                 "' has no GPU implementation in the kernel library");
    uint32_t* task = nullptr;
    const uint32_t* flag = nullptr;
    if (l.task) {
        task = cell_device_address(d, l.task);
        flag = cell_flag_address(d, l.task);
        if (!task || !flag)
            throw std::invalid_argument(std::string(kBackend) +
                                        " device: task words not made by this device (task_words_create)");
    }
    bind(d);

    std::lock_guard lk(s->producer);
    // The bounded device queue: wait while queue_depth launches are outstanding. Their last
    // blocks advance the finished word; a stream that went idle without it (a device fault)
    // or failed ends the wait with an error.
    const uint32_t depth = std::max<uint32_t>(1, d->options.queue_depth);
    const uint32_t seq = s->submitted.load(std::memory_order_relaxed);
    if (seq - finished(s) >= depth) {
        const auto t0 = std::chrono::steady_clock::now();
        for (uint32_t i = 1; seq - finished(s) >= depth; ++i) {
            if ((i & 255) != 0) {
                cpu_relax();
                continue;
            }
            const cudaError_t e = cudaStreamQuery(s->s);
            if (e != cudaSuccess && e != cudaErrorNotReady) fail("waiting for the device queue", e);
            if (e == cudaSuccess && seq - finished(s) >= depth)
                throw std::runtime_error(std::string(kBackend) + " device: stream idle with launches unaccounted");
            if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(200))
                std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
    // A launch of a preempted task must see the raise, even one made before the copy landed.
    if (l.task && l.task->preempt.load(std::memory_order_acquire) != 0) {
        std::lock_guard flk(d->flag_mu);
        const cudaError_t e = cudaStreamWaitEvent(s->s, d->flag_written, 0);
        if (e != cudaSuccess) fail("ordering a launch after its task's flag", e);
    }
    mk::gpu_launch_params p{};
    p.args = l.args;
    p.args_size = l.args_size;
    p.grid = l.grid;
    p.block_offset = l.block_offset;
    p.block_count = l.block_count;
    p.kernel_index = l.kernel_index;
    p.sequence = seq + 1;
    p.flags = d->options.math == gpu_math::tensor_f16    ? mk::gpu_tensor_f16
              : d->options.math == gpu_math::tensor_bf16 ? mk::gpu_tensor_bf16
                                                         : 0u;
    p.task = task;
    p.flag = flag;
    p.counter = s->counter;
    p.stream_done = s->done_dev;
    p.stream = static_cast<void*>(s->s);
    const int rc = fn(p);
    if (rc != 0) {
        throw std::runtime_error(std::string(kBackend) + " device: launch of '" + name + "' (" +
                                 std::to_string(l.block_count) + " blocks) failed: " + mk::gpu_error_string(rc));
    }
    s->submitted.store(seq + 1, std::memory_order_release);
    d->launches.fetch_add(1, std::memory_order_relaxed);
}

uint32_t op_queued(device*, stream* st) {
    const gpu_stream* s = as_gpu(st);
    const uint32_t n = s->submitted.load(std::memory_order_acquire) - finished(s);
    // The oldest outstanding launch runs (or is about to): the rest have not started.
    return n ? n - 1 : 0;
}

event* op_event_create(device* dev) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    auto* e = new gpu_event;
    const cudaError_t rc = cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming);
    if (rc != cudaSuccess) {
        delete e;
        fail("event creation", rc);
    }
    std::lock_guard lk(d->mu);
    d->events.insert(e);
    return reinterpret_cast<event*>(e);
}

void op_event_destroy(device* dev, event* ev) {
    if (!ev) return;
    gpu_device_state* d = state_of(dev);
    bind(d);
    std::lock_guard lk(d->mu);
    if (d->events.erase(as_gpu(ev))) {
        (void)cudaEventDestroy(as_gpu(ev)->e);
        delete as_gpu(ev);
    }
}

void op_event_record(device* dev, event* ev, stream* st) {
    bind(state_of(dev));
    gpu_stream* s = as_gpu(st);
    std::lock_guard lk(s->producer);  // orders the marker among this stream's launches
    const cudaError_t e = cudaEventRecord(as_gpu(ev)->e, s->s);
    if (e != cudaSuccess) fail("event record", e);
}

bool op_event_query(device* dev, event* ev) {
    bind(state_of(dev));
    const cudaError_t e = cudaEventQuery(as_gpu(ev)->e);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
        // A failed device never completes the event: report and treat it as passed, so
        // that callers polling it (the scheduler's drain) do not spin forever.
        (void)cudaGetLastError();
        std::fprintf(stderr, "reefline %s device: event query: %s\n", kBackend, runtime_error_text(e).c_str());
    }
    return true;
}

void op_event_synchronize(device* dev, event* ev) {
    bind(state_of(dev));
    const cudaError_t e = cudaEventSynchronize(as_gpu(ev)->e);
    if (e != cudaSuccess)
        std::fprintf(stderr, "reefline %s device: event synchronize: %s\n", kBackend, runtime_error_text(e).c_str());
}

task_words* op_task_words_create(device* dev) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    std::lock_guard lk(d->mu);
    auto* w = new (cell_alloc(d)) task_words{};
    w->preempt.store(0, std::memory_order_relaxed);
    w->completed.store(0, std::memory_order_relaxed);
    write_flag(d, cell_flag_address(d, w), 0);  // a recycled cell's twin may still be raised
    d->words.insert(w);
    return w;
}

void op_task_flag_set(device* dev, task_words* w, uint32_t value) {
    gpu_device_state* d = state_of(dev);
    uint32_t* flag = cell_flag_address(d, w);
    if (!flag)
        throw std::invalid_argument(std::string(kBackend) +
                                    " device: task words not made by this device (task_words_create)");
    bind(d);
    w->preempt.store(value, std::memory_order_seq_cst);
    write_flag(d, flag, value);
}

void op_task_words_destroy(device* dev, task_words* w) {
    if (!w) return;
    gpu_device_state* d = state_of(dev);
    std::lock_guard lk(d->mu);
    // Recycled, never freed before the device: a kernel of a finished launch may still be
    // reading the flag. A second destroy of the same words (a caller's bug) is ignored.
    if (d->words.erase(w)) {
        w->~task_words();
        d->free_cells.push_back(reinterpret_cast<std::byte*>(w));
    }
}

const device_ops gpu_ops = {
    op_destroy,
    op_caps,
    op_alloc,
    op_free,
    op_register_host,
    op_unregister_host,
    op_copy_to_device,
    op_copy_to_host,
    op_stream_create,
    op_stream_destroy,
    op_launch,
    op_queued,
    op_synchronize,
    op_event_create,
    op_event_destroy,
    op_event_record,
    op_event_query,
    op_event_synchronize,
    op_task_words_create,
    op_task_words_destroy,
    op_task_flag_set,
    nullptr,  // launch_padded: not on GPUs yet
    nullptr,  // padding_stats
};

std::unique_ptr<device> make_device(const gpu_device_options& options) {
    const std::string none = std::string("no ") + RL_GPU_RUNTIME_NAME + " device: ";
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw no_device_error(none + runtime_error_text(e));
    }
    if (n <= 0) throw no_device_error(none + "the runtime found none");
    if (options.ordinal < 0 || options.ordinal >= n)
        throw no_device_error(none + "ordinal " + std::to_string(options.ordinal) + " of " + std::to_string(n));
    e = cudaSetDevice(options.ordinal);
    if (e != cudaSuccess) throw no_device_error(none + runtime_error_text(e));
    cudaDeviceProp prop{};
    e = cudaGetDeviceProperties(&prop, options.ordinal);
    if (e != cudaSuccess) throw no_device_error(none + runtime_error_text(e));
    int least = 0, greatest = 0;
    e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e != cudaSuccess) fail("stream priority range", e);

    auto* d = new gpu_device_state;
    d->options = options;
    d->ordinal = options.ordinal;
    d->least_priority = least;
    d->greatest_priority = greatest;
    d->caps.name = prop.name;
    d->caps.compute_units = uint32_t(prop.multiProcessorCount);
    d->caps.max_queue_depth = std::max<uint32_t>(1, options.queue_depth);
    d->caps.lowest_priority = least;
    d->caps.highest_priority = greatest;
    d->caps.gpu = true;
    void* values = nullptr;
    e = cudaHostAlloc(&values, 128, cudaHostAllocPortable);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&d->flag_stream, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&d->flag_written, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        (void)cudaFreeHost(values);
        delete d;
        fail("preemption flag stream", e);
    }
    d->flag_values = static_cast<uint32_t*>(values);
    std::memset(values, 0, 128);
    d->flag_values[16] = 1;
    return std::make_unique<device>(&gpu_ops, d);
}

}  // namespace

const char* gpu_backend_name() { return kBackend; }

std::unique_ptr<device> make_gpu_device(const gpu_device_options& options) { return make_device(options); }

#if defined(RL_GPU_HIP)
std::unique_ptr<device> make_hip_device(const gpu_device_options& options) { return make_device(options); }
std::unique_ptr<device> make_hip_device(int ordinal) {
    gpu_device_options o;
    o.ordinal = ordinal;
    return make_device(o);
}
#else
std::unique_ptr<device> make_cuda_device(const gpu_device_options& options) { return make_device(options); }
std::unique_ptr<device> make_cuda_device(int ordinal) {
    gpu_device_options o;
    o.ordinal = ordinal;
    return make_device(o);
}
#endif

bool gpu_device_stats_of(const device& dv, gpu_device_stats& out) {
    if (&dv.ops() != &gpu_ops) return false;
    gpu_device_state* d = state_of(&dv);
    std::lock_guard lk(d->mu);
    out.launches = d->launches.load();
    out.pool_hits = d->pool_hits;
    out.pool_misses = d->pool_misses;
    out.pool_cached_bytes = d->cached_bytes;
    out.device_bytes_in_use = d->live_bytes;
    out.registered_ranges = uint32_t(d->registered.size());
    return true;
}

}  // namespace reefline::gpu
