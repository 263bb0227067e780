// The cuda and hip device backends: preempt/device.h's table of functions on the CUDA or HIP
// runtime. One source for both: preempt/gpu_vendor.h maps the CUDA names to HIP's when
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
// Preemption levels (raise_levels): their epochs live in one line of device memory that kernels
// read at every check, beside a pinned host line that is the host's view (level_epoch) and the
// source of the copy path. A raise advances the host words and delivers the line on the flag
// stream (highest priority), in the order of the raises (level_mu): by cuStreamWriteValue32
// (hipStreamWriteValue32), a write the stream's front end makes without a copy engine or an SM
// (gpu_level_path::write_value, where the driver has it), or by a copy of the line. Kernels stop
// a launch only when the device's epoch is newer than the launch's (epoch_passed), so a launch
// made after a raise never waits for the raise to land, and nothing is ever lowered.
//
// Streams are non-blocking CUDA streams with priorities (the scheduler gives its RT stream
// caps().highest_priority, the runtime's greatest priority). Each has a launch counter in
// device memory, which the launches use to find their last block (preempt/gpu_kernels.h), and
// a finished word that the last block of every launch sets to the launch's sequence number:
// queued() and the bounded device queue (launch() blocks while queue_depth launches are
// outstanding) read it instead of querying events per launch.
//
// Kernels come from the registry (preempt/gpu_kernels.h) by name (kernel_info::name), resolved
// once per kernel_info; a kernel without a GPU implementation makes launch() throw, and the
// scheduler fails that task.
//
// Padded launches (DKP, launch_padded): one launch of the kernel library's DKP kernel with the
// RT launch and its pads as parts (gpu_kernels.h says what it does on the GPU). The parts are
// staged in a pinned ring and copied, in stream order, to device memory the kernel reads; each
// stream keeps the launch's work words in device memory. A pad's task counts it in its `pads`
// word from launch_padded until the DKP launch has ended: a host function on a stream of its
// own (after an event, so the RT stream never waits for it) takes it off. On the GPU, "another
// pad of the task is running" is a device word beside the task's flag twin, which the DKP
// kernel takes and releases; the host's pads_running stays 0.
//
// Spatial shares (stream_set_units): a reefline stream has its home vendor stream (unbound) and
// keeps up to kMaxUnitStreams vendor streams for unit sets it was bound to, made by
// open_unit_stream: on HIP a CU-mask stream (hipExtStreamCreateWithCUMask), exactly the units
// asked; under the SIMT emulation its counterpart (simt_emu.h); on CUDA a stream in a green
// context, which partitions the SMs by count, not by SM id (see open_unit_stream). Launches go
// to the stream's current vendor stream; a change of it records an event on the old one that the
// new one waits for, so launches stay in order across the change, never overlap (the stream's
// launch counter stays valid), and the stream's finished word, sequence numbers, task words and
// flag twins work whichever vendor stream ran a launch. Where no such stream can be made (CUDA
// without green contexts: a driver older than 12.5, or an error) the stream runs unbound and
// the device counts it (gpu_device_stats::units_fallbacks); MPS-style limits
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, per process) are not a per-stream mechanism and not used.
// Padded launches on a bound stream are plain launches: the DKP kernel splits every SM of the
// device by SM id, which a bound stream's SMs would contradict (the scheduler pads only on its
// RT stream, which it never binds).
#include "preempt/gpu_device.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "preempt/gpu_kernels.h"
#include "preempt/gpu_vendor.h"

namespace reefline::gpu {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "kernels read and write the task words as plain 32-bit words");
static_assert(offsetof(task_words, preempt) == 0 && offsetof(task_words, completed) == 4,
              "the kernel library reads the flag at word 0 and writes the counter at word 1");
static_assert(sizeof(task_words) <= 64, "task words fit a cell");

#if defined(RL_GPU_HIP)
constexpr const char* kBackend = "hip";
#else
constexpr const char* kBackend = "cuda";
#endif

constexpr size_t kCell = 64;               // one task_words, or one stream's finished word
constexpr size_t kSlabBytes = 64 * 1024;   // host-mapped cells per cudaHostAlloc
constexpr size_t kMaxSlabs = 1024;
constexpr uint32_t kOwnerRunningWord = 2;  // in a cell's flag twin: DKP pads of the task running
constexpr uint32_t kFlagValueBytes = 256;  // pinned: a 0 cell, a 1 cell, the levels' host line
constexpr uint32_t kLevelWords = 32;       // the levels' host line, in flag_values

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

std::string runtime_error_text(cudaError_t e) { return cudaGetErrorString(e); }

// The hardware work queues the runtime spreads streams over: its variable's value (make_device
// sets it unless the user did), else the driver's default; 0 on the emulation.
uint32_t hardware_queues_in_effect() {
#if defined(RL_GPU_HIP)
    const char* name = "GPU_MAX_HW_QUEUES";
    const uint32_t fallback = 4;
#elif defined(REEFLINE_SIMT_EMU) && REEFLINE_SIMT_EMU
    const char* name = nullptr;
    const uint32_t fallback = 0;
#else
    const char* name = "CUDA_DEVICE_MAX_CONNECTIONS";
    const uint32_t fallback = 8;
#endif
    const char* v = name ? std::getenv(name) : nullptr;
    if (!v) return fallback;
    char* end = nullptr;
    const unsigned long n = std::strtoul(v, &end, 10);
    return end != v && *end == '\0' && n > 0 && n <= 1024 ? uint32_t(n) : fallback;
}

[[noreturn]] void fail(const std::string& what, cudaError_t e) {
    throw std::runtime_error(std::string(kBackend) + " device: " + what + ": " + runtime_error_text(e));
}

constexpr uint32_t kMaxUnitStreams = 8;  // vendor streams a stream keeps for unit sets
constexpr size_t kMaxFailedSets = 64;     // unit sets remembered as unbindable

#if defined(RL_GPU_GREEN_CONTEXTS)
// A green context on a union of the device's SM slices (see green_ready), shared by every
// stream bound to a set that maps to those slices, destroyed with the last of their streams.
struct green_partition {
    uint64_t slices = 0;       // bit k: slice k
    CUgreenCtx ctx = nullptr;  // null: making it failed (kept, so that it is not tried again)
    uint32_t refs = 0;
    std::string why;           // why it failed
};
#endif

// A vendor stream whose launches run on a set of compute units (stream_set_units).
struct unit_stream {
    uint64_t units = 0;        // the set (bit u: unit u), as the caller asked
    cudaStream_t s = nullptr;
    uint64_t last_used = 0;    // when it last became the stream's current one (LRU)
#if defined(RL_GPU_GREEN_CONTEXTS)
    green_partition* partition = nullptr;
#endif
};

