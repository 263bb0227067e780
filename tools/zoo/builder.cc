#include "tools/zoo/builder.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace reefline::zoo {

static_assert(std::endian::native == std::endian::little,
              "raw_data is little-endian; the zoo writes it with memcpy");

double prng::normal() {
    if (have_spare_) {
        have_spare_ = false;
        return spare_;
    }
    double u1 = 0.0;
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 2.0 * M_PI * u2;
    spare_ = r * std::sin(t);
    have_spare_ = true;
    return r * std::cos(t);
}

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

namespace {
node_attr make_attr(const std::string& name, onnx::AttributeProto_AttributeType type) {
    node_attr a;
    a.name = name;
    a.proto.set_name(name);
    a.proto.set_type(type);
    return a;
}
}  // namespace

node_attr attr(const std::string& name, int64_t v) {
    node_attr a = make_attr(name, onnx::AttributeProto::INT);
    a.proto.set_i(v);
    return a;
}
node_attr attr(const std::string& name, float v) {
    node_attr a = make_attr(name, onnx::AttributeProto::FLOAT);
    a.proto.set_f(v);
    return a;
}
node_attr attr(const std::string& name, const std::string& v) {
    node_attr a = make_attr(name, onnx::AttributeProto::STRING);
    a.proto.set_s(v);
    return a;
}
node_attr attr(const std::string& name, std::vector<int64_t> v) {
    node_attr a = make_attr(name, onnx::AttributeProto::INTS);
    for (int64_t x : v) a.proto.add_ints(x);
    return a;
}

graph_builder::graph_builder(const std::string& graph_name, uint64_t seed, int64_t opset,
                             int64_t calib_batch)
    : seed_(seed), calib_batch_(calib_batch) {
    model_.set_ir_version(8);  // IR 8 goes with opsets up to 17 (onnx 1.12)
    model_.set_producer_name("reefline-zoo");
    model_.set_producer_version("1");
    auto* op = model_.add_opset_import();
    op->set_domain("");
    op->set_version(opset);
    model_.mutable_graph()->set_name(graph_name);
}

std::string graph_builder::unique(const std::string& base) {
    if (used_.insert(base).second) return base;
    for (int i = 2;; ++i) {
        std::string n = base + "_" + std::to_string(i);
        if (used_.insert(n).second) return n;
    }
}

const ref::tensor* graph_builder::value(const std::string& tensor) const {
    auto it = values_.find(tensor);
    return it == values_.end() ? nullptr : &it->second;
}

void graph_builder::set_value(const std::string& tensor, ref::tensor v) {
    values_[tensor] = std::move(v);
}

static void set_type(onnx::ValueInfoProto* vi, int32_t dtype, const std::vector<shape_dim>& dims) {
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(dtype);
    auto* shape = tt->mutable_shape();
    for (const shape_dim& d : dims) {
        auto* dim = shape->add_dim();
        if (const int64_t* v = std::get_if<int64_t>(&d))
            dim->set_dim_value(*v);
        else
            dim->set_dim_param(std::get<std::string>(d));
    }
}

std::string graph_builder::input(const std::string& name, int32_t dtype,
                                 const std::vector<shape_dim>& dims) {
    if (!used_.insert(name).second) throw std::logic_error("duplicate input name " + name);
    auto* vi = graph().add_input();
    vi->set_name(name);
    set_type(vi, dtype, dims);
    if (calib_batch_ > 0 && dtype == onnx::TensorProto::FLOAT) {
        // Calibration batch: N(0, 1), what a normalised image looks like to the first layer.
        ref::tensor v;
        for (const shape_dim& d : dims)
            v.shape.push_back(std::holds_alternative<int64_t>(d) ? std::get<int64_t>(d)
                                                                 : calib_batch_);
        int64_t n = 1;
        for (int64_t d : v.shape) n *= d;
        v.data.resize(static_cast<size_t>(n));
        prng rng(seed_ * 0x9e3779b97f4a7c15ull ^ fnv1a("calibration." + name));
        for (float& x : v.data) x = static_cast<float>(rng.normal());
        set_value(name, std::move(v));
    }
    return name;
}

void graph_builder::output(const std::string& tensor, int32_t dtype,
                           const std::vector<shape_dim>& dims) {
    auto* vi = graph().add_output();
    vi->set_name(tensor);
    set_type(vi, dtype, dims);
}

onnx::TensorProto* graph_builder::new_tensor(const std::string& name, int32_t dtype,
                                             const std::vector<int64_t>& shape, int64_t* count) {
    if (!used_.insert(name).second) throw std::logic_error("duplicate tensor name " + name);
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(dtype);
    int64_t n = 1;
    for (int64_t d : shape) {
        t->add_dims(d);
        n *= d;
    }
    *count = n;
    initializers_[name] = t;
    return t;
}

