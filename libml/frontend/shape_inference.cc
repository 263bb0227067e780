// Shape and type inference for the canonical node forms (see graph.h): one rule per operator
// family and a table (shape_rules) that maps every op_type to its arity and rule; and the move of
// constant shape parameters from inputs into attributes (canonicalize_params).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "libml/frontend/graph.h"
#include "libml/frontend/passes.h"

namespace reefline::ml::detail {

namespace {

using K = model_error::kind;

std::string ints_str(const ints& v) {
    std::string r = "[";
    for (size_t i = 0; i < v.size(); ++i) r += (i ? "," : "") + std::to_string(v[i]);
    return r + "]";
}

// Reads an integer parameter tensor (shape, axes, pads, ...): 0-D or 1-D, integer dtype.
ints param_ints(const node& n, const value& v, const char* what) {
    if (v.type != dtype::i64 && v.type != dtype::i32)
        fail_node(K::shape, n, std::string("input '") + what + "' must be int64, not " + dtype_name(v.type));
    if (v.shape.size() > 1)
        fail_node(K::shape, n, std::string("input '") + what + "' must be 1-D, not " + shape_str(v.shape));
    return v.constant().to_i64();
}

double param_scalar(const node& n, const value& v, const char* what) {
    if (element_count(v.shape) != 1)
        fail_node(K::shape, n, std::string("input '") + what + "' must be a scalar, not " + shape_str(v.shape));
    return v.constant().as_f64(0);
}

}  // namespace

bool canonicalize_params(graph& g, int ni, int* pending) {
    node& n = g.nodes[size_t(ni)];
    int cnt = canonical_input_count(n.op);
    if (cnt < 0 || n.inputs.size() <= size_t(cnt)) return true;
    for (size_t k = size_t(cnt); k < n.inputs.size(); ++k) {
        int v = n.inputs[k];
        if (n.op == op_type::Dropout && k == 1) continue;  // the ratio does not matter at inference
        if (v >= 0 && !g.values[size_t(v)].data) {
            if (pending) *pending = v;
            return false;
        }
    }
    auto in = [&](size_t k) -> const value* {
        int v = n.input(k);
        return v >= 0 ? &g.values[size_t(v)] : nullptr;
    };
    switch (n.op) {
    case op_type::Reshape:
    case op_type::Expand:
        if (in(1)) n.set("shape", param_ints(n, *in(1), "shape"));
        break;
    case op_type::ConstantOfShape:
        if (in(0)) n.set("shape", param_ints(n, *in(0), "input"));
        break;
    case op_type::Unsqueeze:
    case op_type::Squeeze:
    case op_type::ReduceMean:
        if (in(1)) n.set("axes", param_ints(n, *in(1), "axes"));
        break;
    case op_type::Split:
        if (in(1)) n.set("split", param_ints(n, *in(1), "split"));
        break;
    case op_type::Slice:
        if (in(1)) n.set("starts", param_ints(n, *in(1), "starts"));
        if (in(2)) n.set("ends", param_ints(n, *in(2), "ends"));
        if (in(3)) n.set("axes", param_ints(n, *in(3), "axes"));
        if (in(4)) n.set("steps", param_ints(n, *in(4), "steps"));
        break;
    case op_type::Pad:
        if (in(1)) n.set("pads", param_ints(n, *in(1), "pads"));
        if (in(2)) {
            if (element_count(in(2)->shape) > 1)
                fail_node(K::shape, n, "constant_value must be a scalar");
            if (element_count(in(2)->shape) == 1) n.set("value", float(in(2)->constant().as_f64(0)));
        }
        if (in(3)) n.set("axes", param_ints(n, *in(3), "axes"));
        break;
    case op_type::Clip:
        if (in(1)) n.set("min", float(param_scalar(n, *in(1), "min")));
        if (in(2)) n.set("max", float(param_scalar(n, *in(2), "max")));
        break;
    case op_type::Dropout:
        if (in(2) && param_scalar(n, *in(2), "training_mode") != 0)
            fail_node(K::unsupported_feature, n, "training_mode is unsupported (inference only)",
                      "Dropout training_mode");
        break;
    default:
        break;
    }
    n.inputs.resize(size_t(cnt));
    return true;
}

namespace {

struct ctx {
    graph& g;
    node& n;

    const value& in(size_t k) const {
        int v = n.input(k);
        if (v < 0) fail_node(K::invalid_graph, n, "missing required input " + std::to_string(k));
        return g.values[size_t(v)];
    }
    const value* opt(size_t k) const {
        int v = n.input(k);
        return v >= 0 ? &g.values[size_t(v)] : nullptr;
    }
    const shape_t& sh(size_t k) const { return in(k).shape; }
    void out(size_t k, dtype t, const shape_t& s, bool batched = false) {
        int v = n.output(k);
        if (v < 0) return;
        value& o = g.values[size_t(v)];
        check_size(t, s, n.label() + " output '" + o.name + "'");
        o.type = t;
        o.shape = s;
        o.batched = batched && !s.empty();
    }
    [[noreturn]] void err(const std::string& msg, K k = K::shape) const {
        fail_node(k, n, msg, k == K::unsupported_feature ? std::string(op_name(n.op)) + " " + msg : std::string());
    }

