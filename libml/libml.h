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
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "libml/graph.h"
#include "libml/kernels/decomp.h"
#include "libml/onnx_import.h"
#include "libml/plan.h"
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
    // One entry per instance: its batch size and its bytes (arena, inputs region, gather list).
    std::vector<std::pair<int64_t, int64_t>> instances;

    int64_t instance_bytes() const {
        int64_t total = 0;
        for (const auto& [batch, bytes] : instances) total += bytes;
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

public:
    ~model();
};

// One instance of a model: its own arena, inputs, stream and task words.
class instance {
public:
    ~instance();
    int64_t batch() const { return _batch; }
    const plan& current_plan() const { return *_plan; }
    const graph& specialized() const { return _graph; }
    std::vector<tensor_desc> inputs() const;
    std::vector<tensor_desc> outputs() const;
    int64_t arena_bytes() const { return _plan ? _plan->arena_bytes() : 0; }
    gpu::task_words* task() const { return _task; }
    std::byte* input_memory() const { return static_cast<std::byte*>(_inputs); }
    // Device and host-mapped memory the instance holds now: arena, inputs region, gather list.
    int64_t memory_bytes() const { return int64_t(_arena_size + _inputs_size + _gather_list_size); }

private:
    friend class runtime;
    std::shared_ptr<model> _model;
    gpu::device* _device = nullptr;
    gpu::stream* _stream = nullptr;
    gpu::task_words* _task = nullptr;
    int64_t _batch = 0;
    graph _graph;
    std::unique_ptr<plan> _plan;
    void* _arena = nullptr;
    void* _inputs = nullptr;  // host-mapped: the gather kernel or the caller fills it
    void* _gather_list = nullptr;  // host-mapped: the gather kernel's segments and offsets
    size_t _gather_list_size = 0;
    size_t _arena_size = 0, _inputs_size = 0;
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
    void configure_batch(instance& in, int64_t batch);
    // Runs one batch: copies `inputs` (one per graph input, in order, the configured shapes)
    // into the instance, runs every launch and copies the outputs back.
    void infer_batch(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs);
    // For running an instance under the scheduler (preempt/scheduler.h): write its inputs,
    // submit task_launches() as a task, read its outputs once the task has completed.
    void write_inputs(instance& in, std::span<const tensor> inputs);
    std::vector<gpu::task_launch> task_launches(const instance& in) const;
    std::vector<tensor> read_outputs(const instance& in);

    // Runs a batch of u8 HWC images given as gather lists of payload fragments (as the data
    // plane reassembles them, read in place): the gather kernel writes the normalised f32
    // NCHW input tensor as kernel 0 of the task, then the model's kernels run. The instance
    // must be configured for batch = first.size() - 1, with one f32 [N, C, H, W] input.
    struct image_batch {
        std::span<const kernels::gather_segment> segments;
        std::span<const uint32_t> first;  // batch + 1 offsets into segments
        float mean[4] = {0, 0, 0, 0};
        float std[4] = {1, 1, 1, 1};
    };
    void infer_images(instance& in, const image_batch& images, std::vector<tensor>& outputs);
    // The same batch as a task for the scheduler: the gather kernel, then the model's kernels.
    // The gather list is copied into host-mapped memory the instance owns (kernels on any
    // backend read it there), so the launches stay valid while the task runs and until the
    // next image_task or infer_images on this instance. read_outputs() once it completed.
    std::vector<gpu::task_launch> image_task(instance& in, const image_batch& images);
    // The same, synchronising after every launch: `launch_ms[i]` is launch i's time. For
    // profiles (kprof) and finding hot kernels; slower than infer_batch.
    void infer_batch_profiled(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
                              std::vector<double>& launch_ms);

    gpu::device& device() { return _device; }

    // Footprints (see memory_footprint), with instances configured for `batches` whose image
    // batches arrive in at most `segments_per_image` gather segments per image (0: the
    // instances are not used with image_task). For an imported graph not loaded yet, and for
    // a loaded model (weights already counted where it was loaded: instances only). Throws
    // what plan::build throws for a graph the planner cannot run.
    memory_footprint footprint(const graph& imported, std::span<const int64_t> batches,
                               int64_t segments_per_image) const;
    memory_footprint footprint(const model& m, std::span<const int64_t> batches,
                               int64_t segments_per_image) const;
    // The gather list image_task() allocates at most for a batch of `batch` images of up to
    // `segments_per_image` segments each (it grows to twice what a batch needs).
    static int64_t gather_list_bytes(int64_t batch, int64_t segments_per_image);

private:
    // The plan configure_batch() builds for `batch`, and its specialized graph.
    std::pair<plan, graph> plan_for(const graph& imported, const plan::weight_layout& layout, int64_t batch) const;
    // (batch, bytes) of an instance configured for each of `batches`.
    std::vector<std::pair<int64_t, int64_t>> instance_bytes(const graph& imported, const plan::weight_layout& layout,
                                                            std::span<const int64_t> batches,
                                                            int64_t segments_per_image) const;
    void run(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
             std::vector<double>* launch_ms, const kernels::gather_args* gather = nullptr);
    kernels::gather_args gather_for(instance& in, const image_batch& images);
    static std::shared_ptr<model> finish_load(gpu::device& dev, graph g, std::string name);

    gpu::device& _device;
    plan_options _options;
};

}  // namespace reefline::ml