struct gpu_stream {
    cudaStream_t s = nullptr;              // home: the unbound vendor stream
    int priority = 0;
    std::mutex producer;                   // serialises launches, event records and unit changes on it
    // Spatial shares (producer held to change them): the vendor stream launches go to (`s`, or
    // one of unit_streams), the unit set (~0: every unit), the streams kept for unit sets, a
    // count of their uses (LRU), the event that orders a new current stream after the old one,
    // and synchronize() calls that read `cur` without the lock (a stream they may wait on is
    // not destroyed meanwhile).
    std::atomic<cudaStream_t> cur{nullptr};
    std::atomic<uint64_t> units{~uint64_t{0}};
    std::vector<unit_stream> unit_streams;
    uint64_t unit_uses = 0;
    cudaEvent_t handoff = nullptr;
    std::atomic<uint32_t> waiters{0};
    std::atomic<uint32_t> submitted{0};    // sequence number of the last launch submitted
    uint32_t* counter = nullptr;           // device memory: {blocks finished, flagged}
    std::atomic<uint32_t>* done = nullptr; // host-mapped: sequence of the last finished launch
    uint32_t* done_dev = nullptr;          // its device address
    // DKP, made at the stream's first padded launch (producer held): the launch's work words
    // and parts (device memory), the pinned ring the parts are staged in (an entry is reused
    // after queue_depth + 1 launches, when the copy that read it has long run), and the event
    // the pads' release waits for.
    gpu_pad_work* pad_work = nullptr;
    gpu_padded_params* pad_params = nullptr;
    gpu_padded_params* pad_staging = nullptr;
    uint32_t pad_staging_n = 0;
    cudaEvent_t pad_ended = nullptr;
};

struct gpu_event {
    cudaEvent_t e = nullptr;
};

struct mapped_slab {
    std::byte* host = nullptr;
    std::byte* dev = nullptr;    // the host cells' device address
    std::byte* flags = nullptr;  // device memory: the flag twins, at the cells' offsets
};

// A kernel as this device launches it: its registry entry and its occupancy for the device's
// launch flags (0: unknown).
struct resolved_kernel {
    const gpu_kernel_entry* entry = nullptr;
    uint32_t blocks_per_unit = 0;
};

struct gpu_device_state {
    gpu_device_options options;
    int ordinal = 0;
    device_caps caps;
    int least_priority = 0, greatest_priority = 0;
    uint32_t hardware_queues = 0;  // make_device: hardware_queues_in_effect()

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
    // Preemption levels: the device line kernels read, the host line (pinned, in flag_values at
    // kLevelWords), how raises reach the device, and the order they are queued in.
    uint32_t* level_dev = nullptr;
    uint32_t* level_host = nullptr;
    gpu_level_path level_path = gpu_level_path::copy;
    std::mutex level_mu;
    // The relay path: the host-mapped line raises store to (words 0..3) and its stop word (word
    // 16, a cache line apart), their device addresses, and the relay kernel's stream.
    uint32_t* relay_line = nullptr;
    const uint32_t* relay_line_dev = nullptr;
    cudaStream_t relay_stream = nullptr;
#if defined(RL_GPU_GREEN_CONTEXTS)
    PFN_cuStreamWriteValue32_v11070 write_value32 = nullptr;
#endif
    std::atomic<uint64_t> level_raises{0};

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
    std::mutex launchers_mu;  // the kernel cache alone: launches do not wait for allocations
    std::unordered_map<const kernel_info*, resolved_kernel> launchers;
    uint64_t pool_hits = 0, pool_misses = 0;
    std::atomic<uint64_t> launches{0};

    // DKP: the kernel library's padded launcher (null: launch_padded launches plainly), the
    // device's totals (device memory), the stream the pads' releases run on, host counts.
    const gpu_padded_library* padded = nullptr;
    gpu_pad_totals* pad_totals = nullptr;
    cudaStream_t pad_release_stream = nullptr;
    std::atomic<uint64_t> padded_launches{0}, pads_accepted{0};

    // Spatial shares: counts (gpu_device_stats), and on CUDA the green contexts' driver
    // functions and partitions (units_mu, taken after a stream's producer).
    std::atomic<uint64_t> units_binds{0}, units_fallbacks{0}, unit_switches{0}, unit_streams_made{0};
    std::atomic<uint32_t> unit_streams_live{0};
    std::atomic<bool> units_fallback_reported{false};
    std::mutex units_mu;
    // Sets the runtime could not bind, with why (units_mu; at most kMaxFailedSets, oldest out):
    // unit_grant_of reports them unbound.
    std::vector<std::pair<uint64_t, std::string>> failed_sets;
#if defined(RL_GPU_GREEN_CONTEXTS)
    struct {
        PFN_cuDeviceGet_v2000 device_get = nullptr;
        PFN_cuDeviceGetDevResource_v12040 get_resource = nullptr;
        PFN_cuDevSmResourceSplitByCount_v12040 split = nullptr;
        PFN_cuDevResourceGenerateDesc_v12040 generate_desc = nullptr;
        PFN_cuGreenCtxCreate_v12040 create = nullptr;
        PFN_cuGreenCtxDestroy_v12040 destroy = nullptr;
        PFN_cuGreenCtxStreamCreate_v12050 stream_create = nullptr;
        PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
    } green;
    int green_state = 0;  // 0: not tried yet, 1: usable, -1: unavailable (green_why)
    std::string green_why;
    CUdevice cu_device = 0;
    CUdevResource sm_all{};  // every SM of the device
    // The device's SMs split once into disjoint slices of slice_sms each (the SMs left over,
    // fewer than a slice, are in none): every partition is a union of slices, so partitions
    // made of different slices share no SM, whatever order the driver hands SMs out in.
    std::vector<CUdevResource> slices;
    uint32_t slice_sms = 0;
    std::vector<std::unique_ptr<green_partition>> partitions;
#endif
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

// ---- spatial shares: vendor streams for unit sets ------------------------------------------

enum class unit_open {
    made,          // `out` holds a vendor stream for the set
    whole_device,  // the set amounts to every unit here: the home stream serves it
    unavailable,   // the runtime cannot bind this stream (`why`): it runs unbound
};

#if defined(RL_GPU_GREEN_CONTEXTS)
// Resolves the green contexts' driver functions and the device's SM resource, once (units_mu
// held). False, with the reason in green_why, where the driver lacks them.
bool green_ready(gpu_device_state* d) {
    if (d->green_state != 0) return d->green_state > 0;
    d->green_state = -1;
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess || driver < 12050) {
        (void)cudaGetLastError();
        d->green_why = "the driver (CUDA " + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) +
                       ") has no green-context streams (12.5+)";
        return false;
    }
    auto get = [&](const char* name, auto& fn, unsigned version) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !p) {
            (void)cudaGetLastError();
            if (d->green_why.empty()) d->green_why = std::string("the driver has no ") + name;
            return false;
        }
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        return true;
    };
    auto& g = d->green;
    if (!(get("cuDeviceGet", g.device_get, 2000) & get("cuDeviceGetDevResource", g.get_resource, 12040) &
          get("cuDevSmResourceSplitByCount", g.split, 12040) &
          get("cuDevResourceGenerateDesc", g.generate_desc, 12040) & get("cuGreenCtxCreate", g.create, 12040) &
          get("cuGreenCtxDestroy", g.destroy, 12040) & get("cuGreenCtxStreamCreate", g.stream_create, 12050) &
          get("cuStreamDestroy", g.stream_destroy, 4000)))
        return false;
    CUresult r = g.device_get(&d->cu_device, d->ordinal);
    if (r == CUDA_SUCCESS) r = g.get_resource(d->cu_device, &d->sm_all, CU_DEV_RESOURCE_TYPE_SM);
    if (r != CUDA_SUCCESS || d->sm_all.sm.smCount == 0) {
        d->green_why = "the device's SM resource: driver error " + std::to_string(int(r));
        return false;
    }
    // Slices of the architecture's step (smCoscheduledAlignment; 8 SMs on Hopper), at least the
    // smallest partition it makes (minSmPartitionSize).
    const CUdevSmResource& sm = d->sm_all.sm;
    const uint32_t step = std::max(1u, sm.smCoscheduledAlignment);
    d->slice_sms = (std::max(step, sm.minSmPartitionSize) + step - 1) / step * step;
    unsigned n = std::min<unsigned>(64, sm.smCount / d->slice_sms);
    if (n < 2) {
        d->green_why = "the device's " + std::to_string(sm.smCount) + " SMs make fewer than two partitions of " +
                       std::to_string(d->slice_sms);
        return false;
    }
    d->slices.assign(n, CUdevResource{});
    CUdevResource rest{};
    r = g.split(d->slices.data(), &n, &d->sm_all, &rest, 0, d->slice_sms);
    if (r != CUDA_SUCCESS || n < 2) {
        d->green_why = "splitting the device's SMs into slices of " + std::to_string(d->slice_sms) + ": " +
                       (r != CUDA_SUCCESS ? "driver error " + std::to_string(int(r)) : std::string("one slice"));
        return false;
    }
    d->slices.resize(n);
    d->green_state = 1;
    return true;
}