    int64_t axis(int64_t a, int64_t rank, const char* what = "axis") const {
        if (a < -rank || a >= rank)
            err(std::string(what) + " " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
        return a < 0 ? a + rank : a;
    }
    void need_float(size_t k) const {
        if (!is_float(in(k).type))
            err(std::string("input ") + std::to_string(k) + " must be a floating-point tensor, not " +
                dtype_name(in(k).type));
    }
    void same_type(size_t a, size_t b) const {
        if (in(a).type != in(b).type)
            err(std::string("type mismatch: ") + dtype_name(in(a).type) + " and " + dtype_name(in(b).type));
    }
};

// Multidirectional (numpy) broadcast of several shapes.
shape_t broadcast(const ctx& c, const std::vector<const shape_t*>& shapes) {
    size_t r = 0;
    for (auto* s : shapes) r = std::max(r, s->size());
    shape_t out(r, 1);
    for (auto* s : shapes) {
        size_t off = r - s->size();
        for (size_t i = 0; i < s->size(); ++i) {
            int64_t d = (*s)[i];
            int64_t& o = out[off + i];
            if (d == o || d == 1) continue;
            if (o == 1) {
                o = d;
                continue;
            }
            std::string all;
            for (auto* x : shapes) all += (all.empty() ? "" : " and ") + shape_str(*x);
            c.err("incompatible broadcast of " + all);
        }
    }
    return out;
}

bool batched_like(const graph& g, const node& n, const shape_t& out) {
    for (int v : n.inputs) {
        if (v < 0) continue;
        const value& x = g.values[size_t(v)];
        if (x.batched && x.shape.size() == out.size() && !out.empty() && x.shape[0] == out[0]) return true;
    }
    return false;
}

// Spatial output sizes for Conv and pools; resolves auto_pad into explicit pads.
void conv_pool_dims(ctx& c, const shape_t& x, const ints& kernel, bool pool, shape_t& out) {
    node& n = c.n;
    size_t nd = kernel.size();
    ints strides = n.is("strides", ints(nd, 1));
    ints dil = n.is("dilations", ints(nd, 1));
    ints pads = n.is("pads", ints(2 * nd, 0));
    std::string ap = n.s("auto_pad", "NOTSET");
    bool ceil_mode = pool && n.i("ceil_mode", 0) != 0;
    if (strides.size() != nd || dil.size() != nd || pads.size() != 2 * nd)
        c.err("strides/dilations/pads do not match the " + std::to_string(nd) + " spatial dims");
    for (size_t i = 0; i < nd; ++i) {
        if (strides[i] < 1 || dil[i] < 1 || kernel[i] < 1)
            c.err("kernel, strides and dilations must be >= 1");
        if (pads[i] < 0 || pads[i + nd] < 0) c.err("pads must be >= 0");
        if (pads[i] > (int64_t{1} << 30) || pads[i + nd] > (int64_t{1} << 30) ||
            strides[i] > (int64_t{1} << 30) || dil[i] > (int64_t{1} << 30) || kernel[i] > (int64_t{1} << 30))
            c.err("absurd kernel/stride/pad/dilation", K::limits);
    }
    for (size_t i = 0; i < nd; ++i) {
        int64_t d = x[2 + i];
        int64_t ek = (kernel[i] - 1) * dil[i] + 1;
        int64_t s = strides[i];
        int64_t o;
        if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
            o = (d + s - 1) / s;
            int64_t total = std::max<int64_t>(0, (o - 1) * s + ek - d);
            int64_t small = total / 2;
            pads[i] = ap == "SAME_UPPER" ? small : total - small;
            pads[i + nd] = total - pads[i];
        } else if (ap == "VALID") {
            pads[i] = pads[i + nd] = 0;
            if (d < ek) c.err("input " + shape_str(x) + " is smaller than the kernel");
            o = (d - ek) / s + 1;
        } else if (ap == "NOTSET" || ap.empty()) {
            int64_t span = d + pads[i] + pads[i + nd] - ek;
            if (span < 0) c.err("input " + shape_str(x) + " plus padding is smaller than the kernel");
            if (ceil_mode) {
                o = (span + s - 1) / s + 1;
                // the last window must start inside the input or the left padding
                if ((o - 1) * s >= d + pads[i]) --o;
            } else {
                o = span / s + 1;
            }
        } else {
            c.err("unknown auto_pad '" + ap + "'", K::unsupported_feature);
        }
        if (o < 1) c.err("output spatial dim would be " + std::to_string(o));
        out.push_back(o);
    }
    n.erase("auto_pad");
    n.set("kernel_shape", kernel);
    n.set("strides", strides);
    n.set("dilations", dil);
    n.set("pads", pads);
}

// ---- elementwise unary

void infer_numeric_unary(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (x.type == dtype::boolean && n.op != op_type::Identity) c.err("bool input is not numeric");
    c.out(0, x.type, x.shape, x.batched);
}

void infer_dropout(ctx& c) {
    const value& x = c.in(0);
    c.out(0, x.type, x.shape, x.batched);
    c.out(1, dtype::boolean, x.shape, x.batched);
}

void infer_float_unary(ctx& c) {
    node& n = c.n;
    c.need_float(0);
    const value& x = c.in(0);
    if (n.op == op_type::LeakyRelu) n.set("alpha", n.f("alpha", 0.01f));
    if (n.op == op_type::HardSigmoid) {
        n.set("alpha", n.f("alpha", 0.2f));
        n.set("beta", n.f("beta", 0.5f));
    }
    if (n.op == op_type::Gelu) {
        std::string a = n.s("approximate", "none");
        if (a != "none" && a != "tanh") c.err("unknown approximate '" + a + "'", K::unsupported_feature);
        n.set("approximate", a);
    }
    c.out(0, x.type, x.shape, x.batched);
}

void infer_clip(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (x.type == dtype::boolean) c.err("bool input is not numeric");
    n.set("min", n.f("min", -std::numeric_limits<float>::infinity()));
    n.set("max", n.f("max", std::numeric_limits<float>::infinity()));
    c.out(0, x.type, x.shape, x.batched);
}

void infer_cast(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    int64_t to = n.i("to", -1);
    if (to <= 0 || to > int64_t(dtype::boolean)) c.err("missing or bad 'to'", K::invalid_graph);
    c.out(0, dtype(to), x.shape, x.batched);
}

// ---- elementwise binary / variadic

void infer_binary(ctx& c) {
    graph& g = c.g;
    node& n = c.n;
    if (n.inputs.size() != 2) c.err("needs exactly 2 inputs", K::invalid_graph);
    if (n.op != op_type::Pow) c.same_type(0, 1);
    if (n.op != op_type::Equal && (c.in(0).type == dtype::boolean || c.in(1).type == dtype::boolean))
        c.err("bool inputs are not numeric");
    shape_t s = broadcast(c, {&c.sh(0), &c.sh(1)});
    c.out(0, n.op == op_type::Equal ? dtype::boolean : c.in(0).type, s, batched_like(g, n, s));
}

void infer_variadic(ctx& c) {
    graph& g = c.g;
    node& n = c.n;
    if (n.inputs.empty()) c.err("needs at least one input", K::invalid_graph);
    std::vector<const shape_t*> shapes;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
        c.same_type(0, k);
        shapes.push_back(&c.sh(k));
    }
    shape_t s = broadcast(c, shapes);
    c.out(0, c.in(0).type, s, batched_like(g, n, s));
}

void infer_where(ctx& c) {
    graph& g = c.g;
    node& n = c.n;
    if (c.in(0).type != dtype::boolean) c.err("condition must be bool");
    c.same_type(1, 2);
    shape_t s = broadcast(c, {&c.sh(0), &c.sh(1), &c.sh(2)});
    c.out(0, c.in(1).type, s, batched_like(g, n, s));
}

// ---- convolution and pooling

void infer_conv(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    const value& w = c.in(1);
    c.need_float(0);
    c.same_type(0, 1);
    size_t r = x.shape.size();
    if (r < 3) c.err("input must be N x C x spatial..., got " + shape_str(x.shape));
    if (w.shape.size() != r)
        c.err("weight " + shape_str(w.shape) + " and input " + shape_str(x.shape) + " differ in rank");
    int64_t group = n.i("group", 1);
    if (group < 1) c.err("group must be >= 1");
    int64_t cin = x.shape[1], m = w.shape[0];
    if (checked_mul(w.shape[1], group) != cin)
        c.err("weight " + shape_str(w.shape) + " expects " + std::to_string(w.shape[1]) + " x " +
              std::to_string(group) + " (group) input channels, input " + shape_str(x.shape) + " has " +
              std::to_string(cin));
    if (m % group != 0) c.err("output channels " + std::to_string(m) + " not divisible by group");
    ints kernel(w.shape.begin() + 2, w.shape.end());
    if (n.has("kernel_shape") && n.is("kernel_shape") != kernel)
        c.err("kernel_shape " + ints_str(n.is("kernel_shape")) + " does not match weight " + shape_str(w.shape));
    if (const value* b = c.opt(2)) {
        c.same_type(0, 2);
        if (b->shape != shape_t{m}) c.err("bias " + shape_str(b->shape) + " must be [" + std::to_string(m) + "]");
    }
    shape_t out{x.shape[0], m};
    conv_pool_dims(c, x.shape, kernel, false, out);
    n.set("group", group);
    c.out(0, x.type, out, x.batched);
}

void infer_pool(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (n.op == op_type::AveragePool || (x.type != dtype::i8 && x.type != dtype::u8)) c.need_float(0);
    size_t r = x.shape.size();
    if (r < 3) c.err("input must be N x C x spatial..., got " + shape_str(x.shape));
    if (!n.has("kernel_shape")) c.err("kernel_shape is required", K::invalid_graph);
    ints kernel = n.is("kernel_shape");
    if (kernel.size() != r - 2) c.err("kernel_shape " + ints_str(kernel) + " does not match input " + shape_str(x.shape));
    shape_t out{x.shape[0], x.shape[1]};
    conv_pool_dims(c, x.shape, kernel, true, out);
    n.set("ceil_mode", n.i("ceil_mode", 0));
    if (n.op == op_type::MaxPool) n.set("storage_order", n.i("storage_order", 0));
    if (n.op == op_type::AveragePool) n.set("count_include_pad", n.i("count_include_pad", 0));
    c.out(0, x.type, out, x.batched);
    // MaxPool's Indices: int64, the output's shape (flat indices into X).
    if (n.op == op_type::MaxPool && n.output(1) >= 0) c.out(1, dtype::i64, out, x.batched);
}

void infer_global_pool(ctx& c) {
    const value& x = c.in(0);
    c.need_float(0);
    if (x.shape.size() < 3) c.err("input must be N x C x spatial..., got " + shape_str(x.shape));
    shape_t out = x.shape;
    std::fill(out.begin() + 2, out.end(), 1);
    c.out(0, x.type, out, x.batched);
}

void infer_batch_norm(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    c.need_float(0);
    if (x.shape.size() < 2) c.err("input must be at least N x C, got " + shape_str(x.shape));
    if (n.i("training_mode", 0) != 0)
        c.err("training_mode is unsupported (inference only)", K::unsupported_feature);
    for (size_t k = 1; k < n.outputs.size(); ++k)
        if (n.outputs[k] >= 0) c.err("training outputs (mean/var) are unsupported", K::unsupported_feature);
    for (size_t k = 1; k <= 4; ++k) {
        if (!is_float(c.in(k).type)) c.err("parameters must be floating-point");
        if (c.sh(k) != shape_t{x.shape[1]})
            c.err("parameter " + std::to_string(k) + " " + shape_str(c.sh(k)) + " must be [" +
                  std::to_string(x.shape[1]) + "] (the input's channels)");
    }
    n.set("epsilon", n.f("epsilon", 1e-5f));
    n.erase("momentum");
    n.erase("spatial");
    n.erase("training_mode");
    c.out(0, x.type, x.shape, x.batched);
}

void infer_lrn(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    c.need_float(0);
    if (x.shape.size() < 3) c.err("input must be N x C x spatial..., got " + shape_str(x.shape));
    if (n.i("size", 0) < 1) c.err("size must be >= 1", K::invalid_graph);
    n.set("alpha", n.f("alpha", 1e-4f));
    n.set("beta", n.f("beta", 0.75f));
    n.set("bias", n.f("bias", 1.0f));
    c.out(0, x.type, x.shape, x.batched);
}

// ---- matrix products

void infer_gemm(ctx& c) {
    node& n = c.n;
    const value& a = c.in(0);
    const value& b = c.in(1);
    c.same_type(0, 1);
    if (a.type == dtype::boolean) c.err("bool inputs are not numeric");
    if (a.shape.size() != 2 || b.shape.size() != 2)
        c.err("A " + shape_str(a.shape) + " and B " + shape_str(b.shape) + " must be 2-D");
    int64_t ta = n.i("transA", 0), tb = n.i("transB", 0);
    int64_t m = ta ? a.shape[1] : a.shape[0], k = ta ? a.shape[0] : a.shape[1];
    int64_t kb = tb ? b.shape[1] : b.shape[0], nn = tb ? b.shape[0] : b.shape[1];
    if (k != kb)
        c.err("inner dimensions differ: A " + shape_str(a.shape) + (ta ? "^T" : "") + " x B " +
              shape_str(b.shape) + (tb ? "^T" : ""));
    if (const value* cc = c.opt(2)) {
        c.same_type(0, 2);
        const shape_t& s = cc->shape;
        if (s.size() > 2) c.err("C " + shape_str(s) + " must be at most 2-D");
        shape_t full{m, nn};
        for (size_t i = 0; i < s.size(); ++i) {
            int64_t want = full[2 - s.size() + i];
            if (s[i] != 1 && s[i] != want)
                c.err("C " + shape_str(s) + " does not broadcast to " + shape_str(full));
        }
    }
    n.set("alpha", n.f("alpha", 1.0f));
    n.set("beta", n.f("beta", 1.0f));
    n.set("transA", ta);
    n.set("transB", tb);
    c.out(0, a.type, {m, nn}, a.batched && !ta);
}

void infer_matmul(ctx& c) {
    const value& a = c.in(0);
    const value& b = c.in(1);
    c.same_type(0, 1);
    if (a.type == dtype::boolean) c.err("bool inputs are not numeric");
    if (a.shape.empty() || b.shape.empty()) c.err("inputs must be at least 1-D");
    shape_t sa = a.shape, sb = b.shape;
    bool a1 = sa.size() == 1, b1 = sb.size() == 1;
    if (a1) sa.insert(sa.begin(), 1);
    if (b1) sb.push_back(1);
    if (sa.back() != sb[sb.size() - 2])
        c.err("inner dimensions differ: " + shape_str(a.shape) + " x " + shape_str(b.shape));
    shape_t ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
    shape_t out = broadcast(c, {&ba, &bb});
    if (!a1) out.push_back(sa[sa.size() - 2]);
    if (!b1) out.push_back(sb.back());
    c.out(0, a.type, out, a.batched && a.shape.size() >= 2 && out.size() == a.shape.size());
}

// ---- shape manipulation

void infer_concat(ctx& c) {
    node& n = c.n;
    if (n.inputs.empty()) c.err("needs at least one input", K::invalid_graph);
    const shape_t& s0 = c.sh(0);
    if (s0.empty()) c.err("inputs must be at least 1-D");
    if (!n.has("axis")) c.err("axis is required", K::invalid_graph);
    int64_t ax = c.axis(n.i("axis", 0), int64_t(s0.size()));
    shape_t out = s0;
    out[size_t(ax)] = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
        c.same_type(0, k);
        const shape_t& s = c.sh(k);
        bool ok = s.size() == s0.size();
        for (size_t i = 0; ok && i < s.size(); ++i)
            if (i != size_t(ax) && s[i] != s0[i]) ok = false;
        if (!ok)
            c.err("input " + std::to_string(k) + " " + shape_str(s) + " does not match " + shape_str(s0) +
                  " outside axis " + std::to_string(ax));
        if (__builtin_add_overflow(out[size_t(ax)], s[size_t(ax)], &out[size_t(ax)]))
            c.err("dimension overflow", K::limits);
    }
    n.set("axis", ax);
    c.out(0, c.in(0).type, out, ax != 0 && c.in(0).batched);
}

