#include "libml/libml.h"

#include "libml/kernels/kernels.h"

#include <chrono>
#include <cstring>
#include <set>

namespace reefline::ml {

namespace {

// What configure_batch() allocates for a plan: the regions never smaller than 64 bytes.
int64_t arena_allocation(const plan& p) { return std::max<int64_t>(p.arena_bytes(), 64); }
int64_t inputs_allocation(const plan& p) { return std::max<int64_t>(p.input_bytes(), 64); }
// What gather_for() allocates when a batch needs `needed` bytes of gather list: twice that, so
// that batches of slightly more segments do not reallocate every time.
size_t gather_list_allocation(size_t needed) { return std::max<size_t>(4096, 2 * needed); }

// Bytes of the distinct constants of a graph and of the batch-independent form it came from
// (specializations share most of their data).
int64_t distinct_constant_bytes(const graph& g) {
    std::set<const bytes_t*> seen;
    int64_t total = 0;
    auto add = [&](const graph& x) {
        for (const value& v : x.values)
            if (v.data && seen.insert(v.data.get()).second) total += int64_t(v.data->size());
    };
    add(g);
    if (g.generic()) add(*g.generic());
    return total;
}

}  // namespace

model::~model() {
    if (_weights) _device->free(_weights);
}

instance::~instance() {
    if (_stream) {
        _device->synchronize(_stream);
        _device->ops().stream_destroy(_device, _stream);
    }
    if (_task) _device->ops().task_words_destroy(_device, _task);
    if (_arena) _device->free(_arena);
    if (_inputs) _device->free(_inputs);
    if (_gather_list) _device->free(_gather_list);
    if (_model) --_model->_instances;
}

std::vector<tensor_desc> instance::inputs() const {
    std::vector<tensor_desc> d;
    for (int v : _graph.inputs) d.push_back({_graph.values[size_t(v)].name, _graph.values[size_t(v)].type, _graph.values[size_t(v)].shape});
    return d;
}

std::vector<tensor_desc> instance::outputs() const {
    std::vector<tensor_desc> d;
    for (int v : _graph.outputs) d.push_back({_graph.values[size_t(v)].name, _graph.values[size_t(v)].type, _graph.values[size_t(v)].shape});
    return d;
}

runtime::runtime(gpu::device& device, plan_options options) : _device(device), _options(options) {
    if (_options.tiles == plan_options::tiles_for::device)
        _options.tiles = device.caps().gpu ? plan_options::tiles_for::gpu : plan_options::tiles_for::cpu;
}
runtime::~runtime() = default;

std::shared_ptr<model> runtime::finish_load(gpu::device& dev, graph g, std::string name) {
    auto m = std::make_shared<model>();
    m->_name = std::move(name);
    m->_device = &dev;
    m->_layout = plan::layout_weights(g);
    m->_host_bytes = distinct_constant_bytes(g);
    m->_generic = g.generic() ? g.generic() : std::make_shared<const graph>(g);
    m->_imported = std::move(g);
    if (m->_layout.bytes) {
        m->_weights = dev.alloc(size_t(m->_layout.bytes));
        if (!m->_weights) throw std::bad_alloc();
        std::vector<std::byte> host(size_t(m->_layout.bytes));
        plan::fill_weights(m->_layout, host.data());
        dev.ops().copy_to_device(&dev, m->_weights, host.data(), host.size());
    }
    return m;
}

std::shared_ptr<model> runtime::load_model(const std::string& path, const import_options& opts) {
    const auto slash = path.find_last_of('/');
    return finish_load(_device, import_onnx(path, opts), slash == std::string::npos ? path : path.substr(slash + 1));
}

std::shared_ptr<model> runtime::load_model_buffer(const void* data, size_t size, const std::string& name,
                                                  const import_options& opts) {
    return finish_load(_device, import_onnx_buffer(data, size, opts, name), name);
}

std::shared_ptr<model> runtime::load_graph(graph g, const std::string& name) {
    return finish_load(_device, std::move(g), name);
}

std::unique_ptr<instance> runtime::link_model(const std::shared_ptr<model>& m, int stream_priority) {
    auto in = std::make_unique<instance>();
    in->_model = m;
    in->_device = &_device;
    in->_stream = _device.create_stream(stream_priority);
    in->_task = _device.ops().task_words_create(&_device);
    ++m->_instances;
    configure_batch(*in, m->_imported.batch > 0 ? m->_imported.batch : 1);
    return in;
}

std::pair<plan, graph> runtime::plan_for(const graph& imported, const plan::weight_layout& layout, int64_t batch) const {
    graph g = imported;
    if (g.batch > 0 && g.batch != batch) g.set_batch(batch);
    // Constants a specialization created that the model's weights lack are placed in the
    // instance's inputs region by the plan; the rest come from the shared weights.
    plan p = plan::build(g, layout, _options);
    return {std::move(p), std::move(g)};
}

int64_t runtime::gather_list_bytes(int64_t batch, int64_t segments_per_image) {
    if (segments_per_image <= 0) return 0;
    const size_t needed = size_t(batch * segments_per_image) * sizeof(kernels::gather_segment) +
                          size_t(batch + 1) * sizeof(uint32_t);
    return int64_t(gather_list_allocation(needed));
}

std::vector<std::pair<int64_t, int64_t>> runtime::instance_bytes(const graph& imported, const plan::weight_layout& layout,
                                                                 std::span<const int64_t> batches,
                                                                 int64_t segments_per_image) const {
    // link_model() configures the imported batch first; configure_batch() then replaces the
    // arena and the inputs region only with larger ones: the larger of the two plans stays.
    const int64_t first = imported.batch > 0 ? imported.batch : 1;
    const plan first_plan = plan_for(imported, layout, first).first;
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const int64_t b : batches) {
        int64_t arena = arena_allocation(first_plan), inputs = inputs_allocation(first_plan);
        if (b != first) {
            const plan p = plan_for(imported, layout, b).first;
            arena = std::max(arena, arena_allocation(p));
            inputs = std::max(inputs, inputs_allocation(p));
        }
        out.emplace_back(b, arena + inputs + gather_list_bytes(b, segments_per_image));
    }
    return out;
}