// The slices a unit set runs on (green_ready done): slice k when the set holds the unit of the
// slice's middle SM, so that disjoint sets get disjoint slices. A set too small to hold any
// middle gets the one slice holding most of its SMs (`shared`: it may share it with the set
// beside it).
uint64_t slices_of_set(const gpu_device_state* d, uint64_t units, bool& shared) {
    shared = false;
    const uint32_t group = unit_group(d->caps.compute_units), n = uint32_t(d->slices.size());
    const auto holds = [&](uint32_t sm) { return sm / group < 64 && (units >> (sm / group) & 1); };
    uint64_t out = 0;
    for (uint32_t k = 0; k < n; ++k)
        if (holds(k * d->slice_sms + d->slice_sms / 2)) out |= uint64_t{1} << k;
    if (out) return out;
    uint32_t best = 0, most = 0;
    for (uint32_t k = 0; k < n; ++k) {
        uint32_t in = 0;
        for (uint32_t sm = k * d->slice_sms; sm < (k + 1) * d->slice_sms; ++sm) in += holds(sm);
        if (in > most) most = in, best = k;
    }
    shared = true;
    return uint64_t{1} << best;
}

// "SM slices 2-3 of 16 (8 SMs each)": where a partition is, for operators.
std::string slices_text(const gpu_device_state* d, uint64_t slices) {
    std::string s;
    for (uint32_t k = 0; k < 64;) {
        if (!(slices >> k & 1)) {
            ++k;
            continue;
        }
        uint32_t e = k;
        while (e + 1 < 64 && (slices >> (e + 1) & 1)) ++e;
        s += (s.empty() ? "" : ",") + std::to_string(k) + (e > k ? "-" + std::to_string(e) : "");
        k = e + 1;
    }
    return "SM slice" + std::string(std::popcount(slices) > 1 ? "s " : " ") + s + " of " +
           std::to_string(d->slices.size()) + " (" + std::to_string(d->slice_sms) + " SMs each)";
}

// The green context of a union of slices (units_mu held): made at its first use. A failed one
// is kept (ctx null) and not tried again.
green_partition* green_partition_for(gpu_device_state* d, uint64_t slices) {
    for (auto& p : d->partitions)
        if (p->slices == slices) return p.get();
    auto p = std::make_unique<green_partition>();
    p->slices = slices;
    auto& g = d->green;
    std::vector<CUdevResource> parts;
    for (uint32_t k = 0; k < d->slices.size(); ++k)
        if (slices >> k & 1) parts.push_back(d->slices[k]);
    CUdevResourceDesc desc = nullptr;
    CUresult r = g.generate_desc(&desc, parts.data(), unsigned(parts.size()));
    if (r == CUDA_SUCCESS) r = g.create(&p->ctx, desc, d->cu_device, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r != CUDA_SUCCESS) {
        p->ctx = nullptr;
        p->why = "a green context on " + slices_text(d, slices) + ": driver error " + std::to_string(int(r));
    }
    d->partitions.push_back(std::move(p));
    return d->partitions.back().get();
}
#endif

// Makes a vendor stream whose launches run on `units` (a proper, non-empty subset of the
// device's units, as bits), with the stream's priority where the runtime takes one.
// - HIP: a CU-mask stream, exactly the CUs of the set (each bit a group of CUs past 64: unit_group).
// - SIMT emulation: its counterpart (simt_emu.h), exactly these emulated units.
// - CUDA: a stream in a green context. Green contexts partition by SM count in steps of the
//   architecture's granularity (8 SMs on Hopper) and the driver does not say which SMs a split
//   gives, so the device is split once into disjoint slices of that step (green_ready) and a set
//   runs on the union of the slices whose middle SM it holds (slices_of_set): sets placed side
//   by side (the IF manager's placement) get partitions that share no SM. Blocks do not run on
//   the SM ids of the mask. A set holding every slice is unbound.
unit_open open_unit_stream(gpu_device_state* d, int priority, uint64_t units, unit_stream& out, std::string& why) {
    out = unit_stream{};
    out.units = units;
#if defined(RL_GPU_CU_MASK_STREAM)
    (void)priority;  // a CU-mask stream has the default priority
    const uint32_t n = d->caps.compute_units, group = unit_group(n);
    std::vector<uint32_t> mask((n + 31) / 32, 0u);
    for (uint32_t u = 0; u < n; ++u)
        if (units >> (u / group) & 1) mask[u / 32] |= 1u << (u % 32);
    const cudaError_t e = RL_GPU_CU_MASK_STREAM(&out.s, uint32_t(mask.size()), mask.data());
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        out.s = nullptr;
        why = "a stream with a unit mask: " + runtime_error_text(e);
        return unit_open::unavailable;
    }
    return unit_open::made;
#elif defined(RL_GPU_GREEN_CONTEXTS)
    std::lock_guard lk(d->units_mu);
    if (!green_ready(d)) {
        why = d->green_why;
        return unit_open::unavailable;
    }
    bool shared = false;
    const uint64_t slices = slices_of_set(d, units, shared);
    if (std::popcount(slices) >= int(d->slices.size())) return unit_open::whole_device;
    green_partition* p = green_partition_for(d, slices);
    if (!p->ctx) {
        why = p->why;
        return unit_open::unavailable;
    }
    CUstream cs = nullptr;
    const CUresult r = d->green.stream_create(&cs, p->ctx, CU_STREAM_NON_BLOCKING, priority);
    if (r != CUDA_SUCCESS) {
        why = "a stream in a green context: driver error " + std::to_string(int(r));
        return unit_open::unavailable;
    }
    ++p->refs;
    out.s = reinterpret_cast<cudaStream_t>(cs);
    out.partition = p;
    return unit_open::made;
#else
    (void)d, (void)priority, (void)units;
    why = "this runtime has no per-stream unit sets";
    return unit_open::unavailable;
#endif
}

