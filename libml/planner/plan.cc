#include "libml/planner/plan.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "libml/planner/c16_layout.h"
#include "libml/kernels/cpu_c16.h"
#include "libml/kernels/cpu_direct_conv.h"
#include "libml/kernels/cpu_pointwise_depthwise.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/cpu_winograd.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml {

namespace k = kernels;

namespace {

// Several units: `count` tiles of `extent` (a launch's grid is `others` times the count)
// become equal tiles, as many as makes the grid a multiple of the units where that takes at
// most half again as many. With tiles of 910, 910, 910 and 406 pixels, the unit that drew the
// short one waited out most of a block at the launch's end; with 4 of 784 both end together.
int64_t balanced_tile(int64_t extent, int64_t tile, int64_t others, int64_t units, int64_t min_tile) {
    if (units <= 1 || extent <= 0 || tile <= 0) return tile;
    const int64_t count = (extent + tile - 1) / tile;
    for (int64_t c = count; c <= count + count / 2 + 1; ++c) {
        const int64_t t = (extent + c - 1) / c, real = (extent + t - 1) / t;
        if ((others * real) % units == 0 && (t >= min_tile || c == count)) return t;
    }
    return (extent + count - 1) / count;  // at least equal
}

// v rounded up to a multiple of 16, at most `limit`: the blocks of layers the cpu device
// takes 16 channels or planes at a time.
int64_t by_16_within(int64_t v, int64_t limit) { return std::min(limit, (v + 15) / 16 * 16); }

// im2col convolutions on planes of up to k::conv2d_images_max_pixels outputs, at batch > 1, take
// several images a block, about images_pixels outputs in all (conv2d_args::tile_images).
constexpr int64_t images_pixels = 512;

constexpr int64_t alignment = 64;
int64_t align_up(int64_t v) { return (v + alignment - 1) / alignment * alignment; }

[[noreturn]] void unsupported(const node& n, const std::string& what) {
    throw model_error(model_error::kind::unsupported_feature, n.label() + ": " + what);
}

shape_t contiguous_strides(const shape_t& s) {
    shape_t st(s.size(), 1);
    for (int i = int(s.size()) - 2; i >= 0; --i) st[size_t(i)] = st[size_t(i) + 1] * s[size_t(i) + 1];
    return st;
}

int64_t product(const shape_t& s, size_t from = 0, size_t to = SIZE_MAX) {
    int64_t p = 1;
    for (size_t i = from; i < std::min(to, s.size()); ++i) p *= s[i];
    return p;
}

std::optional<k::epilogue> activation_of(const node& n) {
    k::epilogue ep;
    switch (n.op) {
    case op_type::Relu: ep.act = k::activation::relu; return ep;
    case op_type::LeakyRelu: ep.act = k::activation::leaky_relu; ep.alpha = n.f("alpha", 0.01f); return ep;
    case op_type::Sigmoid: ep.act = k::activation::sigmoid; return ep;
    case op_type::Tanh: ep.act = k::activation::tanh; return ep;
    case op_type::Clip:
        ep.act = k::activation::clip;
        ep.alpha = n.f("min", -std::numeric_limits<float>::infinity());
        ep.beta = n.f("max", std::numeric_limits<float>::infinity());
        return ep;
    case op_type::HardSigmoid:
        ep.act = k::activation::hard_sigmoid;
        ep.alpha = n.f("alpha", 0.2f);
        ep.beta = n.f("beta", 0.5f);
        return ep;
    case op_type::HardSwish: ep.act = k::activation::hard_swish; return ep;
    case op_type::Gelu:
        ep.act = n.s("approximate", "none") == "tanh" ? k::activation::gelu_tanh : k::activation::gelu_erf;
        return ep;
    default: return std::nullopt;
    }
}

// The kernels' element type for a runtime tensor, or nullopt when no kernel handles it.
std::optional<k::elem> elem_of(dtype t) {
    switch (t) {
    case dtype::f32: return k::elem::f32;
    case dtype::f64: return k::elem::f64;
    case dtype::f16: return k::elem::f16;
    case dtype::i64: return k::elem::i64;
    case dtype::i32: return k::elem::i32;
    case dtype::i8: return k::elem::i8;
    case dtype::u8: return k::elem::u8;
    case dtype::boolean: return k::elem::boolean;
    default: return std::nullopt;
    }
}

}  // namespace

// GPU tiles (plan_options::tiles_for::gpu), for the GPU kernels' 256-thread blocks
// (libml/kernels/gpu/gemm_conv.cu): a 128 x 128 output tile per block where the layer still has
// a block for every compute unit at that size, else 64 x 64; a flag check every 128 elements of
// K for the cpu blocks (the GPU blocks check at every K step). Convolutions at batch > 1 cut
// their pixel tiles across images (span_images), and a layer that still has fewer blocks than
// units splits K (split-K: two launches, lower_conv) into chunks of at least gpu_min_k_chunk,
// enough for every unit to get a block. The cpu tiles are sized for OpenBLAS calls instead and
// would leave most of a GPU idle.
namespace {
constexpr int64_t gpu_wide_tile = 128, gpu_tile = 64, gpu_min_k_chunk = 128, gpu_max_k_splits = 32;

}  // namespace

void use_gpu_tiles(k::conv2d_args& a, uint32_t compute_units) {
    const int64_t units = std::max<int64_t>(1, compute_units);
    const int64_t co_g = a.c_out / a.groups, npix = a.h_out * a.w_out, K = k::conv2d_k(a);
    a.span_images = a.n > 1 && a.n * npix <= int64_t(std::numeric_limits<int32_t>::max()) ? 1 : 0;
    a.tile_groups = 1;
    a.tile_images = 1;
    a.tile_k = int32_t(std::clamp<int64_t>(K, 1, 128));
    const int64_t pixels = k::conv2d_pixels(a);
    const auto blocks = [&](int64_t tile) {
        return k::ceil_div(co_g, tile) * k::ceil_div(pixels, tile) * a.groups * (a.span_images ? 1 : a.n);
    };
    const int64_t tile =
        co_g >= gpu_wide_tile && pixels >= gpu_wide_tile && blocks(gpu_wide_tile) >= units ? gpu_wide_tile : gpu_tile;
    a.tile_co = int32_t(std::clamp<int64_t>(co_g, 1, tile));
    a.tile_pix = int32_t(std::clamp<int64_t>(pixels, 1, tile));
    a.k_splits = a.k_chunk = a.split_phase = 0;
    const int64_t tiles = k::conv2d_grid(a);
    if (tiles < units && K >= 2 * gpu_min_k_chunk) {
        const int64_t want = std::min(gpu_max_k_splits, k::ceil_div(units, tiles));
        const int64_t chunk = std::max(gpu_min_k_chunk, k::ceil_div(k::ceil_div(K, want), 32) * 32);
        if (k::ceil_div(K, chunk) > 1) {
            a.k_chunk = int32_t(chunk);
            a.k_splits = int32_t(k::ceil_div(K, chunk));
        }
    }
}

void use_gpu_tiles(k::gemm_args& g, uint32_t compute_units) {
    const int64_t units = std::max<int64_t>(1, compute_units);
    const int64_t wide_blocks = g.batch * k::ceil_div(g.m, gpu_wide_tile) * k::ceil_div(g.n, gpu_wide_tile);
    const int64_t tile = g.m >= gpu_wide_tile && g.n >= gpu_wide_tile && wide_blocks >= units ? gpu_wide_tile : gpu_tile;
    g.tile_m = int32_t(std::clamp<int64_t>(g.m, 1, tile));
    g.tile_n = int32_t(std::clamp<int64_t>(g.n, 1, tile));
    g.tile_k = int32_t(std::clamp<int64_t>(g.k, 1, 128));
}


// ---- weights ----------------------------------------------------------------------------

plan::weight_layout plan::layout_weights(const graph& g, bool cpu_filters) {
    weight_layout w;
    // The convolutions on the channel-blocked layout, and the constants only they read (as
    // their weights): those are laid out packed (below) instead.
    const c16_layout blocked = cpu_filters ? choose_c16_layout(g) : c16_layout{};
    std::vector<char> packed_only(g.values.size(), 0);
    if (blocked.any()) {
        const auto consumers = g.consumers();
        for (size_t vi = 0; vi < g.values.size(); ++vi)
            packed_only[vi] = g.values[vi].is_constant() && !consumers[vi].empty() && !g.is_output(int(vi)) &&
                              std::all_of(consumers[vi].begin(), consumers[vi].end(), [&](const auto& c) {
                                  return c.second == 1 && blocked.conv[size_t(c.first)];
                              });
    }
    for (size_t vi = 0; vi < g.values.size(); ++vi) {
        const value& v = g.values[vi];
        if (!v.is_constant() || packed_only[vi] || w.offset.count(v.data.get())) continue;
        w.offset[v.data.get()] = w.bytes;
        w.data.push_back(v.data);
        w.bytes = align_up(w.bytes + int64_t(v.data->size()));
    }
    if (!cpu_filters) return w;
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
        if (!blocked.conv[ni]) continue;
        const node& n = g.nodes[ni];
        const value& wv = g.values[size_t(n.input(1))];
        if (w.c16.count(wv.data.get())) continue;
        const bool x_c16 = blocked.value[size_t(n.input(0))];
        const auto geometry = conv2d_geometry(g, n);
        // 3x3 layers at stride 1 between c16 tensors by Winograd where it pays.
        const bool winograd = x_c16 && blocked.value[size_t(n.output(0))] && geometry &&
                              k::c16_winograd_possible(*geometry) &&
                              k::c16_winograd_wanted(geometry->c_out, geometry->c_in, geometry->h_out, geometry->w_out);
        const bool depthwise = geometry && k::conv2d_c16_depthwise(*geometry);
        w.c16[wv.data.get()] = {w.bytes, x_c16, winograd};
        w.c16_sources.push_back(
            {w.bytes, wv.data, wv.shape[0], wv.shape[1], wv.shape[2], wv.shape[3], x_c16, winograd, depthwise});
        const int64_t floats = winograd ? k::conv2d_c16_winograd_floats(wv.shape[0], wv.shape[1])
                                        : k::conv2d_c16_filter_floats(wv.shape[0], wv.shape[1], wv.shape[2], wv.shape[3]);
        w.bytes = align_up(w.bytes + floats * int64_t(sizeof(float)));
    }
    for (const node& n : g.nodes) {
        if (n.op != op_type::Conv || n.inputs.size() < 2 || n.outputs.empty()) continue;
        const value& x = g.values[size_t(n.input(0))];
        const value& wv = g.values[size_t(n.input(1))];
        const value& y = g.values[size_t(n.output(0))];
        if (!wv.is_constant() || wv.type != dtype::f32 || w.winograd.count(wv.data.get()) || w.c16.count(wv.data.get()))
            continue;
        if (x.shape.size() != 4 || wv.shape.size() != 4 || y.shape.size() != 4 || wv.shape[2] != 3 || wv.shape[3] != 3)
            continue;
        const auto ones = [](const ints& v) { return std::all_of(v.begin(), v.end(), [](int64_t s) { return s == 1; }); };
        if (!ones(n.is("strides")) || !ones(n.is("dilations"))) continue;
        const int64_t groups = n.i("group", 1), co = wv.shape[0], ci_g = wv.shape[1];
        if (groups < 1 || co % groups != 0 || int64_t(wv.data->size()) != co * ci_g * 9 * int64_t(sizeof(float)))
            continue;
        if (!k::winograd_filters_wanted(co / groups, ci_g, y.shape[2], y.shape[3])) continue;
        // Only the place: fill_weights transforms the filters into the region itself, so that
        // no host copy of them outlives the upload and a footprint costs no transform.
        w.winograd[wv.data.get()] = w.bytes;
        w.winograd_sources.push_back({w.bytes, wv.data, co, ci_g, co / groups});
        w.bytes = align_up(w.bytes + k::winograd_filter_floats(co, ci_g) * int64_t(sizeof(float)));
    }
    return w;
}