void infer_split(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (x.shape.empty()) c.err("input must be at least 1-D");
    int64_t ax = c.axis(n.i("axis", 0), int64_t(x.shape.size()));
    int64_t d = x.shape[size_t(ax)];
    size_t nout = n.outputs.size();
    ints split;
    if (n.has("split")) {
        split = n.is("split");
    } else {
        int64_t parts = n.i("num_outputs", int64_t(nout));
        if (parts < 1 || size_t(parts) != nout)
            c.err("num_outputs " + std::to_string(parts) + " does not match " + std::to_string(nout) + " outputs",
                  K::invalid_graph);
        if (n.has("num_outputs")) {  // opset 18: the last chunk may be smaller
            int64_t chunk = (d + parts - 1) / parts;
            for (int64_t i = 0; i < parts; ++i) split.push_back(std::clamp<int64_t>(d - i * chunk, 0, chunk));
        } else {
            if (d % parts != 0)
                c.err("dim " + std::to_string(d) + " does not split into " + std::to_string(parts) + " equal parts");
            split.assign(size_t(parts), d / parts);
        }
    }
    if (split.size() != nout)
        c.err("split " + ints_str(split) + " does not match " + std::to_string(nout) + " outputs", K::invalid_graph);
    int64_t sum = 0;
    for (int64_t s : split) {
        if (s < 0) c.err("negative split size");
        sum += s;
    }
    if (sum != d) c.err("split " + ints_str(split) + " does not sum to dim " + std::to_string(d));
    n.set("axis", ax);
    n.set("split", split);
    n.erase("num_outputs");
    for (size_t k = 0; k < nout; ++k) {
        shape_t s = x.shape;
        s[size_t(ax)] = split[k];
        c.out(k, x.type, s, ax != 0 && x.batched);
    }
}

