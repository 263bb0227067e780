// The GPU scheduler (docs/architecture.md): REEF-style reset-based preemption
// of best-effort (BE) work by real-time (RT) work, and the baseline policies it is compared with.
//
// A task is an inference: its kernel launches in order (kernel, argument bytes, grid), a class
// (RT or BE) and a priority. It knows nothing of ONNX: libml builds tasks from its plans.
//
// Queues and streams: one RT queue bound to a stream of the device's highest priority; N BE
// queues, each bound to its own stream through a virtual host queue (vHQ). A vHQ holds the
// running task's pending launches on the host and keeps at most c of them outstanding on the
// device (closed loop on the task's completion counter). Each vHQ owns the task words (preempt
// flag, completion counter) of the task it runs; they live as long as the scheduler, so no
// launch on a stream ever sees freed words.
//
// One scheduler thread busy-polls the queues (it sleeps on a condition variable only after a
// spell of complete idleness). Policy reef: normal mode runs the BE vHQs concurrently; an RT
// arrival switches to real-time mode: every running BE task is preempted (its vHQ's pending
// list is detached in O(1) and handed to a reclamation thread that frees it, its preemption
// flag is raised so queued launches exit without running and running blocks exit at their next
// check point, and a drain marker (event) is recorded on its stream), and the RT task is
// launched at once. On a device with preemption levels (device_ops::raise_levels) every BE
// launch is made at one level, and submit() of an RT task raises that level itself, one write
// from the submitting thread, before the scheduler thread even gets a core: every BE launch made
// before it stops, queued or running, and no task flag is written or lowered. (Without levels
// submit() raises every BE queue's flag; only the scheduler thread clears a flag, after a
// drain.) When the RT queue is empty the scheduler goes back to normal mode and
// restores each preempted task once its stream has drained (the device note: a stale launch
// must never run after the flag is cleared): exact restore from the first kernel whose
// completion was not reached, or REEF's approximate restore from (last submitted - c).
//
// Results: a task submitted with on_done gets its result through the callback (which runs on
// the scheduler thread and must not block on the scheduler); without one, wait(id) returns it
// once (a second wait, or a wait on a callback task, returns status rejected at once).
// Nothing here depends on the backend or on ONNX; libml builds a task from a plan's
// planned_launch list (kernel, args bytes, grid).
#pragma once

#include "preempt/abacus.h"
#include "preempt/device.h"
#include "preempt/policy_registry.h"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace reefline::gpu {

enum class task_class : uint8_t { rt, be };

// reef: reset-based preemption (above).
// rt_only: BE tasks are rejected (status rejected): the RT latency reference.
// seq: one task at a time, RT first, never preempts (waits for the running task).
// streams: everything concurrent on streams (RT stream highest priority), never preempts.
// prema: one task at a time, token scheduling (PREMA, HPCA'20): tokens 1/3/9 for low/medium/
//   high priority (RT counts as high; BE: task.priority 0 low, 1 medium, >= 2 high); every
//   0.25 ms each waiting task gains its priority x its normalised slowdown (time waited over
//   its estimated isolated time); candidates are the tasks at or above the threshold (the
//   largest token count rounded down to a priority level); the shortest estimated remaining
//   job is picked. On preemption: DRAIN (let the running task finish) when its remaining time
//   is at most the candidate's, else KILL (flag, restore later). Estimates: task.est_us (from
//   per-kernel profiles) or kernels x a running average of measured kernel times.
// abacus: Abacus (SC'21), every task a query with a deadline (task.deadline_ns) run in
//   segments (launch ranges) within operator groups: each round issues one group and the next
//   starts when it has ended. The query with the least headroom (deadline - now; RT queries
//   before BE ones) runs to its end in the round; the others, in headroom order, add the
//   longest segment (binary search on its end) that keeps the group's predicted duration
//   within the lead's headroom (an RT lead: within 5% of its time alone). A query that cannot
//   meet its deadline even alone is dropped (status dropped). Predictions: the options'
//   predictor (abacus.h) for groups of models it covers, else the profiles' sums (task_launch
//   est_us: the segments back to back). An RT arrival preempts the round's BE segments
//   (reset, as reef), which resume exactly in a later round. DKP is off.
// (The policy enumeration and registry: preempt/policy_registry.h.)