void plan::fill_weights(const weight_layout& layout, std::byte* weights) {
    for (const auto& d : layout.data) std::memcpy(weights + layout.offset.at(d.get()), d->data(), d->size());
    for (const auto& f : layout.winograd_sources)
        k::winograd_filters(reinterpret_cast<const float*>(f.weights->data()), f.c_out, f.ci_per_group, f.co_per_group,
                            reinterpret_cast<float*>(weights + f.offset));
    for (const auto& f : layout.c16_sources) {
        const auto* w = reinterpret_cast<const float*>(f.weights->data());
        auto* out = reinterpret_cast<float*>(weights + f.offset);
        if (f.winograd) k::conv2d_c16_winograd_filters(w, f.c_out, f.c_in, out);
        else if (f.depthwise) k::conv2d_c16_depthwise_filters(w, f.c_out, f.kh, f.kw, out);
        else k::conv2d_c16_filters(w, f.c_out, f.c_in, f.kh, f.kw, f.x_c16, out);
    }
}

// ---- the planner --------------------------------------------------------------------------

class planner {
public:
    planner(const graph& g, const plan::weight_layout& w, const plan_options& o)
        : _g(g), _w(w), _o(o), _storage(g.values.size(), -1), _view_offset(g.values.size(), 0) {}

    plan run();

private:
    struct pointer_ref {
        size_t args_offset;
        int value;            // -1: the weights region at byte_offset (packed filters)
        int64_t byte_offset;
    };
    struct pending {
        const gpu::kernel_info* kernel;
        std::vector<std::byte> args;
        uint32_t grid;
        size_t scratch;
        std::string node;
        std::vector<pointer_ref> pointers;
        std::vector<int> reads, writes;  // value ids
        // A launch for `image_count` images of a batch from `image` on (interleave_images): of
        // its [batch, ...] values it reads and writes only those images' bytes.
        int64_t image = 0, images = 0, image_count = 1;
    };
    // A storage: the memory of one or more values (aliases share one).
    struct storage {
        region where;
        int64_t bytes;
        int64_t offset = -1;  // weights: from the layout; inputs/arena: assigned
        int first = std::numeric_limits<int>::max();  // first launch writing it
        int last = -1;                                 // last launch reading it
        bool output = false;
    };

    const value& val(int v) const {
        return size_t(v) < _g.values.size() ? _g.values[size_t(v)] : _temps[size_t(v) - _g.values.size()];
    }
    // A tensor the lowering needs that the graph does not have (chained n-ary ops).
    int temp(dtype t, const shape_t& s) {
        value v;
        v.name = "tmp" + std::to_string(_temps.size());
        v.type = t;
        v.shape = s;
        _temps.push_back(std::move(v));
        _storage.push_back(-1);
        _view_offset.push_back(0);
        return int(_g.values.size() + _temps.size() - 1);
    }
    int storage_of(int v) {
        if (_storage[size_t(v)] >= 0) return _storage[size_t(v)];
        const value& x = val(v);
        storage s;
        s.bytes = int64_t(dtype_size(x.type)) * std::max<int64_t>(1, element_count(x.shape));
        if (x.is_constant()) {
            const auto it = _w.offset.find(x.data.get());
            if (it != _w.offset.end()) {
                s.where = region::weights;
                s.offset = it->second;
            } else {  // made by specialization: lives after the inputs, written at bind time
                s.where = region::inputs;
                s.offset = _extra_at;
                _extra.push_back({_extra_at, x.data});
                _extra_at = align_up(_extra_at + int64_t(x.data->size()));
            }
        } else {
            s.where = region::arena;
        }
        _storages.push_back(s);
        return _storage[size_t(v)] = int(_storages.size() - 1);
    }
    void alias(int out, int in) {
        _storage[size_t(out)] = storage_of(in);
        _view_offset[size_t(out)] = _view_offset[size_t(in)];
    }
    // Concatenation in place, where every dimension before the axis is 1 (channels of one
    // image: each input's slot is one contiguous range of the output). The output becomes a
    // view of the first input's storage from that input on, and each later input is either
    // there already, at its slot, or is placed there (its producer writes the slot directly)
    // when it has no storage yet and its slot lies past everything the storage holds; the
    // storage grows to fit. A chain of concatenations (DenseNet: every layer concatenates all
    // the block's earlier feature maps) becomes one buffer and no copy runs. False when any
    // input does not fit that; the caller then copies every input.
    bool concat_in_place(const node& n, int y, int64_t axis) {
        const value& out = val(y);
        const shape_t& ys = out.shape;
        if (product(ys, 0, size_t(axis)) != 1 || _storage[size_t(y)] >= 0 || _g.is_output(y) || n.inputs.empty())
            return false;
        const int first = n.inputs[0];
        if (first < 0 || val(first).is_constant() || _g.is_output(first)) return false;
        const int64_t esize = int64_t(dtype_size(out.type)), slot_stride = contiguous_strides(ys)[size_t(axis)] * esize;
        const int sv = storage_of(first);
        const storage& s = _storages[size_t(sv)];
        if (s.where != region::arena) return false;
        const int64_t base = _view_offset[size_t(first)];
        int64_t end = s.bytes, at = 0;
        std::vector<std::pair<int, int64_t>> fresh;
        for (int in : n.inputs) {
            const value& x = val(in);
            const int64_t off = base + at * slot_stride, bytes = esize * element_count(x.shape);
            if (x.type != out.type || bytes <= 0) return false;
            at += x.shape[size_t(axis)];
            if (_storage[size_t(in)] == sv && _view_offset[size_t(in)] == off) continue;  // there already
            if (_storage[size_t(in)] >= 0 || x.is_constant() || _g.is_output(in) || off < end) return false;
            if (std::find_if(fresh.begin(), fresh.end(), [&](const auto& f) { return f.first == in; }) != fresh.end())
                return false;  // the same value twice
            fresh.push_back({in, off});
            end = off + bytes;
        }
        for (auto [in, off] : fresh) {
            _storage[size_t(in)] = sv;
            _view_offset[size_t(in)] = off;
        }
        _storages[size_t(sv)].bytes = std::max(_storages[size_t(sv)].bytes, base + esize * element_count(ys));
        _storage[size_t(y)] = sv;
        _view_offset[size_t(y)] = base;
        return true;
    }

    template <class A>
    void emit(const gpu::kernel_info& kernel, const A& args, int64_t grid, const node& n,
              std::initializer_list<std::pair<const void*, int>> pointers,
              std::vector<int> reads, std::vector<int> writes, size_t scratch = 0) {
        emit_list(kernel, args, grid, n, std::vector<std::pair<const void*, int>>(pointers), std::move(reads),
                  std::move(writes), scratch);
    }

    template <class A>
    void emit_list(const gpu::kernel_info& kernel, const A& args, int64_t grid, const node& n,
                   const std::vector<std::pair<const void*, int>>& pointers, std::vector<int> reads,
                   std::vector<int> writes, size_t scratch = 0) {
        pending p;
        p.kernel = &kernel;
        p.args.resize(sizeof(A));
        std::memcpy(p.args.data(), &args, sizeof(A));
        if (grid <= 0 || grid > int64_t(std::numeric_limits<uint32_t>::max()))
            unsupported(n, "grid of " + std::to_string(grid) + " blocks");
        p.grid = uint32_t(grid);
        p.scratch = scratch;
        p.node = n.name;
        for (auto [field, v] : pointers) {
            const auto off = size_t(static_cast<const std::byte*>(field) -
                                    reinterpret_cast<const std::byte*>(&args));
            p.pointers.push_back({off, v, 0});
        }
        p.reads = std::move(reads);
        p.writes = std::move(writes);
        _pending.push_back(std::move(p));
    }

    // The bytes of one image of value v when v is a runtime [images, ...] tensor; 0 otherwise
    // (a constant, or a value of another leading dimension).
    int64_t image_bytes(int v, int64_t images) const {
        const value& x = val(v);
        if (images < 1 || x.is_constant() || x.shape.empty() || x.shape[0] != images) return 0;
        return int64_t(dtype_size(x.type)) * element_count(x.shape) / images;
    }

    // The bytes of the batch's [n, ...] values among vs.
    int64_t batch_bytes(const std::vector<int>& vs, int64_t n) const {
        int64_t bytes = 0;
        for (int v : vs) bytes += image_bytes(v, n) * n;
        return bytes;
    }
    // The bytes of the batch's [n, ...] values that `to` reads of those `from` writes.
    int64_t passed_bytes(const pending& from, const pending& to, int64_t n) const {
        int64_t bytes = 0;
        for (int v : to.reads)
            if (std::find(from.writes.begin(), from.writes.end(), v) != from.writes.end()) bytes += image_bytes(v, n) * n;
        return bytes;
    }

    // Launch p as one launch per `group` images of its batch: the batch set to group, the grid
    // of that many images, the activations' pointers moved to the group's first image
    // (constants stay). False (images untouched) where the kernel's blocks do not split by
    // image, a pointer's value is not [batch, ...] or the batch is not a multiple of group.
    bool split_by_image(const pending& p, int64_t group, std::vector<pending>& images) const {
        pending one = p;
        int64_t n = 0, grid = 0;
        const auto edit = [&](auto a, auto grid_of) {
            std::memcpy(&a, p.args.data(), sizeof a);
            n = a.n;
            a.n = group;
            grid = grid_of(a);
            std::memcpy(one.args.data(), &a, sizeof a);
            return a;
        };
        if (p.kernel == &k::conv2d_kernel) {
            k::conv2d_args c;
            std::memcpy(&c, p.args.data(), sizeof c);
            // Blocks of several images run them as one GEMM on purpose (conv2d_images_cpu).
            if (k::conv2d_image_tile(c) > 1) return false;
            edit(c, [](const k::conv2d_args& a) { return k::conv2d_grid(a); });
        } else if (p.kernel == &k::conv2d_c16_kernel) {
            edit(k::conv2d_c16_args{}, [](const k::conv2d_c16_args& a) { return k::conv2d_c16_grid(a); });
        } else if (p.kernel == &k::batchnorm_c16_kernel) {
            edit(k::batchnorm_args{}, [](const k::batchnorm_args& a) { return k::batchnorm_c16_grid(a); });
        } else if (p.kernel == &k::pool2d_c16_kernel) {
            edit(k::pool2d_args{}, [](const k::pool2d_args& a) { return k::pool2d_c16_grid(a); });
        } else if (p.kernel == &k::batchnorm_kernel) {
            edit(k::batchnorm_args{}, [](const k::batchnorm_args& a) { return k::batchnorm_grid(a); });
        } else if (p.kernel == &k::pool2d_kernel) {
            if (edit(k::pool2d_args{}, [](const k::pool2d_args& a) { return k::pool2d_grid(a); }).indices)
                return false;  // flat indices over the whole batch
        } else {
            return false;
        }
        if (n < 2 * group || n % group != 0) return false;
        for (const pointer_ref& r : p.pointers)
            if (r.value >= 0 && !val(r.value).is_constant() && image_bytes(r.value, n) == 0) return false;
        one.grid = uint32_t(grid);
        one.images = n;
        one.image_count = group;
        images.assign(size_t(n / group), one);
        for (int64_t b = 0; b < n / group; ++b) {
            images[size_t(b)].image = b * group;
            for (pointer_ref& r : images[size_t(b)].pointers)
                if (r.value >= 0) r.byte_offset += b * group * image_bytes(r.value, n);
        }
        return true;
    }