void infer_slice(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    int64_t r = int64_t(x.shape.size());
    if (!n.has("starts") || !n.has("ends")) c.err("starts and ends are required", K::invalid_graph);
    ints starts = n.is("starts"), ends = n.is("ends");
    ints axes = n.is("axes"), steps = n.is("steps");
    if (axes.empty()) {
        axes.resize(starts.size());
        std::iota(axes.begin(), axes.end(), 0);
    }
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
        c.err("starts/ends/axes/steps differ in length");
    shape_t out = x.shape;
    std::set<int64_t> seen;
    bool batched = x.batched;
    for (size_t i = 0; i < starts.size(); ++i) {
        int64_t a = c.axis(axes[i], r);
        if (!seen.insert(a).second) c.err("repeated axis " + std::to_string(a));
        int64_t d = x.shape[size_t(a)];
        int64_t s = starts[i], e = ends[i], st = steps[i];
        if (st == 0) c.err("step 0");
        if (s < 0) s += d;
        if (e < 0) e += d;
        int64_t len;
        if (st > 0) {
            s = std::clamp<int64_t>(s, 0, d);
            e = std::clamp<int64_t>(e, 0, d);
            len = e > s ? (e - s + st - 1) / st : 0;
        } else {
            s = std::clamp<int64_t>(s, 0, d - 1);
            e = std::clamp<int64_t>(e, -1, d - 1);
            len = s > e ? (s - e + (-st) - 1) / (-st) : 0;
        }
        axes[i] = a;
        starts[i] = s;
        ends[i] = e;
        out[size_t(a)] = len;
        if (a == 0 && len != d) batched = false;
    }
    n.set("axes", axes);
    n.set("starts", starts);
    n.set("ends", ends);
    n.set("steps", steps);
    c.out(0, x.type, out, batched);
}