enum class restore_mode : uint8_t { exact, approximate };

// reset: raise the flag (queued launches evicted, running blocks killed at a check point).
// wait: REEF-N style: the pending host list is still reset, but launches already on the device
// run to their end and the RT task is launched only once the BE streams have drained.
enum class preempt_mode : uint8_t { reset, wait };

// failed: the device refused a launch (e.g. a kernel the backend cannot run).
// dropped: abacus dropped it early, its deadline out of reach.
enum class task_status : uint8_t { completed, rejected, cancelled, failed, dropped };


// One kernel launch of a task (the whole grid). `args` is the kernel's argument struct.
// est_us and occupancy come from the kernel's profile on this device (kprof; 0: unknown).
struct task_launch {
    const kernel_info* kernel = nullptr;
    std::vector<std::byte> args;
    uint32_t grid = 1;
    float est_us = 0;        // time of the whole grid alone on the device
    uint32_t occupancy = 0;  // blocks one compute unit holds at once

    template <typename A>
    static task_launch make(const kernel_info* k, const A& a, uint32_t grid) {
        task_launch l;
        l.kernel = k;
        l.args.resize(sizeof(A));
        std::memcpy(l.args.data(), &a, sizeof(A));
        l.grid = grid;
        return l;
    }
};

using task_id = uint64_t;

struct task_result {
    task_id id = 0;
    task_class cls = task_class::be;
    task_status status = task_status::cancelled;
    uint32_t kernels = 0;
    uint32_t completed_kernels = 0;   // completion counter at the end
    uint32_t preemptions = 0;
    uint32_t restores = 0;
    uint64_t reexecuted_kernels = 0;  // completed kernels run again because of restores
    uint64_t lost_launches = 0;       // launches evicted or killed by preemptions
    int64_t submit_ns = 0, start_ns = 0, end_ns = 0;  // steady_clock
};

struct task {
    task_class cls = task_class::be;
    int priority = 0;       // prema: 0 low, 1 medium, >= 2 high (RT tasks count as high)
    double est_us = 0;      // prema: estimated isolated run time; 0: from measured averages
    int be_queue = -1;      // BE queue to use; -1: the one with the least work waiting
    // BE tasks: the compute units its blocks may run on (GSLICE's spatial share; bit u = unit u,
    // device_ops::stream_set_units); 0: every unit. RT tasks run on every unit whatever this
    // says (they preempt BE work in any share), and a bound BE task is never used as a DKP pad
    // (pads run where the RT kernel leaves units idle, which its share may not cover).
    uint64_t units = 0;
    // abacus: when the task must have ended (steady_clock ns; 0: no deadline, never dropped),
    // and its features for the predictor (abacus::segment): the predictor's model index (-1:
    // a model it does not cover), batch size and sequence length (0: none).
    int64_t deadline_ns = 0;
    int32_t model = -1;
    uint32_t batch = 1;
    uint32_t length = 0;
    std::vector<task_launch> launches;
    // Called on the scheduler thread when the task ends. Without it, the result is kept until
    // wait() collects it.
    std::function<void(const task_result&)> on_done;
};

// Dynamic kernel padding (DKP): what a BE queue offers to pad an RT kernel with (the next
// kernel of its preempted task), and the policy that chooses among the offers (dkp/ builds
// it: REEF's rules 1 and 2). The scheduler calls select() once per RT launch, on its own
// thread; it must be fast (REEF: 0.2-0.4 us).
struct pad_candidate {
    const task_launch* kernel;
    uint32_t queue;  // BE queue index
};

