// The IF API (GSLICE's libml): init, deinit, load_model, link_model, configure_batch,
// infer_batch, plus the queries later layers need.
//
//   ml::runtime rt(device);                       // init (deinit: destructor)
//   auto m = rt.load_model("resnet50.onnx");      // import, fold, upload weights once
//   auto a = rt.link_model(m);                    // an instance; weights shared with m's others
//   rt.configure_batch(*a, 8);                    // plan for batch 8 (arena, inputs, launches)
//   rt.infer_batch(*a, inputs, outputs);          // run on the device, synchronously
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dkp/profile.h"
#include "libml/frontend/graph.h"
#include "libml/kernels/decomp.h"
#include "libml/frontend/onnx_import.h"
#include "libml/planner/plan.h"
#include "libml/runtime/request_input.h"
#include "preempt/device.h"
#include "preempt/scheduler.h"

namespace reefline::ml {

struct tensor_desc {
    std::string name;
    dtype type;
    shape_t shape;  // for the configured batch size
};

// What a model and its instances take in memory, from the graph and its plans, computed
// without allocating anything: the admission check of a memory budget runs before a model
// is loaded or a batch size planned.
struct memory_footprint {
    int64_t weight_bytes = 0;   // device: the weights region, one per loaded model
    int64_t host_bytes = 0;     // host: the constants a loaded model keeps (plans are built from them)
    int64_t staging_bytes = 0;  // host, while loading only: the buffer the weights are uploaded from
    // One entry per instance: its batch size and its bytes (inputs regions, gather list, and
    // its arena unless it shares one).
    std::vector<std::pair<int64_t, int64_t>> instances;
    // The shared arenas, one per group of instances that share one (footprint's groups).
    std::vector<int64_t> arenas;