void infer_flatten(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    int64_t r = int64_t(x.shape.size());
    int64_t a = n.i("axis", 1);
    if (a < -r || a > r) c.err("axis " + std::to_string(a) + " out of range for rank " + std::to_string(r));
    if (a < 0) a += r;
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < r; ++i) (i < a ? outer : inner) = checked_mul(i < a ? outer : inner, x.shape[size_t(i)]);
    n.set("axis", a);
    c.out(0, x.type, {outer, inner}, a >= 1 && x.batched && outer == x.shape[0]);
}

void infer_reshape(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (!n.has("shape")) c.err("shape is required", K::invalid_graph);
    ints target = n.is("shape");
    bool allowzero = n.i("allowzero", 0) != 0;
    shape_t out(target.begin(), target.end());
    int neg = -1;
    int64_t known = 1;
    bool has_zero = false;
    for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] == 0 && !allowzero) {
            if (i >= x.shape.size()) c.err("shape " + ints_str(target) + " copies dim " + std::to_string(i) + " that " + shape_str(x.shape) + " lacks");
            out[i] = x.shape[i];
        } else if (out[i] == -1) {
            if (neg >= 0) c.err("shape " + ints_str(target) + " has more than one -1");
            neg = int(i);
            continue;
        } else if (out[i] < -1) {
            c.err("shape " + ints_str(target) + " has a negative dim");
        }
        if (out[i] == 0) has_zero = true;
        known = checked_mul(known, out[i]);
    }
    int64_t total = element_count(x.shape);
    if (neg >= 0) {
        if (allowzero && has_zero) c.err("allowzero with both 0 and -1 in " + ints_str(target));
        if (known == 0 || total % known != 0)
            c.err("cannot reshape " + shape_str(x.shape) + " (" + std::to_string(total) + " elements) to " + ints_str(target));
        out[size_t(neg)] = total / known;
    } else if (known != total) {
        c.err("cannot reshape " + shape_str(x.shape) + " (" + std::to_string(total) + " elements) to " +
              ints_str(target) + " (" + std::to_string(known) + " elements)");
    }
    n.set("allowzero", int64_t(allowzero));
    bool batched = x.batched && !target.empty() && target[0] == 0 && !allowzero;
    c.out(0, x.type, out, batched);
}

void infer_transpose(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    size_t r = x.shape.size();
    ints perm = n.is("perm");
    if (perm.empty()) {
        perm.resize(r);
        for (size_t i = 0; i < r; ++i) perm[i] = int64_t(r - 1 - i);
    }
    if (perm.size() != r) c.err("perm " + ints_str(perm) + " does not match rank " + std::to_string(r));
    std::vector<char> used(r, 0);
    shape_t out(r);
    for (size_t i = 0; i < r; ++i) {
        int64_t p = perm[i];
        if (p < 0 || p >= int64_t(r) || used[size_t(p)]) c.err("perm " + ints_str(perm) + " is not a permutation");
        used[size_t(p)] = 1;
        out[i] = x.shape[size_t(p)];
    }
    n.set("perm", perm);
    c.out(0, x.type, out, x.batched && r > 0 && perm[0] == 0);
}

void infer_squeeze(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    int64_t r = int64_t(x.shape.size());
    ints axes = n.is("axes");
    std::set<int64_t> ax;
    if (!n.has("axes")) {
        for (int64_t i = 0; i < r; ++i)
            if (x.shape[size_t(i)] == 1) ax.insert(i);
    } else {
        for (int64_t a : axes) {
            a = c.axis(a, r);
            if (x.shape[size_t(a)] != 1)
                c.err("cannot squeeze dim " + std::to_string(a) + " of " + shape_str(x.shape) + " (not 1)");
            ax.insert(a);
        }
    }
    shape_t out;
    for (int64_t i = 0; i < r; ++i)
        if (!ax.count(i)) out.push_back(x.shape[size_t(i)]);
    n.set("axes", ints(ax.begin(), ax.end()));
    c.out(0, x.type, out, x.batched && !ax.count(0));
}

