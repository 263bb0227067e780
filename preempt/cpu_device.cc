// The cpu backend: a software device.
//
// Compute units are worker threads. There is no separate command-processor thread: every idle
// worker is its own command processor. It scans the streams in priority order (a snapshot list
// sorted by priority; equal priorities are visited round-robin), claims the next block of the
// first stream whose head launch still has undispatched blocks, runs it, and scans again. So a
// higher-priority launch gets every compute unit at the next block boundary, and a queued
// launch behind another on the same stream never runs early.
//
// Hot path, per block: one CAS on the head launch's claim word, loads of the task's preemption
// flag, one fetch_add on the launch's done counter. No mutex. Per launch: the
// producer and the launch's last block touch the stream's head/tail indices and, only when a
// thread sleeps waiting for that launch (or an earlier one), a futex.
//
// Stream queue: a ring of `queue_depth` slots (rounded up to a power of two), indices head and
// tail are 64-bit and only grow. tail is written by producers (under the stream's producer
// mutex), head only by the last block of the head launch. A slot's claim word holds the low 32
// bits of the launch index and the number of blocks not yet dispatched, so a worker that read
// a stale head can never claim a block of a newer launch that reused the slot.
//
// Preemption levels: the epochs are words of the device state; raise_levels advances them (a
// plain store from any thread) and a launch of a raised level made at an older epoch is
// treated exactly as a launch of a flagged task (below): the flag check reads both.
//
// Preemption: a block is dispatched only after the claimer has read task->preempt == 0. A
// claimer that finds the flag raised (or a block that returns false at a check point) marks the
// launch failed and zeroes its undispatched count at once, so no further block of it runs. The
// launch's last finished block stores task->completed = kernel_index + 1 (release) only if the
// launch did not fail. Queued launches of a flagged task run no block: whoever finishes the
// launch ahead of them evicts them on the spot, in a loop (so a preempted stream empties
// within microseconds even when every other unit is busy), and a scanning worker evicts a
// flagged launch it finds at a stream's head.
//
// Idle workers poll for kSpinNs (a launch on an idle device then starts within about a
// microsecond), yielding the core between polls after kPureSpinNs so that they do not starve
// a thread that shares their core, then sleep on a futex (work_seq) that producers and
// finishers bump, and wake only when someone sleeps.
//
// Spatial shares: a stream may be bound to a subset of the units (stream_set_units); a worker
// outside it skips the stream in its scan, and while any stream is bound a new runnable launch
// wakes every sleeping worker, since the ones a partial wake-up reaches may not be allowed.
//
// Pinning: where the units are as many as the CPUs the creating thread may run on, each stays on
// one of its own (cpu_device_options::pin_units). Unpinned, the two units of a 2-CPU machine
// woken together after an idle spell of a few milliseconds were often placed on one CPU and left
// there for the whole run: MobileNet-v2 at batch 1 then took as long as on one unit (8.3 against
// 5.2 ms), for series of runs at a time. Fewer units than CPUs stay unpinned: the scheduler can
// move one off a CPU that another thread or process keeps busy, which a pinned unit cannot
// leave (one unit pinned on a 2-CPU machine ran Abacus groups at 1.7x their prediction while
// other test processes ran).
//
// Streams are never freed before the device: stream_destroy drains the stream, takes it out of
// the dispatch list and keeps it for reuse by a later stream_create. Its indices keep growing,
// so events recorded on it stay valid. The dispatch list is copy-on-write; a replaced list is
// freed after a grace period (every worker has left the scan it was in).
#include "preempt/device.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <sched.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace reefline::gpu {
namespace {

// Priorities as in CUDA: a lower number is a higher priority; out-of-range values are clamped.
constexpr int cpu_highest_priority = 0;
constexpr int cpu_lowest_priority = 7;

constexpr size_t kAlign = 64;
constexpr size_t kInlineArgs = 256;
constexpr int64_t kSpinNs = 50'000;       // idle workers spin this long before sleeping
constexpr int64_t kWaiterSpinNs = 20'000; // synchronize/launch spin before sleeping
constexpr int64_t kPureSpinNs = 2'000;    // then they yield between polls

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Sleeping on a 32-bit atomic: the futex directly on Linux, C++20 atomic wait elsewhere.
void wait_word(std::atomic<uint32_t>& w, uint32_t seen) {
#if defined(__linux__)
    static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
#else
    w.wait(seen, std::memory_order_seq_cst);
#endif
}

void wake_word(std::atomic<uint32_t>& w, uint32_t n) {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w), FUTEX_WAKE_PRIVATE,
            static_cast<int>(std::min<uint32_t>(n, INT_MAX)), nullptr, nullptr, 0);
#else
    if (n == 1) w.notify_one(); else w.notify_all();
#endif
}

// Polls `pred` for up to `ns`: a few microseconds of pure spinning, then yielding the core
// between polls so that a thread it shares the core with (the host thread that launches, or
// another worker when compute units outnumber cores) is not starved. True once pred held.
template <typename Pred>
bool spin_until(Pred&& pred, int64_t ns) {
    const int64_t start = now_ns();
    for (uint32_t i = 1;; ++i) {
        if (pred()) return true;
        if ((i & 15) != 0) {
            cpu_relax();
            continue;
        }
        const int64_t t = now_ns() - start;
        if (t > ns) return false;
        if (t > kPureSpinNs) sched_yield();
    }
}

