#include "libml/planner/c16_layout.h"

#include <algorithm>
#include <atomic>
#include <numeric>

#include "libml/kernels/cpu_c16.h"
#include "libml/kernels/cpu_pointwise_depthwise.h"
#include "libml/kernels/cpu_rows.h"
#include "libml/kernels/kernels.h"

namespace reefline::ml {

namespace k = kernels;

namespace {

std::atomic<bool> c16_on{true};

struct classes {
    std::vector<int> parent;
    explicit classes(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
    int find(int v) {
        while (parent[size_t(v)] != v) v = parent[size_t(v)] = parent[size_t(parent[size_t(v)])];
        return v;
    }
    void join(int a, int b) { parent[size_t(find(a))] = find(b); }
};

bool rank4_f32(const value& v) { return v.type == dtype::f32 && v.shape.size() == 4 && !v.is_constant(); }

bool ones(const ints& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t s) { return s == 1; });
}

// The ops that read and write one layout (their runtime f32 inputs and outputs join one
// class): element-wise on equal shapes, batch norm, 2-D pooling the c16 kernels run, and
// concatenation along channels.
bool passes_layout(const graph& g, const node& n) {
    if (n.outputs.empty() || n.output(0) < 0 || n.inputs.empty() || n.input(0) < 0) return false;
    const value& x = g.values[size_t(n.input(0))];
    const value& y = g.values[size_t(n.output(0))];
    if (!rank4_f32(x) || !rank4_f32(y)) return false;
    switch (n.op) {
    case op_type::Relu: case op_type::LeakyRelu: case op_type::Sigmoid: case op_type::Tanh:
    case op_type::HardSigmoid: case op_type::HardSwish: case op_type::Gelu: case op_type::Clip:
    case op_type::Identity:
        return x.shape == y.shape;
    case op_type::BatchNormalization: return x.shape == y.shape && (n.outputs.size() == 1);
    case op_type::MaxPool: case op_type::AveragePool: {
        if (n.outputs.size() > 1 && n.output(1) >= 0) return false;  // indices
        return n.is("kernel_shape").size() == 2 && ones(n.is("dilations", ints(2, 1)));
    }
    case op_type::Add: case op_type::Sub: case op_type::Mul: case op_type::Div: case op_type::Max: case op_type::Min: {
        if (n.inputs.size() != 2 || n.input(1) < 0) return false;
        const value& b = g.values[size_t(n.input(1))];
        return rank4_f32(b) && x.shape == y.shape && b.shape == y.shape;
    }
    case op_type::Concat: {
        if (n.i("axis", 0) != 1) return false;
        for (int in : n.inputs)
            if (in < 0 || !rank4_f32(g.values[size_t(in)])) return false;
        return true;
    }
    default: return false;
    }
}

}  // namespace

bool c16_layout::any() const { return std::any_of(value.begin(), value.end(), [](char c) { return c != 0; }); }

void use_c16_layout(bool on) { c16_on = on; }
bool c16_layout_in_use() { return c16_on.load(std::memory_order_relaxed) && k::cpu_has_avx512(); }

std::optional<k::conv2d_args> conv2d_geometry(const graph& g, const node& n) {
    if (n.op != op_type::Conv || n.inputs.size() < 2 || n.input(0) < 0 || n.input(1) < 0 || n.outputs.empty() ||
        n.output(0) < 0)
        return std::nullopt;
    return conv2d_geometry(n, g.values[size_t(n.input(0))], g.values[size_t(n.input(1))], g.values[size_t(n.output(0))]);
}

std::optional<k::conv2d_args> conv2d_geometry(const node& n, const value& x, const value& w, const value& y) {
    const shape_t& xs = x.shape;
    const shape_t& ws = w.shape;
    if (x.type != dtype::f32 || w.type != dtype::f32 || (xs.size() != 4 && xs.size() != 3) || ws.size() != xs.size() ||
        y.shape.size() != xs.size())
        return std::nullopt;
    const ints pads = n.is("pads"), strides = n.is("strides"), dil = n.is("dilations");
    k::conv2d_args a{};
    a.n = xs[0];
    a.c_in = xs[1];
    a.c_out = ws[0];
    a.groups = n.i("group", 1);
    if (xs.size() == 3) {
        if (pads.empty() || strides.empty() || dil.empty()) return std::nullopt;
        // 1-D: a 2-D convolution of height 1 (a temporal convolution over sensor windows).
        // Only the begin pads matter: the output length comes from shape inference, and
        // reads past the input's end are zeros, which the end pads are.
        a.h = 1; a.w_in = xs[2];
        a.kh = 1; a.kw = ws[2];
        a.stride_h = 1; a.stride_w = strides[0];
        a.pad_top = 0; a.pad_left = pads[0];
        a.dil_h = 1; a.dil_w = dil[0];
        a.h_out = 1;
        a.w_out = y.shape[2];
    } else {
        if (pads.size() < 2 || strides.size() < 2 || dil.size() < 2) return std::nullopt;
        a.h = xs[2]; a.w_in = xs[3];
        a.kh = ws[2]; a.kw = ws[3];
        a.stride_h = strides[0]; a.stride_w = strides[1];
        a.pad_top = pads[0]; a.pad_left = pads[1];
        a.dil_h = dil[0]; a.dil_w = dil[1];
        a.h_out = y.shape[2];
        a.w_out = y.shape[3];
    }
    return a;
}