void infer_unsqueeze(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (!n.has("axes")) c.err("axes is required", K::invalid_graph);
    ints axes = n.is("axes");
    int64_t r = int64_t(x.shape.size()) + int64_t(axes.size());
    std::set<int64_t> ax;
    for (int64_t a : axes)
        if (!ax.insert(c.axis(a, r, "axes")).second) c.err("repeated axis in " + ints_str(axes));
    shape_t out;
    size_t src = 0;
    for (int64_t i = 0; i < r; ++i) out.push_back(ax.count(i) ? 1 : x.shape[src++]);
    n.set("axes", ints(ax.begin(), ax.end()));
    c.out(0, x.type, out, x.batched && !ax.count(0));
}

void infer_gather(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    const value& idx = c.in(1);
    if (x.shape.empty()) c.err("data must be at least 1-D");
    if (idx.type != dtype::i64 && idx.type != dtype::i32) c.err("indices must be int32 or int64");
    int64_t ax = c.axis(n.i("axis", 0), int64_t(x.shape.size()));
    int64_t d = x.shape[size_t(ax)];
    if (idx.data) {
        tensor t = idx.constant();
        for (int64_t i = 0, e = t.elements(); i < e; ++i) {
            int64_t v = t.as_i64(i);
            if (v < -d || v >= d) c.err("index " + std::to_string(v) + " out of range for dim " + std::to_string(d));
        }
    }
    shape_t out(x.shape.begin(), x.shape.begin() + ax);
    out.insert(out.end(), idx.shape.begin(), idx.shape.end());
    out.insert(out.end(), x.shape.begin() + ax + 1, x.shape.end());
    n.set("axis", ax);
    c.out(0, x.type, out, ax != 0 && x.batched);
}

void infer_shape(ctx& c) {
    node& n = c.n;
    int64_t r = int64_t(c.sh(0).size());
    int64_t s = n.i("start", 0), e = n.i("end", r);
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = std::clamp<int64_t>(s, 0, r);
    e = std::clamp<int64_t>(e, 0, r);
    n.set("start", s);
    n.set("end", e);
    c.out(0, dtype::i64, {std::max<int64_t>(0, e - s)});
}

void infer_constant_of_shape(ctx& c) {
    node& n = c.n;
    if (!n.has("shape")) c.err("shape is required", K::invalid_graph);
    ints s = n.is("shape");
    for (int64_t d : s)
        if (d < 0) c.err("negative dim in " + ints_str(s), K::limits);
    dtype t = dtype::f32;
    if (const tensor* v = n.t("value")) {
        if (v->elements() != 1) c.err("value must have exactly one element");
        t = v->type;
    }
    c.out(0, t, shape_t(s.begin(), s.end()));
}

void infer_range(ctx& c) {
    node& n = c.n;
    for (size_t k = 0; k < 3; ++k) {
        const value& v = c.in(k);
        if (!v.data)
            fail_node(K::dynamic, n, "input '" + v.name + "' must be constant (the output shape depends on it)",
                      v.name);
        if (element_count(v.shape) != 1) c.err("inputs must be scalars");
        c.same_type(0, k);
    }
    dtype t = c.in(0).type;
    if (t == dtype::boolean || t == dtype::i8 || t == dtype::u8 || t == dtype::f16)
        c.err(std::string("unsupported Range type ") + dtype_name(t), K::unsupported_dtype);
    double start = c.in(0).constant().as_f64(0), limit = c.in(1).constant().as_f64(0),
           delta = c.in(2).constant().as_f64(0);
    if (is_integer(t)) {  // exact
        int64_t s = c.in(0).constant().as_i64(0), l = c.in(1).constant().as_i64(0), d = c.in(2).constant().as_i64(0);
        if (d == 0) c.err("delta is 0");
        start = double(s), limit = double(l), delta = double(d);
    }
    if (delta == 0) c.err("delta is 0");
    if (t == dtype::f32) limit = double(float(limit) - float(start)), start = 0;  // as ONNX Runtime: in T
    double cnt = std::ceil((limit - start) / delta);
    if (!(cnt < double(max_elements))) {
        if (std::isnan(cnt)) c.err("non-finite start/limit/delta");
        c.err("output would have more than 2^31 elements", K::limits);
    }
    c.out(0, t, {std::max<int64_t>(0, int64_t(cnt))});
}

void infer_expand(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (!n.has("shape")) c.err("shape is required", K::invalid_graph);
    ints s = n.is("shape");
    for (int64_t d : s)
        if (d < 0) c.err("negative dim in shape " + ints_str(s));
    shape_t target(s.begin(), s.end());
    shape_t out = broadcast(c, {&x.shape, &target});
    c.out(0, x.type, out, x.batched && out.size() == x.shape.size() && out[0] == x.shape[0]);
}

void infer_softmax(ctx& c) {
    node& n = c.n;
    c.need_float(0);
    const value& x = c.in(0);
    int64_t r = int64_t(x.shape.size());
    if (r == 0) c.err("input must be at least 1-D");
    int64_t coerce = n.i("coerce_2d", 0);
    int64_t a = c.axis(n.i("axis", coerce ? 1 : -1), r);
    if (a == r - 1) coerce = 0;
    n.set("axis", a);
    n.set("coerce_2d", coerce);
    c.out(0, x.type, x.shape, x.batched && a != 0);
}