// The CPUs the calling thread may run on, in order; empty where that cannot be known.
std::vector<int> allowed_cpus() {
    std::vector<int> cpus;
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
#endif
    return cpus;
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// kAlign-aligned memory, or null when it cannot be had.
void* aligned_bytes_or_null(size_t bytes) {
    return std::aligned_alloc(kAlign, round_up(std::max<size_t>(bytes, 1), kAlign));
}

void* aligned_bytes(size_t bytes) {
    void* p = aligned_bytes_or_null(bytes);
    if (!p) throw std::bad_alloc();
    return p;
}

struct aligned_deleter {
    void operator()(void* p) const { std::free(p); }
};

// One launch in a stream's ring.
struct alignas(64) slot {
    // Dispatch state, shared by the workers running the launch.
    std::atomic<uint64_t> claim{0};   // (launch index & 0xffffffff) << 32 | blocks not dispatched
    std::atomic<uint32_t> done{0};    // blocks finished or skipped
    std::atomic<uint32_t> failed{0};  // some block was preempted or skipped
    std::atomic<uint32_t> units{0};   // blocks to account for (block_count, at least 1)

    // Written by the producer before the launch is published, read-only while it is live.
    alignas(64) cpu_block_fn fn = nullptr;
    const void* args = nullptr;
    std::atomic<task_words*> task{nullptr};  // atomic: evictors read it before claiming
    uint32_t grid = 0;
    uint32_t offset = 0;
    uint32_t count = 0;
    uint32_t kernel_index = 0;
    uint32_t level = 0, epoch = 0;  // preemption level and the epoch the launch was made at
    std::unique_ptr<unsigned char, aligned_deleter> heap;  // args above kInlineArgs, reused
    size_t heap_cap = 0;
    // DKP: the pads of this launch (entries of the device's pad pool and their generations).
    uint32_t n_pads = 0;
    uint32_t pad_ids[4] = {};
    uint32_t pad_gens[4] = {};
    alignas(64) unsigned char inline_args[kInlineArgs];
};

constexpr uint32_t kMaxPadsPerLaunch = 4;
constexpr uint32_t kPadPool = 64;

// A pad (DKP) in the device's pool. Its life: allocated by launch_padded (generation + 1, the
// owner's `pads` + 1), blocks claimed by workers that find its RT launch with nothing left to
// hand out, ended by its RT launch's end (cut) or by its last block (finished), freed by
// whoever sees it ended with no worker inside (the owner's `pads` - 1). `state` packs the
// generation, the workers inside and the ended bits, so that a worker holding a stale id can
// never enter a reused entry, and the entry is never reused while a worker is inside.
struct alignas(64) pad_entry {
    // (generation << 32) | (workers inside << 3) | freed (4) | finished (2) | cut (1)
    std::atomic<uint64_t> state{0};
    std::atomic<uint32_t> next{0};     // blocks handed out
    std::atomic<uint32_t> done{0};     // blocks that ran to their end
    std::atomic<uint32_t> check{0};    // 0: not yet decided, 1: runs, 2: skipped, 3: deciding
    std::atomic<uint32_t> failed{0};   // a block stopped at a check point
    std::atomic<uint32_t> running{0};  // counted in the owner's pads_running (1 until it can run no block)
    task_words words{};                // the blocks' flag: raised when the pad is cut
    cpu_block_fn fn = nullptr;
    task_words* owner = nullptr;
    uint32_t grid = 0, offset = 0, count = 0, kernel_index = 0;
    std::unique_ptr<unsigned char, aligned_deleter> heap;
    size_t heap_cap = 0;
    const void* args = nullptr;
    alignas(64) unsigned char inline_args[kInlineArgs];
};

constexpr uint64_t kPadCut = 1, kPadFinished = 2, kPadFreed = 4, kPadOne = 8;
constexpr uint64_t kPadInside = 0xffffffffull & ~uint64_t{7};

struct cpu_device_state;

struct cpu_stream {
    int priority = 0;
    uint32_t mask = 0;
    uint32_t depth = 0;
    std::unique_ptr<slot[]> slots;
    bool live = false;  // guarded by the device mutex

    std::atomic<uint64_t> allowed{~uint64_t{0}};  // units that may run its blocks (stream_set_units)
    alignas(64) std::atomic<uint64_t> head{0};   // first launch not finished
    std::atomic<uint32_t> progress{0};           // bumped after head moves (futex word)
    std::atomic<uint32_t> waiters{0};            // threads sleeping on progress
    // The least head a sleeping waiter waits for: a finished launch wakes the sleepers only once
    // head reaches it (waking a synchronize for each of a model's 50 launches cost the compute
    // unit 7% of its time in futex wake-ups). Lowered and recomputed under wait_mu.
    std::atomic<uint64_t> wake_at{UINT64_MAX};
    std::mutex wait_mu;
    std::vector<uint64_t> wait_targets;  // the heads the sleeping waiters wait for
    alignas(64) std::atomic<uint64_t> tail{0};   // next launch index
    std::mutex producer;                         // serialises producers of this stream
};

struct cpu_event {
    std::mutex m;
    cpu_stream* s = nullptr;  // null: never recorded
    uint64_t ticket = 0;      // complete once s->head >= ticket
};

// Streams in dispatch order: sorted by priority, with the [begin, end) of each priority level.
struct stream_list {
    std::vector<cpu_stream*> s;
    std::vector<std::pair<uint32_t, uint32_t>> levels;
};

struct alignas(64) worker {
    uint32_t id = 0;
    uint32_t unit_bit = 0;               // its bit in a unit set: id / unit_group(units), once
    uint32_t rotate = 0;                 // round-robin among equal priorities
    int cpu = -1;                        // the CPU it is pinned to (cpu_device_options::pin_units)
    std::atomic<uint64_t> epoch{0};      // odd while it reads the stream list
    void* scratch = nullptr;
    std::thread thread;
};

struct claimed {
    cpu_stream* s;
    slot* sl;
    uint32_t unit;
    pad_entry* pad = nullptr;  // a pad block: unit is the block within the pad's slice
};

struct cpu_device_state {
    cpu_device_options options;
    uint32_t units = 1;
    std::unique_ptr<worker[]> workers;

    std::atomic<const stream_list*> list{nullptr};
    alignas(64) std::atomic<uint32_t> work_seq{0};   // futex word of sleeping workers
    std::atomic<uint32_t> sleepers{0};
    // Streams bound to a subset of the units: while any is, a launch wakes every sleeper (a
    // woken worker outside the subset would go back to sleep and leave the blocks waiting).
    std::atomic<uint32_t> bound_streams{0};
    std::atomic<uint64_t> units_binds{0};  // stream_set_units with a proper subset
    std::atomic<bool> stop{false};
    // Preemption levels' epochs (raise_levels), read at every check of a launch with a level.
    alignas(64) std::atomic<uint32_t> level_epochs[preempt_levels] = {};

    alignas(64) std::mutex mu;  // everything below
    std::vector<std::unique_ptr<cpu_stream>> streams;  // all ever created; live or reusable
    std::unordered_map<void*, size_t> allocs;
    std::unordered_map<void*, size_t> registered;
    std::unordered_set<cpu_event*> events;
    std::unordered_set<task_words*> words;
    // Destroyed task words are recycled, never freed before the device: a worker that read a
    // launch's task pointer just before the launch finished may still load its flag, so the
    // memory must stay valid (a stale flag is harmless: the claim CAS then fails).
    std::vector<task_words*> recycled;

    // DKP: the pad pool (entries are never freed before the device) and its free list.
    std::unique_ptr<pad_entry[]> pads;
    std::vector<uint32_t> free_pads;  // guarded by mu
    std::atomic<uint64_t> padded_launches{0}, pads_accepted{0}, pads_completed{0}, pads_cut{0},
        pads_skipped{0}, pad_blocks{0};
};

cpu_device_state* state_of(const device* d) { return static_cast<cpu_device_state*>(d->state()); }
cpu_stream* as_cpu(stream* s) { return reinterpret_cast<cpu_stream*>(s); }
cpu_event* as_cpu(event* e) { return reinterpret_cast<cpu_event*>(e); }

// --- dispatch ----------------------------------------------------------------------------------

constexpr uint64_t kIdBits = ~uint64_t{0xffffffff};

void finish_launch(cpu_device_state* d, cpu_stream* s, slot* sl);

// Whether a launch must stop: its task's flag is raised, or its level was raised after it
// was made.
bool stopped(const cpu_device_state* d, const slot& sl, const task_words* t) {
    if (t && t->preempt.load(std::memory_order_acquire) != 0) return true;
    return sl.level != 0 && epoch_passed(d->level_epochs[sl.level].load(std::memory_order_acquire), sl.epoch);
}

// Lazy eviction: if launch `idx` (in `sl`) must stop (a flagged task, a raised level), takes
// all its undispatched blocks off the device and marks it failed. Returns how many it took (0:
// not stopped, nothing left, or the slot moved on); the caller accounts for them.
uint32_t evict_if_flagged(const cpu_device_state* d, slot& sl, uint64_t idx) {
    uint64_t cw = sl.claim.load(std::memory_order_acquire);
    for (;;) {
        if ((cw >> 32) != static_cast<uint32_t>(idx) || static_cast<uint32_t>(cw) == 0) return 0;
        // While blocks are left the launch cannot finish, so the slot still holds it.
        const task_words* t = sl.task.load(std::memory_order_relaxed);
        if (!stopped(d, sl, t)) return 0;
        if (sl.claim.compare_exchange_weak(cw, cw & kIdBits, std::memory_order_acq_rel,
                                           std::memory_order_acquire)) {
            sl.failed.store(1, std::memory_order_relaxed);
            return static_cast<uint32_t>(cw);
        }
    }
}

// Adds `n` finished or dropped blocks to a launch; the one that completes it finishes it.
void account(cpu_device_state* d, cpu_stream* s, slot& sl, uint32_t n) {
    const uint32_t units = sl.units.load(std::memory_order_relaxed);
    if (sl.done.fetch_add(n, std::memory_order_acq_rel) + n == units) finish_launch(d, s, &sl);
}

// ---- DKP pads ----

// The pad can run no block any more (finished, or freed after a cut): its owner's next pad
// may start.
void pad_stop_running(pad_entry& p) {
    if (p.running.exchange(0, std::memory_order_acq_rel) == 1) p.owner->pads_running.fetch_sub(1, std::memory_order_acq_rel);
}

// Frees an ended entry with no worker inside, once (the owner may restore after this).
void pad_maybe_free(cpu_device_state* d, uint32_t id, uint64_t st) {
    pad_entry& p = d->pads[id];
    for (;;) {
        if ((st & (kPadCut | kPadFinished)) == 0 || (st & kPadInside) != 0 || (st & kPadFreed)) return;
        if (p.state.compare_exchange_weak(st, st | kPadFreed, std::memory_order_acq_rel, std::memory_order_acquire)) break;
    }
    pad_stop_running(p);
    p.owner->pads.fetch_sub(1, std::memory_order_acq_rel);
    std::lock_guard lk(d->mu);
    d->free_pads.push_back(id);
}

// Ends a pad (its RT launch ended): no more blocks; running ones stop at their next check.
void pad_cut(cpu_device_state* d, uint32_t id, uint32_t gen) {
    pad_entry& p = d->pads[id];
    uint64_t st = p.state.load(std::memory_order_acquire);
    for (;;) {
        if ((st >> 32) != gen || (st & (kPadCut | kPadFinished))) return;
        if (p.state.compare_exchange_weak(st, st | kPadCut, std::memory_order_acq_rel, std::memory_order_acquire)) break;
    }
    p.words.preempt.store(1, std::memory_order_release);
    // Never decided: no worker came to it while its RT launch ran. Decided here as skipped (a
    // worker deciding at the same moment loses the exchange and skips it too), so that every
    // pad is counted once: completed, cut or skipped.
    uint32_t undecided = 0;
    if (p.check.compare_exchange_strong(undecided, 2, std::memory_order_acq_rel))
        d->pads_skipped.fetch_add(1, std::memory_order_relaxed);
    else if (undecided == 1 && p.done.load(std::memory_order_acquire) < p.count)
        d->pads_cut.fetch_add(1, std::memory_order_relaxed);
    pad_maybe_free(d, id, st | kPadCut);
}

// A worker leaves an entry it entered.
void pad_leave(cpu_device_state* d, uint32_t id) {
    const uint64_t st = d->pads[id].state.fetch_sub(kPadOne, std::memory_order_acq_rel) - kPadOne;
    pad_maybe_free(d, id, st);
}

// Claims a block of one of the slot's pads (the slot's launch `id` has no block left to hand
// out). False when none is available.
bool try_claim_pad(cpu_device_state* d, slot& sl, uint32_t launch_id, claimed& c) {
    const uint32_t n = std::min(sl.n_pads, kMaxPadsPerLaunch);
    uint32_t ids[kMaxPadsPerLaunch], gens[kMaxPadsPerLaunch];
    for (uint32_t i = 0; i < n; ++i) {
        ids[i] = sl.pad_ids[i];
        gens[i] = sl.pad_gens[i];
    }
    // The slot may have moved on while we read: its claim word names the launch it holds.
    if ((sl.claim.load(std::memory_order_acquire) >> 32) != launch_id) return false;
    for (uint32_t i = 0; i < n; ++i) {
        pad_entry& p = d->pads[ids[i]];
        uint64_t st = p.state.load(std::memory_order_acquire);
        bool inside = false;
        for (;;) {
            if ((st >> 32) != gens[i] || (st & (kPadCut | kPadFinished | kPadFreed))) break;
            if (p.state.compare_exchange_weak(st, st + kPadOne, std::memory_order_acq_rel, std::memory_order_acquire)) {
                inside = true;
                break;
            }
        }
        if (!inside) continue;
        // Decided once, by the first worker in: the owner must be at this kernel, with no
        // other pad of it still able to run a block (an earlier one, cut, whose blocks are on
        // their way out). Pads of one owner ride different RT launches, and only the head
        // launch's pads are claimed: two never decide at once.
        uint32_t chk = p.check.load(std::memory_order_acquire);
        if (chk == 0) {
            uint32_t expect = 0;
            if (p.check.compare_exchange_strong(expect, 3, std::memory_order_acq_rel)) {  // 3: deciding
                const bool ok = p.owner->pads_running.load(std::memory_order_acquire) == 0 &&
                                p.owner->completed.load(std::memory_order_acquire) == p.kernel_index;
                if (ok) {
                    p.running.store(1, std::memory_order_relaxed);
                    p.owner->pads_running.fetch_add(1, std::memory_order_acq_rel);
                } else {
                    d->pads_skipped.fetch_add(1, std::memory_order_relaxed);
                    uint64_t s2 = p.state.load(std::memory_order_acquire);
                    while (!(s2 & kPadCut) &&
                           !p.state.compare_exchange_weak(s2, s2 | kPadCut, std::memory_order_acq_rel, std::memory_order_acquire)) {
                    }
                }
                chk = ok ? 1u : 2u;
                p.check.store(chk, std::memory_order_release);
            } else {
                chk = expect;  // 1 runs, 2 skipped, 3 another worker is deciding: not yet
            }
        }
        if (chk == 1) {
            const uint32_t b = p.next.fetch_add(1, std::memory_order_acq_rel);
            if (b < p.count && p.words.preempt.load(std::memory_order_acquire) == 0) {
                c.pad = &p;
                c.unit = b;
                return true;
            }
        }
        pad_leave(d, ids[i]);
    }
    return false;
}

void run_pad_block(cpu_device_state* d, worker& w, const claimed& c) {
    pad_entry& p = *c.pad;
    const uint32_t id = static_cast<uint32_t>(&p - d->pads.get());
    block_context ctx{p.offset + c.unit, p.grid, w.id, &p.words, w.scratch, w.scratch ? d->options.scratch_per_unit : 0};
    const bool ok = !ctx.preempted() && p.fn(p.args, ctx);
    if (!ok) {
        p.failed.store(1, std::memory_order_release);
    } else {
        d->pad_blocks.fetch_add(1, std::memory_order_relaxed);
        if (p.done.fetch_add(1, std::memory_order_acq_rel) + 1 == p.count && p.failed.load(std::memory_order_acquire) == 0) {
            // Every block ran: the pad ends finished unless its cut came first.
            uint64_t st = p.state.load(std::memory_order_acquire);
            bool finished = false;
            while (!(st & kPadCut)) {
                if (p.state.compare_exchange_weak(st, st | kPadFinished, std::memory_order_acq_rel, std::memory_order_acquire)) {
                    finished = true;
                    break;
                }
            }
            if (finished) {
                // No block is left to run: the owner's next pad may start once the counter moved.
                d->pads_completed.fetch_add(1, std::memory_order_relaxed);
                pad_stop_running(p);
                p.owner->completed.store(p.kernel_index + 1, std::memory_order_release);
            }
        }
    }
    pad_leave(d, id);
}

// Claims one block of the stream's head launch, if it has one left. Head launches of flagged
// tasks met on the way are evicted. When the head launch has no block left to hand out but
// carries pads, a pad block instead (DKP).
bool try_claim(cpu_device_state* d, cpu_stream* s, claimed& c) {
    for (;;) {
        const uint64_t h = s->head.load(std::memory_order_seq_cst);
        if (h == s->tail.load(std::memory_order_seq_cst)) return false;
        slot& sl = s->slots[h & s->mask];
        if (const uint32_t n = evict_if_flagged(d, sl, h)) {
            account(d, s, sl, n);
            continue;  // the next launch may be runnable now
        }
        const uint64_t id = static_cast<uint32_t>(h);
        uint64_t cw = sl.claim.load(std::memory_order_acquire);
        for (;;) {
            if ((cw >> 32) != id) return false;  // stale head: the slot moved on
            const uint32_t left = static_cast<uint32_t>(cw);
            if (left == 0) {                     // all dispatched; the next launch waits for it
                if (sl.n_pads == 0 || !try_claim_pad(d, sl, static_cast<uint32_t>(id), c)) return false;
                c.s = s;
                c.sl = &sl;
                return true;
            }
            if (sl.claim.compare_exchange_weak(cw, cw - 1, std::memory_order_acq_rel,
                                               std::memory_order_acquire)) {
                c.s = s;
                c.sl = &sl;
                c.unit = sl.units.load(std::memory_order_relaxed) - left;
                c.pad = nullptr;
                return true;
            }
        }
    }
}

// One pass over the streams in priority order. Marks the worker as reading the list.
bool scan(cpu_device_state* d, worker& w, claimed& c) {
    const uint64_t e = w.epoch.load(std::memory_order_relaxed);
    w.epoch.store(e + 1, std::memory_order_seq_cst);
    const stream_list* l = d->list.load(std::memory_order_seq_cst);
    bool got = false;
    if (l) {
        for (const auto& [b, end] : l->levels) {
            const uint32_t n = end - b;
            const uint32_t start = n > 1 ? w.rotate % n : 0;
            for (uint32_t i = 0; i < n && !got; ++i) {
                uint32_t k = start + i;
                if (k >= n) k -= n;
                cpu_stream* st = l->s[b + k];
                const uint64_t allowed = st->allowed.load(std::memory_order_relaxed);
                if (allowed != ~uint64_t{0} && !(allowed >> w.unit_bit & 1)) continue;
                got = try_claim(d, st, c);
            }
            if (got) break;
        }
    }
    w.epoch.store(e + 2, std::memory_order_release);
    if (got) ++w.rotate;
    return got;
}

// The last block of the head launch is done: advance the counter (unless it failed) and the
// head. Queued launches of flagged tasks behind it are evicted at once, in the same loop.
void finish_launch(cpu_device_state* d, cpu_stream* s, slot* sl) {
    for (;;) {
        // DKP: the pads end with their launch, before anyone can see it completed (a task
        // restored once the RT work is seen done must find no pad that could still start).
        for (uint32_t i = 0; i < sl->n_pads; ++i) pad_cut(d, sl->pad_ids[i], sl->pad_gens[i]);
        task_words* task = sl->task.load(std::memory_order_relaxed);
        if (task && sl->failed.load(std::memory_order_relaxed) == 0)
            task->completed.store(sl->kernel_index + 1, std::memory_order_release);
        const uint64_t h = s->head.load(std::memory_order_relaxed);
        // After this store the slot belongs to the producers again: do not touch it.
        s->head.store(h + 1, std::memory_order_seq_cst);
        const uint64_t t = s->tail.load(std::memory_order_seq_cst);
        s->progress.fetch_add(1, std::memory_order_seq_cst);
        if (s->waiters.load(std::memory_order_seq_cst) != 0 && h + 1 >= s->wake_at.load(std::memory_order_seq_cst))
            wake_word(s->progress, UINT32_MAX);
        if (t <= h + 1) return;

        slot& next = s->slots[(h + 1) & s->mask];
        if (const uint32_t n = evict_if_flagged(d, next, h + 1)) {
            const uint32_t units = next.units.load(std::memory_order_relaxed);
            if (next.done.fetch_add(n, std::memory_order_acq_rel) + n != units) return;
            sl = &next;
            continue;
        }
        // The next launch became runnable. This worker takes one block itself when it scans
        // again; wake sleepers for the others.
        // (A padded launch wakes them all: its pads take the units its own blocks leave.)
        const uint32_t units = next.n_pads || d->bound_streams.load(std::memory_order_relaxed)
                                   ? UINT32_MAX
                                   : next.units.load(std::memory_order_relaxed);
        d->work_seq.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t sleeping = d->sleepers.load(std::memory_order_seq_cst);
        if (sleeping != 0 && units > 1) wake_word(d->work_seq, std::min(sleeping, units - 1));
        return;
    }
}

void run_claimed(cpu_device_state* d, worker& w, const claimed& c) {
    if (c.pad) return run_pad_block(d, w, c);
    slot& sl = *c.sl;
    uint32_t accounted = 1;
    bool ok = true;
    task_words* task = sl.task.load(std::memory_order_relaxed);
    if (stopped(d, sl, task)) {
        ok = false;
    } else if (sl.count != 0) {
        block_context ctx{sl.offset + c.unit, sl.grid, w.id, task, w.scratch,
                          w.scratch ? d->options.scratch_per_unit : 0,
                          sl.level ? &d->level_epochs[sl.level] : nullptr, sl.epoch};
        ok = sl.fn(sl.args, ctx);
    }
    if (!ok) {
        // Preempted: no block of this launch is dispatched any more; account for the rest.
        sl.failed.store(1, std::memory_order_relaxed);
        uint64_t cw = sl.claim.load(std::memory_order_relaxed);
        while (static_cast<uint32_t>(cw) != 0) {
            if (sl.claim.compare_exchange_weak(cw, cw & kIdBits, std::memory_order_acq_rel,
                                               std::memory_order_relaxed)) {
                accounted += static_cast<uint32_t>(cw);
                break;
            }
        }
    }
    account(d, c.s, sl, accounted);
}

void worker_main(cpu_device_state* d, worker& w) {
#if defined(__x86_64__)
    // Flush denormals to zero (FTZ) and read them as zero (DAZ), as GPUs do for f32 kernels by
    // default: one denormal operand stalls an AVX-512 FMA ~100x (measured: 164 ms vs 1.6 ms
    // for one 256x3136x64 sgemm). Results differ from IEEE only below 1.2e-38.
    _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
    if (d->options.scratch_per_unit != 0) w.scratch = aligned_bytes(d->options.scratch_per_unit);
#if defined(__linux__)
    if (w.cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(w.cpu, &one);
        (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);  // unpinned if refused
    }
#endif
    claimed c{};
    while (!d->stop.load(std::memory_order_acquire)) {
        if (scan(d, w, c)) {
            run_claimed(d, w, c);
            continue;
        }
        // Idle: spin a while, then sleep until a producer or finisher bumps work_seq.
        bool got = false;
        spin_until([&] { return (got = scan(d, w, c)) || d->stop.load(std::memory_order_relaxed); }, kSpinNs);
        if (got) {
            run_claimed(d, w, c);
            continue;
        }
        if (d->stop.load(std::memory_order_relaxed)) break;
        d->sleepers.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t seq = d->work_seq.load(std::memory_order_seq_cst);
        const bool found = !d->stop.load(std::memory_order_seq_cst) && scan(d, w, c);
        if (!found && !d->stop.load(std::memory_order_seq_cst)) wait_word(d->work_seq, seq);
        d->sleepers.fetch_sub(1, std::memory_order_seq_cst);
        if (found) run_claimed(d, w, c);
    }
    std::free(w.scratch);
    w.scratch = nullptr;
}

// Waits until s->head >= target. Spins briefly, then sleeps on progress with the target
// registered, so that finishers wake it only when head reaches the least registered target.
// (A finisher reads waiters and wake_at after storing head; a waiter registers before it reads
// head: whichever comes second sees the other.)
void wait_progress(cpu_device_state* d, cpu_stream* s, uint64_t target) {
    const auto reached = [&] { return s->head.load(std::memory_order_seq_cst) >= target; };
    if (spin_until(reached, kWaiterSpinNs)) return;
    {
        std::lock_guard lk(s->wait_mu);
        s->wait_targets.push_back(target);
        if (target < s->wake_at.load(std::memory_order_relaxed)) s->wake_at.store(target, std::memory_order_seq_cst);
    }
    s->waiters.fetch_add(1, std::memory_order_seq_cst);
    for (;;) {
        const uint32_t p = s->progress.load(std::memory_order_seq_cst);
        if (reached() || d->stop.load(std::memory_order_seq_cst)) break;
        wait_word(s->progress, p);
    }
    s->waiters.fetch_sub(1, std::memory_order_seq_cst);
    std::lock_guard lk(s->wait_mu);
    s->wait_targets.erase(std::find(s->wait_targets.begin(), s->wait_targets.end(), target));
    uint64_t least = UINT64_MAX;
    for (const uint64_t w : s->wait_targets) least = std::min(least, w);
    s->wake_at.store(least, std::memory_order_seq_cst);
}

// Publishes a new dispatch list (device mutex held) and frees the old one after every worker
// has left the scan that may have been reading it.
void publish_list(cpu_device_state* d) {
    auto* l = new stream_list;
    for (auto& s : d->streams)
        if (s->live) l->s.push_back(s.get());
    std::stable_sort(l->s.begin(), l->s.end(),
                     [](const cpu_stream* a, const cpu_stream* b) { return a->priority < b->priority; });
    for (uint32_t i = 0; i < l->s.size();) {
        uint32_t j = i;
        while (j < l->s.size() && l->s[j]->priority == l->s[i]->priority) ++j;
        l->levels.emplace_back(i, j);
        i = j;
    }
    const stream_list* old = d->list.exchange(l, std::memory_order_seq_cst);
    if (!old) return;
    for (uint32_t i = 0; i < d->units; ++i) {
        const uint64_t e = d->workers[i].epoch.load(std::memory_order_seq_cst);
        if ((e & 1) == 0) continue;
        while (d->workers[i].epoch.load(std::memory_order_seq_cst) == e) std::this_thread::yield();
    }
    delete old;
}

// --- device_ops --------------------------------------------------------------------------------

void op_destroy(device* dev) {
    cpu_device_state* d = state_of(dev);
    d->stop.store(true, std::memory_order_seq_cst);
    d->work_seq.fetch_add(1, std::memory_order_seq_cst);
    wake_word(d->work_seq, UINT32_MAX);
    for (uint32_t i = 0; i < d->units; ++i)
        if (d->workers[i].thread.joinable()) d->workers[i].thread.join();
    {
        std::lock_guard lk(d->mu);
        for (auto& s : d->streams) {  // release anyone still waiting (a caller's bug)
            s->progress.fetch_add(1, std::memory_order_seq_cst);
            wake_word(s->progress, UINT32_MAX);
        }
        for (auto& [p, n] : d->allocs) std::free(p);
        for (cpu_event* e : d->events) delete e;
        for (task_words* w : d->words) {
            w->~task_words();
            std::free(w);
        }
    }
    delete d->list.load();
    delete d;
}

device_caps op_caps(const device* dev) {
    const cpu_device_state* d = state_of(dev);
    device_caps c;
    c.name = "cpu (" + std::to_string(d->units) + (d->units == 1 ? " compute unit)" : " compute units)");
    c.compute_units = d->units;
    c.max_queue_depth = d->options.queue_depth;
    c.lowest_priority = cpu_lowest_priority;
    c.highest_priority = cpu_highest_priority;
    c.scratch_per_unit = d->options.scratch_per_unit;
    return c;
}

void* op_alloc(device* dev, size_t bytes, memory_kind) {
    cpu_device_state* d = state_of(dev);
    void* p = aligned_bytes_or_null(bytes);
    if (!p) return nullptr;  // as a GPU backend answers: the caller reports what it could not have
    std::lock_guard lk(d->mu);
    d->allocs.emplace(p, bytes);
    return p;
}

void op_free(device* dev, void* p) {
    if (!p) return;
    cpu_device_state* d = state_of(dev);
    std::lock_guard lk(d->mu);
    if (d->allocs.erase(p) == 0) {
        std::fprintf(stderr, "reefline cpu device: free of %p, which it did not allocate\n", p);
        std::abort();
    }
    std::free(p);
}

bool op_register_host(device* dev, void* p, size_t bytes) {
    if (!p || bytes == 0) return false;
    cpu_device_state* d = state_of(dev);
    std::lock_guard lk(d->mu);
    d->registered[p] = bytes;  // host memory is already visible to the cpu device
    return true;
}

void op_unregister_host(device* dev, void* p) {
    cpu_device_state* d = state_of(dev);
    std::lock_guard lk(d->mu);
    d->registered.erase(p);
}

void op_copy(device*, void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
}

stream* op_stream_create(device* dev, int priority) {
    cpu_device_state* d = state_of(dev);
    priority = std::clamp(priority, cpu_highest_priority, cpu_lowest_priority);
    std::lock_guard lk(d->mu);
    cpu_stream* s = nullptr;
    for (auto& r : d->streams)
        if (!r->live) {
            s = r.get();  // reuse a destroyed stream; its indices go on growing
            break;
        }
    if (!s) {
        auto n = std::make_unique<cpu_stream>();
        n->depth = std::max<uint32_t>(1, d->options.queue_depth);
        uint32_t cap = 1;
        while (cap < n->depth) cap <<= 1;
        n->mask = cap - 1;
        n->slots = std::make_unique<slot[]>(cap);
        s = n.get();
        d->streams.push_back(std::move(n));
    }
    s->priority = priority;
    s->live = true;
    publish_list(d);
    return reinterpret_cast<stream*>(s);
}

void op_synchronize(device* dev, stream* st);

// Under the device mutex: binds `s` to `units` (~0: every unit), keeping bound_streams.
void bind_units(cpu_device_state* d, cpu_stream* s, uint64_t units) {
    const uint64_t before = s->allowed.exchange(units, std::memory_order_seq_cst);
    if ((before == ~uint64_t{0}) != (units == ~uint64_t{0}))
        d->bound_streams.fetch_add(units == ~uint64_t{0} ? uint32_t(-1) : 1u, std::memory_order_seq_cst);
}

void op_stream_destroy(device* dev, stream* st) {
    if (!st) return;
    cpu_device_state* d = state_of(dev);
    op_synchronize(dev, st);
    std::lock_guard lk(d->mu);
    as_cpu(st)->live = false;
    bind_units(d, as_cpu(st), ~uint64_t{0});  // a reused stream starts on every unit
    publish_list(d);
}

void op_stream_set_units(device* dev, stream* st, uint64_t units) {
    cpu_device_state* d = state_of(dev);
    const uint64_t all = every_unit_set(d->units);
    units &= all;
    if (units == 0 || units == all) units = ~uint64_t{0};
    else d->units_binds.fetch_add(1, std::memory_order_relaxed);
    {
        std::lock_guard lk(d->mu);
        bind_units(d, as_cpu(st), units);
    }
    // Units that may run its blocks now may be asleep.
    d->work_seq.fetch_add(1, std::memory_order_seq_cst);
    if (d->sleepers.load(std::memory_order_seq_cst) != 0) wake_word(d->work_seq, UINT32_MAX);
}

// Workers bind exactly: a set runs on its very units.
unit_grant op_unit_grant_of(device* dev, uint64_t units) {
    const cpu_device_state* d = state_of(dev);
    unit_grant g;
    const uint64_t all = every_unit_set(d->units);
    units &= all;
    if (units == 0 || units == all) {
        g.note = "every unit: the set is the whole device";
        return g;
    }
    g.bound = true;
    g.exact = true;
    g.units = units_in_set(units, d->units);
    g.count = uint32_t(g.units.size());
    g.note = "worker threads";
    return g;
}

unit_shares_info op_unit_shares(device* dev) {
    const cpu_device_state* d = state_of(dev);
    unit_shares_info i;
    i.mechanism = "workers";
    i.usable = d->units > 1;
    if (!i.usable) i.why = "one compute unit";
    i.binds = d->units_binds.load(std::memory_order_relaxed);
    return i;
}

void check_launch(const cpu_device_state* d, const launch& l) {
    if (!l.kernel || !l.kernel->cpu) throw std::invalid_argument("cpu device: launch without a cpu kernel");
    if (l.block_offset > l.grid || l.block_count > l.grid - l.block_offset)
        throw std::invalid_argument(std::string("cpu device: block slice outside the grid of ") +
                                    (l.kernel->name ? l.kernel->name : "?"));
    if (l.args_size != 0 && !l.args) throw std::invalid_argument("cpu device: args_size without args");
    if (l.kernel->scratch_bytes > d->options.scratch_per_unit)
        throw std::invalid_argument("cpu device: kernel needs more scratch than a compute unit has");
    if (l.level >= preempt_levels) throw std::invalid_argument("cpu device: preemption level out of range");
}

// Copies a launch's argument bytes into inline storage or a reused heap buffer.
const void* keep_args(const launch& l, unsigned char* inline_args,
                      std::unique_ptr<unsigned char, aligned_deleter>& heap, size_t& heap_cap) {
    if (l.args_size <= kInlineArgs) {
        if (l.args_size) std::memcpy(inline_args, l.args, l.args_size);
        return inline_args;
    }
    if (heap_cap < l.args_size) {
        heap.reset(static_cast<unsigned char*>(aligned_bytes(l.args_size)));
        heap_cap = round_up(l.args_size, kAlign);
    }
    std::memcpy(heap.get(), l.args, l.args_size);
    return heap.get();
}

void enqueue(cpu_device_state* d, cpu_stream* s, const launch& l, const launch* pads, uint32_t n_pads);

void op_launch(device* dev, stream* st, const launch& l) { enqueue(state_of(dev), as_cpu(st), l, nullptr, 0); }

void op_launch_padded(device* dev, stream* st, const launch& l, const launch* pads, uint32_t n_pads) {
    enqueue(state_of(dev), as_cpu(st), l, pads, n_pads);
}

device_ops::padding_counters op_padding_stats(const device* dev) {
    const cpu_device_state* d = state_of(dev);
    device_ops::padding_counters c;
    c.padded_launches = d->padded_launches.load(std::memory_order_relaxed);
    c.pads = d->pads_accepted.load(std::memory_order_relaxed);
    c.pads_completed = d->pads_completed.load(std::memory_order_relaxed);
    c.pads_cut = d->pads_cut.load(std::memory_order_relaxed);
    c.pads_skipped = d->pads_skipped.load(std::memory_order_relaxed);
    c.pad_blocks = d->pad_blocks.load(std::memory_order_relaxed);
    return c;
}

void enqueue(cpu_device_state* d, cpu_stream* s, const launch& l, const launch* pads, uint32_t n_pads) {
    if (!s) throw std::invalid_argument("cpu device: launch without a stream");
    check_launch(d, l);
    for (uint32_t i = 0; i < n_pads; ++i) {
        check_launch(d, pads[i]);
        if (!pads[i].task) throw std::invalid_argument("cpu device: a pad without task words");
    }
    // Pads take entries of the pool; a pad that finds none is dropped (it would only have
    // used idle units).
    uint32_t pad_ids[kMaxPadsPerLaunch], pad_gens[kMaxPadsPerLaunch], kept = 0;
    if (n_pads) {
        std::lock_guard lk(d->mu);
        for (uint32_t i = 0; i < n_pads && kept < kMaxPadsPerLaunch && !d->free_pads.empty(); ++i) {
            const uint32_t id = d->free_pads.back();
            d->free_pads.pop_back();
            pad_entry& p = d->pads[id];
            const launch& pl = pads[i];
            const uint32_t gen = static_cast<uint32_t>(p.state.load(std::memory_order_relaxed) >> 32) + 1;
            p.fn = pl.kernel->cpu;
            p.owner = pl.task;
            p.grid = pl.grid;
            p.offset = pl.block_offset;
            p.count = pl.block_count;
            p.kernel_index = pl.kernel_index;
            p.args = keep_args(pl, p.inline_args, p.heap, p.heap_cap);
            p.next.store(0, std::memory_order_relaxed);
            p.done.store(0, std::memory_order_relaxed);
            p.check.store(0, std::memory_order_relaxed);
            p.failed.store(0, std::memory_order_relaxed);
            p.running.store(0, std::memory_order_relaxed);
            p.words.preempt.store(0, std::memory_order_relaxed);
            pl.task->pads.fetch_add(1, std::memory_order_acq_rel);
            p.state.store(uint64_t{gen} << 32, std::memory_order_release);
            pad_ids[kept] = id;
            pad_gens[kept] = gen;
            ++kept;
        }
        d->padded_launches.fetch_add(kept ? 1 : 0, std::memory_order_relaxed);
        d->pads_accepted.fetch_add(kept, std::memory_order_relaxed);
    }

    std::unique_lock lk(s->producer);
    const uint64_t t = s->tail.load(std::memory_order_relaxed);
    wait_progress(d, s, t >= s->depth ? t - s->depth + 1 : 0);  // until a slot is free: t - head < depth
    if (d->stop.load(std::memory_order_relaxed)) return;

    slot& sl = s->slots[t & s->mask];
    sl.fn = l.kernel->cpu;
    sl.task.store(l.task, std::memory_order_relaxed);
    sl.grid = l.grid;
    sl.offset = l.block_offset;
    sl.count = l.block_count;
    sl.kernel_index = l.kernel_index;
    sl.level = l.level;
    sl.epoch = l.epoch;
    sl.args = keep_args(l, sl.inline_args, sl.heap, sl.heap_cap);
    sl.n_pads = kept;
    uint32_t pad_blocks = 0;
    for (uint32_t i = 0; i < kept; ++i) {
        sl.pad_ids[i] = pad_ids[i];
        sl.pad_gens[i] = pad_gens[i];
        pad_blocks += d->pads[pad_ids[i]].count;
    }
    const uint32_t units = std::max<uint32_t>(1, l.block_count);
    sl.units.store(units, std::memory_order_relaxed);
    sl.done.store(0, std::memory_order_relaxed);
    sl.failed.store(0, std::memory_order_relaxed);
    sl.claim.store(uint64_t{static_cast<uint32_t>(t)} << 32 | units, std::memory_order_release);
    s->tail.store(t + 1, std::memory_order_seq_cst);
    // Only a launch at the head is runnable now; later ones are woken by its predecessor's
    // last block (finish_launch).
    const bool at_head = s->head.load(std::memory_order_seq_cst) == t;
    lk.unlock();
    if (at_head) {
        d->work_seq.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t sleeping = d->sleepers.load(std::memory_order_seq_cst);
        if (sleeping != 0)
            wake_word(d->work_seq, d->bound_streams.load(std::memory_order_relaxed) ? UINT32_MAX
                                                                                    : std::min(sleeping, units + pad_blocks));
    }
}

uint32_t op_queued(device*, stream* st) {
    cpu_stream* s = as_cpu(st);
    const uint64_t h = s->head.load(std::memory_order_seq_cst);
    const uint64_t t = s->tail.load(std::memory_order_seq_cst);
    if (t <= h) return 0;
    uint32_t n = static_cast<uint32_t>(t - h);
    const slot& sl = s->slots[h & s->mask];
    const uint64_t cw = sl.claim.load(std::memory_order_acquire);
    const bool started = (cw >> 32) != static_cast<uint32_t>(h) ||
                         static_cast<uint32_t>(cw) != sl.units.load(std::memory_order_relaxed);
    return started ? n - 1 : n;
}

void op_synchronize(device* dev, stream* st) {
    cpu_device_state* d = state_of(dev);
    cpu_stream* s = as_cpu(st);
    const uint64_t t = s->tail.load(std::memory_order_seq_cst);
    wait_progress(d, s, t);
}

event* op_event_create(device* dev) {
    cpu_device_state* d = state_of(dev);
    auto* e = new cpu_event;
    std::lock_guard lk(d->mu);
    d->events.insert(e);
    return reinterpret_cast<event*>(e);
}

void op_event_destroy(device* dev, event* ev) {
    if (!ev) return;
    cpu_device_state* d = state_of(dev);
    std::lock_guard lk(d->mu);
    if (d->events.erase(as_cpu(ev))) delete as_cpu(ev);
}

void op_event_record(device*, event* ev, stream* st) {
    cpu_event* e = as_cpu(ev);
    cpu_stream* s = as_cpu(st);
    std::lock_guard pl(s->producer);  // orders the marker among this stream's launches
    std::lock_guard el(e->m);
    e->s = s;
    e->ticket = s->tail.load(std::memory_order_seq_cst);
}

bool op_event_query(device*, event* ev) {
    cpu_event* e = as_cpu(ev);
    std::lock_guard el(e->m);
    return !e->s || e->s->head.load(std::memory_order_seq_cst) >= e->ticket;
}

void op_event_synchronize(device* dev, event* ev) {
    cpu_event* e = as_cpu(ev);
    cpu_stream* s;
    uint64_t ticket;
    {
        std::lock_guard el(e->m);
        s = e->s;
        ticket = e->ticket;
    }
    if (!s) return;
    wait_progress(state_of(dev), s, ticket);
}

task_words* op_task_words_create(device* dev) {
    cpu_device_state* d = state_of(dev);
    std::lock_guard lk(d->mu);
    task_words* w;
    if (!d->recycled.empty()) {
        w = d->recycled.back();
        d->recycled.pop_back();
    } else {
        w = new (aligned_bytes(sizeof(task_words))) task_words{};
        d->words.insert(w);
    }
    w->preempt.store(0, std::memory_order_relaxed);
    w->completed.store(0, std::memory_order_relaxed);
    w->pads.store(0, std::memory_order_relaxed);
    w->pads_running.store(0, std::memory_order_relaxed);
    return w;
}

void op_task_words_destroy(device* dev, task_words* w) {
    if (!w) return;
    cpu_device_state* d = state_of(dev);
    std::lock_guard lk(d->mu);
    // Freed with the device; a second destroy of the same words (a caller's bug) is ignored.
    if (d->words.count(w) && std::find(d->recycled.begin(), d->recycled.end(), w) == d->recycled.end())
        d->recycled.push_back(w);
}

// Workers read the flag where the host writes it: a plain store is all it takes.
void op_task_flag_set(device*, task_words* w, uint32_t value) { w->preempt.store(value, std::memory_order_seq_cst); }

// The same for levels: a store per level raised, read by every check of their launches.
void op_raise_levels(device* dev, uint32_t mask) {
    cpu_device_state* d = state_of(dev);
    for (uint32_t l = 1; l < preempt_levels; ++l)
        if (mask >> l & 1) d->level_epochs[l].fetch_add(1, std::memory_order_seq_cst);
}

uint32_t op_level_epoch(const device* dev, uint32_t level) {
    return level < preempt_levels ? state_of(dev)->level_epochs[level].load(std::memory_order_seq_cst) : 0;
}

const device_ops cpu_ops = {
    .destroy = op_destroy,
    .caps = op_caps,
    .alloc = op_alloc,
    .free = op_free,
    .register_host = op_register_host,
    .unregister_host = op_unregister_host,
    .copy_to_device = op_copy,
    .copy_to_host = op_copy,
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
    // .kernel_resources_of: kernel_info's figures are the cpu kernels' own
    .stream_set_units = op_stream_set_units,
    .raise_levels = op_raise_levels,
    .level_epoch = op_level_epoch,
    .unit_grant_of = op_unit_grant_of,
    .unit_shares = op_unit_shares,
};

}  // namespace

std::unique_ptr<device> make_cpu_device(const cpu_device_options& options) {
    auto* d = new cpu_device_state;
    d->options = options;
    d->options.queue_depth = std::max<uint32_t>(1, options.queue_depth);
    uint32_t units = options.compute_units;
    if (units == 0) {
        const unsigned hc = std::thread::hardware_concurrency();
        units = hc > 1 ? hc - 1 : 1;
    }
    d->units = units;
    d->workers = std::make_unique<worker[]>(units);
    d->list.store(new stream_list);
    d->pads = std::make_unique<pad_entry[]>(kPadPool);
    for (uint32_t i = kPadPool; i-- > 0;) d->free_pads.push_back(i);
    auto dev = std::make_unique<device>(&cpu_ops, d);  // its destructor stops what started
    const std::vector<int> cpus = options.pin_units ? allowed_cpus() : std::vector<int>{};
    for (uint32_t i = 0; i < units; ++i) {
        d->workers[i].id = i;
        if (cpus.size() == units) d->workers[i].cpu = cpus[i];
        d->workers[i].unit_bit = i / unit_group(units);
        d->workers[i].thread = std::thread(worker_main, d, std::ref(d->workers[i]));
    }
    return dev;
}

}  // namespace reefline::gpu