// Destroys a stream made by open_unit_stream (idle, or its work is not waited for).
void close_unit_stream(gpu_device_state* d, unit_stream& u) {
#if defined(RL_GPU_GREEN_CONTEXTS)
    std::lock_guard lk(d->units_mu);
    (void)d->green.stream_destroy(reinterpret_cast<CUstream>(u.s));
    if (u.partition && --u.partition->refs == 0) {
        (void)d->green.destroy(u.partition->ctx);
        std::erase_if(d->partitions, [&](const auto& p) { return p.get() == u.partition; });
    }
#else
    (void)d;
    (void)cudaStreamDestroy(u.s);
#endif
    u.s = nullptr;
    d->unit_streams_live.fetch_sub(1, std::memory_order_relaxed);
}

// What a set gets (device_ops::unit_grant_of): exact units on HIP and the emulation, a count
// of SMs in named slices on CUDA, unbound where binding failed or cannot be done.
unit_grant op_unit_grant_of(device* dev, uint64_t units) {
    gpu_device_state* d = state_of(dev);
    unit_grant g;
    const uint64_t all = every_unit_set(d->caps.compute_units);
    units &= all;
    if (units == 0 || units == all) {
        g.note = "every unit: the set is the whole device";
        return g;
    }
    std::lock_guard lk(d->units_mu);
    for (const auto& [set, why] : d->failed_sets)
        if (set == units) {
            g.note = why;
            return g;
        }
#if defined(RL_GPU_GREEN_CONTEXTS)
    bind(d);
    if (!green_ready(d)) {
        g.note = d->green_why;
        return g;
    }
    bool shared = false;
    const uint64_t slices = slices_of_set(d, units, shared);
    if (std::popcount(slices) >= int(d->slices.size())) {
        g.note = "every SM slice: the set runs unbound";
        return g;
    }
    g.bound = true;
    g.count = uint32_t(std::popcount(slices)) * d->slice_sms;
    g.note = slices_text(d, slices);
    if (shared) g.note += ", shared: the set is smaller than a slice";
#else
    g.bound = true;
    g.exact = true;
    g.units = units_in_set(units, d->caps.compute_units);
    g.count = uint32_t(g.units.size());
#if defined(RL_GPU_EMU)
    g.note = "emulated units";
#else
    g.note = "a CU mask";
#endif
#endif
    return g;
}

unit_shares_info op_unit_shares(device* dev) {
    gpu_device_state* d = state_of(dev);
    unit_shares_info i;
    i.binds = d->units_binds.load(std::memory_order_relaxed);
    i.fallbacks = d->units_fallbacks.load(std::memory_order_relaxed);
    std::lock_guard lk(d->units_mu);
#if defined(RL_GPU_GREEN_CONTEXTS)
    i.mechanism = "green_contexts";
    bind(d);
    i.usable = green_ready(d);
    if (i.usable) i.step = d->slice_sms;
    else i.why = d->green_why;
    for (const auto& p : d->partitions) i.partitions += p->ctx != nullptr;
#else
#if defined(RL_GPU_EMU)
    i.mechanism = "emulated_units";
#else
    i.mechanism = "cu_masks";
#endif
    i.usable = d->caps.compute_units > 1;
    if (!i.usable) i.why = "one compute unit";
#endif
    return i;
}

// ---- device_ops ---------------------------------------------------------------------------

// A stream's runtime objects and device memory (its finished word is a cell, recycled apart).
void free_stream(gpu_device_state* d, gpu_stream* s) {
    // A bound stream's last launches may be on a unit stream: the current one is the tail of
    // the chain of handoffs, so once it is idle every vendor stream of this one is.
    if (!s->unit_streams.empty()) (void)cudaStreamSynchronize(s->cur.load());
    for (unit_stream& u : s->unit_streams) close_unit_stream(d, u);
    s->unit_streams.clear();
    if (s->handoff) (void)cudaEventDestroy(s->handoff);
    (void)cudaStreamDestroy(s->s);
    (void)cudaFree(s->counter);
    if (s->pad_ended) (void)cudaEventDestroy(s->pad_ended);
    (void)cudaFree(s->pad_work);
    (void)cudaFree(s->pad_params);
    if (s->pad_staging) (void)cudaFreeHost(s->pad_staging);
}

// Ends the relay kernel (its stop word) and waits for it: everything else on the device may
// then be waited for.
void stop_relay(gpu_device_state* d) {
    if (!d->relay_stream) return;
    std::atomic_ref<uint32_t>(d->relay_line[16]).store(1, std::memory_order_seq_cst);
    (void)cudaStreamSynchronize(d->relay_stream);
    (void)cudaStreamDestroy(d->relay_stream);
    d->relay_stream = nullptr;
}

void op_destroy(device* dev) {
    gpu_device_state* d = state_of(dev);
    bind(d);
    stop_relay(d);
    (void)cudaDeviceSynchronize();
    {
        std::lock_guard lk(d->mu);
        for (gpu_event* e : d->events) {
            (void)cudaEventDestroy(e->e);
            delete e;
        }
        for (gpu_stream* s : d->streams) {
            free_stream(d, s);
            delete s;
        }
        if (d->pad_release_stream) (void)cudaStreamDestroy(d->pad_release_stream);
        (void)cudaFree(d->pad_totals);
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
        (void)cudaFree(d->level_dev);
        if (d->relay_line) (void)cudaFreeHost(d->relay_line);
    }
    delete d;
}

device_caps op_caps(const device* dev) {
    device_caps c = state_of(dev)->caps;
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        c.memory_free_bytes = free;
        c.memory_total_bytes = total;
    }
    return c;
}

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
    s->cur.store(s->s, std::memory_order_relaxed);
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
    gpu_stream* s = as_gpu(st);
    // The current vendor stream, read without the producer lock (a launch blocked on a full
    // queue holds it): counted first, so a change of units does not destroy it meanwhile.
    s->waiters.fetch_add(1, std::memory_order_seq_cst);
    const cudaError_t e = cudaStreamSynchronize(s->cur.load(std::memory_order_seq_cst));
    s->waiters.fetch_sub(1, std::memory_order_seq_cst);
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
    free_stream(d, s);
    d->free_cells.push_back(reinterpret_cast<std::byte*>(s->done));
    delete s;
}

uint32_t launch_flags(const gpu_device_state* d) {
    return d->options.math == gpu_math::tensor_f16    ? gpu_tensor_f16
           : d->options.math == gpu_math::tensor_bf16 ? gpu_tensor_bf16
                                                      : 0u;
}

// The kernel's registry entry and occupancy, resolved once per kernel_info (a miss is not
// cached: a test may register the kernel later).
resolved_kernel resolve(gpu_device_state* d, const kernel_info* k) {
    std::lock_guard lk(d->launchers_mu);
    auto it = d->launchers.find(k);
    if (it != d->launchers.end()) return it->second;
    resolved_kernel r;
    r.entry = find_gpu_kernel(k->name);
    if (!r.entry) return r;
    kernel_resources res;
    if (r.entry->resources && r.entry->resources(launch_flags(d), res)) r.blocks_per_unit = res.blocks_per_unit;
    d->launchers.emplace(k, r);
    return r;
}

uint32_t finished(const gpu_stream* s) { return s->done->load(std::memory_order_acquire); }