void infer_layer_norm(ctx& c) {
    node& n = c.n;
    c.need_float(0);
    const value& x = c.in(0);
    int64_t r = int64_t(x.shape.size());
    if (r == 0) c.err("input must be at least 1-D");
    int64_t a = c.axis(n.i("axis", -1), r);
    shape_t norm(x.shape.begin() + a, x.shape.end());
    for (size_t k = 1; k <= 2; ++k) {
        const value* p = c.opt(k);
        if (!p) {
            if (k == 1) c.err("scale is required", K::invalid_graph);
            continue;
        }
        c.same_type(0, k);
        if (p->shape.size() > norm.size()) c.err("scale/bias " + shape_str(p->shape) + " do not broadcast to " + shape_str(norm));
        for (size_t i = 0; i < p->shape.size(); ++i) {
            int64_t want = norm[norm.size() - p->shape.size() + i];
            if (p->shape[i] != 1 && p->shape[i] != want)
                c.err("scale/bias " + shape_str(p->shape) + " do not broadcast to " + shape_str(norm));
        }
    }
    int64_t stash = n.i("stash_type", 1);
    if (stash != 1) c.err("stash_type other than float is unsupported", K::unsupported_feature);
    n.set("axis", a);
    n.set("epsilon", n.f("epsilon", 1e-5f));
    n.set("stash_type", stash);
    c.out(0, x.type, x.shape, x.batched && a > 0);
    shape_t stat(x.shape.begin(), x.shape.begin() + a);
    stat.resize(size_t(r), 1);
    c.out(1, dtype::f32, stat, x.batched && a > 0);
    c.out(2, dtype::f32, stat, x.batched && a > 0);
}

void infer_reduce_mean(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    if (x.type == dtype::boolean) c.err("bool input is not numeric");
    int64_t r = int64_t(x.shape.size());
    ints axes = n.is("axes");
    int64_t keep = n.i("keepdims", 1);
    if (axes.empty() && n.i("noop_with_empty_axes", 0)) {
        n.op = op_type::Identity;
        n.attrs.clear();
        c.out(0, x.type, x.shape, x.batched);
        return;
    }
    std::set<int64_t> ax;
    if (axes.empty()) {
        for (int64_t i = 0; i < r; ++i) ax.insert(i);
    } else {
        for (int64_t a : axes)
            if (!ax.insert(c.axis(a, r)).second) c.err("repeated axis in " + ints_str(axes));
    }
    shape_t out;
    for (int64_t i = 0; i < r; ++i) {
        if (!ax.count(i)) out.push_back(x.shape[size_t(i)]);
        else if (keep) out.push_back(1);
    }
    n.set("axes", ints(ax.begin(), ax.end()));
    n.set("keepdims", keep ? int64_t(1) : int64_t(0));
    n.erase("noop_with_empty_axes");
    c.out(0, x.type, out, x.batched && !ax.count(0));
}

void infer_pad(ctx& c) {
    node& n = c.n;
    const value& x = c.in(0);
    size_t r = x.shape.size();
    ints pads = n.is("pads");
    if (n.has("axes")) {
        ints axes = n.is("axes");
        if (pads.size() != 2 * axes.size())
            c.err("pads " + ints_str(pads) + " do not match axes " + ints_str(axes));
        ints full(2 * r, 0);
        for (size_t i = 0; i < axes.size(); ++i) {
            int64_t a = c.axis(axes[i], int64_t(r));
            full[size_t(a)] = pads[i];
            full[size_t(a) + r] = pads[i + axes.size()];
        }
        pads = full;
        n.erase("axes");
    }
    if (pads.empty()) pads.assign(2 * r, 0);
    if (pads.size() != 2 * r) c.err("pads " + ints_str(pads) + " do not match rank " + std::to_string(r));
    std::string mode = n.s("mode", "constant");
    if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
        c.err("unknown mode '" + mode + "'", K::unsupported_feature);
    shape_t out = x.shape;
    for (size_t i = 0; i < r; ++i) {
        if (std::abs(pads[i]) > (int64_t{1} << 31) || std::abs(pads[i + r]) > (int64_t{1} << 31))
            c.err("absurd pads " + ints_str(pads), K::limits);
        out[i] = x.shape[i] + pads[i] + pads[i + r];
        if (out[i] < 0) c.err("pads " + ints_str(pads) + " remove more than " + shape_str(x.shape));
        if (mode != "constant" && x.shape[i] == 0 && out[i] > 0) c.err("cannot pad an empty dim in mode " + mode);
    }
    n.set("pads", pads);
    n.set("mode", mode);
    n.set("value", n.f("value", 0.0f));
    c.out(0, x.type, out, x.batched && r > 0 && pads[0] == 0 && pads[r] == 0);
}

void infer_constant(ctx& c) {
    c.err("Constant nodes are turned into constants at import", K::invalid_graph);
}

// Input and output counts of the canonical forms: {min in, max in, min out, max out}.
struct arity {
    int in_min, in_max, out_min, out_max;
};
constexpr int many = 1 << 20;

// One entry per operator, in op_type order: the arity of its canonical form, how many parameter
// inputs ONNX may add after the canonical ones (canonicalize_params moves them into attributes),
// and its shape rule. A new operator is one row here and its rule above.
struct shape_rule {
    op_type op;
    arity canonical;
    int param_inputs;
    void (*infer)(ctx&);
};