    // At batch > 1 a kernel's output is the whole batch's (MobileNet-v2's first expansion at
    // batch 8: 38 MB), so the next kernel reads its input back from memory; at batch 1 it
    // comes from the caches. Runs of consecutive per-image kernels (up to image_run, each
    // writing image_run_min_bytes or more, or reading that much from the launch before it) are
    // launched image by image instead: image 0 through the run, then image 1, ... Lifetimes
    // and the idempotence check see each launch's own images. MobileNet-v2 at batch 8, one
    // unit: 46 -> 43 ms (ResNet-50, DenseNet-121 and Inception-v3 within 1%). With several
    // units, as many images a launch as units, where the batch is a multiple of them: a
    // launch of one image gave them fewer blocks to share and they waited for each other at
    // every launch (MobileNet-v2 on two units 26 -> 27.5 ms), where two images a launch are
    // 1.008-1.025x faster at batch 8 and 1.021x at batch 4 (the plans alternated run by run;
    // its 112x112 expansion and depthwise layers 10-15%; ResNet-50, DenseNet-121 and
    // Inception-v3 1.005-1.009x), and batch 3 in groups of two and one 0.997x. Not below
    // 8 MB either, where each launch's cost outweighed the caches' gain. A launch that writes
    // less joins the run where it reads the launch before it (DenseNet-121's 2x2 average
    // pools and 3x3 layers after the 1x1 layers whose 12.8 MB they read).
    void interleave_images() {
        if (_o.tiles == plan_options::tiles_for::gpu || _o.image_run < 2) return;
        const int64_t group = std::max<int64_t>(1, _o.compute_units);
        std::vector<pending> out;
        out.reserve(_pending.size());
        size_t i = 0;
        while (i < _pending.size()) {
            // The longest run from i whose launches all split into the same batch of images.
            std::vector<std::vector<pending>> run;
            std::vector<pending> images;
            for (size_t j = i; j < _pending.size() && run.size() < size_t(_o.image_run); ++j) {
                if (!split_by_image(_pending[j], group, images)) break;
                const int64_t n = images[0].images;
                if (!run.empty() && images.size() != run[0].size()) break;
                const bool large = batch_bytes(_pending[j].writes, n) >= _o.image_run_min_bytes;
                if (!large && (run.empty() || passed_bytes(_pending[j - 1], _pending[j], n) < _o.image_run_min_bytes))
                    break;
                run.push_back(std::move(images));
            }
            if (run.size() < 2) {
                out.push_back(std::move(_pending[i++]));
                continue;
            }
            for (size_t b = 0; b < run[0].size(); ++b)
                for (auto& launch_images : run) out.push_back(std::move(launch_images[b]));
            i += run.size();
        }
        _pending = std::move(out);
    }

    void require_f32(const node& n, int v) {
        if (val(v).type != dtype::f32)
            unsupported(n, "runtime tensor '" + val(v).name + "' is " + dtype_name(val(v).type) +
                               " (the kernels compute in f32)");
    }

    int64_t blocks_for(int64_t elements) const { return std::max<int64_t>(1, k::ceil_div(elements, _o.elements_per_block)); }

    // Fusion: the single consumer of v, if v is not a graph output.
    const node* sole_consumer(int v, int* index = nullptr) const {
        if (_g.is_output(v) || _consumers[size_t(v)].size() != 1) return nullptr;
        const int c = _consumers[size_t(v)][0].first;
        if (index) *index = c;
        return &_g.nodes[size_t(c)];
    }

    void lower(int ni);
    void lower_node(const node& n, int ni);
    // The channel-blocked layout (c16_layout.h): whether value v is stored so, and a copy of a
    // value in the other layout for a reader that takes only that one (made once per value).
    bool blocked(int v) const { return v >= 0 && size_t(v) < _c16.value.size() && _c16.value[size_t(v)]; }
    int reordered(int v, bool to_c16, const node& reader);
    void copy_layout(const node& n, int from, int to, bool to_c16);
    // Whether node ni reads c16 inputs itself: the ops of a class (c16_layout.h), convolutions
    // on the layout and global poolings.
    bool takes_c16(const node& n, int ni) const;
    void lower_conv_c16(const node& n, int x, int w, int b, int residual, int y, k::conv2d_args a);
    void lower_conv_split(const node& n, k::conv2d_args a, int x, int w, int b, int residual, int y);
    // A pointwise convolution folded into the depthwise convolution after it (cpu plans,
    // kernels::pointwise_depthwise_possible): its input, weights and bias (-1: none), its args
    // (activation included) and its node.
    struct folded_pointwise {
        int x, w, b;
        k::conv2d_args args;
        const node* n;
    };
    k::conv2d_args conv_geometry(const node& n);
    void lower_conv(const node& n, int ni, const folded_pointwise* pre = nullptr);
    void choose_conv_tiles(k::conv2d_args& a, bool winograd, bool folded);
    void lower_gemm(const node& n);
    void lower_matmul(const node& n);
    void lower_binary(const node& n, k::binary_op op, int a, int b, int y, k::epilogue ep = {});
    void lower_unary(const node& n, k::unary_op op, int x, int y, k::epilogue ep = {}, float alpha = 0);
    void lower_copy_view(const node& n, int x, int y, const shape_t& shape, int64_t x_offset,
                         const shape_t& x_strides, int64_t y_offset, const shape_t& y_strides);
    void lower_pool(const node& n, bool global, int x = -1, int y = -1);
    void lower_cast(const node& n, int x, int y);
    void lower_clip(const node& n);
    void lower_variadic(const node& n);
    void lower_pad(const node& n);
    void lower_transpose(const node& n);
    void lower_expand(const node& n);
    void lower_slice(const node& n);
    void lower_concat(const node& n);
    void lower_split(const node& n);
    void lower_gather(const node& n);
    void lower_softmax(const node& n);
    void lower_layer_norm(const node& n);
    void lower_reduce_mean(const node& n);
    void lower_lrn(const node& n);
    void lower_batch_norm(const node& n);
    void lower_where(const node& n);
    void lower_rows(const node& n, k::row_op op, int x, int y, int64_t outer, int64_t axis,
                    int64_t inner, int scale = -1, int bias = -1, float eps = 0);

    void broadcast_strides(const shape_t& out, const shape_t& in, int64_t* strides) const {
        const shape_t st = contiguous_strides(in);
        const size_t r = out.size(), ri = in.size();
        for (size_t d = 0; d < r; ++d) {
            if (d + ri < r) { strides[d] = 0; continue; }
            const size_t di = d + ri - r;
            strides[d] = in[di] == 1 && out[d] != 1 ? 0 : st[di];
        }
    }
    static k::nd_shape nd(const node& n, const shape_t& s) {
        if (s.size() > size_t(k::max_dims)) unsupported(n, "rank " + std::to_string(s.size()) + " > 6");
        k::nd_shape r{};
        r.rank = int32_t(s.size());
        for (size_t i = 0; i < s.size(); ++i) r.dims[i] = s[i];
        if (r.rank == 0) {  // a scalar is one element
            r.rank = 1;
            r.dims[0] = 1;
        }
        return r;
    }

    const graph& _g;
    const plan::weight_layout& _w;
    plan_options _o;
    std::vector<std::vector<std::pair<int, int>>> _consumers;
    std::vector<int> _storage;          // by value id
    std::vector<int64_t> _view_offset;  // bytes into the storage (aliases of views)
    std::vector<storage> _storages;
    std::vector<pending> _pending;
    std::vector<bool> _done;  // nodes consumed by a fusion
    c16_layout _c16;
    std::map<std::pair<int, bool>, int> _reordered;  // (value, to c16) -> its copy
    std::vector<value> _temps;
    int64_t _extra_at = 0;    // next free byte for specialization constants (inputs region)
    std::vector<std::pair<int64_t, std::shared_ptr<const bytes_t>>> _extra;
};

void planner::lower_binary(const node& n, k::binary_op op, int a, int b, int y, k::epilogue ep) {
    k::binary_args args{};
    const auto at = elem_of(val(a).type), bt = elem_of(val(b).type), yt = elem_of(val(y).type);
    if (!at || !bt || !yt) unsupported(n, std::string("element type ") + dtype_name(val(a).type));
    args.a_type = *at;
    args.b_type = *bt;
    args.y_type = *yt;
    if (*yt != k::elem::f32 && ep.act != k::activation::none) unsupported(n, "a fused activation on a non-f32 result");
    const shape_t& out = val(y).shape;
    args.shape = nd(n, out);
    if (out.empty()) {
        args.a_strides[0] = args.b_strides[0] = 0;
    } else {
        broadcast_strides(out, val(a).shape, args.a_strides);
        broadcast_strides(out, val(b).shape, args.b_strides);
    }
    args.op = op;
    args.ep = ep;
    args.per_block = _o.elements_per_block;
    emit(k::binary_kernel, args, k::binary_grid(args), n, {{&args.a, a}, {&args.b, b}, {&args.y, y}}, {a, b}, {y});
}

void planner::lower_unary(const node& n, k::unary_op op, int x, int y, k::epilogue ep, float alpha) {
    k::unary_args args{};
    args.count = std::max<int64_t>(1, element_count(val(y).shape));
    args.op = op;
    args.ep = ep;
    args.alpha = alpha;
    args.per_block = _o.elements_per_block;
    if (op == k::unary_op::fill) {
        if (element_count(val(y).shape) == 0) return;
        return emit(k::unary_kernel, args, k::unary_grid(args), n, {{&args.y, y}}, {}, {y});
    }
    require_f32(n, x);
    emit(k::unary_kernel, args, k::unary_grid(args), n, {{&args.x, x}, {&args.y, y}}, {x}, {y});
}

void planner::lower_cast(const node& n, int x, int y) {
    const auto xt = elem_of(val(x).type), yt = elem_of(val(y).type);
    if (!xt || !yt) unsupported(n, std::string("cast from ") + dtype_name(val(x).type) + " to " + dtype_name(val(y).type));
    k::unary_args a{};
    a.count = element_count(val(y).shape);
    if (a.count == 0) return;
    a.op = k::unary_op::identity;
    a.x_type = *xt;
    a.y_type = *yt;
    a.per_block = _o.elements_per_block;
    emit(k::unary_kernel, a, k::unary_grid(a), n, {{&a.x, x}, {&a.y, y}}, {x}, {y});
}

void planner::lower_copy_view(const node& n, int x, int y, const shape_t& shape, int64_t x_offset,
                              const shape_t& x_strides, int64_t y_offset, const shape_t& y_strides) {
    k::copy_args args{};
    if (element_count(shape) == 0) return;
    // Dimensions contiguous with the next on both sides merged, and those of size 1 dropped: a
    // batch-8 concatenation of [8, c, h, w] copies 8 runs of c*h*w, not 8*c*h runs of w (its
    // copies took 13% of DenseNet-121's time at batch 8, row by row).
    shape_t ms, mx, my;
    for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] == 1) continue;
        if (!ms.empty() && mx.back() == x_strides[d] * shape[d] && my.back() == y_strides[d] * shape[d]) {
            ms.back() *= shape[d];
            mx.back() = x_strides[d];
            my.back() = y_strides[d];
        } else {
            ms.push_back(shape[d]);
            mx.push_back(x_strides[d]);
            my.push_back(y_strides[d]);
        }
    }
    if (ms.empty()) ms = mx = my = {1};  // one element
    args.shape = nd(n, ms);
    for (size_t d = 0; d < ms.size(); ++d) {
        args.x_strides[d] = mx[d];
        args.y_strides[d] = my[d];
    }
    args.x_offset = x_offset;
    args.y_offset = y_offset;
    args.element_bytes = int32_t(dtype_size(val(x).type));
    args.per_block = _o.elements_per_block;
    emit(k::copy_kernel, args, k::copy_grid(args), n, {{&args.x, x}, {&args.y, y}}, {x}, {y});
}

void planner::lower_rows(const node& n, k::row_op op, int x, int y, int64_t outer, int64_t axis,
                         int64_t inner, int scale, int bias, float eps) {
    require_f32(n, x);
    k::row_args args{};
    args.outer = outer;
    args.axis = axis;
    args.inner = inner;
    args.op = op;
    args.epsilon = eps;
    const int64_t per_unit = op == k::row_op::layer_norm ? axis * inner : axis;
    args.rows_per_block = std::max<int64_t>(1, _o.elements_per_block / std::max<int64_t>(1, per_unit));
    // A c16 tensor's global pool reduces 16 lines at once where a block holds whole pixels' worth.
    if (inner == k::c16 && op != k::row_op::layer_norm && op != k::row_op::softmax && op != k::row_op::log_softmax)
        args.rows_per_block = (args.rows_per_block + k::c16 - 1) / k::c16 * k::c16;
    std::vector<int> reads{x};
    if (scale >= 0) reads.push_back(scale);
    if (bias >= 0) reads.push_back(bias);
    if (scale >= 0 && bias >= 0)
        emit(k::row_kernel, args, k::row_grid(args), n, {{&args.x, x}, {&args.scale, scale}, {&args.bias, bias}, {&args.y, y}}, reads, {y});
    else if (scale >= 0)
        emit(k::row_kernel, args, k::row_grid(args), n, {{&args.x, x}, {&args.scale, scale}, {&args.y, y}}, reads, {y});
    else
        emit(k::row_kernel, args, k::row_grid(args), n, {{&args.x, x}, {&args.y, y}}, reads, {y});
}

