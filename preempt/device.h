// The device interface that the whole GPU side is written against (docs/architecture.md,
// "The GPU runtime"). Backends: cpu (the embedded default, a software device), cuda and hip.
//
// Shaped like ggml's backend interface: a device is a small table of functions plus its
// state, so the scheduler and libml never see a backend's types.
//
// Model of execution, the same on every backend:
// - A kernel is a grid of independent blocks. A launch runs a slice of them
//   [block_offset, block_offset + block_count), so a padded launch can run the rest later.
// - Launches on one stream run in order: a launch starts after the previous one on the same
//   stream has finished (or exited on preemption). Streams run concurrently; when compute
//   units are scarce, higher-priority streams get them first.
// - Every launch belongs to a task and carries the task's device-visible words: a preemption
//   flag that blocks check (at block start and at check points inside long loops), and a
//   completion counter that the launch's last block advances to `kernel_index + 1`. A flagged
//   launch exits without advancing the counter; the task restores from the first kernel whose
//   counter value was not reached.
// - Preemption levels: a launch may also carry a level (1 .. preempt_levels - 1) and the
//   level's epoch when it was made. raise_levels() advances the epochs of some levels in one
//   write; every launch of such a level made before it (an older epoch) then stops as a
//   flagged one does, queued or running, while launches made after it run. It is how an RT
//   arrival stops every BE queue at once without touching their tasks' flags: one store from
//   the submitting thread on the cpu device, one device write on a GPU.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace reefline::gpu {

enum class memory_kind : uint8_t {
    device,       // device memory (on the cpu backend: ordinary, 64-byte aligned host memory)
    pinned,       // page-locked host memory, for DMA
    host_mapped,  // page-locked host memory that kernels can read and write directly
};

// Per-task words that kernels read and write. On GPUs they live in host-mapped memory so the
// host sees the counter without a copy. The flag is set through device_ops::task_flag_set
// (device::set_task_flag), never by a store of the caller's: a GPU backend keeps the copy its
// kernels read in device memory, because a host-mapped read at every check point costs a
// PCIe round trip (6-9x the kernels' time on an H100). `preempt` here is the host's view.
struct alignas(64) task_words {
    std::atomic<uint32_t> preempt;    // non-zero: every launch of the task exits at its next check
    std::atomic<uint32_t> completed;  // kernels of the task completed, in order (index + 1)
    std::atomic<uint32_t> pads;       // DKP: pads of the task queued or running (0: none can run)
    std::atomic<uint32_t> pads_running;  // DKP: pads of the task that started and may run a block
};

// Preemption levels (device_ops::raise_levels): level 0 is none (only the task's flag stops a
// launch); 1 .. preempt_levels - 1 are raised together or apart.
inline constexpr uint32_t preempt_levels = 4;

// Whether a launch made at `launch_epoch` is stale once its level's epoch reads `now`: only an
// epoch newer than the launch's (a raise after it was made). A launch made just after a raise,
// whose device copy of the epoch may still be on its way, reads an older value and runs.
constexpr bool epoch_passed(uint32_t now, uint32_t launch_epoch) { return int32_t(now - launch_epoch) > 0; }

// Handed to every block: where it is, and how to check the preemption flag.
struct block_context {
    uint32_t block;         // block index within the whole grid
    uint32_t grid;          // total blocks of the kernel
    uint32_t worker;        // compute unit running the block
    const task_words* task;
    void* scratch;          // per-compute-unit scratch memory (cpu backend)
    size_t scratch_size;
    const std::atomic<uint32_t>* level_epoch = nullptr;  // the launch's level's epoch, or null
    uint32_t epoch = 0;                                  // the epoch the launch was made at

    // A check point: true when the task was preempted (its flag, or a raise of its launch's
    // level) and the block must return now.
    bool preempted() const {
        if (task && task->preempt.load(std::memory_order_relaxed) != 0) return true;
        return level_epoch && epoch_passed(level_epoch->load(std::memory_order_relaxed), epoch);
    }
};