class pad_selector {
public:
    virtual ~pad_selector() = default;
    // Writes the indices (into `candidates`) of the pads chosen for `rt` on a device of
    // `units` compute units, at most `max`, to `out`; returns how many.
    virtual uint32_t select(const task_launch& rt, uint32_t units, const pad_candidate* candidates, uint32_t n,
                            uint32_t* out, uint32_t max) = 0;
};

// One operator group of the abacus policy, as it ended.
struct abacus_group {
    struct part {
        task_id id;
        task_class cls;
        uint32_t start, end, kernels;
    };
    std::vector<part> parts;       // the lead first
    // Every query considered when the group was planned (after drops), in the order the policy
    // ranked them: (id, class, headroom in us; +inf without a deadline).
    std::vector<std::tuple<task_id, task_class, double>> ranked;
    double predicted_us = 0, measured_us = 0;
    bool by_profile = false;       // predicted from profiles (a model the predictor lacks)
    bool preempted = false;        // an RT arrival cut its BE parts short
};

struct scheduler_options {
    policy pol = policy::reef;
    uint32_t be_queues = 4;
    uint32_t vhq_capacity = 4;         // c: launches outstanding on a BE stream
    restore_mode restore = restore_mode::exact;
    preempt_mode preempt = preempt_mode::reset;
    int64_t idle_spin_ns = 2'000'000;  // busy-poll this long when idle before sleeping
    // reef, reset: stop BE work by raising the device's preemption level of BE launches (one
    // write) where the device has levels; false: by raising each BE queue's task flag (the
    // earlier mechanism, kept for comparison in benchmarks).
    bool use_levels = true;
    // The scheduler thread on this CPU (-1: where the kernel puts it), spinning while it polls
    // instead of yielding the core between polls: an RT arrival is then seen within the poll
    // loop's own time, not after a thread that shares its core has run. For machines that can
    // give the dispatcher a core of its own (the cpu device's units on the others).
    int dispatcher_cpu = -1;
    // DKP (policy reef, on a device with launch_padded): RT kernels padded with BE kernels of
    // preempted tasks on the compute units they leave idle. Null: no padding.
    std::shared_ptr<pad_selector> padding;
    // abacus: the group predictor (null: profiles only), and a report of every group as it
    // ends (on the scheduler thread; must not block).
    std::shared_ptr<const abacus::predictor> predictor;
    std::function<void(const abacus_group&)> on_group;
};

// Selection times of DKP, in nanoseconds: a histogram (upper bounds; the last bucket is +Inf).
inline constexpr uint32_t select_ns_buckets[] = {50, 100, 150, 200, 300, 400, 500, 700, 1000, 1500, 2000, 5000, 10000, 50000};

struct scheduler_stats {
    uint64_t submitted = 0;
    uint64_t completed_rt = 0, completed_be = 0;
    uint64_t rejected = 0, cancelled = 0, failed = 0;
    uint64_t preemptions = 0;          // BE tasks preempted (one per task per RT episode)
    uint64_t restores = 0;
    uint64_t finished_in_drain = 0;    // preempted tasks whose last kernel completed anyway
    uint64_t reexecuted_kernels = 0;
    uint64_t lost_launches = 0;
    uint64_t rt_episodes = 0;          // normal -> real-time switches
    uint64_t reclaimed_lists = 0;      // detached pending lists freed by the reclamation thread
    uint64_t prema_drains = 0, prema_kills = 0;  // prema preemption decisions
    // abacus: groups run (by the predictor or by profiles), queries dropped, and the sums of
    // predicted and measured group durations (us) of the groups that ran to their end.
    uint64_t abacus_groups = 0, abacus_by_profile = 0, abacus_dropped = 0;
    double abacus_predicted_us = 0, abacus_measured_us = 0;
    // DKP: RT launches padded, pads issued, and selection times (histogram, sum, count).
    bool padding = false;
    uint64_t padded_launches = 0, pads_issued = 0;
    uint64_t select_count = 0, select_ns_sum = 0;
    uint64_t select_ns_hist[std::size(select_ns_buckets) + 1] = {};
};