    // Everything the instances hold: their own bytes and the arenas they share.
    int64_t instance_bytes() const {
        int64_t total = 0;
        for (const auto& [batch, bytes] : instances) total += bytes;
        for (const int64_t a : arenas) total += a;
        return total;
    }
    // What loading the model and then planning every instance needs at its peak: the staging
    // buffer is freed once the weights are uploaded, before any instance exists.
    int64_t peak_bytes() const { return weight_bytes + host_bytes + std::max(staging_bytes, instance_bytes()); }
};

// A loaded model: its batch-independent graph and its weights on the device.
class model {
public:
    const std::string& name() const { return _name; }
    const graph& generic() const { return *_generic; }
    // The graph as imported (batch as in the file), which every instance is specialized from.
    const graph& imported() const { return _imported; }
    int64_t weight_bytes() const { return _layout.bytes; }
    // Host memory the model keeps: its constants (shared by its graphs and weight layout).
    int64_t host_bytes() const { return _host_bytes; }
    const void* weights() const { return _weights; }
    int instances() const { return _instances; }
    // What requests the model takes (request_input.h), derived once on first use. Throws
    // std::invalid_argument when the model's inputs fit no request format.
    const request_input& requests() const;

private:
    friend class runtime;
    friend class instance;
    std::string _name;
    std::shared_ptr<const graph> _generic;
    graph _imported;  // as imported (batch as in the file): re-specialized per batch size
    plan::weight_layout _layout;
    void* _weights = nullptr;  // device memory
    gpu::device* _device = nullptr;
    int _instances = 0;
    int64_t _host_bytes = 0;
    mutable std::once_flag _requests_once;
    mutable std::optional<request_input> _requests;
    mutable std::string _requests_error;

public:
    ~model();
};

class instance;

// Device memory for intermediate tensors that instances use in turn: an IF lane's instances
// (one per planned batch size; the lane runs one batch at a time), so that the lane holds one
// arena the size of its largest plan's instead of one per batch size. Only for instances whose
// tasks are never in flight at once: a preempted task resumes from what it left in the arena.
// Grows when configure_batch() plans an instance that needs more; the instances that share it
// are then bound to the new memory (so none of their tasks may be in flight then either).
// Not thread-safe: configure and destroy the instances that share one from one thread at a
// time (an IF's control thread does both).
class shared_arena {
public:
    ~shared_arena();
    int64_t bytes() const { return int64_t(_size); }
    size_t users() const { return _users.size(); }

private:
    friend class runtime;
    friend class instance;
    gpu::device* _device = nullptr;
    void* _memory = nullptr;
    size_t _size = 0;
    std::vector<instance*> _users;
};

// One instance of a model: its own arena (or a shared one), inputs, stream and task words. A sequence model's
// instance holds a plan per length bucket; they share the arena (one batch runs at a time)
// and each has its own inputs region (which holds the constants only its length has).
class instance {
public:
    ~instance();
    int64_t batch() const { return _batch; }
    // The selected plan: the one the last task or inference ran (or the longest length).
    const plan& current_plan() const { return *selected().p; }
    const graph& specialized() const { return selected().g; }
    std::vector<tensor_desc> inputs() const;
    std::vector<tensor_desc> outputs() const;
    // The arena the instance's plans use (its own, or the shared arena's size).
    int64_t arena_bytes() const { return _shared ? _shared->bytes() : int64_t(_arena_size); }
    const std::shared_ptr<shared_arena>& shared() const { return _shared; }
    gpu::task_words* task() const { return _task; }
    // The selected plan's inputs region: device memory, which the host writes and reads only
    // through the device's copies (copy_to_device, copy_to_host).
    std::byte* input_memory() const { return static_cast<std::byte*>(selected().inputs); }
    // The planned sequence lengths (empty: one plan at the model's own input shapes) and the
    // selected plan's length (0 for such a plan).
    std::vector<int64_t> lengths() const;
    int64_t length() const { return selected().length; }
    // Device and host-mapped memory the instance holds now: its own arena (not a shared one:
    // shared() says), inputs regions, gather list.
    int64_t memory_bytes() const;

private:
    friend class runtime;
    struct variant {
        int64_t length = 0;
        graph g;
        std::unique_ptr<plan> p;
        void* inputs = nullptr;  // device memory: the gather kernel or the caller (copy_to_device) fills it
        size_t inputs_size = 0;
        // From the plan's kernel profile (apply_profile), per launch; empty: not profiled.
        std::vector<float> est_us;
        std::vector<uint32_t> occupancy;
    };
    const variant& selected() const { return _variants[_selected]; }
    void free_variants();

    std::shared_ptr<model> _model;
    gpu::device* _device = nullptr;
    gpu::stream* _stream = nullptr;
    gpu::task_words* _task = nullptr;
    int64_t _batch = 0;
    std::vector<variant> _variants;
    size_t _selected = 0;
    void* _arena = nullptr;  // own; null while the instance uses _shared
    size_t _arena_size = 0;
    std::shared_ptr<shared_arena> _shared;
    std::byte* arena_memory() const { return static_cast<std::byte*>(_shared ? _shared->_memory : _arena); }
    void leave_shared();
    // Host-mapped: the gather kernel's segments and offsets, then (sequences) its token errors.
    void* _gather_list = nullptr;
    size_t _gather_list_size = 0;
    const kernels::token_error* _token_errors = nullptr;
    int64_t _token_blocks_per_request = 0, _token_requests = 0;
};

class runtime {
public:
    explicit runtime(gpu::device& device, plan_options options = {});  // init
    ~runtime();                                                        // deinit