// A Conv node's geometry (shapes, strides, padding, groups): its args without tiles, pointers
// or activation.
k::conv2d_args planner::conv_geometry(const node& n) {
    const int x = n.input(0), w = n.input(1);
    require_f32(n, x);
    const shape_t& xs = val(x).shape;
    if (xs.size() != 4 && xs.size() != 3) unsupported(n, "only 1-D (NCL) and 2-D (NCHW) convolution is implemented");
    require_f32(n, w);
    const auto a = conv2d_geometry(n, val(x), val(w), val(n.output(0)));
    if (!a) unsupported(n, "weights of shape " + shape_str(val(w).shape) + " for an input of shape " + shape_str(xs));
    return *a;
}

// The tiles of a convolution's blocks on the cpu device (GPU plans take use_gpu_tiles after):
// pixels, channels, images and K chunks sized for cache reuse and ~0.1-1 ms between check points,
// then split until every compute unit has work. `folded`: a pointwise layer is folded in.
void planner::choose_conv_tiles(k::conv2d_args& a, bool winograd, bool folded) {
    const int64_t co_g = a.c_out / a.groups, npix = a.h_out * a.w_out;
    a.tile_co = int32_t(std::min<int64_t>(co_g, 256));
    // About 64K multiply-adds per output row chunk keeps blocks in the 0.1-1 ms range.
    const int64_t K = k::conv2d_k(a);
    a.tile_pix = int32_t(std::clamp<int64_t>((int64_t(1) << 20) / std::max<int64_t>(1, K), 64, std::max<int64_t>(64, npix)));
    a.tile_pix = int32_t(std::min<int64_t>(a.tile_pix, npix));
    // Long K left blocks of few pixels, each repacking the weights (oneDNN's sgemm, per call)
    // or reloading them (direct convolution): VGG-19's 28x28 x 512 3x3 layers (K = 4608,
    // direct) ran at 98 GMAC/s in tiles of 227 pixels and 113 with the whole 784-pixel plane,
    // its 56x56 x 256 layers (K = 2304, im2col) 5% faster in tiles of 784 than of 455; tiles
    // of 1456-3136 pixels showed no such step. So blocks take at least 784 pixels (the plane
    // where smaller) while an im2col scratch stays within 16 MB, and their K chunks shrink
    // instead, so check points stay as close as before (below).
    bool chunk_by_work = false;
    if (!(co_g == 1 && k::conv2d_ci_per_group(a) == 1)) {
        const int64_t floor_pix = std::min<int64_t>({npix, 784, (int64_t(4) << 20) / std::max<int64_t>(1, K)});
        if (a.tile_pix < floor_pix) {
            a.tile_pix = int32_t(floor_pix);
            chunk_by_work = true;
        }
    }
    // A block that runs im2col copies its pixels' columns once for all of its channels. Where
    // blocks have few pixels (small planes, long K) the copy is a larger share, so im2col
    // layers take up to 512 channels a block while one K chunk stays within 64M multiply-adds
    // (as large as the chunks of the layers above, ~0.6 ms between check points). Measured
    // alone: ResNet-50's 7x7 3x3 layers 83 -> 94 GMAC/s, its stride-2 1x1 layer 512 -> 1024
    // on 28x28 93 -> 102; no change where one block already held every channel.
    if (co_g > a.tile_co && !k::conv2d_is_pointwise(a) && !k::conv2d_direct_chosen(a) &&
        k::conv2d_ci_per_group(a) > 1) {
        const int64_t chunk = std::min<int64_t>(K, 1024) * a.tile_pix;
        const int64_t fits = ((int64_t(64) << 20) / chunk) / 32 * 32;  // whole 32-row panels
        a.tile_co = int32_t(std::max<int64_t>(a.tile_co, std::min<int64_t>({co_g, 512, fits})));
    }
    // Batches of 8x8 planes or smaller: an im2col layer's block takes several images' whole
    // planes (up to ~512 outputs, its columns and output within 16 MB of scratch) as one GEMM,
    // which reads the weights once for them all (conv2d_images_cpu); tiles of equal image
    // counts. ResNet-50 at batch 8, one unit: its 7x7 3x3 layers 9.7 -> 9.2 ms, the 1x1
    // stride-2 layer into 7x7 11.5 -> 9.9, the model 330.1 -> 326.4 ms (min of 4 alternated
    // runs); Inception-v3 within noise. Not on 14x14 planes, where the 3x3 layers run direct
    // and were faster image by image (8.4 vs 9.0 ms), nor on pointwise layers, whose weights
    // stay in the caches from image to image and which gained nothing for the copies.
    if (_o.tiles != plan_options::tiles_for::gpu && a.n > 1 && a.tile_pix >= npix && npix <= k::conv2d_images_max_pixels &&
        !(co_g == 1 && k::conv2d_ci_per_group(a) == 1) && !k::conv2d_is_pointwise(a) && !k::conv2d_direct_chosen(a)) {
        const int64_t per_image = (K + std::min<int64_t>(a.tile_co, co_g)) * npix * int64_t(sizeof(float));
        const int64_t images = std::min({a.n, k::ceil_div(images_pixels, npix), std::max<int64_t>(1, (int64_t(16) << 20) / per_image)});
        if (images > 1) {
            a.tile_images = int32_t(k::ceil_div(a.n, k::ceil_div(a.n, images)));
            chunk_by_work = true;
        }
    }
    // Several units: at least two blocks per unit (one on small planes, below), or a batch-1
    // layer of one or two blocks leaves units idle. With one unit the larger tiles are faster
    // (fewer, longer GEMM calls), so they stay. The cheapest splits first: for windows up to 3x3, pixel tiles down to
    // 256, then output channels down to 32 (a GEMM 49 or 98 pixels wide ran 10-30% slower
    // than one 196 wide; a block of half the channels redoes the im2col of its pixels, which
    // cost 3% on ResNet-50's 14x14 layers; the direct 3x3 on 14x14 x 256 ran at 105 GMAC/s in
    // four blocks of 64 channels and 84 in four of 49 pixels, two units 23.8 -> 22.8 ms on
    // ResNet-50); for longer windows, pixels first (a block of half the channels copies its
    // input rows again: Inception-v3's 1x7 and 7x1 layers on 17x17 ran 40% slower). Then
    // pixels down to 64, channels down to 16.
    if (_o.compute_units > 1) {
        // One block per unit on planes of 17x17 or smaller outside pointwise layers: their
        // blocks are few pixels already, and halving the channels again cost more than the
        // balance it bought (Inception-v3's 8x8 3x3 448 -> 384 layers: 1.10 ms on one unit,
        // 0.83 on two in four blocks; two units, five alternated runs: Inception-v3 36.6-37.6
        // -> 35.1-35.9 ms; ResNet-50 and MobileNet-v2 within noise). Nor on Winograd layers:
        // every block transforms the input rows of its pixels for all its input channels, so a
        // block of half the channels repeats that work (ResNet-50's 28x28 x 128 layers on two
        // units, kprof: 0.79 ms in two blocks of pixels against 0.90 in four of half the
        // channels each).
        const int64_t per_unit = (npix <= 17 * 17 && !k::conv2d_is_pointwise(a)) || winograd ? 1 : 2;
        const int64_t want = per_unit * int64_t(_o.compute_units);
        while (k::conv2d_grid(a) < want && a.tile_images > 1) a.tile_images = int32_t((a.tile_images + 1) / 2);
        if (a.kh <= 3 && a.kw <= 3) {
            while (k::conv2d_grid(a) < want && (a.tile_pix + 1) / 2 >= 256) a.tile_pix = int32_t((a.tile_pix + 1) / 2);
            while (k::conv2d_grid(a) < want && a.tile_co > 32)
                a.tile_co = int32_t(std::max<int64_t>(32, (a.tile_co + 1) / 2));
        }
        while (k::conv2d_grid(a) < want && a.tile_pix > 64)
            a.tile_pix = int32_t(std::max<int64_t>(64, (a.tile_pix + 1) / 2));
        while (k::conv2d_grid(a) < want && a.tile_co > 16) a.tile_co = int32_t(std::max<int64_t>(16, (a.tile_co + 1) / 2));
        a.tile_pix = int32_t(balanced_tile(npix, a.tile_pix, k::conv2d_grid(a) / k::conv2d_tiles_pix(a),
                                           _o.compute_units, 16));
        // Channel tiles of one size: 384 channels in tiles of 256 left one unit two thirds of
        // the layer (Inception-v3's stride-2 288 -> 384 and 192 -> 320 layers, which run direct
        // and so keep tiles of 256). Two units, the two plans alternated run by run in one
        // process: Inception-v3 1.026-1.041x at batch 1, 1.022x at batch 8; ResNet-50 (its
        // 512-channel stride-2 1x1 layer: 320 + 192 -> 256 + 256) and MobileNet-v2 (960 in
        // 4 x 240) within noise.
        if (a.tile_co < co_g) {
            const int64_t tiles = k::ceil_div(co_g, a.tile_co);
            a.tile_co = int32_t(std::min<int64_t>(a.tile_co, k::ceil_div(k::ceil_div(co_g, tiles), 16) * 16));
        }
    }
    // Direct convolution sums whole output rows (a tile starting or ending mid-row computes the
    // rest of the row too and drops it), so its tiles are whole rows where that keeps their
    // count: DenseNet-121's 56x56 3x3 layers in tiles of 910 pixels summed 5% more than the
    // 784 they kept (1.03 -> 0.985 ms a layer alone), ResNet-50's 1820 -> 1568 1.3%.
    if (k::conv2d_direct_chosen(a) && k::conv2d_image_tile(a) == 1 && a.w_out > 0) {
        const int64_t tiles = k::ceil_div(npix, int64_t(a.tile_pix));
        const int64_t rows = k::ceil_div(a.h_out, tiles);
        if (tiles <= a.h_out && k::ceil_div(a.h_out, rows) == tiles) a.tile_pix = int32_t(rows * a.w_out);
    }
    a.tile_k = int32_t(std::min<int64_t>(K, 1024));
    if (chunk_by_work) {
        // About 64M multiply-adds between check points, in steps of 64 rows of K.
        const int64_t pixels = std::min<int64_t>(a.tile_pix, npix) * k::conv2d_image_tile(a);
        const int64_t rows = (int64_t(64) << 20) / (int64_t(a.tile_co) * pixels) / 64 * 64;
        a.tile_k = int32_t(std::clamp<int64_t>(rows, 64, a.tile_k));
    }
    // Depthwise planes of a few thousand outputs or fewer (MobileNet's 14x14 and 7x7): several
    // per block, about 4096 outputs' worth, keeping two blocks per unit where there are units.
    // With several units, 960 blocks of one 7x7 plane each spent more time claiming blocks
    // (one cache line the units pass back and forth) than summing.
    // Planes small enough for the cpu device to take 16 channels at a time
    // (depthwise16_max_pixels) get a multiple of 16 where the channels allow.
    if (folded) {
        // With a pointwise layer folded in: whole passes of its planes a block, about 256K
        // multiply-adds of its sums or more each (MobileNet-v2's, 112x112 to 28x28: one pass
        // of 8 channels), two blocks a unit where there are units.
        const int64_t pass = k::pointwise_depthwise_pass, hw = a.h * a.w_in;
        const int64_t passes = std::max<int64_t>(1, (int64_t(1) << 18) / (pass * hw * a.pre_c_in));
        a.tile_pix = int32_t(npix);
        a.tile_groups = int32_t(std::min<int64_t>(a.groups, passes * pass));
        if (_o.compute_units > 1)
            while (k::conv2d_grid(a) < 2 * int64_t(_o.compute_units) && a.tile_groups > pass)
                a.tile_groups = int32_t(std::max<int64_t>(pass, (a.tile_groups / pass + 1) / 2 * pass));
    } else if (co_g == 1 && k::conv2d_ci_per_group(a) == 1 && a.tile_pix >= npix) {
        const bool by_16 = npix <= k::depthwise16_max_pixels && a.groups >= 16;
        const auto rounded = [&](int64_t g) {
            return by_16 && g >= 16 ? by_16_within(g, a.groups) : g;
        };
        a.tile_groups = int32_t(rounded(std::clamp<int64_t>(4096 / std::max<int64_t>(1, npix), 1, a.groups)));
        if (_o.compute_units > 1)
            while (k::conv2d_grid(a) < 2 * int64_t(_o.compute_units) && a.tile_groups > 1)
                a.tile_groups = int32_t(a.tile_groups > 16 && by_16 ? std::max<int64_t>(16, rounded(a.tile_groups / 2))
                                                                     : (a.tile_groups + 1) / 2);
    }
}