static float* raw_floats(onnx::TensorProto* t, int64_t n) {
    std::string* raw = t->mutable_raw_data();
    raw->resize(static_cast<size_t>(n) * sizeof(float));
    return reinterpret_cast<float*>(raw->data());
}

float* graph_builder::floats(const std::string& initializer) {
    auto it = initializers_.find(initializer);
    if (it == initializers_.end() || it->second->data_type() != onnx::TensorProto::FLOAT)
        throw std::logic_error("no float initializer " + initializer);
    return reinterpret_cast<float*>(it->second->mutable_raw_data()->data());
}

std::string graph_builder::normal(const std::string& name, const std::vector<int64_t>& shape,
                                  double std, double mean) {
    int64_t n = 0;
    auto* t = new_tensor(name, onnx::TensorProto::FLOAT, shape, &n);
    float* p = raw_floats(t, n);
    prng rng(seed_ * 0x9e3779b97f4a7c15ull ^ fnv1a(name));
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(mean + std * rng.normal());
    params_ += n;
    return name;
}

std::string graph_builder::uniform(const std::string& name, const std::vector<int64_t>& shape,
                                   double lo, double hi) {
    int64_t n = 0;
    auto* t = new_tensor(name, onnx::TensorProto::FLOAT, shape, &n);
    float* p = raw_floats(t, n);
    prng rng(seed_ * 0x9e3779b97f4a7c15ull ^ fnv1a(name));
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(rng.uniform(lo, hi));
    params_ += n;
    return name;
}

std::string graph_builder::const_f32(const std::string& name, const std::vector<int64_t>& shape,
                                     const std::vector<float>& values) {
    int64_t n = 0;
    auto* t = new_tensor(name, onnx::TensorProto::FLOAT, shape, &n);
    if (static_cast<int64_t>(values.size()) != n) throw std::logic_error("bad const " + name);
    std::memcpy(raw_floats(t, n), values.data(), values.size() * sizeof(float));
    return name;
}

std::string graph_builder::const_i64(const std::string& name, const std::vector<int64_t>& shape,
                                     const std::vector<int64_t>& values) {
    int64_t n = 0;
    auto* t = new_tensor(name, onnx::TensorProto::INT64, shape, &n);
    if (static_cast<int64_t>(values.size()) != n) throw std::logic_error("bad const " + name);
    std::string* raw = t->mutable_raw_data();
    raw->resize(values.size() * sizeof(int64_t));
    std::memcpy(raw->data(), values.data(), raw->size());
    return name;
}

std::string graph_builder::scalar(const std::string& name, float v) {
    if (used_.count(name)) return name;
    return const_f32(name, {}, {v});
}

std::string graph_builder::rename(const std::string& old_name, const std::string& new_name) {
    if (!used_.insert(new_name).second) throw std::logic_error("duplicate name " + new_name);
    for (auto& n : *graph().mutable_node()) {
        for (auto& o : *n.mutable_output())
            if (o == old_name) o = new_name;
        for (auto& i : *n.mutable_input())
            if (i == old_name) i = new_name;
    }
    if (auto it = values_.find(old_name); it != values_.end()) {
        values_[new_name] = std::move(it->second);
        values_.erase(old_name);
    }
    return new_name;
}

std::vector<std::string> graph_builder::node(const std::string& op,
                                             const std::vector<std::string>& inputs,
                                             const std::string& name, int n_outputs,
                                             const std::vector<node_attr>& attrs) {
    const std::string nn = unique(name);
    auto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(nn);
    for (const auto& i : inputs) n->add_input(i);
    std::vector<std::string> outs;
    for (int i = 0; i < n_outputs; ++i) {
        std::string o = i == 0 ? nn : unique(nn + ":" + std::to_string(i));
        n->add_output(o);
        outs.push_back(o);
    }
    for (const auto& a : attrs) *n->add_attribute() = a.proto;
    return outs;
}

void graph_builder::lsuv(ref::tensor& y, const std::string& weight, const std::string& bias,
                         double target) {
    const double r = ref::rms(y);
    if (!(r > 1e-12) || !std::isfinite(r))
        throw std::runtime_error("calibration: " + weight + " gives no signal");
    const float s = static_cast<float>(target / r);
    const auto scale = [&](const std::string& name) {
        const int64_t n = static_cast<int64_t>(initializers_.at(name)->raw_data().size() / 4);
        float* p = floats(name);
        for (int64_t i = 0; i < n; ++i) p[i] *= s;
    };
    scale(weight);
    if (!bias.empty()) scale(bias);
    for (float& v : y.data) v *= s;
}