// What launch() checks of a launch before it queues anything; the kernel's entry.
resolved_kernel check_launch(gpu_device_state* d, const launch& l) {
    if (!l.kernel) throw std::invalid_argument(std::string(kBackend) + " device: launch without a kernel");
    const char* name = l.kernel->name ? l.kernel->name : "?";
    if (l.block_offset > l.grid || l.block_count > l.grid - l.block_offset)
        throw std::invalid_argument(std::string(kBackend) + " device: block slice outside the grid of " + name);
    if (l.args_size != 0 && !l.args)
        throw std::invalid_argument(std::string(kBackend) + " device: args_size without args");
    if (l.level >= preempt_levels) throw std::invalid_argument(std::string(kBackend) + " device: preemption level out of range");
    const resolved_kernel r = resolve(d, l.kernel);
    if (!r.entry)
        throw std::runtime_error(std::string(kBackend) + " device: kernel '" + name +
                                 "' has no GPU implementation in the kernel library");
    if (l.task && (!cell_device_address(d, l.task) || !cell_flag_address(d, l.task)))
        throw std::invalid_argument(std::string(kBackend) +
                                    " device: task words not made by this device (task_words_create)");
    return r;
}

// Whether every launch queued on the stream has ended (s->producer held). The current vendor
// stream waits for the ones before it; the others of a stream that changed units are asked too,
// so that the verdict does not rest on how a runtime counts a pending wait.
cudaError_t query_stream(gpu_stream* s) {
    const cudaStream_t cur = s->cur.load(std::memory_order_relaxed);
    cudaError_t e = cudaStreamQuery(cur);
    if (e != cudaSuccess || s->unit_streams.empty()) return e;
    if (s->s != cur && (e = cudaStreamQuery(s->s)) != cudaSuccess) return e;
    for (const unit_stream& u : s->unit_streams)
        if (u.s != cur && (e = cudaStreamQuery(u.s)) != cudaSuccess) return e;
    return cudaSuccess;
}