void planner::lower_conv(const node& n, int ni, const folded_pointwise* pre) {
    const int w = n.input(1), b = n.input(2);
    // With a pointwise layer folded in, the launch reads that layer's input.
    const int x = pre ? pre->x : n.input(0);
    int y = n.output(0);
    k::conv2d_args a = conv_geometry(n);
    // Fusions: Conv -> [Add(residual)] -> [activation], each step only when the intermediate
    // has no other reader and the residual is ready before this conv runs. A depthwise layer
    // with a pointwise layer folded in takes no residual and only the activations its windows
    // apply (depthwise3x3); the rest run as launches of their own.
    int residual = -1;
    int c = -1;
    if (const node* next = sole_consumer(y, &c); next && !pre) {
        if ((next->op == op_type::Add) && !_done[size_t(c)]) {
            const int other = next->input(0) == y ? next->input(1) : next->input(0);
            const value& o = val(other);
            const bool ready = o.producer < ni;  // graph inputs and constants are -1
            if (o.type == dtype::f32 && o.shape == val(y).shape && ready && other != y) {
                residual = other;
                _done[size_t(c)] = true;
                y = next->output(0);
            }
        }
    }
    const bool on_c16 = _c16.conv[size_t(ni)] != 0 && !pre;
    if (const node* next = sole_consumer(y, &c); next && !_done[size_t(c)]) {
        const auto ep = activation_of(*next);
        if (ep && ((!pre && !on_c16) || k::bias_activation_applies(*ep))) {
            a.ep = *ep;
            _done[size_t(c)] = true;
            y = next->output(0);
        }
    }
    if (on_c16) return lower_conv_c16(n, x, w, b, residual, y, a);
    // A pointwise layer whose output (after its activation) only a 3x3 depthwise layer reads:
    // on the cpu device the two run as one launch (kernels::pointwise_depthwise), and the
    // pointwise output is never written to memory. MobileNet-v2's expansion and depthwise pairs.
    if (!pre && residual < 0 && _o.tiles != plan_options::tiles_for::gpu && _o.fold_pointwise) {
        if (const node* next = sole_consumer(y, &c); next && next->op == op_type::Conv && !_done[size_t(c)] &&
                                                     next->input(0) == y && val(next->input(1)).is_constant()) {
            const k::conv2d_args dw = conv_geometry(*next);
            if (k::pointwise_depthwise_possible(a, dw)) {
                const folded_pointwise f{x, w, b, a, &n};
                _done[size_t(c)] = true;
                lower_conv(_g.nodes[size_t(c)], c, &f);
                return;
            }
        }
    }
    if (pre) a = k::pointwise_depthwise_args(pre->args, a);
    // Whether the cpu blocks will run this layer by Winograd: its filters are in the weights'
    // layout (only there for the cpu device) and it can.
    const bool winograd = _w.winograd.count(val(w).data.get()) && k::conv2d_winograd_possible(a);
    choose_conv_tiles(a, winograd, pre != nullptr);
    if (_o.tiles == plan_options::tiles_for::gpu) use_gpu_tiles(a, _o.compute_units);
    std::vector<std::pair<const void*, int>> pointers{{&a.x, x}, {&a.w, w}, {&a.y, y}};
    if (b >= 0) pointers.push_back({&a.bias, b});
    if (residual >= 0) pointers.push_back({&a.residual, residual});
    if (pre) {
        pointers.push_back({&a.pre_w, pre->w});
        if (pre->b >= 0) pointers.push_back({&a.pre_bias, pre->b});
    }
    std::vector<int> reads;
    for (const auto& [field, v] : pointers)
        if (v != y) reads.push_back(v);
    if (k::conv2d_split(a)) return lower_conv_split(n, a, x, w, b, residual, y);
    emit_list(k::conv2d_kernel, a, k::conv2d_grid(a), n, pointers, reads, {y}, k::conv2d_scratch_bytes(a));
    if (pre) _pending.back().node = pre->n->name + "+" + n.name;
    // The Winograd filters laid out after the weights (layout_weights): bound as w's bytes
    // moved to theirs.
    if (winograd)
        _pending.back().pointers.push_back({offsetof(k::conv2d_args, w_winograd), w,
                                            _w.winograd.at(val(w).data.get()) - _w.offset.at(val(w).data.get())});
}

// A convolution on the channel-blocked layout (kernels::conv2d_c16): its packed filters from
// the weights' layout, its input in the layout they were packed for.
// A split-K layer (use_gpu_tiles): the first launch writes each K chunk's sums to a temporary
// [k_splits, n, c_out, h_out, w_out]; the second adds them in split order, applies bias,
// residual and activation and writes y.
void planner::lower_conv_split(const node& n, k::conv2d_args a, int x, int w, int b, int residual, int y) {
    const int partial = temp(dtype::f32, {a.k_splits, a.n, a.c_out, a.h_out, a.w_out});
    a.split_phase = 1;
    emit(k::conv2d_kernel, a, k::conv2d_grid(a), n, {{&a.x, x}, {&a.w, w}, {&a.partial, partial}}, {x, w}, {partial},
         k::conv2d_scratch_bytes(a));
    a.split_phase = 2;
    std::vector<std::pair<const void*, int>> pointers{{&a.partial, partial}, {&a.y, y}};
    std::vector<int> reads{partial};
    if (b >= 0) {
        pointers.push_back({&a.bias, b});
        reads.push_back(b);
    }
    if (residual >= 0) {
        pointers.push_back({&a.residual, residual});
        reads.push_back(residual);
    }
    emit_list(k::conv2d_kernel, a, k::conv2d_grid(a), n, pointers, reads, {y}, 0);
}

void planner::lower_conv_c16(const node& n, int x, int w, int b, int residual, int y, k::conv2d_args a) {
    const plan::weight_layout::c16_filters& f = _w.c16.at(val(w).data.get());
    if (blocked(x) != f.x_c16) x = reordered(x, f.x_c16, n);
    k::conv2d_c16_args c{};
    c.n = a.n; c.c_in = a.c_in; c.h = a.h; c.w_in = a.w_in; c.c_out = a.c_out; c.kh = a.kh; c.kw = a.kw;
    c.stride_h = a.stride_h; c.stride_w = a.stride_w; c.pad_top = a.pad_top; c.pad_left = a.pad_left;
    c.h_out = a.h_out; c.w_out = a.w_out;
    c.ep = a.ep;
    c.x_c16 = f.x_c16;
    c.y_c16 = blocked(y);
    c.depthwise = k::conv2d_c16_depthwise(a);
    // Winograd and depthwise layers write c16 only: an NCHW output (a plan whose layouts
    // differ from the weights' choice) goes through a c16 copy.
    const int final_y = y;
    if ((f.winograd || c.depthwise) && !c.y_c16) {
        y = temp(dtype::f32, val(final_y).shape);
        c.y_c16 = true;
    }
    if (residual >= 0 && blocked(residual) != c.y_c16) residual = reordered(residual, c.y_c16, n);
    const int64_t taps = c.kh * c.kw;
    // Chunks of input channels between check points: 128 at 1x1, one block of 16 for larger
    // windows (NCHW inputs: 128 / taps channels), so that a group's filters for a chunk (32-36
    // KB) stay in L1 as its rows go by. (MobileNet-v2's 576 -> 96 projections from NCHW in one
    // chunk streamed 147 KB of filters from L2 for every tile: 1.5x the GEMM's time.)
    c.chunk = int32_t(c.x_c16 ? std::max<int64_t>(k::c16, 128 / taps / k::c16 * k::c16) : std::max<int64_t>(1, 128 / taps));
    // Row tiles whose output for a group of 64 channels (accumulated chunk by chunk) stays
    // within 512 KB of L2, and whose padded input rows within 2 MB of scratch.
    const int64_t wp = std::max(c.w_in + c.pad_left, (c.w_out - 1) * c.stride_w + c.kw);
    const int64_t by_output = std::max<int64_t>(1, 2048 / c.w_out);
    const int64_t by_input = std::max<int64_t>(1, ((int64_t(2) << 20) / (4 * c.c_in * wp) - c.kh) / c.stride_h + 1);
    c.tile_co = int32_t(c.c_out);
    c.tile_rows = int32_t(std::min({c.h_out, by_output, by_input}));
    // Several units: two blocks a unit or more, splitting the output channels where the
    // layer's filters outweigh its input (each block reads the filters of its channels for
    // its rows), its rows otherwise.
    if (c.depthwise && _o.compute_units > 1) {
        // Depthwise: blocks of whole channel blocks (each reads only its own channels).
        const int64_t want = 2 * int64_t(_o.compute_units);
        c.tile_co = int32_t(std::max<int64_t>(k::c16, k::ceil_div(k::ceil_div(c.c_out, want), k::c16) * k::c16));
    } else if (_o.compute_units > 1) {
        const int64_t want = 2 * int64_t(_o.compute_units);
        const int64_t filter_bytes = c.c_out * c.c_in * taps, input_bytes = c.c_in * c.h * c.w_in;
        while (k::conv2d_c16_grid(c) < want) {
            const bool by_co = (filter_bytes > input_bytes || c.tile_rows <= 1) && c.tile_co > 64;
            if (by_co) c.tile_co = int32_t((k::ceil_div(c.tile_co, 2) + 63) / 64 * 64);
            else if (c.tile_rows > 1) c.tile_rows = int32_t(k::ceil_div(c.tile_rows, 2));
            else break;
        }
    }
    c.tile_rows = int32_t(k::ceil_div(c.h_out, k::ceil_div(c.h_out, c.tile_rows)));  // equal tiles
    // Winograd: blocks of whole 2x2 tiles (an even row count).
    const bool winograd = f.winograd;
    if (winograd) c.tile_rows = int32_t(std::min<int64_t>((c.tile_rows + 1) / 2 * 2, (c.h_out + 1) / 2 * 2));
    std::vector<std::pair<const void*, int>> pointers{{&c.x, x}, {&c.y, y}};
    std::vector<int> reads{x};
    if (b >= 0) {
        pointers.push_back({&c.bias, b});
        reads.push_back(b);
    }
    if (residual >= 0) {
        pointers.push_back({&c.residual, residual});
        reads.push_back(residual);
    }
    if (winograd) c.w_winograd = reinterpret_cast<const float*>(1);  // set below, for the scratch's size
    const size_t scratch = k::conv2d_c16_scratch_bytes(c);
    c.w_winograd = nullptr;
    emit_list(k::conv2d_c16_kernel, c, k::conv2d_c16_grid(c), n, pointers, reads, {y}, scratch);
    _pending.back().pointers.push_back(
        {winograd ? offsetof(k::conv2d_c16_args, w_winograd) : offsetof(k::conv2d_c16_args, w), -1, f.offset});
    if (y != final_y) copy_layout(n, y, final_y, false);
}