// A kernel's CPU implementation of one block. `args` is the kernel's argument struct (plain
// data, the same bytes a GPU launch passes). Returns false when it stopped at a check point.
using cpu_block_fn = bool (*)(const void* args, const block_context& ctx);

// What the device needs to know of a kernel: backend-neutral description plus the entry
// point of each backend that implements it.
struct kernel_info {
    const char* name;
    cpu_block_fn cpu;           // cpu backend implementation of one block (null: none);
                                // GPU backends find the kernel by `name` in their registry
                                // (preempt/gpu_kernels.h)
    uint32_t threads_per_block; // GPU resource needs (profiles, DKP occupancy)
    uint32_t registers;
    uint32_t shared_bytes;
    size_t scratch_bytes;       // cpu: scratch a block needs from its compute unit
};

// What a compiled kernel asks of a compute unit on a device (device_ops::kernel_resources).
struct kernel_resources {
    uint32_t threads_per_block = 0;
    uint32_t registers = 0;        // per thread
    uint32_t shared_bytes = 0;     // per block, static and dynamic
    uint32_t blocks_per_unit = 0;  // occupancy: blocks one unit holds at once when alone
};

struct launch {
    const kernel_info* kernel;
    const void* args;       // kernel argument struct; copied at launch time
    uint32_t args_size;
    uint32_t grid;          // total blocks
    uint32_t block_offset;  // slice of blocks this launch runs
    uint32_t block_count;
    task_words* task;       // may be null (no preemption, no counter)
    uint32_t kernel_index;  // position in the task; completion sets task->completed to index+1
    uint32_t level = 0;     // preemption level (0: none), and its epoch when the launch was made
    uint32_t epoch = 0;     // (device_ops::level_epoch, read before the launch was decided on)
};

struct stream;  // opaque, owned by the device
struct event;   // opaque, owned by the device

struct device_caps {
    std::string name;             // e.g. "cpu (1 compute unit)", "NVIDIA H100 80GB HBM3"
    uint32_t compute_units;       // SMs / CUs / worker threads
    uint32_t max_queue_depth;     // device-queue capacity per stream
    int lowest_priority;          // numerically: higher number = lower priority, as in CUDA
    int highest_priority;
    bool gpu = false;             // a CUDA/HIP device: plans pick GPU tile sizes
    // A GPU's own memory, free now and in all (cudaMemGetInfo, when caps() is called); 0 on
    // the cpu device, whose memory is the host's.
    uint64_t memory_free_bytes = 0;
    uint64_t memory_total_bytes = 0;
    // cpu: the scratch each compute unit lends a block (launch scratch_bytes must fit in it);
    // 0 on GPUs, whose kernels use shared memory instead.
    size_t scratch_per_unit = 0;
};