    std::shared_ptr<model> load_model(const std::string& path, const import_options& opts = {});
    std::shared_ptr<model> load_model_buffer(const void* data, size_t size, const std::string& name,
                                             const import_options& opts = {});
    // Takes an already imported (possibly re-specialized) graph.
    std::shared_ptr<model> load_graph(graph g, const std::string& name);
    std::unique_ptr<instance> link_model(const std::shared_ptr<model>& m, int stream_priority = 0);
    // Plans the instance for `batch` at the model's own input shapes (one plan), or for a
    // sequence model at each of `lengths` (a plan per length; request_input::lengths). With
    // `arena`, the plans use that shared arena (grown if they need more) and the instance
    // frees its own.
    void configure_batch(instance& in, int64_t batch, std::span<const int64_t> lengths = {},
                         const std::shared_ptr<shared_arena>& arena = nullptr);
    // An empty shared arena on this device, for configure_batch() to size.
    std::shared_ptr<shared_arena> make_shared_arena();
    // Runs one batch: copies `inputs` (one per graph input, in order, the configured shapes;
    // for an instance with a plan per length, the shapes select the plan) into the instance,
    // runs every launch and copies the outputs back.
    void infer_batch(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs);
    // Binds the instance's own stream (infer_batch's launches) to these compute units (a
    // spatial share, device_ops::stream_set_units; ~0: every unit). False on a device without
    // shares. Call between batches.
    bool set_units(instance& in, uint64_t units);
    // For running an instance under the scheduler (preempt/scheduler.h): write its inputs,
    // submit task_launches() as a task, read its outputs once the task has completed.
    void write_inputs(instance& in, std::span<const tensor> inputs);
    std::vector<gpu::task_launch> task_launches(const instance& in) const;
    std::vector<tensor> read_outputs(const instance& in);

    // A batch of requests given as gather lists of payload fragments (as the data plane
    // reassembles them, read in place), in the model's request format (model::requests()):
    // the gather kernel writes the model's input tensors as kernel 0 of the task, then the
    // model's kernels run. Images: u8 HWC -> f32 NCHW normalised with mean/std. Token
    // sequences: ids, attention mask and token types at `length` (a planned length at least
    // as long as every request); tokens outside the vocabulary are replaced by 0 and reported
    // by token_errors(). Tensors: f32 as they are. The instance must be configured for batch
    // = first.size() - 1 (and `length`, for sequences).
    struct request_batch {
        std::span<const kernels::gather_segment> segments;
        std::span<const uint32_t> first;  // batch + 1 offsets into segments
        float mean[4] = {0, 0, 0, 0};     // images
        float std[4] = {1, 1, 1, 1};
        int64_t length = 0;               // sequences
    };
    void infer_requests(instance& in, const request_batch& batch, std::vector<tensor>& outputs);
    // The same batch as a task for the scheduler. The gather list is copied into host-mapped
    // memory the instance owns (kernels on any backend read it there), with, for images on GPU
    // backends, a descriptor per gather block (kernels::gather_block_desc), so the launches stay
    // valid while the task runs and until the next request_task or infer_requests on this
    // instance. read_outputs() (and token_errors()) once it completed.
    std::vector<gpu::task_launch> request_task(instance& in, const request_batch& batch);
    // After a sequence batch: per request, the first token outside the vocabulary (position
    // -1: none).
    std::vector<kernels::token_error> token_errors(const instance& in) const;
    // Kernel profiles (kprof; dkp/profile.h). profile_name: the name and key the selected plan
    // of `in` is profiled under ("b4" or "b4_l32"; the key changes when the plan does).
    std::pair<std::string, std::string> profile_name(const instance& in) const;
    // Measures every launch of the selected plan alone on the device: each launch `runs`
    // times back to back after the launches before it ran once (a kernel reads what they
    // wrote), median per launch. `run_alone`, when given, runs launches instead of the
    // device directly and returns their time in microseconds: the daemon submits them to the
    // scheduler as BE tasks, so that RT traffic preempts profiling.
    using launch_runner = std::function<double(std::vector<gpu::task_launch>)>;
    dkp::plan_profile profile(instance& in, int runs = 5, const launch_runner& run_alone = {});
    // Gives the instance's plan of that name its launches' profiled time and occupancy, which
    // task_launches() then carries (DKP's rules, PREMA's estimates). False (nothing applied)
    // when the profile's key or launch count does not match the plan.
    bool apply_profile(instance& in, const dkp::plan_profile& p);
    // Selects the plan of a sequence instance at `length` (what profile() and task_launches()
    // use). False when the instance has no plan at that length.
    bool select_length(instance& in, int64_t length);
    // The same, synchronising after every launch: `launch_ms[i]` is launch i's time. For
    // profiles (kprof) and finding hot kernels; slower than infer_batch.
    void infer_batch_profiled(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
                              std::vector<double>& launch_ms);