memory_footprint runtime::footprint(const graph& imported, std::span<const int64_t> batches,
                                    int64_t segments_per_image) const {
    memory_footprint f;
    const plan::weight_layout layout = plan::layout_weights(imported);
    f.weight_bytes = layout.bytes;
    f.host_bytes = distinct_constant_bytes(imported);
    f.staging_bytes = layout.bytes;
    f.instances = instance_bytes(imported, layout, batches, segments_per_image);
    return f;
}

memory_footprint runtime::footprint(const model& m, std::span<const int64_t> batches, int64_t segments_per_image) const {
    memory_footprint f;
    if (!batches.empty()) f.instances = instance_bytes(m._imported, m._layout, batches, segments_per_image);
    return f;
}

void runtime::configure_batch(instance& in, int64_t batch) {
    auto [built, g] = plan_for(in._model->_imported, in._model->_layout, batch);
    auto p = std::make_unique<plan>(std::move(built));
    const size_t arena = size_t(arena_allocation(*p));
    const size_t inputs = size_t(inputs_allocation(*p));
    if (arena > in._arena_size) {
        if (in._arena) _device.free(in._arena);
        in._arena = _device.alloc(arena);
        in._arena_size = arena;
    }
    if (inputs > in._inputs_size) {
        if (in._inputs) _device.free(in._inputs);
        in._inputs = _device.alloc(inputs, gpu::memory_kind::host_mapped);
        in._inputs_size = inputs;
    }
    if (!in._arena || !in._inputs) throw std::bad_alloc();
    p->bind({static_cast<std::byte*>(in._model->_weights), static_cast<std::byte*>(in._arena),
             static_cast<std::byte*>(in._inputs)});
    in._plan = std::move(p);
    in._graph = std::move(g);
    in._batch = batch;
}

void runtime::infer_batch(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs) {
    run(in, inputs, outputs, nullptr);
}

void runtime::infer_batch_profiled(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
                                   std::vector<double>& launch_ms) {
    run(in, inputs, outputs, &launch_ms);
}

void runtime::write_inputs(instance& in, std::span<const tensor> inputs) {
    const plan& p = *in._plan;
    if (inputs.size() != p.inputs().size())
        throw std::invalid_argument("infer_batch: " + std::to_string(inputs.size()) + " inputs given, the model takes " +
                                    std::to_string(p.inputs().size()));
    for (size_t i = 0; i < inputs.size(); ++i) {
        const tensor_location& loc = p.inputs()[i];
        if (inputs[i].type != loc.type || inputs[i].shape != loc.shape)
            throw std::invalid_argument("infer_batch: input " + std::to_string(i) + " is " + dtype_name(inputs[i].type) +
                                        shape_str(inputs[i].shape) + ", expected " + dtype_name(loc.type) + shape_str(loc.shape));
        if (inputs[i].bytes())
            std::memcpy(static_cast<std::byte*>(in._inputs) + loc.offset, inputs[i].data->data(), inputs[i].bytes());
    }
}

std::vector<gpu::task_launch> runtime::task_launches(const instance& in) const {
    std::vector<gpu::task_launch> out;
    for (const planned_launch& l : in._plan->launches()) {
        gpu::task_launch t;
        t.kernel = l.kernel;
        t.args = l.args;
        t.grid = l.grid;
        out.push_back(std::move(t));
    }
    return out;
}

std::vector<tensor> runtime::read_outputs(const instance& in) {
    std::vector<tensor> outputs;
    for (const tensor_location& loc : in._plan->outputs()) {
        const size_t bytes = dtype_size(loc.type) * size_t(element_count(loc.shape));
        bytes_t host(bytes);
        if (bytes) {
            const std::byte* src = loc.where == region::weights ? static_cast<const std::byte*>(in._model->_weights)
                                   : loc.where == region::arena  ? static_cast<const std::byte*>(in._arena)
                                                                  : static_cast<const std::byte*>(in._inputs);
            _device.ops().copy_to_host(&_device, host.data(), src + loc.offset, bytes);
        }
        outputs.push_back(tensor::make(loc.type, loc.shape, std::move(host)));
    }
    return outputs;
}