// With s->producer held: waits while queue_depth launches are outstanding (their last blocks
// advance the finished word; a stream that went idle without it, a device fault, or failed
// ends the wait with an error), then orders the stream after the latest flag write when the
// task is preempted (a launch of a preempted task must see the raise, even one made before the
// copy landed). Returns the launch's sequence number.
uint32_t begin_launch(gpu_device_state* d, gpu_stream* s, const task_words* task) {
    const uint32_t depth = std::max<uint32_t>(1, d->options.queue_depth);
    const uint32_t seq = s->submitted.load(std::memory_order_relaxed);
    if (seq - finished(s) >= depth) {
        const auto t0 = std::chrono::steady_clock::now();
        for (uint32_t i = 1; seq - finished(s) >= depth; ++i) {
            if ((i & 255) != 0) {
                cpu_relax();
                continue;
            }
            const cudaError_t e = query_stream(s);
            if (e != cudaSuccess && e != cudaErrorNotReady) fail("waiting for the device queue", e);
            if (e == cudaSuccess && seq - finished(s) >= depth)
                throw std::runtime_error(std::string(kBackend) + " device: stream idle with launches unaccounted");
            if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(200))
                std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
    if (task && task->preempt.load(std::memory_order_acquire) != 0) {
        std::lock_guard flk(d->flag_mu);
        const cudaError_t e = cudaStreamWaitEvent(s->cur.load(std::memory_order_relaxed), d->flag_written, 0);
        if (e != cudaSuccess) fail("ordering a launch after its task's flag", e);
    }
    return seq + 1;
}

void op_launch(device* dev, stream* st, const launch& l) {
    gpu_device_state* d = state_of(dev);
    gpu_stream* s = as_gpu(st);
    if (!s) throw std::invalid_argument(std::string(kBackend) + " device: launch without a stream");
    bind(d);
    const resolved_kernel k = check_launch(d, l);

    std::lock_guard lk(s->producer);
    const uint32_t seq = begin_launch(d, s, l.task);
    gpu_launch_params p{};
    p.args = l.args;
    p.args_size = l.args_size;
    p.grid = l.grid;
    p.block_offset = l.block_offset;
    p.block_count = l.block_count;
    p.kernel_index = l.kernel_index;
    p.sequence = seq;
    p.flags = launch_flags(d);
    p.task = l.task ? cell_device_address(d, l.task) : nullptr;
    p.flag = l.task ? cell_flag_address(d, l.task) : nullptr;
    p.level = l.level ? d->level_dev + l.level : nullptr;
    p.epoch = l.epoch;
    p.counter = s->counter;
    p.stream_done = s->done_dev;
    p.stream = static_cast<void*>(s->cur.load(std::memory_order_relaxed));
    const int rc = k.entry->launch(p);
    if (rc != 0) {
        throw std::runtime_error(std::string(kBackend) + " device: launch of '" + l.kernel->name + "' (" +
                                 std::to_string(l.block_count) + " blocks) failed: " +
                                 runtime_error_text(static_cast<cudaError_t>(rc)));
    }
    s->submitted.store(seq, std::memory_order_release);
    d->launches.fetch_add(1, std::memory_order_relaxed);
}

// ---- spatial shares: stream_set_units ---------------------------------------------------------

// Destroys the least recently used unit streams past kMaxUnitStreams that are idle and not
// current (s->producer held); busy ones wait for a later change of units.
void trim_unit_streams(gpu_device_state* d, gpu_stream* s) {
    while (s->unit_streams.size() > kMaxUnitStreams) {
        if (s->waiters.load(std::memory_order_seq_cst) != 0) return;  // a synchronize may be on one
        const cudaStream_t cur = s->cur.load(std::memory_order_relaxed);
        size_t victim = s->unit_streams.size();
        for (size_t i = 0; i < s->unit_streams.size(); ++i) {
            const unit_stream& u = s->unit_streams[i];
            if (u.s == cur || (victim < s->unit_streams.size() && u.last_used >= s->unit_streams[victim].last_used))
                continue;
            const cudaError_t e = cudaStreamQuery(u.s);
            if (e == cudaSuccess) victim = i;
            else if (e != cudaErrorNotReady) (void)cudaGetLastError();
        }
        if (victim == s->unit_streams.size()) return;
        close_unit_stream(d, s->unit_streams[victim]);
        s->unit_streams.erase(s->unit_streams.begin() + std::ptrdiff_t(victim));
    }
}

void op_stream_set_units(device* dev, stream* st, uint64_t units) {
    gpu_device_state* d = state_of(dev);
    gpu_stream* s = as_gpu(st);
    if (!s) throw std::invalid_argument(std::string(kBackend) + " device: set_units without a stream");
    const uint64_t all = every_unit_set(d->caps.compute_units);
    units &= all;
    if (units == 0 || units == all) units = ~uint64_t{0};
    bind(d);
    std::lock_guard lk(s->producer);
    if (units == s->units.load(std::memory_order_relaxed)) return;
    cudaStream_t target = s->s;
    if (units != ~uint64_t{0}) {
        d->units_binds.fetch_add(1, std::memory_order_relaxed);
        unit_stream* u = nullptr;
        for (unit_stream& c : s->unit_streams)
            if (c.units == units) u = &c;
        if (!u) {
            unit_stream made;
            std::string why;
            switch (open_unit_stream(d, s->priority, units, made, why)) {
            case unit_open::made:
                s->unit_streams.push_back(made);
                u = &s->unit_streams.back();
                d->unit_streams_made.fetch_add(1, std::memory_order_relaxed);
                d->unit_streams_live.fetch_add(1, std::memory_order_relaxed);
                {
                    std::lock_guard ul(d->units_mu);
                    std::erase_if(d->failed_sets, [&](const auto& f) { return f.first == units; });
                }
                break;
            case unit_open::whole_device: break;
            case unit_open::unavailable:
                d->units_fallbacks.fetch_add(1, std::memory_order_relaxed);
                {
                    std::lock_guard ul(d->units_mu);
                    std::erase_if(d->failed_sets, [&](const auto& f) { return f.first == units; });
                    if (d->failed_sets.size() == kMaxFailedSets) d->failed_sets.erase(d->failed_sets.begin());
                    d->failed_sets.emplace_back(units, why);
                }
                if (!d->units_fallback_reported.exchange(true))
                    std::fprintf(stderr, "reefline %s device: streams bound to compute units run on every unit: %s\n",
                                 kBackend, why.c_str());
                break;
            }
        }
        if (u) {
            u->last_used = ++s->unit_uses;
            target = u->s;
        }
    }
    const cudaStream_t cur = s->cur.load(std::memory_order_relaxed);
    if (target != cur) {
        // Launches stay in order across the change: the new vendor stream starts after what the
        // old one holds (and so never overlaps it: the stream's launch counter stays valid).
        cudaError_t e = cudaSuccess;
        if (!s->handoff) e = cudaEventCreateWithFlags(&s->handoff, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(s->handoff, cur);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(target, s->handoff, 0);
        if (e != cudaSuccess) fail("ordering a stream's launches across a change of its units", e);
        s->cur.store(target, std::memory_order_seq_cst);
        d->unit_switches.fetch_add(1, std::memory_order_relaxed);
    }
    s->units.store(units, std::memory_order_relaxed);
    trim_unit_streams(d, s);
}

// ---- DKP -------------------------------------------------------------------------------------

// The pads' tasks of one padded launch, released (their `pads` words taken down) once it ended.
struct pad_release {
    task_words* owners[kMaxGpuPads] = {};
    uint32_t n = 0;
};

// A stream callback (cudaStreamAddCallback: the runtimes both have it; hipLaunchHostFunc is
// missing from HIP 5.2's library). It calls no runtime function, as callbacks must not.
void release_pads(cudaStream_t, cudaError_t, void* arg) {
    auto* r = static_cast<pad_release*>(arg);
    for (uint32_t i = 0; i < r->n; ++i) r->owners[i]->pads.fetch_sub(1, std::memory_order_acq_rel);
    delete r;
}

// A launch as a part of a padded launch; false when it cannot be one (its kernel has no DKP
// case or its arguments do not fit).
bool make_part(gpu_device_state* d, const launch& l, const resolved_kernel& k, gpu_pad_part& part) {
    if (k.entry->pad_kind < 0 || l.args_size > kGpuPadArgsBytes) return false;
    part.kind = k.entry->pad_kind;
    part.args_size = l.args_size;
    part.grid = l.grid;
    part.block_offset = l.block_offset;
    part.block_count = l.block_count;
    part.kernel_index = l.kernel_index;
    part.task = l.task ? cell_device_address(d, l.task) : nullptr;
    part.flag = l.task ? cell_flag_address(d, l.task) : nullptr;
    part.owner_running = l.task ? cell_flag_address(d, l.task) + kOwnerRunningWord : nullptr;
    std::memset(part.args, 0, sizeof part.args);
    if (l.args_size) std::memcpy(part.args, l.args, l.args_size);
    return true;
}

// The stream's DKP buffers, made at its first padded launch (s->producer held).
void pad_buffers(gpu_device_state* d, gpu_stream* s) {
    if (s->pad_work) return;
    const uint32_t n = std::max<uint32_t>(1, d->options.queue_depth) + 2;
    void* work = nullptr;
    void* params = nullptr;
    void* staging = nullptr;
    cudaError_t e = cudaMalloc(&work, sizeof(gpu_pad_work));
    if (e == cudaSuccess) e = cudaMemset(work, 0, sizeof(gpu_pad_work));
    if (e == cudaSuccess) e = cudaMalloc(&params, sizeof(gpu_padded_params));
    if (e == cudaSuccess) e = cudaHostAlloc(&staging, sizeof(gpu_padded_params) * n, cudaHostAllocPortable);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->pad_ended, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        (void)cudaFree(work);
        (void)cudaFree(params);
        if (staging) (void)cudaFreeHost(staging);
        s->pad_ended = nullptr;
        fail("DKP buffers of a stream", e);
    }
    s->pad_work = static_cast<gpu_pad_work*>(work);
    s->pad_params = static_cast<gpu_padded_params*>(params);
    s->pad_staging = static_cast<gpu_padded_params*>(staging);
    s->pad_staging_n = n;
}

void op_launch_padded(device* dev, stream* st, const launch& l, const launch* pads, uint32_t n_pads) {
    gpu_device_state* d = state_of(dev);
    gpu_stream* s = as_gpu(st);
    if (!s) throw std::invalid_argument(std::string(kBackend) + " device: launch without a stream");
    bind(d);
    const resolved_kernel rk = check_launch(d, l);
    for (uint32_t i = 0; i < n_pads; ++i) {
        check_launch(d, pads[i]);
        if (!pads[i].task) throw std::invalid_argument(std::string(kBackend) + " device: a pad without task words");
    }
    // A stream bound to units launches plainly: the DKP kernel splits every SM of the device
    // by SM id (RT units, then pads), which a bound stream's SMs would contradict.
    if (s->units.load(std::memory_order_relaxed) != ~uint64_t{0}) return op_launch(dev, st, l);
    // The parts. Pads the DKP kernel cannot hold (beyond kMaxGpuPads, kernels without a DKP
    // case) are dropped, as launch_padded allows; with none left, or an RT kernel that fills
    // every unit, this is a plain launch.
    auto params = std::make_unique<gpu_padded_params>();
    gpu_padded_params& p = *params;
    const uint32_t units = d->caps.compute_units;
    uint32_t occupancy = rk.blocks_per_unit ? rk.blocks_per_unit : 1;
    const bool paddable = d->padded && make_part(d, l, rk, p.rt);
    auto release = std::make_unique<pad_release>();
    for (uint32_t i = 0; paddable && i < n_pads && p.n_pads < kMaxGpuPads; ++i) {
        const resolved_kernel pk = resolve(d, pads[i].kernel);
        if (!make_part(d, pads[i], pk, p.pads[p.n_pads])) continue;
        occupancy = std::min(occupancy, pk.blocks_per_unit ? pk.blocks_per_unit : 1);
        release->owners[p.n_pads++] = pads[i].task;
    }
    release->n = p.n_pads;
    // The proxy: the highest level every part reaches (at least the lowest).
    uint32_t level = d->padded ? d->padded->levels[0] : 1;
    for (uint32_t i = 0; d->padded && i < d->padded->n_levels; ++i)
        if (d->padded->levels[i] <= occupancy) level = d->padded->levels[i];
    const uint32_t rt_blocks = std::max<uint32_t>(1, l.block_count);
    const uint32_t rt_units = std::min<uint64_t>(units, (uint64_t(rt_blocks) + level - 1) / level);
    if (!paddable || p.n_pads == 0 || rt_units >= units) return op_launch(dev, st, l);

    std::lock_guard lk(s->producer);
    const cudaStream_t vs = s->cur.load(std::memory_order_relaxed);
    pad_buffers(d, s);
    const uint32_t seq = begin_launch(d, s, l.task);
    p.units = units;
    p.rt_units = rt_units;
    p.level = level;
    p.flags = launch_flags(d);
    p.sequence = seq;
    p.stream_done = s->done_dev;
    p.work = s->pad_work;
    p.totals = d->pad_totals;
    p.stream = static_cast<void*>(vs);
    // Stage the parts and copy them where the kernel reads them, in stream order.
    gpu_padded_params* staged = s->pad_staging + seq % s->pad_staging_n;
    std::memcpy(static_cast<void*>(staged), &p, sizeof p);
    cudaError_t e = cudaMemcpyAsync(s->pad_params, staged, sizeof p, cudaMemcpyHostToDevice, vs);
    if (e != cudaSuccess) fail("copying the parts of a padded launch", e);
    for (uint32_t i = 0; i < release->n; ++i) release->owners[i]->pads.fetch_add(1, std::memory_order_acq_rel);
    const int rc = d->padded->launch(p, s->pad_params);
    if (rc != 0) {
        for (uint32_t i = 0; i < release->n; ++i) release->owners[i]->pads.fetch_sub(1, std::memory_order_acq_rel);
        throw std::runtime_error(std::string(kBackend) + " device: padded launch of '" + l.kernel->name + "' with " +
                                 std::to_string(p.n_pads) + " pads failed: " +
                                 runtime_error_text(static_cast<cudaError_t>(rc)));
    }
    s->submitted.store(seq, std::memory_order_release);
    d->launches.fetch_add(1, std::memory_order_relaxed);
    d->padded_launches.fetch_add(1, std::memory_order_relaxed);
    d->pads_accepted.fetch_add(p.n_pads, std::memory_order_relaxed);
    // The pads' tasks are released once the launch ended, on a stream of their own: the RT
    // stream's next launch does not wait for the host function. (If queueing it fails the
    // device is broken; the tasks keep their pads counted, so none restores into it.)
    e = cudaEventRecord(s->pad_ended, vs);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(d->pad_release_stream, s->pad_ended, 0);
    if (e == cudaSuccess) e = cudaStreamAddCallback(d->pad_release_stream, release_pads, release.get(), 0);
    if (e != cudaSuccess) fail("queueing the release of a padded launch's tasks", e);
    release.release();
}

device_ops::padding_counters op_padding_stats(const device* dev) {
    gpu_device_state* d = state_of(dev);
    device_ops::padding_counters c;
    c.padded_launches = d->padded_launches.load(std::memory_order_relaxed);
    c.pads = d->pads_accepted.load(std::memory_order_relaxed);
    if (d->pad_totals) {
        gpu_pad_totals t{};
        bind(d);
        if (cudaMemcpy(&t, d->pad_totals, sizeof t, cudaMemcpyDeviceToHost) == cudaSuccess) {
            c.pads_completed = t.pads_completed;
            c.pads_cut = t.pads_cut;
            c.pads_skipped = t.pads_skipped;
            c.pad_blocks = t.pad_blocks;
        } else {
            (void)cudaGetLastError();
        }
    }
    return c;
}

bool op_kernel_resources_of(device* dev, const kernel_info* k, kernel_resources& out) {
    gpu_device_state* d = state_of(dev);
    if (!k) return false;
    const resolved_kernel r = resolve(d, k);
    if (!r.entry || !r.entry->resources) return false;
    bind(d);
    return r.entry->resources(launch_flags(d), out);
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
    const cudaError_t e = cudaEventRecord(as_gpu(ev)->e, s->cur.load(std::memory_order_relaxed));
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

// ---- preemption levels ---------------------------------------------------------------------

// Starts the relay kernel on a stream of its own (level_dev made). False, with nothing left
// running, where the library has no relay or the runtime refuses one of its steps.
bool start_relay(gpu_device_state* d) {
    const gpu_level_relay_launch launch = find_gpu_level_relay();
    if (!launch) return false;
    void* line = nullptr;
    void* line_dev = nullptr;
    cudaError_t e = cudaHostAlloc(&line, 128, cudaHostAllocMapped | cudaHostAllocPortable | RL_HOST_COHERENT);
    if (e == cudaSuccess) {
        std::memset(line, 0, 128);
        e = cudaHostGetDevicePointer(&line_dev, line, 0);
    }
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&d->relay_stream, cudaStreamNonBlocking, d->greatest_priority);
    if (e == cudaSuccess) {
        gpu_level_relay_params p;
        p.mapped = static_cast<const uint32_t*>(line_dev);
        p.line = d->level_dev;
        p.words = preempt_levels;
        p.stop = static_cast<const uint32_t*>(line_dev) + 16;
        p.stream = d->relay_stream;
        e = cudaError_t(launch(p));
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (d->relay_stream) (void)cudaStreamDestroy(d->relay_stream);
        d->relay_stream = nullptr;
        if (line) (void)cudaFreeHost(line);
        return false;
    }
    d->relay_line = static_cast<uint32_t*>(line);
    d->relay_line_dev = static_cast<const uint32_t*>(line_dev);
    return true;
}

// The path asked for, or copy where it cannot be had (REEFLINE_LEVEL_PATH=copy|write_value
// overrides the options, for benchmarks that compare them on one build).
gpu_level_path choose_level_path(gpu_device_state* d, gpu_level_path want) {
    if (const char* env = std::getenv("REEFLINE_LEVEL_PATH")) {
        if (std::strcmp(env, "copy") == 0) want = gpu_level_path::copy;
        else if (std::strcmp(env, "write_value") == 0) want = gpu_level_path::write_value;
        else if (std::strcmp(env, "relay") == 0) want = gpu_level_path::relay;
    }
    if (want == gpu_level_path::relay) return start_relay(d) ? gpu_level_path::relay : gpu_level_path::copy;
    if (want != gpu_level_path::write_value) return gpu_level_path::copy;
#if defined(RL_GPU_EMU)
    (void)d;
    return gpu_level_path::copy;  // the emulation has no stream memory operations
#elif defined(RL_GPU_HIP)
    (void)d;
    return gpu_level_path::write_value;
#elif defined(RL_GPU_GREEN_CONTEXTS)
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &p, 11070, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !p) {
        (void)cudaGetLastError();
        return gpu_level_path::copy;
    }
    d->write_value32 = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(p);
    return gpu_level_path::write_value;
#else
    (void)d;
    return gpu_level_path::copy;
#endif
}