constexpr shape_rule shape_rules[] = {
    {op_type::Conv, {2, 3, 1, 1}, 0, infer_conv},
    {op_type::BatchNormalization, {5, 5, 1, 5}, 0, infer_batch_norm},
    {op_type::Relu, {1, 1, 1, 1}, 0, infer_numeric_unary},
    {op_type::LeakyRelu, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Sigmoid, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Tanh, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Clip, {1, 1, 1, 1}, 2, infer_clip},
    {op_type::HardSigmoid, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::HardSwish, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Erf, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Gelu, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::MaxPool, {1, 1, 1, 2}, 0, infer_pool},
    {op_type::AveragePool, {1, 1, 1, 1}, 0, infer_pool},
    {op_type::GlobalAveragePool, {1, 1, 1, 1}, 0, infer_global_pool},
    {op_type::GlobalMaxPool, {1, 1, 1, 1}, 0, infer_global_pool},
    {op_type::LRN, {1, 1, 1, 1}, 0, infer_lrn},
    {op_type::Gemm, {2, 3, 1, 1}, 0, infer_gemm},
    {op_type::MatMul, {2, 2, 1, 1}, 0, infer_matmul},
    {op_type::Add, {2, 2, 1, 1}, 0, infer_binary},
    {op_type::Sub, {2, 2, 1, 1}, 0, infer_binary},
    {op_type::Mul, {2, 2, 1, 1}, 0, infer_binary},
    {op_type::Div, {2, 2, 1, 1}, 0, infer_binary},
    {op_type::Pow, {2, 2, 1, 1}, 0, infer_binary},
    {op_type::Sqrt, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Exp, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Neg, {1, 1, 1, 1}, 0, infer_numeric_unary},
    {op_type::Abs, {1, 1, 1, 1}, 0, infer_numeric_unary},
    {op_type::Sum, {1, many, 1, 1}, 0, infer_variadic},
    {op_type::Mean, {1, many, 1, 1}, 0, infer_variadic},
    {op_type::Max, {1, many, 1, 1}, 0, infer_variadic},
    {op_type::Min, {1, many, 1, 1}, 0, infer_variadic},
    {op_type::Concat, {1, many, 1, 1}, 0, infer_concat},
    {op_type::Split, {1, 1, 1, many}, 1, infer_split},
    {op_type::Slice, {1, 1, 1, 1}, 4, infer_slice},
    {op_type::Flatten, {1, 1, 1, 1}, 0, infer_flatten},
    {op_type::Reshape, {1, 1, 1, 1}, 1, infer_reshape},
    {op_type::Transpose, {1, 1, 1, 1}, 0, infer_transpose},
    {op_type::Squeeze, {1, 1, 1, 1}, 1, infer_squeeze},
    {op_type::Unsqueeze, {1, 1, 1, 1}, 1, infer_unsqueeze},
    {op_type::Gather, {2, 2, 1, 1}, 0, infer_gather},
    {op_type::Shape, {1, 1, 1, 1}, 0, infer_shape},
    {op_type::Constant, {0, 0, 1, 1}, 0, infer_constant},
    {op_type::ConstantOfShape, {0, 0, 1, 1}, 1, infer_constant_of_shape},
    {op_type::Range, {3, 3, 1, 1}, 0, infer_range},
    {op_type::Sin, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Cos, {1, 1, 1, 1}, 0, infer_float_unary},
    {op_type::Cast, {1, 1, 1, 1}, 0, infer_cast},
    {op_type::Where, {3, 3, 1, 1}, 0, infer_where},
    {op_type::Equal, {2, 2, 1, 1}, 0, infer_binary},
    {op_type::Expand, {1, 1, 1, 1}, 1, infer_expand},
    {op_type::Softmax, {1, 1, 1, 1}, 0, infer_softmax},
    {op_type::LogSoftmax, {1, 1, 1, 1}, 0, infer_softmax},
    {op_type::LayerNormalization, {2, 3, 1, 3}, 0, infer_layer_norm},
    {op_type::ReduceMean, {1, 1, 1, 1}, 1, infer_reduce_mean},
    {op_type::Dropout, {1, 1, 1, 2}, 2, infer_dropout},
    {op_type::Identity, {1, 1, 1, 1}, 0, infer_numeric_unary},
    {op_type::Pad, {1, 1, 1, 1}, 3, infer_pad},
};

constexpr bool rules_in_op_order() {
    for (size_t i = 0; i < std::size(shape_rules); ++i)
        if (shape_rules[i].op != op_type(i)) return false;
    return std::size(shape_rules) == size_t(op_type::count_);
}
static_assert(rules_in_op_order(), "shape_rules must list every op_type, in order");

const shape_rule& rule_of(op_type op) {
    if (size_t(op) >= std::size(shape_rules)) fail(model_error::kind::invalid_graph, "bad op");
    return shape_rules[size_t(op)];
}

}  // namespace

int onnx_max_inputs(op_type op) {
    const shape_rule& r = rule_of(op);
    return r.canonical.in_max + r.param_inputs;
}

int canonical_input_count(op_type op) {
    const shape_rule& r = rule_of(op);
    return r.param_inputs > 0 ? r.canonical.in_max : -1;
}

void infer_node(graph& g, int ni) {
    node& n = g.nodes[size_t(ni)];
    const shape_rule& rule = rule_of(n.op);
    arity a = rule.canonical;
    if (int(n.inputs.size()) < a.in_min || int(n.inputs.size()) > a.in_max)
        fail_node(K::invalid_graph, n, "has " + std::to_string(n.inputs.size()) + " inputs (expected " +
                                           std::to_string(a.in_min) + (a.in_max > a.in_min ? " or more" : "") + ")");
    if (int(n.outputs.size()) < a.out_min || int(n.outputs.size()) > a.out_max)
        fail_node(K::invalid_graph, n, "has " + std::to_string(n.outputs.size()) + " outputs");
    for (int v : n.inputs) {
        if (v < 0) continue;
        const value& x = g.values[size_t(v)];
        if (x.type == dtype::undefined)
            fail_node(K::invalid_graph, n, "input '" + x.name + "' has no type");
        for (int64_t d : x.shape)
            if (d < 0) fail_node(K::shape, n, "input '" + x.name + "' has an unknown shape " + shape_str(x.shape));
    }
    ctx c{g, n};
    rule.infer(c);
    for (int v : n.outputs)
        if (v >= 0 && g.values[size_t(v)].type == dtype::undefined)
            fail_node(K::invalid_graph, n, "output '" + g.values[size_t(v)].name + "' was not inferred");
}

}  // namespace reefline::ml::detail