std::string graph_builder::conv(const std::string& x, const std::string& name, int64_t cin,
                                int64_t cout, window2d k, int64_t groups, bool bias, double gain) {
    if (cin % groups || cout % groups) throw std::logic_error("conv groups " + name);
    const ref::tensor* xv = value(x);
    if (xv && (xv->shape.size() != 4 || xv->dim(1) != cin))
        throw std::logic_error("conv " + name + ": input channels do not match");
    const double fan_in = static_cast<double>(cin / groups * k.kh * k.kw);
    const std::string w =
        normal(name + ".weight", {cout, cin / groups, k.kh, k.kw}, gain / std::sqrt(fan_in));
    std::vector<std::string> in{x, w};
    if (bias) in.push_back(normal(name + ".bias", {cout}, 0.01));
    std::vector<node_attr> attrs{attr("kernel_shape", {k.kh, k.kw}), attr("strides", {k.sh, k.sw}),
                                 attr("pads", {k.pt, k.pl, k.pb, k.pr})};
    if (groups != 1) attrs.push_back(attr("group", groups));
    const std::string y = op("Conv", in, name, attrs);
    if (xv) {
        ref::tensor yv =
            ref::conv2d(*xv, floats(w), bias ? floats(in[2]) : nullptr, cout, groups, k);
        lsuv(yv, w, bias ? in[2] : "", gain);
        set_value(y, std::move(yv));
    }
    return y;
}

std::string graph_builder::bn(const std::string& x, const std::string& name, int64_t c,
                              bn_init init) {
    const std::string gamma =
        normal(name + ".weight", {c}, 0.05 * init.gamma_scale, init.gamma_scale);
    const std::string beta = normal(name + ".bias", {c}, 0.02);
    const std::string mean = normal(name + ".running_mean", {c}, 0.02);
    const std::string var = uniform(name + ".running_var", {c}, 0.8, 1.2);
    params_ -= 2 * c;  // running statistics are buffers, not parameters
    buffers_ += 2 * c;
    const std::string y =
        op("BatchNormalization", {x, gamma, beta, mean, var}, name, {attr("epsilon", init.eps)});
    if (const ref::tensor* xv = value(x)) {
        if (xv->shape.size() < 2 || xv->dim(1) != c)
            throw std::logic_error("bn " + name + ": channels do not match");
        std::vector<double> m, v;
        ref::channel_stats(*xv, m, v);
        double avg = 0;
        for (double d : v) avg += d;
        avg = std::max(avg / static_cast<double>(c), 1e-6);
        float* pm = floats(mean);
        float* pv = floats(var);
        for (int64_t i = 0; i < c; ++i) {
            pm[i] = static_cast<float>(m[i]);
            // The PRNG's U(0.8, 1.2) becomes a +-20% jitter on the blended batch variance.
            pv[i] = static_cast<float>((0.5 * v[i] + 0.5 * avg) * pv[i]);
        }
        set_value(y, ref::batchnorm(*xv, floats(gamma), floats(beta), pm, pv, init.eps));
    }
    return y;
}

std::string graph_builder::relu(const std::string& x, const std::string& name) {
    const std::string y = op("Relu", {x}, name);
    if (const ref::tensor* xv = value(x)) set_value(y, ref::relu(*xv));
    return y;
}

std::string graph_builder::relu6(const std::string& x, const std::string& name) {
    const std::string y =
        op("Clip", {x, scalar("const.zero", 0.0f), scalar("const.six", 6.0f)}, name);
    if (const ref::tensor* xv = value(x)) set_value(y, ref::clip(*xv, 0.0f, 6.0f));
    return y;
}

static std::vector<node_attr> pool_attrs(const window2d& k) {
    return {attr("kernel_shape", {k.kh, k.kw}), attr("strides", {k.sh, k.sw}),
            attr("pads", {k.pt, k.pl, k.pb, k.pr})};
}

std::string graph_builder::maxpool(const std::string& x, const std::string& name, window2d k) {
    const std::string y = op("MaxPool", {x}, name, pool_attrs(k));
    if (const ref::tensor* xv = value(x)) set_value(y, ref::maxpool(*xv, k));
    return y;
}

std::string graph_builder::avgpool(const std::string& x, const std::string& name, window2d k,
                                   bool count_include_pad) {
    auto attrs = pool_attrs(k);
    attrs.push_back(attr("count_include_pad", int64_t{count_include_pad ? 1 : 0}));
    const std::string y = op("AveragePool", {x}, name, attrs);
    if (const ref::tensor* xv = value(x)) set_value(y, ref::avgpool(*xv, k, count_include_pad));
    return y;
}