// Unit sets (stream_set_units) are 64-bit masks. On a device with more than 64 compute units
// (an H100 has 132 SMs, an MI300X 304 CUs) bit i names the group of unit_group() consecutive
// units from i * unit_group() (the last group may be smaller), so that a set can still be any
// fraction of the whole device; unit_set_bits() is how many bits a set of every unit has.
constexpr uint32_t unit_group(uint32_t compute_units) { return compute_units <= 64 ? 1u : (compute_units + 63) / 64; }
constexpr uint32_t unit_set_bits(uint32_t compute_units) {
    return (compute_units + unit_group(compute_units) - 1) / unit_group(compute_units);
}
constexpr uint64_t every_unit_set(uint32_t compute_units) {
    const uint32_t bits = unit_set_bits(compute_units);
    return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

// The compute units a unit set names (each bit a unit_group of them), in order.
inline std::vector<uint32_t> units_in_set(uint64_t set, uint32_t compute_units) {
    std::vector<uint32_t> out;
    const uint32_t group = unit_group(compute_units);
    for (uint32_t u = 0; u < compute_units; ++u)
        if (u / group < 64 && (set >> (u / group) & 1)) out.push_back(u);
    return out;
}

// Where a unit set's launches really run (device_ops::unit_grant): backends round sets, place
// them by count rather than by id, or cannot bind a stream at all, and operators must see it.
struct unit_grant {
    bool bound = false;           // false: launches bound to the set run on every unit (`note` says why)
    uint32_t count = 0;           // compute units the set runs on (bound)
    bool exact = false;           // those are the very units of the set (else: `count` of them)
    std::vector<uint32_t> units;  // exact: the units
    std::string note;             // how the backend placed it, or why it could not
};
// The backend's spatial shares as a whole (device_ops::unit_shares).
struct unit_shares_info {
    std::string mechanism;        // "workers", "cu_masks", "emulated_units", "green_contexts"
    bool usable = false;          // false: every bound stream runs unbound (`why`)
    std::string why;
    uint32_t step = 1;            // compute units a set is rounded to (green contexts: an SM slice)
    uint64_t binds = 0;           // stream_set_units calls with a proper subset
    uint64_t fallbacks = 0;       // of those, served on every unit because binding failed
    uint32_t partitions = 0;      // vendor partitions alive (green contexts), else 0
};

class device;

// The backend's table of functions. Every function is thread-safe unless noted.
struct device_ops {
    void (*destroy)(device* d);
    device_caps (*caps)(const device* d);

    // 64-byte aligned (at least); null when the memory cannot be had (it never throws).
    void* (*alloc)(device* d, size_t bytes, memory_kind kind);
    void (*free)(device* d, void* p);
    // Makes external host memory (e.g. DPDK hugepages) readable by kernels in place.
    bool (*register_host)(device* d, void* p, size_t bytes);
    void (*unregister_host)(device* d, void* p);
    // Synchronous copies, for set-up (weights) and tests.
    void (*copy_to_device)(device* d, void* dst, const void* src, size_t bytes);
    void (*copy_to_host)(device* d, void* dst, const void* src, size_t bytes);

    stream* (*stream_create)(device* d, int priority);
    void (*stream_destroy)(device* d, stream* s);
    // Queues a launch. Blocks while the stream's device queue is full (bounded).
    void (*launch)(device* d, stream* s, const launch& l);
    // Launches queued on `s` but not yet started: lets a vHQ keep c outstanding.
    uint32_t (*queued)(device* d, stream* s);
    void (*synchronize)(device* d, stream* s);

    event* (*event_create)(device* d);
    void (*event_destroy)(device* d, event* e);
    void (*event_record)(device* d, event* e, stream* s);
    bool (*event_query)(device* d, event* e);  // true when everything before it finished
    void (*event_synchronize)(device* d, event* e);

    task_words* (*task_words_create)(device* d);
    void (*task_words_destroy)(device* d, task_words* w);
    // Raises (non-zero) or lowers (0) the task's preemption flag. Raising returns at once and
    // the task's blocks see it within microseconds; lowering returns when every launch made
    // after it will read 0 (restore relaunches the task right after).
    void (*task_flag_set)(device* d, task_words* w, uint32_t value);

    // Dynamic kernel padding (DKP); null on a backend without it. Queues `l` on `s` as launch()
    // does, with `pads`: kernels of other (preempted) tasks that run on the compute units `l`
    // leaves idle. A unit takes a pad's block only when `l` has no block left to hand out, and
    // only while `l` runs: when its last block ends, the pads' undispatched blocks are dropped
    // and their running blocks stop at their next check point, so padding holds no unit past
    // the RT kernel by more than a check-point interval. A pad runs at all only if, when its
    // first block is claimed, its task's counter equals its kernel_index (the kernel before it
    // completed) and no other pad of the task is still running: a task's pads run in order and
    // never beside a cut one. A pad whose every block ran sets its task's counter to
    // kernel_index + 1; a cut one sets nothing (the task restores from it: kernels are
    // idempotent). While a pad is queued or may run, its task's `pads` word is non-zero: a
    // task must not restore before it is 0. Pads beyond what the device can hold are dropped.
    void (*launch_padded)(device* d, stream* s, const struct launch& l, const struct launch* pads, uint32_t n_pads);
    // What padding did so far (zeros without DKP).
    struct padding_counters {
        uint64_t padded_launches = 0;  // launches that carried pads
        uint64_t pads = 0;             // pads accepted
        uint64_t pads_completed = 0;   // pads whose every block ran
        uint64_t pads_cut = 0;         // pads started but stopped at the end of their RT launch
        // Pads not run: their task was not at their kernel, another pad of it ran, or their RT
        // launch ended before a unit came to them. completed + cut + skipped = pads, once each
        // launch has ended.
        uint64_t pads_skipped = 0;
        uint64_t pad_blocks = 0;       // blocks run to their end as padding
    };
    padding_counters (*padding_stats)(const device* d);
    // The resources of the code this device runs for `k` (GPU backends: the compiled kernel's
    // attributes and the occupancy calculator's answer); null, or false, where only
    // kernel_info's nominal figures are known.
    bool (*kernel_resources_of)(device* d, const kernel_info* k, kernel_resources& out);
    // Spatial shares (GSLICE's "GPU%"): the compute units whose blocks of launches on `s` may
    // run on, bit u for unit u (for the group of units u names past 64 units: unit_group). A
    // set with no unit of this device, or every unit, means every unit. A caller changes it between tasks;
    // launches stay in order across a change. Null on a backend without it. Per backend:
    // - cpu: workers outside the set skip the stream; applies to launches not yet dispatched.
    // - hip: a CU-mask stream per set (hipExtStreamCreateWithCUMask), exactly these CUs; the
    //   SIMT emulation (-Dgpu_emu=true) does the same with emulated units.
    // - cuda: a stream in a green context (CUDA 12.5+ driver), which partitions SMs by count,
    //   not by SM id: the set is its size rounded up to the architecture's step (8 SMs on
    //   Hopper), placed at its lowest unit as far as the driver hands SMs out in order; a size
    //   that rounds to the whole device, or a driver without green contexts, runs unbound
    //   (gpu_device_stats::units_fallbacks counts the latter).
    // On cuda and hip it applies to launches made after the call (queued ones keep theirs). A
    // padded launch's pads are not bound by it (callers pad only with work that may run
    // anywhere); on cuda and hip a padded launch on a bound stream is a plain launch (its pads
    // dropped), since the DKP kernel splits the whole device by SM id.
    void (*stream_set_units)(device* d, stream* s, uint64_t units);

    // Preemption levels. raise_levels advances the epoch of every level in `mask` (bit l:
    // level l, 1 .. preempt_levels - 1) in one write and returns at once, from any thread: every
    // launch of those levels made at an older epoch then stops as a flagged launch does (queued
    // ones run no block, running blocks stop at their next check point; none advances its
    // task's counter), within microseconds. level_epoch is the epoch a launch made now
    // carries. Null on a backend without levels (callers then raise each task's flag).
    void (*raise_levels)(device* d, uint32_t mask);
    uint32_t (*level_epoch)(const device* d, uint32_t level);

    // Spatial shares as placed: what a set gets (binding it first where the backend makes
    // its partitions on demand, so the answer is the one launches get) and the backend's
    // totals. Null where stream_set_units is.
    unit_grant (*unit_grant_of)(device* d, uint64_t units);
    unit_shares_info (*unit_shares)(device* d);
};

// A device: its backend's table and state. Every op has a method here, named as the op (but
// create_stream and set_task_flag); callers never reach into ops() for what a method does.
// The optional ops (null on a backend without the feature) have a has_/pads_ test, and their
// methods answer "none" (zeros, false, an unbound grant) where the backend lacks them.
class device {
public:
    device(const device_ops* ops, void* state) : _ops(ops), _state(state) {}
    ~device() { _ops->destroy(this); }
    device(const device&) = delete;
    device& operator=(const device&) = delete;

    const device_ops& ops() const { return *_ops; }
    void* state() const { return _state; }
    device_caps caps() const { return _ops->caps(this); }

    void* alloc(size_t bytes, memory_kind kind = memory_kind::device) { return _ops->alloc(this, bytes, kind); }
    void free(void* p) { _ops->free(this, p); }
    bool register_host(void* p, size_t bytes) { return _ops->register_host(this, p, bytes); }
    void unregister_host(void* p) { _ops->unregister_host(this, p); }
    void copy_to_device(void* dst, const void* src, size_t bytes) { _ops->copy_to_device(this, dst, src, bytes); }
    void copy_to_host(void* dst, const void* src, size_t bytes) { _ops->copy_to_host(this, dst, src, bytes); }

    stream* create_stream(int priority) { return _ops->stream_create(this, priority); }
    void stream_destroy(stream* s) { _ops->stream_destroy(this, s); }
    void launch(stream* s, const struct launch& l) { _ops->launch(this, s, l); }
    uint32_t queued(stream* s) { return _ops->queued(this, s); }
    void synchronize(stream* s) { _ops->synchronize(this, s); }

    event* event_create() { return _ops->event_create(this); }
    void event_destroy(event* e) { _ops->event_destroy(this, e); }
    void event_record(event* e, stream* s) { _ops->event_record(this, e, s); }
    bool event_query(event* e) { return _ops->event_query(this, e); }
    void event_synchronize(event* e) { _ops->event_synchronize(this, e); }

    task_words* task_words_create() { return _ops->task_words_create(this); }
    void task_words_destroy(task_words* w) { _ops->task_words_destroy(this, w); }
    void set_task_flag(task_words* w, uint32_t value) { _ops->task_flag_set(this, w, value); }

    // Dynamic kernel padding.
    bool pads_launches() const { return _ops->launch_padded != nullptr; }
    void launch_padded(stream* s, const struct launch& l, const struct launch* pads, uint32_t n_pads) {
        _ops->launch_padded(this, s, l, pads, n_pads);
    }
    device_ops::padding_counters padding_stats() const {
        return _ops->padding_stats ? _ops->padding_stats(this) : device_ops::padding_counters{};
    }

    bool kernel_resources_of(const kernel_info* k, kernel_resources& out) {
        return _ops->kernel_resources_of && _ops->kernel_resources_of(this, k, out);
    }

    // Spatial shares.
    bool has_unit_sets() const { return _ops->stream_set_units != nullptr; }
    void stream_set_units(stream* s, uint64_t units) {
        if (_ops->stream_set_units) _ops->stream_set_units(this, s, units);
    }
    unit_grant unit_grant_of(uint64_t units) {
        if (_ops->unit_grant_of) return _ops->unit_grant_of(this, units);
        unit_grant g;
        g.note = "this backend has no unit sets";
        return g;
    }
    unit_shares_info unit_shares() {
        if (_ops->unit_shares) return _ops->unit_shares(this);
        unit_shares_info u;
        u.why = "this backend has no unit sets";
        return u;
    }

    // Preemption levels.
    bool has_levels() const { return _ops->raise_levels != nullptr && _ops->level_epoch != nullptr; }
    void raise_levels(uint32_t mask) { _ops->raise_levels(this, mask); }
    uint32_t level_epoch(uint32_t level) const { return _ops->level_epoch(this, level); }

private:
    const device_ops* _ops;
    void* _state;
};

struct cpu_device_options {
    uint32_t compute_units = 0;    // 0: cores - 1, at least 1
    uint32_t queue_depth = 64;     // device-queue capacity per stream
    size_t scratch_per_unit = 64u << 20;
    // Each compute unit on a CPU of its own where the units are as many as the CPUs the
    // creating thread may run on (after DPDK's EAL init that set excludes the worker lcores'
    // CPUs). Left to the kernel's scheduler, two units woken together after an idle spell often
    // landed on one CPU and stayed there for a whole run. With fewer units than CPUs they stay
    // unpinned, free to leave a CPU that something else keeps busy.
    bool pin_units = true;
};

// The embedded default backend.
std::unique_ptr<device> make_cpu_device(const cpu_device_options& options = {});

}  // namespace reefline::gpu