    gpu::device& device() { return _device; }

    // Footprints (see memory_footprint), with instances configured for `batches` (at each
    // of `lengths`, for a sequence model) whose requests arrive in at most
    // `segments_per_request` gather segments each (0: the instances are not used with
    // request_task). For an imported graph not loaded yet, and for a loaded model (weights
    // already counted where it was loaded: instances only). Throws what plan::build throws
    // for a graph the planner cannot run.
    memory_footprint footprint(const graph& imported, std::span<const int64_t> batches,
                               int64_t segments_per_request, std::span<const int64_t> lengths = {}) const;
    memory_footprint footprint(const model& m, std::span<const int64_t> batches,
                               int64_t segments_per_request, std::span<const int64_t> lengths = {}) const;
    // The same with the instances in groups that each share one arena (make_shared_arena):
    // an IF's lanes, each with an instance per batch size.
    memory_footprint footprint(const graph& imported, std::span<const std::vector<int64_t>> groups,
                               int64_t segments_per_request, std::span<const int64_t> lengths = {}) const;
    memory_footprint footprint(const model& m, std::span<const std::vector<int64_t>> groups,
                               int64_t segments_per_request, std::span<const int64_t> lengths = {}) const;
    // The gather list request_task() allocates at most for a batch of `batch` requests of up to
    // `segments_per_request` segments each and (sequences) up to `max_length` tokens, with
    // (images on GPU backends) a descriptor for each of `image_blocks_per_request` gather
    // blocks per request (it grows to twice what a batch needs).
    static int64_t gather_list_bytes(int64_t batch, int64_t segments_per_request, int64_t max_length = 0,
                                     int64_t image_blocks_per_request = 0);

private:
    // The image gather's blocks per request whose descriptors the gather list holds on this
    // runtime's device (0: not an image model, or the cpu device, whose blocks need none).
    int64_t image_blocks_per_request(const graph& imported) const;
    // The plan configure_batch() builds for `batch` (at `length`, for a sequence model; 0:
    // the imported shapes), and its specialized graph.
    std::pair<plan, graph> plan_for(const graph& imported, const plan::weight_layout& layout, int64_t batch,
                                    int64_t length = 0) const;
    // (batch, bytes) of an instance configured for each of `batches`. With `shared_arena`, the
    // instances share one: their bytes leave it out and *shared_arena is its size.
    std::vector<std::pair<int64_t, int64_t>> instance_bytes(const graph& imported, const plan::weight_layout& layout,
                                                            std::span<const int64_t> batches, int64_t segments_per_request,
                                                            std::span<const int64_t> lengths,
                                                            int64_t* shared_arena = nullptr) const;
    void add_groups(memory_footprint& f, const graph& imported, const plan::weight_layout& layout,
                    std::span<const std::vector<int64_t>> groups, int64_t segments_per_request,
                    std::span<const int64_t> lengths) const;
    void run(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
             std::vector<double>* launch_ms, const gpu::task_launch* gather = nullptr);
    gpu::task_launch gather_for(instance& in, const request_batch& batch);
    static std::shared_ptr<model> finish_load(gpu::device& dev, graph g, std::string name);

    gpu::device& _device;
    plan_options _options;
};

}  // namespace reefline::ml
