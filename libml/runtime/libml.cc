#include "libml/libml.h"

#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/kernels.h"

#include <chrono>
#include <tuple>
#include <cstring>
#include <set>

namespace reefline::ml {

namespace {

// The cpu device's blocks run 3x3 convolutions by Winograd where the weights' layout holds
// their filters (AVX-512 only); GPU backends never read them.
bool winograd_filters_for(gpu::device& d) { return !d.caps().gpu && kernels::cpu_has_avx512(); }

// What configure_batch() allocates for a plan: the regions never smaller than 64 bytes.
int64_t arena_allocation(const plan& p) { return std::max<int64_t>(p.arena_bytes(), 64); }
int64_t inputs_allocation(const plan& p) { return std::max<int64_t>(p.input_bytes(), 64); }
// What gather_for() allocates when a batch needs `needed` bytes of gather list: twice that, so
// that batches of slightly more segments do not reallocate every time.
size_t gather_list_allocation(size_t needed) { return std::max<size_t>(4096, 2 * needed); }

// HWC bytes one block of the image gather converts. A GPU block reads its bytes over PCIe:
// many small blocks keep more reads in flight.
int64_t image_bytes_per_block(int64_t channels, bool on_gpu) {
    const int64_t per_block = on_gpu ? int64_t(1) << 12 : int64_t(1) << 16;
    return std::max<int64_t>(channels, per_block / channels * channels);
}
// The image gather's block descriptors follow the rest of the gather list at this alignment,
// so that each is one 128-byte read.
constexpr size_t gather_descriptors_alignment = 128;

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

const request_input& model::requests() const {
    std::call_once(_requests_once, [this] {
        try {
            _requests = derive_request_input(_imported);
        } catch (const std::exception& e) {
            _requests_error = e.what();
        }
    });
    if (!_requests) throw std::invalid_argument(_requests_error);
    return *_requests;
}

void instance::free_variants() {
    for (variant& v : _variants)
        if (v.inputs) _device->free(v.inputs);
    _variants.clear();
    _selected = 0;
}

instance::~instance() {
    if (_stream) {
        _device->synchronize(_stream);
        _device->stream_destroy(_stream);
    }
    if (_task) _device->task_words_destroy(_task);
    free_variants();
    if (_arena) _device->free(_arena);
    leave_shared();
    if (_gather_list) _device->free(_gather_list);
    if (_model) --_model->_instances;
}

void instance::leave_shared() {
    if (!_shared) return;
    auto& users = _shared->_users;
    users.erase(std::remove(users.begin(), users.end(), this), users.end());
    _shared.reset();
}

shared_arena::~shared_arena() {
    if (_memory) _device->free(_memory);
}

std::vector<tensor_desc> instance::inputs() const {
    const graph& g = specialized();
    std::vector<tensor_desc> d;
    for (int v : g.inputs) d.push_back({g.values[size_t(v)].name, g.values[size_t(v)].type, g.values[size_t(v)].shape});
    return d;
}

std::vector<tensor_desc> instance::outputs() const {
    const graph& g = specialized();
    std::vector<tensor_desc> d;
    for (int v : g.outputs) d.push_back({g.values[size_t(v)].name, g.values[size_t(v)].type, g.values[size_t(v)].shape});
    return d;
}

std::vector<int64_t> instance::lengths() const {
    std::vector<int64_t> out;
    for (const variant& v : _variants)
        if (v.length) out.push_back(v.length);
    return out;
}

int64_t instance::memory_bytes() const {
    int64_t total = int64_t(_arena_size + _gather_list_size);
    for (const variant& v : _variants) total += int64_t(v.inputs_size);
    return total;
}

runtime::runtime(gpu::device& device, plan_options options) : _device(device), _options(options) {
    if (_options.tiles == plan_options::tiles_for::device)
        _options.tiles = device.caps().gpu ? plan_options::tiles_for::gpu : plan_options::tiles_for::cpu;
    if (_options.compute_units == 0) _options.compute_units = device.caps().compute_units;
}
runtime::~runtime() = default;

std::shared_ptr<model> runtime::finish_load(gpu::device& dev, graph g, std::string name) {
    auto m = std::make_shared<model>();
    m->_name = std::move(name);
    m->_device = &dev;
    m->_layout = plan::layout_weights(g, winograd_filters_for(dev));
    m->_host_bytes = distinct_constant_bytes(g);
    m->_generic = g.generic() ? g.generic() : std::make_shared<const graph>(g);
    m->_imported = std::move(g);
    if (m->_layout.bytes) {
        m->_weights = dev.alloc(size_t(m->_layout.bytes));
        if (!m->_weights) throw std::bad_alloc();
        std::vector<std::byte> host(size_t(m->_layout.bytes));
        plan::fill_weights(m->_layout, host.data());
        dev.copy_to_device(m->_weights, host.data(), host.size());
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
    in->_task = _device.task_words_create();
    ++m->_instances;
    configure_batch(*in, m->_imported.batch > 0 ? m->_imported.batch : 1);
    return in;
}

std::pair<plan, graph> runtime::plan_for(const graph& imported, const plan::weight_layout& layout, int64_t batch,
                                        int64_t length) const {
    graph g = imported;
    if (length > 0) {
        // A sequence model at one length bucket: every token input [batch, length].
        const request_input r = derive_request_input(imported);
        g.specialize(r.shapes(imported, batch, length));
    } else if (g.batch > 0 && g.batch != batch) {
        g.set_batch(batch);
    }
    // Constants a specialization created that the model's weights lack are placed in the
    // instance's inputs region by the plan; the rest come from the shared weights.
    plan p = plan::build(g, layout, _options);
    // A cpu block uses its compute unit's scratch (im2col columns, packed tiles) without bounds
    // checks of its own: a plan that needs more than the device lends is refused here.
    if (const gpu::device_caps caps = _device.caps(); !caps.gpu)
        for (const planned_launch& l : p.launches())
            if (l.scratch_bytes > caps.scratch_per_unit)
                throw std::runtime_error("plan: node '" + l.node + "' needs " + std::to_string(l.scratch_bytes) +
                                         " bytes of scratch per compute unit; the " + caps.name + " device has " +
                                         std::to_string(caps.scratch_per_unit) + " (cpu_device_options::scratch_per_unit)");
    return {std::move(p), std::move(g)};
}

namespace {
// Token positions one block of the token gather handles.
constexpr int64_t tokens_per_block = 128;
}  // namespace

int64_t runtime::gather_list_bytes(int64_t batch, int64_t segments_per_request, int64_t max_length,
                                   int64_t image_blocks_per_request) {
    if (segments_per_request <= 0) return 0;
    size_t needed = size_t(batch * segments_per_request) * sizeof(kernels::gather_segment) +
                    size_t(batch + 1) * sizeof(uint32_t) + 8 +
                    size_t(batch * kernels::ceil_div(max_length, tokens_per_block)) * sizeof(kernels::token_error);
    if (image_blocks_per_request > 0)
        needed += gather_descriptors_alignment +
                  size_t(batch * image_blocks_per_request) * sizeof(kernels::gather_block_desc);
    return int64_t(gather_list_allocation(needed));
}

int64_t runtime::image_blocks_per_request(const graph& imported) const {
    if (_options.tiles != plan_options::tiles_for::gpu) return 0;  // the cpu blocks need no descriptors
    request_input r;
    try {
        r = derive_request_input(imported);
    } catch (const std::exception&) {
        return 0;  // takes no requests
    }
    if (r.kind != request_kind::image) return 0;
    return kernels::ceil_div(r.channels * r.height * r.width, image_bytes_per_block(r.channels, true));
}

std::vector<std::pair<int64_t, int64_t>> runtime::instance_bytes(const graph& imported, const plan::weight_layout& layout,
                                                                 std::span<const int64_t> batches,
                                                                 int64_t segments_per_request,
                                                                 std::span<const int64_t> lengths,
                                                                 int64_t* shared_arena) const {
    const int64_t max_length = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    const int64_t image_blocks = segments_per_request > 0 ? image_blocks_per_request(imported) : 0;
    if (shared_arena) {
        // configure_batch() with a shared arena frees the instance's own (link_model's): the
        // shared one ends as large as the largest plan of the group.
        std::vector<std::pair<int64_t, int64_t>> out;
        *shared_arena = 0;
        const std::vector<int64_t> each = lengths.empty() ? std::vector<int64_t>{0}
                                                          : std::vector<int64_t>(lengths.begin(), lengths.end());
        for (const int64_t b : batches) {
            int64_t inputs = 0;
            for (const int64_t len : each) {
                const plan p = plan_for(imported, layout, b, len).first;
                *shared_arena = std::max(*shared_arena, arena_allocation(p));
                inputs += inputs_allocation(p);
            }
            out.emplace_back(b, inputs + gather_list_bytes(b, segments_per_request, max_length, image_blocks));
        }
        return out;
    }
    // link_model() configures the imported batch first; configure_batch() then replaces the
    // arena only with a larger one (the larger of the plans stays) and the inputs regions with
    // its plans' own.
    const int64_t first = imported.batch > 0 ? imported.batch : 1;
    const plan first_plan = plan_for(imported, layout, first).first;
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const int64_t b : batches) {
        int64_t arena = arena_allocation(first_plan), inputs = inputs_allocation(first_plan);
        if (!lengths.empty()) {
            inputs = 0;
            for (const int64_t len : lengths) {
                const plan p = plan_for(imported, layout, b, len).first;
                arena = std::max(arena, arena_allocation(p));
                inputs += inputs_allocation(p);
            }
        } else if (b != first) {
            const plan p = plan_for(imported, layout, b).first;
            arena = std::max(arena, arena_allocation(p));
            inputs = inputs_allocation(p);
        }
        out.emplace_back(b, arena + inputs + gather_list_bytes(b, segments_per_request, max_length, image_blocks));
    }
    return out;
}

namespace {
// A graph not loaded yet: its weights, their host copy and the upload's staging buffer.
memory_footprint weights_footprint(const graph& imported, const plan::weight_layout& layout) {
    memory_footprint f;
    f.weight_bytes = layout.bytes;
    f.host_bytes = distinct_constant_bytes(imported);
    f.staging_bytes = layout.bytes;
    return f;
}
}  // namespace

memory_footprint runtime::footprint(const graph& imported, std::span<const int64_t> batches,
                                    int64_t segments_per_request, std::span<const int64_t> lengths) const {
    const plan::weight_layout layout = plan::layout_weights(imported, winograd_filters_for(_device));
    memory_footprint f = weights_footprint(imported, layout);
    f.instances = instance_bytes(imported, layout, batches, segments_per_request, lengths);
    return f;
}

memory_footprint runtime::footprint(const model& m, std::span<const int64_t> batches, int64_t segments_per_request,
                                    std::span<const int64_t> lengths) const {
    memory_footprint f;
    if (!batches.empty()) f.instances = instance_bytes(m._imported, m._layout, batches, segments_per_request, lengths);
    return f;
}

void runtime::add_groups(memory_footprint& f, const graph& imported, const plan::weight_layout& layout,
                         std::span<const std::vector<int64_t>> groups, int64_t segments_per_request,
                         std::span<const int64_t> lengths) const {
    for (const std::vector<int64_t>& group : groups) {
        if (group.empty()) continue;
        int64_t arena = 0;
        for (auto& entry : instance_bytes(imported, layout, group, segments_per_request, lengths, &arena))
            f.instances.push_back(entry);
        f.arenas.push_back(arena);
    }
}

memory_footprint runtime::footprint(const graph& imported, std::span<const std::vector<int64_t>> groups,
                                    int64_t segments_per_request, std::span<const int64_t> lengths) const {
    const plan::weight_layout layout = plan::layout_weights(imported, winograd_filters_for(_device));
    memory_footprint f = weights_footprint(imported, layout);
    add_groups(f, imported, layout, groups, segments_per_request, lengths);
    return f;
}

memory_footprint runtime::footprint(const model& m, std::span<const std::vector<int64_t>> groups,
                                    int64_t segments_per_request, std::span<const int64_t> lengths) const {
    memory_footprint f;
    add_groups(f, m._imported, m._layout, groups, segments_per_request, lengths);
    return f;
}

std::shared_ptr<shared_arena> runtime::make_shared_arena() {
    auto a = std::make_shared<shared_arena>();
    a->_device = &_device;
    return a;
}

void runtime::configure_batch(instance& in, int64_t batch, std::span<const int64_t> lengths,
                              const std::shared_ptr<shared_arena>& shared) {
    // Plan everything first: a plan that fails leaves the instance as it was.
    std::vector<instance::variant> built;
    const std::vector<int64_t> each = lengths.empty() ? std::vector<int64_t>{0}
                                                      : std::vector<int64_t>(lengths.begin(), lengths.end());
    size_t arena = 0;
    for (const int64_t len : each) {
        auto [p, g] = plan_for(in._model->_imported, in._model->_layout, batch, len);
        instance::variant v;
        v.length = len;
        v.g = std::move(g);
        v.p = std::make_unique<plan>(std::move(p));
        v.inputs_size = size_t(inputs_allocation(*v.p));
        arena = std::max(arena, size_t(arena_allocation(*v.p)));
        built.push_back(std::move(v));
    }
    if (shared) {
        if (shared->_device != &_device) throw std::invalid_argument("configure_batch: a shared arena of another device");
        if (arena > shared->_size) {
            // Grown: allocated first (a failure leaves everything as it was), then every instance
            // that shares it is bound to the new memory before the old is freed.
            void* memory = _device.alloc(arena);
            if (!memory) throw std::bad_alloc();
            for (instance* user : shared->_users)
                for (instance::variant& v : user->_variants)
                    v.p->bind({static_cast<std::byte*>(user->_model->_weights), static_cast<std::byte*>(memory),
                               static_cast<std::byte*>(v.inputs)});
            if (shared->_memory) _device.free(shared->_memory);
            shared->_memory = memory;
            shared->_size = arena;
        }
    } else if (arena > in._arena_size || in._shared) {
        if (in._arena) _device.free(in._arena);
        in._arena = _device.alloc(arena);
        in._arena_size = in._arena ? arena : 0;
    }
    const auto release = [&] {
        for (instance::variant& v : built)
            if (v.inputs) _device.free(v.inputs);
    };
    if (!shared && !in._arena) {
        release();
        throw std::bad_alloc();
    }
    std::byte* const arena_memory = static_cast<std::byte*>(shared ? shared->_memory : in._arena);
    for (instance::variant& v : built) {
        // Device memory: the gather kernel's stores and the model's reads stay on the device
        // (host-mapped, every float of the batch tensor crossed PCIe twice). The host writes it
        // only through copy_to_device.
        v.inputs = _device.alloc(v.inputs_size, gpu::memory_kind::device);
        if (!v.inputs) {
            release();
            throw std::bad_alloc();
        }
        v.p->bind({static_cast<std::byte*>(in._model->_weights), arena_memory, static_cast<std::byte*>(v.inputs)});
        for (const auto& [offset, data] : v.p->input_constants())
            if (!data->empty())
                _device.copy_to_device(static_cast<std::byte*>(v.inputs) + offset, data->data(),
                                             data->size());
    }
    in.free_variants();
    if (shared && in._shared != shared) {
        in.leave_shared();
        if (in._arena) _device.free(in._arena);
        in._arena = nullptr;
        in._arena_size = 0;
        in._shared = shared;
        shared->_users.push_back(&in);
    } else if (!shared) {
        in.leave_shared();
    }
    in._variants = std::move(built);
    in._selected = in._variants.size() - 1;  // the longest length
    in._batch = batch;
}

void runtime::infer_batch(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs) {
    run(in, inputs, outputs, nullptr);
}

bool runtime::set_units(instance& in, uint64_t units) {
    if (!_device.has_unit_sets()) return false;
    _device.stream_set_units(in._stream, units);
    return true;
}

void runtime::infer_batch_profiled(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
                                   std::vector<double>& launch_ms) {
    run(in, inputs, outputs, &launch_ms);
}

void runtime::write_inputs(instance& in, std::span<const tensor> inputs) {
    // With a plan per length, the one whose input shapes the tensors have.
    if (in._variants.size() > 1)
        for (size_t k = 0; k < in._variants.size(); ++k) {
            const auto& locs = in._variants[k].p->inputs();
            bool match = locs.size() == inputs.size();
            for (size_t i = 0; match && i < inputs.size(); ++i) match = inputs[i].shape == locs[i].shape;
            if (match) {
                in._selected = k;
                break;
            }
        }
    const plan& p = in.current_plan();
    if (inputs.size() != p.inputs().size())
        throw std::invalid_argument("infer_batch: " + std::to_string(inputs.size()) + " inputs given, the model takes " +
                                    std::to_string(p.inputs().size()));
    for (size_t i = 0; i < inputs.size(); ++i) {
        const tensor_location& loc = p.inputs()[i];
        if (inputs[i].type != loc.type || inputs[i].shape != loc.shape)
            throw std::invalid_argument("infer_batch: input " + std::to_string(i) + " is " + dtype_name(inputs[i].type) +
                                        shape_str(inputs[i].shape) + ", expected " + dtype_name(loc.type) + shape_str(loc.shape));
        if (inputs[i].bytes())
            _device.copy_to_device(in.input_memory() + loc.offset, inputs[i].data->data(),
                                         inputs[i].bytes());
    }
}

std::vector<gpu::task_launch> runtime::task_launches(const instance& in) const {
    std::vector<gpu::task_launch> out;
    const instance::variant& v = in.selected();
    const auto& launches = in.current_plan().launches();
    for (size_t i = 0; i < launches.size(); ++i) {
        const planned_launch& l = launches[i];
        gpu::task_launch t;
        t.kernel = l.kernel;
        t.args = l.args;
        t.grid = l.grid;
        if (i < v.est_us.size()) {
            t.est_us = v.est_us[i];
            t.occupancy = v.occupancy[i];
        }
        out.push_back(std::move(t));
    }
    return out;
}

std::pair<std::string, std::string> runtime::profile_name(const instance& in) const {
    const plan& p = in.current_plan();
    std::vector<std::pair<std::string, uint32_t>> kg;
    std::vector<size_t> sizes;
    for (const planned_launch& l : p.launches()) {
        kg.emplace_back(l.kernel->name ? l.kernel->name : "?", l.grid);
        sizes.push_back(l.args.size());
    }
    std::string name = "b" + std::to_string(in.batch());
    if (in.length()) name += "_l" + std::to_string(in.length());
    return {name, dkp::plan_key(kg, sizes)};
}

dkp::plan_profile runtime::profile(instance& in, int runs, const launch_runner& run_alone) {
    runs = std::max(1, runs);
    const plan& p = in.current_plan();
    // Zero inputs: kernel times do not depend on the values (no data-dependent control flow).
    std::vector<tensor> zeros;
    for (const tensor_location& loc : p.inputs())
        zeros.push_back(tensor::make(loc.type, loc.shape, bytes_t(dtype_size(loc.type) * size_t(element_count(loc.shape)))));
    write_inputs(in, zeros);
    const std::vector<gpu::task_launch> launches = task_launches(in);
    const gpu::device_caps caps = _device.caps();
    dkp::plan_profile out;
    std::tie(out.plan, out.key) = profile_name(in);
    gpu::task_words* task = in._task;
    for (size_t i = 0; i < launches.size(); ++i) {
        const gpu::task_launch& l = launches[i];
        std::vector<double> us;
        if (run_alone) {
            us.push_back(run_alone(std::vector<gpu::task_launch>(size_t(runs), l)) / runs);
        } else {
            if (task->preempt.load() != 0) _device.set_task_flag(task, 0);
            for (int r = 0; r < runs; ++r) {
                const auto t0 = std::chrono::steady_clock::now();
                _device.launch(in._stream, gpu::launch{l.kernel, l.args.data(), uint32_t(l.args.size()), l.grid, 0, l.grid,
                                                       nullptr, uint32_t(i)});
                _device.synchronize(in._stream);
                us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            }
        }
        std::sort(us.begin(), us.end());
        dkp::kernel_profile k;
        k.kernel = l.kernel->name ? l.kernel->name : "?";
        k.node = p.launches()[i].node;
        k.time_us = us[us.size() / 2];
        k.blocks = l.grid;
        // The compiled kernel's resources where the device knows them (GPU backends), else
        // kernel_info's nominal figures.
        gpu::kernel_resources res;
        if (_device.kernel_resources_of(l.kernel, res)) {
            k.threads = res.threads_per_block;
            k.registers = res.registers;
            k.shared_bytes = res.shared_bytes;
            k.occupancy = std::max<uint32_t>(1, res.blocks_per_unit);
        } else {
            k.threads = l.kernel->threads_per_block;
            k.registers = l.kernel->registers;
            k.shared_bytes = l.kernel->shared_bytes;
            k.occupancy = dkp::occupancy(*l.kernel, caps);
        }
        out.launches.push_back(std::move(k));
    }
    apply_profile(in, out);
    return out;
}

bool runtime::select_length(instance& in, int64_t length) {
    for (size_t k = 0; k < in._variants.size(); ++k)
        if (in._variants[k].length == length) {
            in._selected = k;
            return true;
        }
    return false;
}

bool runtime::apply_profile(instance& in, const dkp::plan_profile& p) {
    for (size_t k = 0; k < in._variants.size(); ++k) {
        const size_t was = in._selected;
        in._selected = k;
        const auto [name, key] = profile_name(in);
        in._selected = was;
        if (name != p.plan) continue;
        instance::variant& v = in._variants[k];
        if (key != p.key || p.launches.size() != v.p->launches().size()) return false;
        v.est_us.clear();
        v.occupancy.clear();
        for (const dkp::kernel_profile& l : p.launches) {
            v.est_us.push_back(float(l.time_us));
            v.occupancy.push_back(l.occupancy);
        }
        return true;
    }
    return false;
}

std::vector<tensor> runtime::read_outputs(const instance& in) {
    std::vector<tensor> outputs;
    for (const tensor_location& loc : in.current_plan().outputs()) {
        const size_t bytes = dtype_size(loc.type) * size_t(element_count(loc.shape));
        bytes_t host(bytes);
        if (bytes) {
            const std::byte* src = loc.where == region::weights ? static_cast<const std::byte*>(in._model->_weights)
                                   : loc.where == region::arena  ? static_cast<const std::byte*>(in.arena_memory())
                                                                  : in.input_memory();
            _device.copy_to_host(host.data(), src + loc.offset, bytes);
        }
        outputs.push_back(tensor::make(loc.type, loc.shape, std::move(host)));
    }
    return outputs;
}

gpu::task_launch runtime::gather_for(instance& in, const request_batch& b) {
    const request_input& r = in._model->requests();
    const int64_t n = int64_t(b.first.size()) - 1;
    if (n != in._batch)
        throw std::invalid_argument("request batch of " + std::to_string(n) + " for an instance configured for batch " +
                                    std::to_string(in._batch));
    if (r.kind == request_kind::sequence) {
        size_t k = 0;
        while (k < in._variants.size() && in._variants[k].length != b.length) ++k;
        if (k == in._variants.size())
            throw std::invalid_argument("sequence batch at length " + std::to_string(b.length) +
                                        ", which the instance has no plan for");
        in._selected = k;
    }
    const plan& p = in.current_plan();
    std::byte* inputs = in.input_memory();
    const bool on_gpu = _options.tiles == plan_options::tiles_for::gpu;
    kernels::gather_args image{};
    if (r.kind == request_kind::image) {
        const shape_t& s = p.inputs()[0].shape;
        image.y = reinterpret_cast<float*>(inputs + p.inputs()[0].offset);
        image.batch = s[0];
        image.c = s[1];
        image.h = s[2];
        image.w = s[3];
        for (int i = 0; i < 4; ++i) {
            image.mean[i] = b.mean[i];
            image.inv_std[i] = 1.0f / b.std[i];
        }
        image.bytes_per_block = image_bytes_per_block(image.c, on_gpu);
    }
    // GPU blocks of the image gather read their descriptors (the cpu blocks need none).
    const int64_t described = r.kind == request_kind::image && on_gpu ? kernels::gather_grid(image) : 0;
    const int64_t token_blocks = r.kind == request_kind::sequence ? kernels::ceil_div(b.length, tokens_per_block) : 0;
    // Segments first (8-byte aligned pointers), then the offsets, then the token errors, then
    // the image gather's block descriptors.
    const size_t seg_bytes = b.segments.size_bytes(), first_bytes = b.first.size_bytes();
    const size_t errors_at = (seg_bytes + first_bytes + 7) / 8 * 8;
    const size_t errors_end = errors_at + size_t(n * token_blocks) * sizeof(kernels::token_error);
    const size_t blocks_at = (errors_end + gather_descriptors_alignment - 1) / gather_descriptors_alignment *
                             gather_descriptors_alignment;
    const size_t needed = described ? blocks_at + size_t(described) * sizeof(kernels::gather_block_desc) : errors_end;
    if (needed > in._gather_list_size) {
        if (in._gather_list) _device.free(in._gather_list);
        in._gather_list_size = gather_list_allocation(needed);
        in._gather_list = _device.alloc(in._gather_list_size, gpu::memory_kind::host_mapped);
        if (!in._gather_list) {
            in._gather_list_size = 0;
            throw std::bad_alloc();
        }
    }
    auto* list = static_cast<std::byte*>(in._gather_list);
    std::memcpy(list, b.segments.data(), seg_bytes);
    std::memcpy(list + seg_bytes, b.first.data(), first_bytes);
    const auto* segments = reinterpret_cast<const kernels::gather_segment*>(list);
    const auto* first = reinterpret_cast<const uint32_t*>(list + seg_bytes);

    switch (r.kind) {
    case request_kind::image: {
        image.segments = segments;
        image.first = first;
        if (described) {
            auto* blocks = reinterpret_cast<kernels::gather_block_desc*>(list + blocks_at);
            kernels::gather_describe_blocks(image, segments, first, blocks);
            image.blocks = blocks;
        }
        return gpu::task_launch::make(&kernels::gather_kernel, image, uint32_t(kernels::gather_grid(image)));
    }
    case request_kind::sequence: {
        kernels::token_gather_args t{};
        t.segments = segments;
        t.first = first;
        const auto slot = [&](int role, void** ptr, kernels::elem* type) {
            if (role < 0) return;
            const tensor_location& loc = p.inputs()[size_t(role)];
            *ptr = inputs + loc.offset;
            *type = loc.type == dtype::i64 ? kernels::elem::i64 : kernels::elem::i32;
        };
        slot(r.ids, &t.ids, &t.ids_type);
        slot(r.mask, &t.mask, &t.mask_type);
        slot(r.types, &t.types, &t.types_type);
        t.errors = reinterpret_cast<kernels::token_error*>(list + errors_at);
        t.batch = n;
        t.length = b.length;
        t.vocab = r.vocab;
        t.tokens_per_block = tokens_per_block;
        in._token_errors = t.errors;
        in._token_blocks_per_request = token_blocks;
        in._token_requests = n;
        return gpu::task_launch::make(&kernels::token_gather_kernel, t, uint32_t(kernels::token_gather_grid(t)));
    }
    case request_kind::tensor: {
        kernels::tensor_gather_args t{};
        t.segments = segments;
        t.first = first;
        t.y = reinterpret_cast<float*>(inputs + p.inputs()[0].offset);
        t.batch = n;
        t.elements = element_count(r.item);
        t.elements_per_block = on_gpu ? 1024 : 16384;
        return gpu::task_launch::make(&kernels::tensor_gather_kernel, t, uint32_t(kernels::tensor_gather_grid(t)));
    }
    }
    throw std::logic_error("unknown request kind");
}

void runtime::infer_requests(instance& in, const request_batch& batch, std::vector<tensor>& outputs) {
    const gpu::task_launch g = gather_for(in, batch);
    run(in, {}, outputs, nullptr, &g);
}

std::vector<gpu::task_launch> runtime::request_task(instance& in, const request_batch& batch) {
    std::vector<gpu::task_launch> out;
    out.push_back(gather_for(in, batch));
    for (auto& l : task_launches(in)) out.push_back(std::move(l));
    return out;
}

std::vector<kernels::token_error> runtime::token_errors(const instance& in) const {
    std::vector<kernels::token_error> out(size_t(in._token_requests), kernels::token_error{-1, 0});
    for (int64_t i = 0; i < in._token_requests; ++i)
        for (int64_t k = 0; k < in._token_blocks_per_request; ++k) {
            const kernels::token_error e = in._token_errors[i * in._token_blocks_per_request + k];
            if (e.position >= 0) {
                out[size_t(i)] = e;
                break;
            }
        }
    return out;
}

void runtime::run(instance& in, std::span<const tensor> inputs, std::vector<tensor>& outputs,
                  std::vector<double>* launch_ms, const gpu::task_launch* gather) {
    if (!gather) write_inputs(in, inputs);
    const plan& p = in.current_plan();
    gpu::task_words* task = in._task;
    if (task->preempt.load() != 0) _device.set_task_flag(task, 0);
    task->completed.store(0);
    const auto& launches = p.launches();
    // The gather kernel, when given, is kernel 0 of the task; the model's kernels follow.
    const uint32_t first = gather ? 1 : 0;
    if (gather)
        _device.launch(in._stream, gpu::launch{gather->kernel, gather->args.data(), uint32_t(gather->args.size()),
                                               gather->grid, 0, gather->grid, task, 0});
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