void planner::lower_gemm(const node& n) {
    const int A = n.input(0), B = n.input(1), C = n.input(2);
    int y = n.output(0);
    require_f32(n, A);
    require_f32(n, B);
    const bool ta = n.i("transA", 0), tb = n.i("transB", 0);
    const shape_t& as = val(A).shape;
    const shape_t& bs = val(B).shape;
    k::gemm_args g{};
    g.batch = 1;
    g.m = ta ? as[1] : as[0];
    g.k = ta ? as[0] : as[1];
    g.n = tb ? bs[0] : bs[1];
    g.lda = as[1];
    g.ldb = bs[1];
    g.ldc = g.n;
    g.trans_a = ta;
    g.trans_b = tb;
    g.alpha = n.f("alpha", 1.0f);
    g.beta = n.f("beta", 1.0f);
    g.bias_mode = k::bias_kind::none;
    if (C >= 0) {
        require_f32(n, C);
        const shape_t& cs = val(C).shape;
        const int64_t ce = element_count(cs);
        if (ce == 1) g.bias_mode = k::bias_kind::scalar;
        else if (cs.back() == g.n && ce == g.n) g.bias_mode = k::bias_kind::per_col;
        else if (cs.size() == 2 && cs[0] == g.m && cs[1] == 1) g.bias_mode = k::bias_kind::per_row;
        else if (ce == g.m * g.n) { g.bias_mode = k::bias_kind::full; g.ldbias = g.n; }
        else unsupported(n, "bias of shape " + shape_str(cs));
    }
    int c = -1;
    if (const node* next = sole_consumer(y, &c); next && !_done[size_t(c)]) {
        if (auto ep = activation_of(*next)) {
            g.ep = *ep;
            _done[size_t(c)] = true;
            y = next->output(0);
        }
    }
    g.tile_m = int32_t(std::min<int64_t>(g.m, 64));
    g.tile_n = int32_t(std::min<int64_t>(g.n, 256));
    g.tile_k = int32_t(std::max<int64_t>(1, std::min<int64_t>(g.k, 2048)));
    if (_o.tiles == plan_options::tiles_for::gpu) use_gpu_tiles(g, _o.compute_units);
    if (C >= 0)
        emit(k::gemm_kernel, g, k::gemm_grid(g), n, {{&g.a, A}, {&g.b, B}, {&g.bias, C}, {&g.c, y}}, {A, B, C}, {y});
    else
        emit(k::gemm_kernel, g, k::gemm_grid(g), n, {{&g.a, A}, {&g.b, B}, {&g.c, y}}, {A, B}, {y});
}

void planner::lower_matmul(const node& n) {
    int A = n.input(0), B = n.input(1);
    int y = n.output(0);
    require_f32(n, A);
    require_f32(n, B);
    shape_t as = val(A).shape, bs = val(B).shape;
    if (as.size() == 1) as.insert(as.begin(), 1);
    if (bs.size() == 1) bs.push_back(1);
    const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
    shape_t abatch(as.begin(), as.end() - 2), bbatch(bs.begin(), bs.end() - 2);
    // The broadcast batch shape; an operand whose batch dims are neither the full shape nor
    // all ones is first expanded to it with a broadcast copy.
    shape_t batch_shape(std::max(abatch.size(), bbatch.size()), 1);
    for (size_t i = 0; i < batch_shape.size(); ++i) {
        const size_t ia = i + abatch.size() - batch_shape.size(), ib = i + bbatch.size() - batch_shape.size();
        const int64_t da = i + abatch.size() >= batch_shape.size() ? abatch[ia] : 1;
        const int64_t db = i + bbatch.size() >= batch_shape.size() ? bbatch[ib] : 1;
        batch_shape[i] = std::max(da, db);
    }
    const int64_t batch = product(batch_shape);
    auto expand = [&](int v, const shape_t& mat, int64_t rows, int64_t cols) {
        shape_t full = batch_shape;
        full.push_back(rows);
        full.push_back(cols);
        const int t = temp(dtype::f32, full);
        shape_t st(full.size());
        broadcast_strides(full, mat, st.data());
        lower_copy_view(n, v, t, full, 0, st, 0, contiguous_strides(full));
        return t;
    };
    if (product(abatch) != batch && product(abatch) != 1) { A = expand(A, as, M, K); abatch = batch_shape; }
    if (product(bbatch) != batch && product(bbatch) != 1) { B = expand(B, bs, K, N); bbatch = batch_shape; }
    const int64_t na = product(abatch), nb = product(bbatch);
    k::gemm_args g{};
    g.batch = batch;
    g.m = M; g.n = N; g.k = K;
    g.lda = K; g.ldb = N; g.ldc = N;
    g.stride_a = na == 1 ? 0 : M * K;
    g.stride_b = nb == 1 ? 0 : K * N;
    g.stride_c = M * N;
    g.alpha = 1.0f;
    g.beta = 1.0f;
    g.bias_mode = k::bias_kind::none;
    // MatMul + Add(constant bias over the last dim) [+ activation]: the transformer's linear.
    int bias = -1, c = -1;
    if (const node* next = sole_consumer(y, &c); next && next->op == op_type::Add && !_done[size_t(c)]) {
        const int other = next->input(0) == y ? next->input(1) : next->input(0);
        if (val(other).is_constant() && val(other).type == dtype::f32 &&
            element_count(val(other).shape) == N && val(other).shape.back() == N &&
            val(next->output(0)).shape == val(y).shape) {
            bias = other;
            g.bias_mode = k::bias_kind::per_col;
            _done[size_t(c)] = true;
            y = next->output(0);
        }
    }
    if (const node* next = sole_consumer(y, &c); next && !_done[size_t(c)]) {
        if (auto ep = activation_of(*next)) {
            g.ep = *ep;
            _done[size_t(c)] = true;
            y = next->output(0);
        }
    }
    // A transformer's linears are [tokens, K] x [K, N] with tokens = batch x length: rows of
    // 256 let OpenBLAS pack each weight panel for 4x as many rows as 64 did (BERT-base at
    // L=128: 397 -> 344 ms on one core), and K chunks of 256 keep a preemption check every
    // ~34 MFLOP (no slower, measured).
    g.tile_m = int32_t(std::min<int64_t>(M, 256));
    g.tile_n = int32_t(std::min<int64_t>(N, 256));
    g.tile_k = int32_t(std::max<int64_t>(1, std::min<int64_t>(K, 256)));
    // Several units: BERT's 768-wide linears at batch 1 are three blocks, which two units run
    // as two rounds; narrower column tiles (not below 64) until every unit has two blocks.
    if (_o.compute_units > 1) {
        while (k::gemm_grid(g) < 2 * int64_t(_o.compute_units) && g.tile_n > 64)
            g.tile_n = int32_t(std::max<int64_t>(64, (g.tile_n + 1) / 2));
        g.tile_n = int32_t(balanced_tile(N, g.tile_n, g.batch * k::gemm_tiles_m(g), _o.compute_units, 16));
    }
    if (_o.tiles == plan_options::tiles_for::gpu) use_gpu_tiles(g, _o.compute_units);
    if (bias >= 0)
        emit(k::gemm_kernel, g, k::gemm_grid(g), n, {{&g.a, A}, {&g.b, B}, {&g.bias, bias}, {&g.c, y}}, {A, B, bias}, {y});
    else
        emit(k::gemm_kernel, g, k::gemm_grid(g), n, {{&g.a, A}, {&g.b, B}, {&g.c, y}}, {A, B}, {y});
}

void planner::lower_pool(const node& n, bool global, int x, int y) {
    if (x < 0) x = n.input(0);
    if (y < 0) y = n.output(0);
    const int idx = n.output(1);
    if (val(x).type != dtype::f32 && n.op == op_type::MaxPool && !global &&
        (val(x).type == dtype::u8 || val(x).type == dtype::i8)) {
        // 8-bit values are exact in f32: cast, pool, cast back.
        const int xf = temp(dtype::f32, val(x).shape), yf = temp(dtype::f32, val(y).shape);
        lower_cast(n, x, xf);
        lower_pool(n, global, xf, yf);
        return lower_cast(n, yf, y);
    }
    require_f32(n, x);
    shape_t xs = val(x).shape;
    shape_t ys = val(y).shape;
    const size_t spatial = xs.size() - 2;
    if (xs.size() < 3 || spatial > 3) unsupported(n, "only 1-D, 2-D and 3-D pooling (NCW, NCHW, NCDHW)");
    if (global) {
        // A c16 input: rows of 16 channels per pixel, reduced over the pixels into [n, c].
        const int64_t inner = blocked(x) ? k::c16 : 1;
        lower_rows(n, n.op == op_type::GlobalMaxPool ? k::row_op::reduce_max : k::row_op::reduce_mean, x, y,
                   xs[0] * xs[1] / inner, product(xs, 2), inner);
        return;
    }
    if (idx >= 0 && val(idx).type != dtype::i64) unsupported(n, "Indices output other than int64");
    // Spatial attributes as 3-D (depth, height, width): missing leading dims are 1.
    ints ks = n.is("kernel_shape"), pads = n.is("pads"), st = n.is("strides");
    ints dil = n.is("dilations", ints(spatial, 1));
    const size_t lead = 3 - spatial;
    ints pb(pads.begin(), pads.begin() + long(spatial)), pe(pads.begin() + long(spatial), pads.end());
    for (size_t i = 0; i < lead; ++i) {
        ks.insert(ks.begin(), 1);
        st.insert(st.begin(), 1);
        dil.insert(dil.begin(), 1);
        pb.insert(pb.begin(), 0);
        pe.insert(pe.begin(), 0);
        xs.insert(xs.begin() + 2, 1);
        ys.insert(ys.begin() + 2, 1);
    }
    k::pool2d_args a{};
    a.n = xs[0]; a.c = xs[1]; a.d = xs[2]; a.h = xs[3]; a.w = xs[4];
    a.d_out = ys[2]; a.h_out = ys[3]; a.w_out = ys[4];
    a.kd = ks[0]; a.kh = ks[1]; a.kw = ks[2];
    a.stride_d = st[0]; a.stride_h = st[1]; a.stride_w = st[2];
    a.dil_d = dil[0]; a.dil_h = dil[1]; a.dil_w = dil[2];
    a.pad_front = pb[0]; a.pad_top = pb[1]; a.pad_left = pb[2];
    a.pad_back = pe[0]; a.pad_bottom = pe[1]; a.pad_right = pe[2];
    a.op = n.op == op_type::MaxPool ? k::pool_op::max : k::pool_op::average;
    a.count_include_pad = n.i("count_include_pad", 0) != 0;
    a.column_major = n.i("storage_order", 0) != 0;
    a.planes_per_block = std::max<int64_t>(1, _o.elements_per_block /
                                                  std::max<int64_t>(1, a.d_out * a.h_out * a.w_out * a.kd * a.kh * a.kw / 4));
    if (blocked(x)) {
        if (!k::pool2d_c16_possible(a) || !blocked(y)) unsupported(n, "a c16 pooling the kernels cannot run");
        a.planes_per_block = std::max<int64_t>(1, a.planes_per_block / k::c16);
        return emit(k::pool2d_c16_kernel, a, k::pool2d_c16_grid(a), n, {{&a.x, x}, {&a.y, y}}, {x}, {y});
    }
    // Planes the cpu device max-pools 16 at a time (pool16_max_pixels): a multiple of 16 per block.
    if (a.op == k::pool_op::max && a.d_out <= 1 && a.h_out * a.w_out <= k::pool16_max_pixels && a.n * a.c >= 16)
        a.planes_per_block = by_16_within(a.planes_per_block, a.n * a.c);
    if (idx >= 0)
        return emit(k::pool2d_kernel, a, k::pool2d_grid(a), n, {{&a.x, x}, {&a.y, y}, {&a.indices, idx}}, {x}, {y, idx});
    emit(k::pool2d_kernel, a, k::pool2d_grid(a), n, {{&a.x, x}, {&a.y, y}}, {x}, {y},
         k::pool2d_is_separable(a) ? k::pool2d_scratch_bytes(a) : 0);
}

bool planner::takes_c16(const node& n, int ni) const {
    if (n.op == op_type::Conv) return _c16.conv[size_t(ni)] != 0;
    if (n.op == op_type::GlobalAveragePool || n.op == op_type::GlobalMaxPool) return true;
    // The ops of a class read and write one layout: c16 where their output is.
    return !n.outputs.empty() && blocked(n.output(0));
}

int planner::reordered(int v, bool to_c16, const node& reader) {
    const auto key = std::make_pair(v, to_c16);
    if (const auto it = _reordered.find(key); it != _reordered.end()) return it->second;
    const int t = temp(dtype::f32, val(v).shape);
    copy_layout(reader, v, t, to_c16);
    return _reordered[key] = t;
}