std::string graph_builder::global_avgpool(const std::string& x, const std::string& name) {
    const std::string y = op("GlobalAveragePool", {x}, name);
    if (const ref::tensor* xv = value(x)) set_value(y, ref::global_avgpool(*xv));
    return y;
}

std::string graph_builder::lrn(const std::string& x, const std::string& name, int64_t size,
                               float alpha, float beta, float bias) {
    const std::string y =
        op("LRN", {x}, name,
           {attr("size", size), attr("alpha", alpha), attr("beta", beta), attr("bias", bias)});
    if (const ref::tensor* xv = value(x)) set_value(y, ref::lrn(*xv, size, alpha, beta, bias));
    return y;
}

std::string graph_builder::flatten(const std::string& x, const std::string& name) {
    const std::string y = op("Flatten", {x}, name, {attr("axis", int64_t{1})});
    if (const ref::tensor* xv = value(x)) set_value(y, ref::flatten(*xv));
    return y;
}

std::string graph_builder::dropout(const std::string& x, const std::string& name) {
    const std::string y = op("Dropout", {x}, name);
    if (const ref::tensor* xv = value(x)) set_value(y, *xv);
    return y;
}

std::string graph_builder::concat(const std::vector<std::string>& xs, const std::string& name,
                                  int64_t axis) {
    const std::string y = op("Concat", xs, name, {attr("axis", axis)});
    std::vector<const ref::tensor*> vs;
    for (const auto& x : xs) {
        const ref::tensor* v = value(x);
        if (!v) return y;
        if (!vs.empty()) {
            if (v->shape.size() != vs[0]->shape.size())
                throw std::logic_error("concat " + name + ": ranks differ");
            for (size_t d = 0; d < v->shape.size(); ++d)
                if (static_cast<int64_t>(d) != axis && v->shape[d] != vs[0]->shape[d])
                    throw std::logic_error("concat " + name + ": shapes do not match");
        }
        vs.push_back(v);
    }
    set_value(y, ref::concat(vs, axis));
    return y;
}

std::string graph_builder::add(const std::string& a, const std::string& b,
                               const std::string& name) {
    const std::string y = op("Add", {a, b}, name);
    const ref::tensor *av = value(a), *bv = value(b);
    if (av && bv) set_value(y, ref::add(*av, *bv));
    return y;
}

std::string graph_builder::gemm(const std::string& x, const std::string& name, int64_t in,
                                int64_t out, double gain) {
    const ref::tensor* xv = value(x);
    if (xv && (xv->shape.size() != 2 || xv->dim(1) != in))
        throw std::logic_error("gemm " + name + ": input features do not match");
    const std::string w =
        normal(name + ".weight", {out, in}, gain / std::sqrt(static_cast<double>(in)));
    const std::string b = normal(name + ".bias", {out}, 0.01);
    const std::string y = op("Gemm", {x, w, b}, name,
                             {attr("alpha", 1.0f), attr("beta", 1.0f), attr("transB", int64_t{1})});
    if (xv) {
        ref::tensor yv = ref::gemm(*xv, floats(w), floats(b), out);
        lsuv(yv, w, b, gain);
        set_value(y, std::move(yv));
    }
    return y;
}

std::string graph_builder::linear(const std::string& x, const std::string& name, int64_t in,
                                  int64_t out, double gain) {
    const std::string w =
        normal(name + ".weight", {in, out}, gain / std::sqrt(static_cast<double>(in)));
    const std::string b = normal(name + ".bias", {out}, 0.01);
    return add(op("MatMul", {x, w}, name + ".matmul"), b, name);
}

std::string graph_builder::layernorm(const std::string& x, const std::string& name, int64_t dim,
                                     float eps) {
    const std::string gamma = normal(name + ".weight", {dim}, 0.05, 1.0);
    const std::string beta = normal(name + ".bias", {dim}, 0.02);
    return op("LayerNormalization", {x, gamma, beta}, name,
              {attr("axis", int64_t{-1}), attr("epsilon", eps)});
}

std::string conv_bn_relu(graph_builder& g, const std::string& x, const std::string& name,
                         int64_t cin, int64_t cout, window2d k, int64_t groups, bn_init bn) {
    std::string y = g.conv(x, name + ".conv", cin, cout, k, groups);
    y = g.bn(y, name + ".bn", cout, bn);
    return g.relu(y, name + ".relu");
}

}  // namespace reefline::zoo