void op_raise_levels(device* dev, uint32_t mask) {
    gpu_device_state* d = state_of(dev);
    mask &= (1u << preempt_levels) - 2;  // levels 1 .. preempt_levels - 1
    if (!mask) return;
    bind(d);
    cudaError_t e = cudaSuccess;
    // Raises are delivered in the order they advance the words: a later write never lands
    // before an earlier one (the device's epochs only move forward).
    std::lock_guard lk(d->level_mu);
    for (uint32_t l = 1; l < preempt_levels; ++l)
        if (mask >> l & 1) std::atomic_ref<uint32_t>(d->level_host[l]).fetch_add(1, std::memory_order_seq_cst);
    if (d->level_path == gpu_level_path::relay) {
        // A store per level into mapped memory; the relay kernel carries it to the device line.
        for (uint32_t l = 1; l < preempt_levels; ++l)
            if (mask >> l & 1)
                std::atomic_ref<uint32_t>(d->relay_line[l]).store(
                    std::atomic_ref<uint32_t>(d->level_host[l]).load(std::memory_order_relaxed), std::memory_order_seq_cst);
    } else if (d->level_path == gpu_level_path::write_value) {
        for (uint32_t l = 1; l < preempt_levels && e == cudaSuccess; ++l) {
            if (!(mask >> l & 1)) continue;
            [[maybe_unused]] const uint32_t value =  // (the emulation has no write_value path)
                std::atomic_ref<uint32_t>(d->level_host[l]).load(std::memory_order_relaxed);
#if defined(RL_GPU_HIP)
            e = hipStreamWriteValue32(d->flag_stream, d->level_dev + l, value, 0);
#elif defined(RL_GPU_GREEN_CONTEXTS)
            const CUresult r = d->write_value32(reinterpret_cast<CUstream>(d->flag_stream),
                                                reinterpret_cast<CUdeviceptr>(d->level_dev + l), value, 0);
            if (r != CUDA_SUCCESS) e = cudaErrorInvalidValue;
#endif
        }
    } else {
        // The copy reads the pinned line when it runs: a later raise's values, if one came
        // meanwhile, which is as right (epochs only grow).
        e = cudaMemcpyAsync(d->level_dev, d->level_host, preempt_levels * sizeof(uint32_t), cudaMemcpyHostToDevice,
                            d->flag_stream);
    }
    if (e != cudaSuccess) fail("raising preemption levels", e);
    d->level_raises.fetch_add(1, std::memory_order_relaxed);
}