void planner::copy_layout(const node& n, int from, int to, bool to_c16) {
    const shape_t& s = val(from).shape;  // [n, c, h, w], c a multiple of 16
    const int64_t c = s[1], hw = s[2] * s[3];
    // The c16 tensor as [n][c / 16][hw][16], the NCHW one as [n][c / 16][16][hw]: the copy's
    // shape is the destination's.
    const shape_t blocked{c * hw, k::c16 * hw, 1, k::c16}, plain{c * hw, k::c16 * hw, hw, 1};
    if (to_c16)
        lower_copy_view(n, from, to, {s[0], c / k::c16, hw, k::c16}, 0, {c * hw, k::c16 * hw, 1, hw}, 0,
                        {c * hw, k::c16 * hw, k::c16, 1});
    else
        lower_copy_view(n, from, to, {s[0], c / k::c16, k::c16, hw}, 0, blocked, 0, plain);
}

void planner::lower(int ni) {
    const node& n = _g.nodes[size_t(ni)];
    // A reader of c16 values that takes only NCHW reads them reordered.
    if (!takes_c16(n, ni) && std::any_of(n.inputs.begin(), n.inputs.end(), [&](int v) { return blocked(v); })) {
        node copy = n;
        for (int& v : copy.inputs)
            if (blocked(v)) v = reordered(v, false, n);
        return lower_node(copy, ni);
    }
    lower_node(n, ni);
}

void planner::lower_node(const node& n, int ni) {
    const int x = n.input(0), y = n.output(0);
    switch (n.op) {
    case op_type::Conv: return lower_conv(n, ni);
    case op_type::Gemm: return lower_gemm(n);
    case op_type::MatMul: return lower_matmul(n);
    case op_type::MaxPool:
    case op_type::AveragePool: return lower_pool(n, false);
    case op_type::GlobalAveragePool:
    case op_type::GlobalMaxPool: return lower_pool(n, true);
    case op_type::Clip: return lower_clip(n);
    case op_type::Relu: case op_type::LeakyRelu: case op_type::Sigmoid: case op_type::Tanh:
    case op_type::HardSigmoid: case op_type::HardSwish: case op_type::Gelu:
        return lower_unary(n, k::unary_op::identity, x, y, *activation_of(n));
    case op_type::Erf: return lower_unary(n, k::unary_op::erf, x, y);
    case op_type::Sqrt: return lower_unary(n, k::unary_op::sqrt, x, y);
    case op_type::Exp: return lower_unary(n, k::unary_op::exp, x, y);
    case op_type::Neg: return lower_unary(n, k::unary_op::neg, x, y);
    case op_type::Abs: return lower_unary(n, k::unary_op::abs, x, y);
    case op_type::Sin: return lower_unary(n, k::unary_op::sin, x, y);
    case op_type::Cos: return lower_unary(n, k::unary_op::cos, x, y);
    case op_type::Add: return lower_binary(n, k::binary_op::add, x, n.input(1), y);
    case op_type::Sub: return lower_binary(n, k::binary_op::sub, x, n.input(1), y);
    case op_type::Mul: return lower_binary(n, k::binary_op::mul, x, n.input(1), y);
    case op_type::Div: return lower_binary(n, k::binary_op::div, x, n.input(1), y);
    case op_type::Pow: return lower_binary(n, k::binary_op::pow, x, n.input(1), y);
    case op_type::Equal: return lower_binary(n, k::binary_op::equal, x, n.input(1), y);
    case op_type::Cast: return lower_cast(n, x, y);
    case op_type::Sum: case op_type::Max: case op_type::Min: case op_type::Mean: return lower_variadic(n);
    case op_type::Pad: return lower_pad(n);
    case op_type::Reshape: case op_type::Flatten: case op_type::Squeeze: case op_type::Unsqueeze:
        return alias(y, x);
    case op_type::Identity: return lower_unary(n, k::unary_op::identity, x, y);
    case op_type::Transpose: return lower_transpose(n);
    case op_type::Expand: return lower_expand(n);
    case op_type::Slice: return lower_slice(n);
    case op_type::Concat: return lower_concat(n);
    case op_type::Split: return lower_split(n);
    case op_type::Gather: return lower_gather(n);
    case op_type::Softmax: case op_type::LogSoftmax: return lower_softmax(n);
    case op_type::LayerNormalization: return lower_layer_norm(n);
    case op_type::ReduceMean: return lower_reduce_mean(n);
    case op_type::LRN: return lower_lrn(n);
    case op_type::BatchNormalization: return lower_batch_norm(n);
    case op_type::Where: return lower_where(n);
    default:
        unsupported(n, std::string("no kernel for ") + op_name(n.op) + " at run time");
    }
}


// Clip on f32 is an activation (fused where it follows a producer); on other element types it is
// a saturating unary kernel.
void planner::lower_clip(const node& n) {
    const int x = n.input(0), y = n.output(0);
    if (val(x).type != dtype::f32) {
        const auto t = elem_of(val(x).type);
        if (!t) unsupported(n, std::string("element type ") + dtype_name(val(x).type));
        k::unary_args a{};
        a.count = std::max<int64_t>(1, element_count(val(y).shape));
        a.op = k::unary_op::clip;
        a.alpha = n.f("min", -std::numeric_limits<float>::infinity());
        a.beta = n.f("max", std::numeric_limits<float>::infinity());
        // Integer bounds beyond the type saturate to the type's range.
        a.alpha = std::max(a.alpha, -9.2e18f);
        a.beta = std::min(a.beta, 9.2e18f);
        a.x_type = a.y_type = *t;
        a.per_block = _o.elements_per_block;
        return emit(k::unary_kernel, a, k::unary_grid(a), n, {{&a.x, x}, {&a.y, y}}, {x}, {y});
    }
    return lower_unary(n, k::unary_op::identity, x, y, *activation_of(n));
}
void planner::lower_variadic(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const k::binary_op op = n.op == op_type::Max ? k::binary_op::max
                            : n.op == op_type::Min ? k::binary_op::min : k::binary_op::add;
    const size_t count = n.inputs.size();
    const bool mean = n.op == op_type::Mean;
    // A chain of binary launches through temporaries of the output's shape (element-wise
    // ops commute with broadcasting); Mean scales the sum by 1/count at the end.
    int acc = x;
    for (size_t i = 1; i < count; ++i) {
        const int out = i + 1 == count && !mean ? y : temp(val(y).type, val(y).shape);
        lower_binary(n, op, acc, n.input(i), out);
        acc = out;
    }
    if (mean) return lower_unary(n, k::unary_op::scale, acc, y, {}, 1.0f / float(count));
    if (count == 1) return lower_unary(n, k::unary_op::identity, x, y);
    return;
}

void planner::lower_pad(const node& n) {
    const int x = n.input(0), y = n.output(0);
    if (n.s("mode", "constant") != "constant") unsupported(n, "mode '" + n.s("mode") + "' (constant only)");
    const shape_t& xs = val(x).shape;
    const shape_t& ys = val(y).shape;
    const ints pads = n.is("pads");
    const size_t r = xs.size();
    // Fill the output with the value, then copy the input's kept part into its place
    // (negative pads crop).
    lower_unary(n, k::unary_op::fill, -1, y, {}, n.f("value", 0.0f));
    const shape_t xst = contiguous_strides(xs), yst = contiguous_strides(ys);
    shape_t part(r);
    int64_t xoff = 0, yoff = 0;
    for (size_t d = 0; d < r; ++d) {
        const int64_t b = pads[d], e = pads[d + r];
        part[d] = xs[d] + std::min<int64_t>(b, 0) + std::min<int64_t>(e, 0);
        if (part[d] <= 0) return;
        xoff += std::max<int64_t>(-b, 0) * xst[d];
        yoff += std::max<int64_t>(b, 0) * yst[d];
    }
    require_f32(n, x);
    return lower_copy_view(n, x, y, part, xoff, xst, yoff, yst);
}

void planner::lower_transpose(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const ints perm = n.is("perm");
    const shape_t& xs = val(x).shape;
    const shape_t xst = contiguous_strides(xs);
    shape_t st(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) st[d] = xst[size_t(perm[d])];
    const shape_t& ys = val(y).shape;
    return lower_copy_view(n, x, y, ys, 0, st, 0, contiguous_strides(ys));
}

void planner::lower_expand(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const shape_t& ys = val(y).shape;
    shape_t st(ys.size());
    broadcast_strides(ys, val(x).shape, st.data());
    return lower_copy_view(n, x, y, ys, 0, st, 0, contiguous_strides(ys));
}

void planner::lower_slice(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const shape_t& xs = val(x).shape;
    const shape_t xst = contiguous_strides(xs);
    const ints axes = n.is("axes"), starts = n.is("starts"), steps = n.is("steps");
    shape_t st = xst;
    int64_t off = 0;
    for (size_t i = 0; i < axes.size(); ++i) {
        const size_t ax = size_t(axes[i]);
        off += starts[i] * xst[ax];
        st[ax] = xst[ax] * steps[i];
    }
    const shape_t& ys = val(y).shape;
    return lower_copy_view(n, x, y, ys, off, st, 0, contiguous_strides(ys));
}

void planner::lower_concat(const node& n) {
    const int y = n.output(0);
    const int64_t axis = n.i("axis", 0);
    const shape_t& ys = val(y).shape;
    const shape_t yst = contiguous_strides(ys);
    if (concat_in_place(n, y, axis)) return;
    int64_t at = 0;
    for (int in : n.inputs) {
        const shape_t& is = val(in).shape;
        lower_copy_view(n, in, y, is, 0, contiguous_strides(is), at * yst[size_t(axis)], yst);
        at += is[size_t(axis)];
    }
    return;
}

void planner::lower_split(const node& n) {
    const int x = n.input(0);
    const int64_t axis = n.i("axis", 0);
    const shape_t& xs = val(x).shape;
    const shape_t xst = contiguous_strides(xs);
    int64_t at = 0;
    for (int out : n.outputs) {
        if (out < 0) continue;
        const shape_t& os = val(out).shape;
        lower_copy_view(n, x, out, os, at * xst[size_t(axis)], xst, 0, contiguous_strides(os));
        at += os[size_t(axis)];
    }
    return;
}

void planner::lower_gather(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const int idx = n.input(1);
    const shape_t& xs = val(x).shape;
    const int64_t axis = n.i("axis", 0);
    if (val(idx).type != dtype::i64 && val(idx).type != dtype::i32) unsupported(n, "indices must be int64 or int32");
    k::gather_axis_args a{};
    a.index_bytes = int32_t(dtype_size(val(idx).type));
    a.outer = product(xs, 0, size_t(axis));
    a.axis = xs[size_t(axis)];
    a.inner = product(xs, size_t(axis) + 1);
    a.count = std::max<int64_t>(1, element_count(val(idx).shape));
    a.element_bytes = int32_t(dtype_size(val(x).type));
    a.rows_per_block = std::max<int64_t>(1, _o.elements_per_block / std::max<int64_t>(1, a.inner));
    return emit(k::gather_axis_kernel, a, k::gather_axis_grid(a), n,
                {{&a.x, x}, {&a.indices, idx}, {&a.y, y}}, {x, idx}, {y});
}

void planner::lower_softmax(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const shape_t& xs = val(x).shape;
    const int64_t axis = n.i("axis", int64_t(xs.size()) - 1);
    const k::row_op op = n.op == op_type::Softmax ? k::row_op::softmax : k::row_op::log_softmax;
    if (n.i("coerce_2d", 0)) return lower_rows(n, op, x, y, product(xs, 0, size_t(axis)), product(xs, size_t(axis)), 1);
    return lower_rows(n, op, x, y, product(xs, 0, size_t(axis)), xs[size_t(axis)], product(xs, size_t(axis) + 1));
}