c16_layout choose_c16_layout(const graph& g, const std::function<bool(int, bool)>& conv_ok) {
    c16_layout out;
    out.value.assign(g.values.size(), 0);
    out.conv.assign(g.nodes.size(), 0);
    if (!c16_layout_in_use()) return out;
    const auto consumers = g.consumers();
    classes cls(g.values.size());
    std::vector<char> passes(g.nodes.size(), 0);
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
        const node& n = g.nodes[ni];
        if (!passes_layout(g, n)) continue;
        passes[ni] = 1;
        for (int in : n.inputs)
            if (in >= 0 && !g.values[size_t(in)].is_constant()) cls.join(in, n.output(0));
    }
    const auto conv_input_ok = [&](int ni, int v) {
        const node& n = g.nodes[size_t(ni)];
        return n.op == op_type::Conv && n.input(0) == v && conv_ok(ni, true);
    };
    // Per class: can it be blocked (every member a candidate with an allowed writer), and does
    // it pay (a reader that takes c16).
    std::vector<char> allowed(g.values.size(), 1), pays(g.values.size(), 0);
    for (size_t vi = 0; vi < g.values.size(); ++vi) {
        const value& v = g.values[vi];
        const int root = cls.find(int(vi));
        if (v.is_constant()) continue;
        const bool candidate = rank4_f32(v) && v.shape[1] % k::c16 == 0 && v.shape[1] >= k::c16 &&
                               !g.is_output(int(vi)) &&
                               std::find(g.inputs.begin(), g.inputs.end(), int(vi)) == g.inputs.end();
        bool writer_ok = false;
        if (candidate && v.producer >= 0) {
            const node& p = g.nodes[size_t(v.producer)];
            writer_ok = passes[size_t(v.producer)] ||
                        (p.op == op_type::Conv && p.output(0) == int(vi) && (conv_ok(v.producer, false) || conv_ok(v.producer, true)));
        }
        if (!writer_ok) allowed[size_t(root)] = 0;
        for (const auto& [c, slot] : consumers[vi]) {
            (void)slot;
            const op_type op = g.nodes[size_t(c)].op;
            if (conv_input_ok(c, int(vi)) || op == op_type::GlobalAveragePool || op == op_type::GlobalMaxPool)
                pays[size_t(root)] = 1;
        }
    }
    // A convolution writes c16 only from the input layouts it takes (a depthwise one: c16
    // only): where its input's class stayed NCHW, its output's class is NCHW too, until
    // nothing changes.
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t vi = 0; vi < g.values.size(); ++vi) {
            const int root = cls.find(int(vi));
            out.value[vi] = !g.values[vi].is_constant() && allowed[size_t(root)] && pays[size_t(root)];
        }
        for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
            const node& n = g.nodes[ni];
            if (n.op != op_type::Conv || n.input(0) < 0 || n.output(0) < 0 || !out.value[size_t(n.output(0))]) continue;
            if (!conv_ok(int(ni), out.value[size_t(n.input(0))])) {
                allowed[size_t(cls.find(n.output(0)))] = 0;
                changed = true;
            }
        }
    }
    for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
        const node& n = g.nodes[ni];
        if (n.op != op_type::Conv || n.input(0) < 0 || n.output(0) < 0) continue;
        const bool x16 = out.value[size_t(n.input(0))], y16 = out.value[size_t(n.output(0))];
        out.conv[ni] = (x16 || y16) && conv_ok(int(ni), x16);
    }
    return out;
}

c16_layout choose_c16_layout(const graph& g) {
    const auto consumers = g.consumers();
    return choose_c16_layout(g, [&](int ni, bool x_c16) {
        const node& n = g.nodes[size_t(ni)];
        const auto a = conv2d_geometry(g, n);
        if (!a || !g.values[size_t(n.input(1))].is_constant() || !k::conv2d_c16_possible(*a, x_c16)) return false;
        // A pointwise layer the planner folds into the depthwise layer after it (through the
        // activation it fuses) reads NCHW.
        int y = n.output(0);
        const auto sole = [&](int v) -> const node* {
            if (g.is_output(v) || consumers[size_t(v)].size() != 1) return nullptr;
            return &g.nodes[size_t(consumers[size_t(v)][0].first)];
        };
        const node* next = sole(y);
        if (next && (next->op == op_type::Relu || next->op == op_type::Clip)) {
            y = next->output(0);
            next = sole(y);
        }
        if (next && next->input(0) == y)
            if (const auto dw = conv2d_geometry(g, *next); dw && k::pointwise_depthwise_possible(*a, *dw)) return false;
        return true;
    });
}

}  // namespace reefline::ml