kernels::gather_args runtime::gather_for(instance& in, const image_batch& images) {
    const plan& p = *in._plan;
    if (p.inputs().size() != 1 || p.inputs()[0].type != dtype::f32 || p.inputs()[0].shape.size() != 4)
        throw std::invalid_argument("infer_images: the model's input is not one f32 [N, C, H, W] tensor");
    const shape_t& s = p.inputs()[0].shape;
    if (int64_t(images.first.size()) != s[0] + 1)
        throw std::invalid_argument("infer_images: " + std::to_string(images.first.size() - 1) +
                                    " images for an instance configured for batch " + std::to_string(s[0]));
    if (s[1] > 4) throw std::invalid_argument("infer_images: more than 4 channels");
    // Segments first (8-byte aligned pointers), then the offsets.
    const size_t seg_bytes = images.segments.size_bytes(), first_bytes = images.first.size_bytes();
    if (seg_bytes + first_bytes > in._gather_list_size) {
        if (in._gather_list) _device.free(in._gather_list);
        in._gather_list_size = gather_list_allocation(seg_bytes + first_bytes);
        in._gather_list = _device.alloc(in._gather_list_size, gpu::memory_kind::host_mapped);
        if (!in._gather_list) {
            in._gather_list_size = 0;
            throw std::bad_alloc();
        }
    }
    auto* list = static_cast<std::byte*>(in._gather_list);
    std::memcpy(list, images.segments.data(), seg_bytes);
    std::memcpy(list + seg_bytes, images.first.data(), first_bytes);
    kernels::gather_args g{};
    g.segments = reinterpret_cast<const kernels::gather_segment*>(list);
    g.first = reinterpret_cast<const uint32_t*>(list + seg_bytes);
    g.y = reinterpret_cast<float*>(static_cast<std::byte*>(in._inputs) + p.inputs()[0].offset);
    g.batch = s[0];
    g.c = s[1];
    g.h = s[2];
    g.w = s[3];
    for (int i = 0; i < 4; ++i) {
        g.mean[i] = images.mean[i];
        g.inv_std[i] = 1.0f / images.std[i];
    }
    // A GPU block reads its bytes over PCIe: many small blocks keep more reads in flight.
    const int64_t per_block = _options.tiles == plan_options::tiles_for::gpu ? int64_t(1) << 12 : int64_t(1) << 16;
    g.bytes_per_block = std::max<int64_t>(g.c, per_block / g.c * g.c);
    return g;
}

void runtime::infer_images(instance& in, const image_batch& images, std::vector<tensor>& outputs) {
    const kernels::gather_args g = gather_for(in, images);
    run(in, {}, outputs, nullptr, &g);
}

std::vector<gpu::task_launch> runtime::image_task(instance& in, const image_batch& images) {
    const kernels::gather_args g = gather_for(in, images);
    std::vector<gpu::task_launch> out;
    out.push_back(gpu::task_launch::make(&kernels::gather_kernel, g, uint32_t(kernels::gather_grid(g))));
    for (auto& l : task_launches(in)) out.push_back(std::move(l));
    return out;
}

void runtime::run(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
                  std::vector<double>* launch_ms, const kernels::gather_args* gather) {
    const plan& p = *in._plan;
    if (!gather) write_inputs(in, inputs);
    gpu::task_words* task = in._task;
    if (task->preempt.load() != 0) _device.set_task_flag(task, 0);
    task->completed.store(0);
    const auto& launches = p.launches();
    // The gather kernel, when given, is kernel 0 of the task; the model's kernels follow.
    const uint32_t first = gather ? 1 : 0;
    if (gather) {
        const uint32_t grid = uint32_t(kernels::gather_grid(*gather));
        _device.launch(in._stream, gpu::launch{&kernels::gather_kernel, gather, uint32_t(sizeof *gather), grid, 0,
                                               grid, task, 0});
    }
    for (size_t i = 0; i < launches.size(); ++i) {
        const planned_launch& l = launches[i];
        gpu::launch g{l.kernel, l.args.data(), uint32_t(l.args.size()), l.grid, 0, l.grid, task, uint32_t(i) + first};
        const auto t0 = std::chrono::steady_clock::now();
        _device.launch(in._stream, g);
        if (launch_ms) {
            _device.synchronize(in._stream);
            launch_ms->push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
    }
    _device.synchronize(in._stream);
    if (task->completed.load() != launches.size() + first)
        throw std::runtime_error("infer_batch: the task was preempted (" + std::to_string(task->completed.load()) + " of " +
                                 std::to_string(launches.size() + first) + " kernels completed)");
    outputs = read_outputs(in);
}

}  // namespace reefline::ml