void planner::lower_layer_norm(const node& n) {
    const int x = n.input(0), y = n.output(0);
    require_f32(n, x);
    const shape_t& xs = val(x).shape;
    const int64_t axis = n.i("axis", -1);
    const int64_t norm = product(xs, size_t(axis));
    const int scale = n.input(1), bias = n.input(2), mean = n.output(1), inv = n.output(2);
    if (element_count(val(scale).shape) != norm || (bias >= 0 && element_count(val(bias).shape) != norm))
        unsupported(n, "scale/bias that broadcast over the normalised dims");
    if ((mean >= 0 && val(mean).type != dtype::f32) || (inv >= 0 && val(inv).type != dtype::f32))
        unsupported(n, "Mean/InvStdDev outputs other than f32");
    k::row_args a{};
    a.outer = product(xs, 0, size_t(axis));
    a.axis = norm;
    a.inner = 1;
    a.op = k::row_op::layer_norm;
    a.epsilon = n.f("epsilon", 1e-5f);
    a.rows_per_block = std::max<int64_t>(1, _o.elements_per_block / std::max<int64_t>(1, norm));
    // Optional operands as (field, value) pairs; absent ones stay null in the arguments.
    std::vector<int> reads{x, scale}, writes{y};
    std::vector<std::pair<const void*, int>> ptrs{{&a.x, x}, {&a.scale, scale}, {&a.y, y}};
    if (bias >= 0) { ptrs.push_back({&a.bias, bias}); reads.push_back(bias); }
    if (mean >= 0) { ptrs.push_back({&a.mean_out, mean}); writes.push_back(mean); }
    if (inv >= 0) { ptrs.push_back({&a.inv_std_out, inv}); writes.push_back(inv); }
    return emit_list(k::row_kernel, a, k::row_grid(a), n, ptrs, reads, writes);
}

void planner::lower_reduce_mean(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const shape_t& xs = val(x).shape;
    ints axes = n.is("axes");
    if (axes.empty()) { axes.resize(xs.size()); std::iota(axes.begin(), axes.end(), 0); }
    for (size_t i = 1; i < axes.size(); ++i)
        if (axes[i] != axes[i - 1] + 1) unsupported(n, "non-contiguous reduction axes");
    return lower_rows(n, k::row_op::reduce_mean, x, y, product(xs, 0, size_t(axes.front())),
                      product(xs, size_t(axes.front()), size_t(axes.back()) + 1),
                      product(xs, size_t(axes.back()) + 1));
}

void planner::lower_lrn(const node& n) {
    const int x = n.input(0), y = n.output(0);
    require_f32(n, x);
    const shape_t& xs = val(x).shape;
    k::lrn_args a{};
    a.n = xs[0]; a.c = xs[1]; a.hw = product(xs, 2);
    a.size = n.i("size", 1);
    a.alpha = n.f("alpha", 1e-4f); a.beta = n.f("beta", 0.75f); a.bias = n.f("bias", 1.0f);
    a.planes_per_block = std::max<int64_t>(1, _o.elements_per_block / std::max<int64_t>(1, a.hw * a.size));
    return emit(k::lrn_kernel, a, k::lrn_grid(a), n, {{&a.x, x}, {&a.y, y}}, {x}, {y});
}

void planner::lower_batch_norm(const node& n) {
    const int x = n.input(0), y = n.output(0);
    require_f32(n, x);
    const shape_t& xs = val(x).shape;
    if (xs.size() < 2) unsupported(n, "input of rank < 2");
    for (int i = 1; i <= 4; ++i)
        if (val(n.input(size_t(i))).type != dtype::f32 || element_count(val(n.input(size_t(i))).shape) != xs[1])
            unsupported(n, "per-channel parameters that are not f32 vectors of C");
    k::batchnorm_args a{};
    a.n = xs[0]; a.c = xs[1]; a.hw = product(xs, 2);
    a.epsilon = n.f("epsilon", 1e-5f);
    int out = y, c = -1;
    if (const node* next = sole_consumer(y, &c); next && !_done[size_t(c)]) {
        if (auto ep = activation_of(*next)) {
            a.ep = *ep;
            _done[size_t(c)] = true;
            out = next->output(0);
        }
    }
    a.planes_per_block = std::max<int64_t>(1, _o.elements_per_block / std::max<int64_t>(1, a.hw));
    const int s_ = n.input(1), b_ = n.input(2), m_ = n.input(3), v_ = n.input(4);
    if (blocked(x)) {
        a.planes_per_block = std::max<int64_t>(1, a.planes_per_block / k::c16);
        return emit(k::batchnorm_c16_kernel, a, k::batchnorm_c16_grid(a), n,
                    {{&a.x, x}, {&a.scale, s_}, {&a.bias, b_}, {&a.mean, m_}, {&a.var, v_}, {&a.y, out}},
                    {x, s_, b_, m_, v_}, {out});
    }
    return emit(k::batchnorm_kernel, a, k::batchnorm_grid(a), n,
                {{&a.x, x}, {&a.scale, s_}, {&a.bias, b_}, {&a.mean, m_}, {&a.var, v_}, {&a.y, out}},
                {x, s_, b_, m_, v_}, {out});
}

void planner::lower_where(const node& n) {
    const int x = n.input(0), y = n.output(0);
    const int cond = x, a_in = n.input(1), b_in = n.input(2);
    const auto ct = elem_of(val(cond).type), vt = elem_of(val(a_in).type);
    if (!ct || !vt || val(b_in).type != val(a_in).type) unsupported(n, "condition or value types");
    k::where_args a{};
    a.c_type = *ct;
    a.type = *vt;
    const shape_t& ys = val(y).shape;
    a.shape = nd(n, ys);
    broadcast_strides(ys, val(cond).shape, a.c_strides);
    broadcast_strides(ys, val(a_in).shape, a.a_strides);
    broadcast_strides(ys, val(b_in).shape, a.b_strides);
    a.per_block = _o.elements_per_block;
    return emit(k::where_kernel, a, k::where_grid(a), n, {{&a.cond, cond}, {&a.a, a_in}, {&a.b, b_in}, {&a.y, y}}, {cond, a_in, b_in}, {y});
}

plan planner::run() {
    _consumers = _g.consumers();
    _done.assign(_g.nodes.size(), false);
    // The channel-blocked layout where the weights have the packed filters of its
    // convolutions (layout_weights made the same choice on this graph's structure; a
    // convolution whose filters were packed for the other input layout reads its input
    // reordered).
    if (_o.tiles != plan_options::tiles_for::gpu && !_w.c16.empty())
        _c16 = choose_c16_layout(_g, [&](int ni, bool) {
            const node& n = _g.nodes[size_t(ni)];
            return n.inputs.size() >= 2 && n.input(1) >= 0 && val(n.input(1)).is_constant() &&
                   _w.c16.count(val(n.input(1)).data.get()) && conv2d_geometry(_g, n).has_value();
        });
    else
        _c16 = c16_layout{std::vector<char>(_g.values.size(), 0), std::vector<char>(_g.nodes.size(), 0)};
    plan p;
    p._restore_window = _o.restore_window;

    // Graph inputs: their own region, in order.
    int64_t in_off = 0;
    for (int v : _g.inputs) {
        storage s;
        s.where = region::inputs;
        s.bytes = int64_t(dtype_size(val(v).type)) * std::max<int64_t>(1, element_count(val(v).shape));
        s.offset = in_off;
        in_off = align_up(in_off + s.bytes);
        _storages.push_back(s);
        _storage[size_t(v)] = int(_storages.size() - 1);
    }
    _extra_at = in_off;

    for (size_t ni = 0; ni < _g.nodes.size(); ++ni)
        if (!_done[ni]) lower(int(ni));
    interleave_images();

    // Liveness per storage, in launch indices.
    for (size_t li = 0; li < _pending.size(); ++li) {
        for (int v : _pending[li].writes) {
            storage& s = _storages[size_t(storage_of(v))];
            s.first = std::min(s.first, int(li));
            s.last = std::max(s.last, int(li));
        }
        for (int v : _pending[li].reads) {
            storage& s = _storages[size_t(storage_of(v))];
            s.last = std::max(s.last, int(li));
        }
    }
    for (int v : _g.outputs) _storages[size_t(storage_of(v))].output = true;

    // Arena placement: largest first, lowest offset that overlaps no storage alive at an
    // overlapping time. A storage stays reserved for restore_window launches after its last
    // reader, so approximate restore re-executes kernels over intact inputs.
    std::vector<int> order;
    for (size_t i = 0; i < _storages.size(); ++i)
        if (_storages[i].where == region::arena) order.push_back(int(i));
    std::sort(order.begin(), order.end(), [&](int a, int b) {
        return _storages[size_t(a)].bytes != _storages[size_t(b)].bytes
                   ? _storages[size_t(a)].bytes > _storages[size_t(b)].bytes : a < b;
    });
    const int end_of_time = std::numeric_limits<int>::max() / 2;
    auto until = [&](const storage& s) { return s.output ? end_of_time : s.last + _o.restore_window; };
    std::vector<int> placed;
    int64_t arena = 0;
    for (int si : order) {
        storage& s = _storages[size_t(si)];
        if (s.first == std::numeric_limits<int>::max()) s.first = 0;  // never written (empty)
        std::vector<std::pair<int64_t, int64_t>> busy;
        for (int pi : placed) {
            const storage& o = _storages[size_t(pi)];
            if (o.first <= until(s) && s.first <= until(o)) busy.push_back({o.offset, o.offset + o.bytes});
        }
        std::sort(busy.begin(), busy.end());
        int64_t at = 0;
        for (auto [b0, b1] : busy) {
            if (at + s.bytes <= b0) break;
            at = std::max(at, align_up(b1));
        }
        s.offset = at;
        arena = std::max(arena, align_up(at + s.bytes));
        placed.push_back(si);
    }
    p._arena_bytes = arena;
    p._input_bytes = _extra_at;
    p._constants = std::move(_extra);

    auto location = [&](int v) {
        const storage& s = _storages[size_t(storage_of(v))];
        return tensor_location{s.where, s.offset + _view_offset[size_t(v)], val(v).type, val(v).shape};
    };
    for (int v : _g.inputs) p._inputs.push_back(location(v));
    for (int v : _g.outputs) p._outputs.push_back(location(v));

    for (size_t li = 0; li < _pending.size(); ++li) {
        pending& q = _pending[li];
        planned_launch l;
        l.kernel = q.kernel;
        l.args = std::move(q.args);
        l.grid = q.grid;
        l.scratch_bytes = q.scratch;
        l.node = q.node;
        for (auto& ptr : q.pointers) {
            if (ptr.value < 0) {
                p._fixups.push_back({li, ptr.args_offset, region::weights, ptr.byte_offset});
                continue;
            }
            const tensor_location t = location(ptr.value);
            p._fixups.push_back({li, ptr.args_offset, t.where, t.offset + ptr.byte_offset});
        }
        // A value's own bytes (a slot of a concatenation shares its storage with the others).
        auto range = [&](int v) {
            const value& x = val(v);
            const tensor_location t = location(v);
            if (const int64_t one = image_bytes(v, q.images))
                return byte_range{t.where, t.offset + q.image * one, one * q.image_count};
            return byte_range{t.where, t.offset, int64_t(dtype_size(x.type)) * std::max<int64_t>(1, element_count(x.shape))};
        };
        for (int v : q.reads) l.reads.push_back(range(v));
        for (int v : q.writes) l.writes.push_back(range(v));
        p._launches.push_back(std::move(l));
    }
    return p;
}

plan plan::build(const graph& g, const weight_layout& weights, const plan_options& opts) {
    return planner(g, weights, opts).run();
}

void plan::bind(const memory_bases& bases) {
    for (const pointer_fixup& f : _fixups) {
        std::byte* base = f.where == region::weights ? bases.weights
                          : f.where == region::arena ? bases.arena : bases.inputs;
        void* ptr = base + f.offset;
        std::memcpy(_launches[f.launch].args.data() + f.args_offset, &ptr, sizeof ptr);
    }
}

std::string plan::check_idempotence() const {
    auto overlap = [](const byte_range& a, const byte_range& b) {
        return a.where == b.where && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
    };
    for (size_t j = 0; j < _launches.size(); ++j) {
        for (const byte_range& r : _launches[j].reads) {
            if (r.where != region::arena) continue;
            for (size_t kk = j; kk < std::min(_launches.size(), j + size_t(_restore_window) + 1); ++kk)
                for (const byte_range& w : _launches[kk].writes)
                    if (overlap(r, w))
                        return "launch " + std::to_string(kk) + " (" + _launches[kk].kernel->name +
                               ", node '" + _launches[kk].node + "') writes memory that launch " +
                               std::to_string(j) + " (node '" + _launches[j].node + "') reads";
        }
        for (const byte_range& w : _launches[j].writes)
            if (w.where != region::arena)
                return "launch " + std::to_string(j) + " writes outside the arena";
    }
    return "";
}

}  // namespace reefline::ml