class scheduler {
public:
    scheduler(device& dev, scheduler_options options = {});
    ~scheduler();  // shutdown()
    scheduler(const scheduler&) = delete;
    scheduler& operator=(const scheduler&) = delete;

    // Queues a task. After shutdown, the task ends at once with status rejected.
    task_id submit(task t);
    // Blocks until the task (submitted without on_done) ends; returns its result and forgets it.
    task_result wait(task_id id);
    scheduler_stats stats() const;
    const scheduler_options& options() const { return _opt; }

    // Stops the scheduler: tasks not finished are cancelled (running ones killed through their
    // flag), every callback runs, the streams drain, every resource is released. Idempotent.
    void shutdown();

    struct record;
    struct vhq;

private:
    void loop();
    void reclaim_loop();
    void intake();
    void finish(record* r, task_status st);
    // Starts r on q; pumps its first launches unless the caller pumps itself (reef pads them).
    void start_task(vhq& q, record* r, bool pump_now = true);
    // Binds q's stream to its task's units (BE queues; on a drained stream, before launches).
    void bind_units(vhq& q);
    // The vHQ's task flag, through the device (a GPU keeps the copy kernels read in device
    // memory). Lowering waits for the device's copy, so it is skipped when already down.
    void raise_flag(vhq& q);
    void lower_flag(vhq& q);
    void pump(vhq& q);
    // The device refused a launch of q's task: the task fails.
    void fail_launches(vhq& q);
    bool check_done(vhq& q);
    void preempt(vhq& q);
    bool try_restore(vhq& q);
    void cancel_all();

    device& _dev;
    scheduler_options _opt;
    // Reset-based preemption by level (reef, reset, a device with levels): BE launches are made
    // at be_level; an RT submit counts itself in _rt_submitted, then raises the level; the
    // loop counts the RT tasks it took in (_rt_intaken) and makes no BE launch while the two
    // differ.
    static constexpr uint32_t be_level = 1;
    bool _levels = false;
    std::atomic<uint64_t> _rt_submitted{0};
    uint64_t _rt_intaken = 0;

    // Submission (any thread).
    std::mutex _in_mu;
    std::condition_variable _in_cv;
    std::vector<record*> _incoming;
    std::atomic<uint64_t> _incoming_n{0};
    std::atomic<bool> _stop{false};
    bool _stopped = false;  // guarded by _in_mu
    task_id _next_id = 1;

    // Results for wait().
    std::mutex _res_mu;
    std::condition_variable _res_cv;
    std::unordered_map<task_id, task_result> _results;
    std::unordered_map<task_id, bool> _waitable;  // submitted without callback, not yet ended

    // Scheduler-thread state: the vHQs, the policy that decides what they do
    // (preempt/policies/), and a running average of a kernel's time (for tasks without
    // profiles).
    std::unique_ptr<vhq> _rt;
    std::vector<std::unique_ptr<vhq>> _be;
    std::unique_ptr<scheduling_policy> _policy;
    double _kernel_est_us = 100;
    friend class scheduling_policy;

    // Reclamation: lists detached in a step (scheduler thread), then handed to the thread.
    std::vector<std::unique_ptr<std::vector<launch>>> _rc_local;
    void hand_over_reclaim();
    std::mutex _rc_mu;
    std::condition_variable _rc_cv;
    std::vector<std::unique_ptr<std::vector<launch>>> _rc_queue;
    bool _rc_stop = false;

    mutable std::mutex _st_mu;
    scheduler_stats _stats;

    std::thread _thread, _reclaimer;
};

}  // namespace reefline::gpu