uint32_t op_level_epoch(const device* dev, uint32_t level) {
    const gpu_device_state* d = state_of(dev);
    return level < preempt_levels ? std::atomic_ref<uint32_t>(d->level_host[level]).load(std::memory_order_seq_cst) : 0;
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
    .destroy = op_destroy,
    .caps = op_caps,
    .alloc = op_alloc,
    .free = op_free,
    .register_host = op_register_host,
    .unregister_host = op_unregister_host,
    .copy_to_device = op_copy_to_device,
    .copy_to_host = op_copy_to_host,
    .stream_create = op_stream_create,
    .stream_destroy = op_stream_destroy,
    .launch = op_launch,
    .queued = op_queued,
    .synchronize = op_synchronize,
    .event_create = op_event_create,
    .event_destroy = op_event_destroy,
    .event_record = op_event_record,
    .event_query = op_event_query,
    .event_synchronize = op_event_synchronize,
    .task_words_create = op_task_words_create,
    .task_words_destroy = op_task_words_destroy,
    .task_flag_set = op_task_flag_set,
    .launch_padded = op_launch_padded,
    .padding_stats = op_padding_stats,
    .kernel_resources_of = op_kernel_resources_of,
    .stream_set_units = op_stream_set_units,
    .raise_levels = op_raise_levels,
    .level_epoch = op_level_epoch,
    .unit_grant_of = op_unit_grant_of,
    .unit_shares = op_unit_shares,
};

std::unique_ptr<device> make_device(const gpu_device_options& options) {
    const std::string none = std::string("no ") + RL_GPU_RUNTIME_NAME + " device: ";
#if !defined(RL_GPU_HIP) && !(defined(REEFLINE_SIMT_EMU) && REEFLINE_SIMT_EMU)
    // Kernels load when the runtime starts, unless the user chose otherwise. Under CUDA's
    // default lazy loading (12.2+) a kernel's first launch loads it, and loading may wait for
    // the kernels running on the device (the programming guide's "Lazy Loading" hazards): an
    // RT task's first kernel could wait for a long BE kernel, the opposite of preemption (on an
    // H200 a stream's first launch of a kernel waited for another stream's spinning block to
    // end, which this explains). The driver reads the variable when it initialises: at the
    // first call below, as long as nothing in the process used CUDA before.
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
#endif
    // Hardware work queues: the runtime spreads streams over a few hardware queues (CUDA:
    // CUDA_DEVICE_MAX_CONNECTIONS, 8 by default; HIP: GPU_MAX_HW_QUEUES, 4), and two streams on
    // one queue run in order. An RT stream sharing a queue with a BE stream waits behind that
    // stream's queued launches whatever its priority, which no preemption flag can shorten. The
    // most each driver gives, unless the user chose; read, like the loading mode, when the
    // runtime initialises. Streams beyond that many still alias (unit streams: up to 8 per
    // stream), which stats report beside hardware_queues.
#if defined(RL_GPU_HIP)
    setenv("GPU_MAX_HW_QUEUES", "16", 0);
#elif !(defined(REEFLINE_SIMT_EMU) && REEFLINE_SIMT_EMU)
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
#endif
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
    d->hardware_queues = hardware_queues_in_effect();
    void* values = nullptr;
    void* levels = nullptr;
    e = cudaHostAlloc(&values, kFlagValueBytes, cudaHostAllocPortable);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&d->flag_stream, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&d->flag_written, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc(&levels, 64);
    if (e == cudaSuccess) e = cudaMemset(levels, 0, 64);
    if (e != cudaSuccess) {
        (void)cudaFreeHost(values);
        (void)cudaFree(levels);
        delete d;
        fail("preemption flag stream and levels", e);
    }
    d->flag_values = static_cast<uint32_t*>(values);
    std::memset(values, 0, kFlagValueBytes);
    d->flag_values[16] = 1;
    d->level_dev = static_cast<uint32_t*>(levels);
    d->level_host = d->flag_values + kLevelWords;
    d->level_path = choose_level_path(d, options.level_path);
    // DKP, when the kernel library has a padded launcher.
    d->padded = find_gpu_padded_library();
    if (d->padded) {
        void* totals = nullptr;
        e = cudaMalloc(&totals, sizeof(gpu_pad_totals));
        if (e == cudaSuccess) e = cudaMemset(totals, 0, sizeof(gpu_pad_totals));
        if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&d->pad_release_stream, cudaStreamNonBlocking, least);
        if (e != cudaSuccess) {
            (void)cudaFree(totals);
            auto dv = std::make_unique<device>(&gpu_ops, d);  // destroys what was made
            fail("DKP totals and release stream", e);
        }
        d->pad_totals = static_cast<gpu_pad_totals*>(totals);
    }
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
    out.units_binds = d->units_binds.load(std::memory_order_relaxed);
    out.units_fallbacks = d->units_fallbacks.load(std::memory_order_relaxed);
    out.unit_switches = d->unit_switches.load(std::memory_order_relaxed);
    out.unit_streams_made = d->unit_streams_made.load(std::memory_order_relaxed);
    out.unit_streams_live = d->unit_streams_live.load(std::memory_order_relaxed);
    out.level_path = d->level_path == gpu_level_path::write_value ? "write_value"
                     : d->level_path == gpu_level_path::relay     ? "relay"
                                                                   : "copy";
    out.level_raises = d->level_raises.load(std::memory_order_relaxed);
    out.hardware_queues = d->hardware_queues;
    return true;
}

}  // namespace reefline::gpu
