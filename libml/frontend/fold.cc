// Constant folding: a small reference evaluator (plain loops; f32/f64/i64/i32/i8/u8/bool;
// f16 only for data movement and Cast) and the graph passes built on it: the generic
// (batch-independent) fold at import, specialization for concrete input shapes, Identity
// removal, Conv+BatchNormalization fusion and dead-code elimination.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "libml/frontend/graph.h"
#include "libml/frontend/passes.h"

namespace reefline::ml::detail {

namespace {

using K = model_error::kind;

template <class T>
struct tag {
    using type = T;
};

// Calls f(tag<T>{}) for the storage type of t; returns false for f16/undefined.
template <class F>
bool visit_type(dtype t, F&& f) {
    switch (t) {
    case dtype::f32: f(tag<float>{}); return true;
    case dtype::f64: f(tag<double>{}); return true;
    case dtype::i64: f(tag<int64_t>{}); return true;
    case dtype::i32: f(tag<int32_t>{}); return true;
    case dtype::i8: f(tag<int8_t>{}); return true;
    case dtype::u8: f(tag<uint8_t>{}); return true;
    case dtype::boolean: f(tag<bool>{}); return true;
    default: return false;
    }
}

template <class T>
const T* ptr(const tensor& t) {
    return reinterpret_cast<const T*>(t.data->data());
}

struct out_buf {
    dtype type;
    shape_t shape;
    bytes_t bytes;
    out_buf(dtype t, shape_t s) : type(t), shape(std::move(s)) {
        bytes.resize(size_t(element_count(shape)) * dtype_size(t));
    }
    template <class T>
    T* p() {
        return reinterpret_cast<T*>(bytes.data());
    }
    tensor done() { return tensor::make(type, std::move(shape), std::move(bytes)); }
};

// Iterates over every element of `out`, calling f(out_index, offsets) where offsets[j] is the
// (broadcast) element offset into input j.
template <class F>
void broadcast_loop(const shape_t& out, const std::vector<shape_t>& ins, F&& f) {
    int64_t total = element_count(out);
    if (total <= 0) return;
    size_t k = ins.size(), r = out.size();
    std::vector<int64_t> off(k, 0);
    bool simple = true;
    std::vector<int64_t> step(k);
    for (size_t j = 0; j < k; ++j) {
        int64_t e = element_count(ins[j]);
        if (e == 1) step[j] = 0;
        else if (e == total && ins[j].size() == r && ins[j] == out) step[j] = 1;
        else simple = false;
    }
    if (simple) {
        for (int64_t i = 0; i < total; ++i) {
            for (size_t j = 0; j < k; ++j) off[j] = step[j] * i;
            f(i, off.data());
        }
        return;
    }
    std::vector<std::vector<int64_t>> st(k, std::vector<int64_t>(r, 0));
    for (size_t j = 0; j < k; ++j) {
        const shape_t& s = ins[j];
        int64_t acc = 1;
        for (size_t d = s.size(); d-- > 0;) {
            size_t od = r - s.size() + d;
            st[j][od] = s[d] == 1 ? 0 : acc;
            acc *= s[d];
        }
    }
    std::vector<int64_t> idx(r, 0);
    for (int64_t i = 0; i < total; ++i) {
        f(i, off.data());
        for (size_t d = r; d-- > 0;) {
            ++idx[d];
            for (size_t j = 0; j < k; ++j) off[j] += st[j][d];
            if (idx[d] < out[d]) break;
            for (size_t j = 0; j < k; ++j) off[j] -= st[j][d] * out[d];
            idx[d] = 0;
        }
    }
}

std::vector<int64_t> strides_of(const shape_t& s) {
    std::vector<int64_t> st(s.size(), 1);
    for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
    return st;
}

// Row-major index -> multi-index iteration for data movement: calls f(out_i, idx).
template <class F>
void index_loop(const shape_t& out, F&& f) {
    int64_t total = element_count(out);
    std::vector<int64_t> idx(out.size(), 0);
    for (int64_t i = 0; i < total; ++i) {
        f(i, idx);
        for (size_t d = out.size(); d-- > 0;) {
            if (++idx[d] < out[d]) break;
            idx[d] = 0;
        }
    }
}

template <class T>
T from_f64(double v) {
    if constexpr (std::is_same_v<T, bool>) {
        return v != 0;
    } else if constexpr (std::is_floating_point_v<T>) {
        return T(v);
    } else {
        if (std::isnan(v)) return T(0);
        double lo = double(std::numeric_limits<T>::min()), hi = double(std::numeric_limits<T>::max());
        if (v <= lo) return std::numeric_limits<T>::min();
        if (v >= hi) return std::numeric_limits<T>::max();
        return T(v);
    }
}

template <class T>
T wrap_i64(int64_t v) {
    if constexpr (std::is_same_v<T, bool>) return v != 0;
    else return T(v);  // modular for narrower integer types (C++20)
}

// ---- elementwise ------------------------------------------------------------------------

std::optional<tensor> eval_unary(const node& n, const tensor& x) {
    std::optional<tensor> result;
    float alpha = n.f("alpha", 0), beta = n.f("beta", 0);
    float lo = n.f("min", -INFINITY), hi = n.f("max", INFINITY);
    bool tanh_gelu = n.op == op_type::Gelu && n.s("approximate", "none") == "tanh";
    visit_type(x.type, [&](auto tg) {
        using T = typename decltype(tg)::type;
        if constexpr (std::is_same_v<T, bool>) {
            return;
        } else {
            out_buf o(x.type, x.shape);
            const T* a = ptr<T>(x);
            T* y = o.p<T>();
            int64_t e = x.elements();
            if constexpr (std::is_floating_point_v<T>) {
                switch (n.op) {
                case op_type::Sigmoid: for (int64_t i = 0; i < e; ++i) y[i] = T(1) / (T(1) + std::exp(-a[i])); break;
                case op_type::Tanh: for (int64_t i = 0; i < e; ++i) y[i] = std::tanh(a[i]); break;
                case op_type::Erf: for (int64_t i = 0; i < e; ++i) y[i] = std::erf(a[i]); break;
                case op_type::Sqrt: for (int64_t i = 0; i < e; ++i) y[i] = std::sqrt(a[i]); break;
                case op_type::Exp: for (int64_t i = 0; i < e; ++i) y[i] = std::exp(a[i]); break;
                case op_type::Sin: for (int64_t i = 0; i < e; ++i) y[i] = std::sin(a[i]); break;
                case op_type::Cos: for (int64_t i = 0; i < e; ++i) y[i] = std::cos(a[i]); break;
                case op_type::LeakyRelu: for (int64_t i = 0; i < e; ++i) y[i] = a[i] < 0 ? T(alpha) * a[i] : a[i]; break;
                case op_type::HardSigmoid:
                    for (int64_t i = 0; i < e; ++i) y[i] = std::max(T(0), std::min(T(1), T(alpha) * a[i] + T(beta)));
                    break;
                case op_type::HardSwish:
                    for (int64_t i = 0; i < e; ++i) y[i] = a[i] * std::max(T(0), std::min(T(1), a[i] / T(6) + T(0.5)));
                    break;
                case op_type::Gelu:
                    for (int64_t i = 0; i < e; ++i) {
                        double v = double(a[i]);
                        y[i] = tanh_gelu ? T(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))))
                                         : T(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
                    }
                    break;
                default: break;
                }
            }
            bool done = true;
            switch (n.op) {
            case op_type::Relu: for (int64_t i = 0; i < e; ++i) y[i] = a[i] < T(0) ? T(0) : a[i]; break;
            case op_type::Neg: for (int64_t i = 0; i < e; ++i) y[i] = T(-a[i]); break;
            case op_type::Abs: for (int64_t i = 0; i < e; ++i) y[i] = a[i] < T(0) ? T(-a[i]) : a[i]; break;
            case op_type::Clip:
                for (int64_t i = 0; i < e; ++i) {
                    double v = double(a[i]);
                    y[i] = v < lo ? from_f64<T>(lo) : v > hi ? from_f64<T>(hi) : a[i];
                    if (lo > hi) y[i] = from_f64<T>(hi);  // ONNX: min > max gives max
                }
                break;
            default:
                done = std::is_floating_point_v<T>;
            }
            if (done) result = o.done();
        }
    });
    return result;
}

template <class T>
T int_pow(T base, double ex) {
    return from_f64<T>(std::pow(double(base), ex));
}

std::optional<tensor> eval_binary(const node& n, const tensor& a, const tensor& b, const shape_t& out_shape) {
    std::optional<tensor> result;
    if (n.op == op_type::Pow && a.type != b.type) {  // mixed: exponent read as double
        visit_type(a.type, [&](auto tg) {
            using T = typename decltype(tg)::type;
            if constexpr (!std::is_same_v<T, bool>) {
                out_buf o(a.type, out_shape);
                const T* x = ptr<T>(a);
                T* y = o.p<T>();
                broadcast_loop(out_shape, {a.shape, b.shape}, [&](int64_t i, const int64_t* off) {
                    y[i] = from_f64<T>(std::pow(double(x[off[0]]), b.as_f64(off[1])));
                });
                result = o.done();
            }
        });
        return result;
    }
    if (a.type != b.type) return std::nullopt;
    visit_type(a.type, [&](auto tg) {
        using T = typename decltype(tg)::type;
        const T* x = ptr<T>(a);
        const T* z = ptr<T>(b);
        if (n.op == op_type::Equal) {
            out_buf o(dtype::boolean, out_shape);
            bool* y = o.p<bool>();
            broadcast_loop(out_shape, {a.shape, b.shape},
                           [&](int64_t i, const int64_t* off) { y[i] = x[off[0]] == z[off[1]]; });
            result = o.done();
            return;
        }
        if constexpr (std::is_same_v<T, bool>) {
            return;
        } else {
            out_buf o(a.type, out_shape);
            T* y = o.p<T>();
            auto run = [&](auto op) {
                broadcast_loop(out_shape, {a.shape, b.shape},
                               [&](int64_t i, const int64_t* off) { y[i] = op(x[off[0]], z[off[1]]); });
            };
            if constexpr (std::is_floating_point_v<T>) {
                switch (n.op) {
                case op_type::Add: run([](T p, T q) { return p + q; }); break;
                case op_type::Sub: run([](T p, T q) { return p - q; }); break;
                case op_type::Mul: run([](T p, T q) { return p * q; }); break;
                case op_type::Div: run([](T p, T q) { return p / q; }); break;
                case op_type::Pow: run([](T p, T q) { return T(std::pow(p, q)); }); break;
                default: return;
                }
            } else {
                using U = std::make_unsigned_t<std::conditional_t<sizeof(T) < 4, int32_t, T>>;
                bool div0 = false;
                switch (n.op) {
                case op_type::Add: run([](T p, T q) { return T(U(p) + U(q)); }); break;
                case op_type::Sub: run([](T p, T q) { return T(U(p) - U(q)); }); break;
                case op_type::Mul: run([](T p, T q) { return T(U(p) * U(q)); }); break;
                case op_type::Div:
                    run([&](T p, T q) {
                        if (q == 0) {
                            div0 = true;
                            return T(0);
                        }
                        if constexpr (std::is_signed_v<T>)
                            if (q == T(-1)) return T(U(0) - U(p));
                        return T(p / q);
                    });
                    break;
                case op_type::Pow: run([](T p, T q) { return int_pow<T>(p, double(q)); }); break;
                default: return;
                }
                if (div0) fail_node(K::shape, n, "integer division by zero in a constant subgraph");
            }
            result = o.done();
        }
    });
    return result;
}

std::optional<tensor> eval_variadic(const node& n, const std::vector<tensor>& xs, const shape_t& out_shape) {
    std::optional<tensor> result;
    for (const tensor& x : xs)
        if (x.type != xs[0].type) return std::nullopt;
    visit_type(xs[0].type, [&](auto tg) {
        using T = typename decltype(tg)::type;
        if constexpr (!std::is_same_v<T, bool>) {
            std::vector<shape_t> shapes;
            std::vector<const T*> ps;
            for (const tensor& x : xs) {
                shapes.push_back(x.shape);
                ps.push_back(ptr<T>(x));
            }
            out_buf o(xs[0].type, out_shape);
            T* y = o.p<T>();
            size_t k = xs.size();
            broadcast_loop(out_shape, shapes, [&](int64_t i, const int64_t* off) {
                if (n.op == op_type::Sum || n.op == op_type::Mean) {
                    double s = 0;
                    for (size_t j = 0; j < k; ++j) s += double(ps[j][off[j]]);
                    if (n.op == op_type::Mean) s /= double(k);
                    y[i] = from_f64<T>(s);
                } else {
                    T m = ps[0][off[0]];
                    for (size_t j = 1; j < k; ++j) {
                        T v = ps[j][off[j]];
                        if constexpr (std::is_floating_point_v<T>)
                            if (std::isnan(v)) { m = v; continue; }
                        m = n.op == op_type::Max ? std::max(m, v) : std::min(m, v);
                    }
                    y[i] = m;
                }
            });
            result = o.done();
        }
    });
    return result;
}

tensor eval_cast(const tensor& x, dtype to) {
    out_buf o(to, x.shape);
    int64_t e = x.elements();
    if (x.type == dtype::f16 || to == dtype::f16) {
        for (int64_t i = 0; i < e; ++i) {
            double v = x.as_f64(i);
            std::byte* p = o.bytes.data() + i * dtype_size(to);
            if (to == dtype::f16) {
                uint16_t h = float_to_half(float(v));
                std::memcpy(p, &h, 2);
            } else {
                visit_type(to, [&](auto tg) {
                    using T = typename decltype(tg)::type;
                    T t = from_f64<T>(v);
                    std::memcpy(p, &t, sizeof(T));
                });
            }
        }
        return o.done();
    }
    visit_type(x.type, [&](auto ts) {
        using S = typename decltype(ts)::type;
        visit_type(to, [&](auto td) {
            using D = typename decltype(td)::type;
            const S* a = ptr<S>(x);
            D* y = o.p<D>();
            for (int64_t i = 0; i < e; ++i) {
                if constexpr (std::is_floating_point_v<S>) y[i] = from_f64<D>(double(a[i]));
                else if constexpr (std::is_floating_point_v<D>) y[i] = D(a[i]);
                else y[i] = wrap_i64<D>(int64_t(a[i]));
            }
        });
    });
    return o.done();
}

// ---- data movement (type-agnostic, element size es) ------------------------------------------

tensor same_data(const tensor& x, dtype t, shape_t s) { return {t, std::move(s), x.data}; }

tensor eval_transpose(const tensor& x, const ints& perm, const shape_t& out_shape) {
    size_t es = dtype_size(x.type);
    out_buf o(x.type, out_shape);
    auto ist = strides_of(x.shape);
    std::vector<int64_t> pst(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) pst[i] = ist[size_t(perm[i])];
    const std::byte* src = x.data->data();
    index_loop(out_shape, [&](int64_t i, const std::vector<int64_t>& idx) {
        int64_t off = 0;
        for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * pst[d];
        std::memcpy(o.bytes.data() + i * es, src + off * es, es);
    });
    return o.done();
}

tensor eval_slice(const node& n, const tensor& x, const shape_t& out_shape) {
    size_t es = dtype_size(x.type), r = x.shape.size();
    std::vector<int64_t> start(r, 0), step(r, 1);
    ints axes = n.is("axes"), starts = n.is("starts"), steps = n.is("steps");
    for (size_t i = 0; i < axes.size(); ++i) {
        start[size_t(axes[i])] = starts[i];
        step[size_t(axes[i])] = steps[i];
    }
    auto ist = strides_of(x.shape);
    out_buf o(x.type, out_shape);
    const std::byte* src = x.data->data();
    index_loop(out_shape, [&](int64_t i, const std::vector<int64_t>& idx) {
        int64_t off = 0;
        for (size_t d = 0; d < r; ++d) off += (start[d] + idx[d] * step[d]) * ist[d];
        std::memcpy(o.bytes.data() + i * es, src + off * es, es);
    });
    return o.done();
}

tensor eval_gather(const tensor& x, const tensor& idx, int64_t axis, const shape_t& out_shape) {
    size_t es = dtype_size(x.type);
    int64_t outer = 1, inner = 1, d = x.shape[size_t(axis)];
    for (int64_t i = 0; i < axis; ++i) outer *= x.shape[size_t(i)];
    for (size_t i = size_t(axis) + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
    int64_t ni = idx.elements();
    out_buf o(x.type, out_shape);
    const std::byte* src = x.data->data();
    std::byte* dst = o.bytes.data();
    for (int64_t a = 0; a < outer; ++a)
        for (int64_t j = 0; j < ni; ++j) {
            int64_t k = idx.as_i64(j);
            if (k < 0) k += d;
            if (inner > 0) std::memcpy(dst, src + (a * d + k) * inner * int64_t(es), size_t(inner) * es);
            dst += inner * int64_t(es);
        }
    return o.done();
}

tensor eval_concat(const std::vector<tensor>& xs, int64_t axis, const shape_t& out_shape) {
    size_t es = dtype_size(xs[0].type);
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= out_shape[size_t(i)];
    out_buf o(xs[0].type, out_shape);
    std::byte* dst = o.bytes.data();
    for (int64_t a = 0; a < outer; ++a)
        for (const tensor& x : xs) {
            int64_t block = x.elements() / std::max<int64_t>(outer, 1) * int64_t(es);
            if (outer == 0 || block == 0) continue;
            std::memcpy(dst, x.data->data() + a * block, size_t(block));
            dst += block;
        }
    return o.done();
}

std::vector<tensor> eval_split(const tensor& x, int64_t axis, const ints& split) {
    size_t es = dtype_size(x.type);
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.shape[size_t(i)];
    for (size_t i = size_t(axis) + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
    int64_t d = x.shape[size_t(axis)];
    std::vector<tensor> r;
    int64_t begin = 0;
    for (int64_t s : split) {
        shape_t sh = x.shape;
        sh[size_t(axis)] = s;
        out_buf o(x.type, sh);
        for (int64_t a = 0; a < outer && s * inner > 0; ++a)
            std::memcpy(o.bytes.data() + a * s * inner * int64_t(es),
                        x.data->data() + (a * d + begin) * inner * int64_t(es), size_t(s * inner) * es);
        begin += s;
        r.push_back(o.done());
    }
    return r;
}

tensor eval_broadcast_copy(const tensor& x, const shape_t& out_shape) {
    size_t es = dtype_size(x.type);
    out_buf o(x.type, out_shape);
    const std::byte* src = x.data->data();
    broadcast_loop(out_shape, {x.shape}, [&](int64_t i, const int64_t* off) {
        std::memcpy(o.bytes.data() + i * int64_t(es), src + off[0] * int64_t(es), es);
    });
    return o.done();
}

tensor eval_where(const tensor& c, const tensor& a, const tensor& b, const shape_t& out_shape) {
    size_t es = dtype_size(a.type);
    out_buf o(a.type, out_shape);
    const bool* cp = ptr<bool>(c);
    broadcast_loop(out_shape, {c.shape, a.shape, b.shape}, [&](int64_t i, const int64_t* off) {
        const tensor& s = cp[off[0]] ? a : b;
        std::memcpy(o.bytes.data() + i * int64_t(es), s.data->data() + off[cp[off[0]] ? 1 : 2] * int64_t(es), es);
    });
    return o.done();
}

bytes_t scalar_bytes(dtype t, double v) {
    tensor s = is_float(t) ? tensor::from_f64({v}, {}, t) : tensor::from_i64({int64_t(v)}, {}, t);
    return *s.data;
}

tensor eval_pad(const node& n, const tensor& x, const shape_t& out_shape) {
    size_t es = dtype_size(x.type), r = x.shape.size();
    ints pads = n.is("pads");
    std::string mode = n.s("mode", "constant");
    bytes_t fill = scalar_bytes(x.type, n.f("value", 0));
    auto ist = strides_of(x.shape);
    out_buf o(x.type, out_shape);
    const std::byte* src = x.data->data();
    index_loop(out_shape, [&](int64_t i, const std::vector<int64_t>& idx) {
        int64_t off = 0;
        bool inside = true;
        for (size_t d = 0; d < r; ++d) {
            int64_t j = idx[d] - pads[d], dim = x.shape[d];
            if (j < 0 || j >= dim) {
                if (mode == "constant") {
                    inside = false;
                    break;
                } else if (mode == "edge") {
                    j = std::clamp<int64_t>(j, 0, dim - 1);
                } else if (mode == "wrap") {
                    j = ((j % dim) + dim) % dim;
                } else {  // reflect
                    if (dim == 1) j = 0;
                    else {
                        int64_t period = 2 * (dim - 1);
                        j = ((j % period) + period) % period;
                        if (j >= dim) j = period - j;
                    }
                }
            }
            off += j * ist[d];
        }
        std::memcpy(o.bytes.data() + i * int64_t(es), inside ? src + off * int64_t(es) : fill.data(), es);
    });
    return o.done();
}

std::optional<tensor> eval_range(const tensor& s, const tensor& l, const tensor& d, const shape_t& out_shape) {
    std::optional<tensor> result;
    visit_type(s.type, [&](auto tg) {
        using T = typename decltype(tg)::type;
        if constexpr (!std::is_same_v<T, bool>) {
            out_buf o(s.type, out_shape);
            T* y = o.p<T>();
            // Accumulates in T like ONNX Runtime's kernel (so float ranges past 2^24 match it).
            T v = ptr<T>(s)[0], delta = ptr<T>(d)[0];
            (void)l;
            for (int64_t i = 0, e = element_count(out_shape); i < e; ++i) {
                y[i] = v;
                v = T(v + delta);
            }
            result = o.done();
        }
    });
    return result;
}

std::optional<tensor> eval_reduce_mean(const node& n, const tensor& x, const shape_t& out_shape) {
    if (!is_float(x.type) || x.type == dtype::f16) return std::nullopt;
    ints axes = n.is("axes");
    size_t r = x.shape.size();
    std::vector<char> red(r, 0);
    for (int64_t a : axes) red[size_t(a)] = 1;
    // output strides over the kept dims
    shape_t kept(r);
    for (size_t d = 0; d < r; ++d) kept[d] = red[d] ? 1 : x.shape[d];
    auto ost = strides_of(kept);
    int64_t on = element_count(kept);
    std::vector<double> acc(size_t(on), 0.0);
    index_loop(x.shape, [&](int64_t i, const std::vector<int64_t>& idx) {
        int64_t off = 0;
        for (size_t d = 0; d < r; ++d)
            if (!red[d]) off += idx[d] * ost[d];
        acc[size_t(off)] += x.as_f64(i);
    });
    int64_t cnt = on ? x.elements() / on : 0;
    for (double& v : acc) v = cnt ? v / double(cnt) : NAN;
    return tensor::from_f64(acc, out_shape, x.type);
}

}  // namespace

std::optional<std::vector<tensor>> evaluate(const graph& g, const node& n) {
    std::vector<tensor> in;
    for (int v : n.inputs) in.push_back(v >= 0 ? g.values[size_t(v)].constant() : tensor{});
    auto out_value = [&](size_t k) -> const value& { return g.values[size_t(n.outputs[k])]; };
    const shape_t& os = out_value(0).shape;
    dtype ot = out_value(0).type;
    auto one = [](std::optional<tensor> t) -> std::optional<std::vector<tensor>> {
        if (!t) return std::nullopt;
        return std::vector<tensor>{std::move(*t)};
    };
    switch (n.op) {
    case op_type::Identity:
        return std::vector<tensor>{in[0]};
    case op_type::Dropout: {
        std::vector<tensor> r{in[0]};
        if (n.output(1) >= 0) {
            out_buf m(dtype::boolean, in[0].shape);
            std::fill(m.bytes.begin(), m.bytes.end(), std::byte{1});
            r.push_back(m.done());
        }
        return r;
    }
    case op_type::Reshape:
    case op_type::Flatten:
    case op_type::Squeeze:
    case op_type::Unsqueeze:
        return std::vector<tensor>{same_data(in[0], in[0].type, os)};
    case op_type::Shape: {
        const shape_t& s = g.values[size_t(n.inputs[0])].shape;
        int64_t b = n.i("start", 0), e = n.i("end", int64_t(s.size()));
        return std::vector<tensor>{tensor::from_i64(ints(s.begin() + b, s.begin() + std::max(b, e)), os)};
    }
    case op_type::ConstantOfShape: {
        out_buf o(ot, os);
        bytes_t v(dtype_size(ot), std::byte{0});
        if (const tensor* t = n.t("value")) v = bytes_t(t->data->begin(), t->data->begin() + long(dtype_size(ot)));
        for (size_t i = 0; i < o.bytes.size(); i += v.size()) std::memcpy(o.bytes.data() + i, v.data(), v.size());
        return std::vector<tensor>{o.done()};
    }
    case op_type::Transpose:
        return std::vector<tensor>{eval_transpose(in[0], n.is("perm"), os)};
    case op_type::Slice:
        return std::vector<tensor>{eval_slice(n, in[0], os)};
    case op_type::Gather:
        return std::vector<tensor>{eval_gather(in[0], in[1], n.i("axis", 0), os)};
    case op_type::Concat:
        return std::vector<tensor>{eval_concat(in, n.i("axis", 0), os)};
    case op_type::Split:
        return eval_split(in[0], n.i("axis", 0), n.is("split"));
    case op_type::Expand:
        return std::vector<tensor>{eval_broadcast_copy(in[0], os)};
    case op_type::Where:
        return std::vector<tensor>{eval_where(in[0], in[1], in[2], os)};
    case op_type::Pad:
        return std::vector<tensor>{eval_pad(n, in[0], os)};
    case op_type::Cast:
        return std::vector<tensor>{eval_cast(in[0], ot)};
    case op_type::Range:
        return one(eval_range(in[0], in[1], in[2], os));
    case op_type::ReduceMean:
        return one(eval_reduce_mean(n, in[0], os));
    case op_type::Relu: case op_type::Neg: case op_type::Abs: case op_type::Clip:
    case op_type::Sigmoid: case op_type::Tanh: case op_type::Erf: case op_type::Sqrt:
    case op_type::Exp: case op_type::Sin: case op_type::Cos: case op_type::LeakyRelu:
    case op_type::HardSigmoid: case op_type::HardSwish: case op_type::Gelu:
        return one(eval_unary(n, in[0]));
    case op_type::Add: case op_type::Sub: case op_type::Mul: case op_type::Div:
    case op_type::Pow: case op_type::Equal:
        return one(eval_binary(n, in[0], in[1], os));
    case op_type::Sum: case op_type::Mean: case op_type::Max: case op_type::Min:
        return one(eval_variadic(n, in, os));
    default:
        return std::nullopt;
    }
}

// ---- passes ---------------------------------------------------------------------------------

namespace {

// Drops the nodes marked dead (keeping the order of the rest) and recomputes every value's
// producer index.
void remove_nodes(graph& g, const std::vector<char>& dead) {
    std::vector<node> kept;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (!dead[i]) kept.push_back(std::move(g.nodes[i]));
    g.nodes = std::move(kept);
    for (value& v : g.values) v.producer = -1;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        for (int v : g.nodes[i].outputs)
            if (v >= 0) g.values[size_t(v)].producer = int(i);
}

struct folder {
    graph& g;
    const fold_limits& limits;
    std::vector<char> dead;       // per node
    std::vector<int> uses;        // remaining live consumers per value
    int64_t folded_bytes = 0;

    folder(graph& gr, const fold_limits& l) : g(gr), limits(l), dead(gr.nodes.size(), 0), uses(gr.values.size(), 0) {
        for (const node& n : g.nodes)
            for (int v : n.inputs)
                if (v >= 0) ++uses[size_t(v)];
    }

    bool all_inputs_constant(const node& n) const {
        for (int v : n.inputs)
            if (v >= 0 && !g.values[size_t(v)].data) return false;
        return true;
    }

    // Folds node i (already inferred); returns false if it cannot or should not.
    bool fold(int i) {
        node& n = g.nodes[size_t(i)];
        int64_t bytes = 0;
        for (int v : n.outputs) {
            if (v < 0) continue;
            const value& o = g.values[size_t(v)];
            int64_t b = element_count(o.shape) * int64_t(dtype_size(o.type));
            if (b > limits.max_fold_bytes) return false;
            bytes += b;
        }
        if (folded_bytes + bytes > limits.max_total_bytes) return false;
        auto r = evaluate(g, n);
        if (!r) return false;
        for (size_t k = 0; k < n.outputs.size() && k < r->size(); ++k) {
            int v = n.outputs[k];
            if (v < 0) continue;
            value& o = g.values[size_t(v)];
            tensor& t = (*r)[k];
            if (t.type != o.type || t.shape != o.shape || !t.data ||
                int64_t(t.data->size()) != element_count(t.shape) * int64_t(dtype_size(t.type)))
                fail_node(K::invalid_graph, n, "internal error: folded output disagrees with inference");
            o.set_constant(t);
            o.producer = -1;
        }
        folded_bytes += bytes;
        kill(i);
        return true;
    }

    void kill(int i) {
        dead[size_t(i)] = 1;
        for (int v : g.nodes[size_t(i)].inputs) {
            if (v < 0) continue;
            if (--uses[size_t(v)] == 0 && !g.is_output(v) && g.values[size_t(v)].producer < 0 &&
                std::find(g.inputs.begin(), g.inputs.end(), v) == g.inputs.end())
                g.values[size_t(v)].data.reset();  // release intermediates early (DCE drops them)
        }
    }

    void compact() { remove_nodes(g, dead); }
};

void replace_uses(graph& g, int from, int to) {
    for (node& n : g.nodes)
        for (int& v : n.inputs)
            if (v == from) v = to;
}

void check_declared(graph& g, const value& v, int64_t declared_batch) {
    auto it = g.declared.find(v.name);
    if (it == g.declared.end()) return;
    const auto& d = it->second;
    if (d.type != dtype::undefined && d.type != v.type)
        fail(K::shape, "value '" + v.name + "': inferred type " + dtype_name(v.type) + " but the model declares " +
                           dtype_name(d.type));
    if (!d.shape) return;
    const shape_t& s = *d.shape;
    bool ok = s.size() == v.shape.size();
    for (size_t i = 0; ok && i < s.size(); ++i) {
        if (s[i] < 0 || s[i] == v.shape[i]) continue;
        if (i == 0 && v.batched && s[0] == declared_batch) continue;
        ok = false;
    }
    if (!ok) {
        std::string w = "value '" + v.name + "': inferred shape " + shape_str(v.shape) + " but the model declares " +
                        shape_str(s) + " (keeping the inferred shape)";
        if (std::find(g.warnings.begin(), g.warnings.end(), w) == g.warnings.end()) g.warnings.push_back(w);
    }
}

}  // namespace

void fold_generic(graph& g, const fold_limits& limits) {
    folder f(g, limits);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (!canonicalize_params(g, int(i))) continue;
        if (!f.all_inputs_constant(g.nodes[i])) continue;
        infer_node(g, int(i));
        f.fold(int(i));
    }
    f.compact();
    remove_identities(g);
    fuse_batchnorm(g);
    fuse_gelu(g);
    eliminate_dead_code(g);
}

graph specialize_graph(const graph& generic, const std::map<int, shape_t>& input_shapes, const fold_limits& limits,
                       std::vector<int>* batch_fixups) {
    graph g = generic;
    g.set_generic(nullptr);
    g.warnings.clear();
    int64_t batch = 0, declared_batch = 0;
    for (int in : g.inputs) {
        value& v = g.values[size_t(in)];
        auto it = input_shapes.find(in);
        shape_t s = it != input_shapes.end() ? it->second : v.shape;
        const shape_t& decl = generic.values[size_t(in)].shape;
        auto dit = g.declared.find(v.name);
        bool has_decl = dit != g.declared.end() && dit->second.shape.has_value();
        if (has_decl) {
            bool ok = s.size() == decl.size();
            for (size_t i = 0; ok && i < s.size(); ++i)
                if (decl[i] >= 0 && decl[i] != s[i] && !(i == 0 && v.batched)) ok = false;
            if (!ok)
                fail(K::shape, "graph input '" + v.name + "': shape " + shape_str(s) + " does not match the declared " +
                                   shape_str(decl));
        }
        for (size_t i = 0; i < s.size(); ++i)
            if (s[i] < 0)
                fail(K::dynamic,
                     "graph input '" + v.name + "' has a symbolic dim " + std::to_string(i) + " " + shape_str(s) +
                         "; give its shape at import (import_options::input_shapes)",
                     v.name);
        check_size(v.type, s, "graph input '" + v.name + "'");
        v.shape = s;
        if (v.batched && !s.empty()) {
            if (batch && batch != s[0])
                fail(K::shape, "batched graph inputs disagree on the batch size (" + std::to_string(batch) + " vs " +
                                   std::to_string(s[0]) + ")");
            batch = s[0];
            if (has_decl && decl[0] >= 0) declared_batch = decl[0];
        }
    }
    g.batch = batch;

    folder f(g, limits);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        int pending = -1;
        if (!canonicalize_params(g, int(i), &pending)) {
            const value& p = g.values[size_t(pending)];
            fail_node(K::dynamic, g.nodes[i],
                      "input '" + p.name + "' must be constant (it determines the output shape)" +
                          (std::find(g.inputs.begin(), g.inputs.end(), pending) != g.inputs.end()
                               ? "; it is a graph input: bind it with import_options::constant_inputs"
                               : ""),
                      p.name);
        }
        infer_node(g, int(i));
        node& n = g.nodes[i];
        if (n.op == op_type::Reshape && batch_fixups) {
            const value& x = g.values[size_t(n.inputs[0])];
            value& y = g.values[size_t(n.outputs[0])];
            ints s = n.is("shape");
            const node& gn = generic.nodes[i];
            if (x.batched && !y.batched && !s.empty() && s[0] == x.shape[0] && n.i("allowzero", 0) == 0 &&
                gn.has("shape") && gn.inputs.size() == 1) {
                s[0] = 0;
                n.set("shape", s);
                y.batched = true;
                batch_fixups->push_back(int(i));
            }
        }
        for (int v : n.outputs)
            if (v >= 0) check_declared(g, g.values[size_t(v)], declared_batch ? declared_batch : batch);
        if (n.op == op_type::Dropout && n.output(1) >= 0 && !f.all_inputs_constant(n)) {
            // the mask of an inference-mode Dropout is all true
            value& m = g.values[size_t(n.outputs[1])];
            out_buf o(dtype::boolean, m.shape);
            std::fill(o.bytes.begin(), o.bytes.end(), std::byte{1});
            m.set_constant(o.done());
            m.producer = -1;
            n.outputs.resize(1);
        }
        if (n.op == op_type::Shape || f.all_inputs_constant(n)) f.fold(int(i));
    }
    f.compact();
    remove_identities(g);
    eliminate_dead_code(g);
    for (int v : g.outputs) check_declared(g, g.values[size_t(v)], declared_batch ? declared_batch : batch);
    g.validate();
    return g;
}



void remove_identities(graph& g) {
    std::vector<char> dead(g.nodes.size(), 0);
    bool any = false;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        node& n = g.nodes[i];
        if (n.op != op_type::Identity && n.op != op_type::Dropout) continue;
        if (n.op == op_type::Dropout && n.output(1) >= 0) continue;  // mask still needed
        if (n.inputs.size() != 1) continue;  // parameters not yet canonical (training_mode unknown)
        int vin = n.inputs[0], vout = n.output(0);
        if (vout < 0) {
            dead[i] = 1;
        } else if (!g.is_output(vout)) {
            replace_uses(g, vout, vin);
            dead[i] = 1;
        } else if (int p = g.values[size_t(vin)].producer; p >= 0 && !g.is_output(vin)) {
            node& pn = g.nodes[size_t(p)];
            for (int& o : pn.outputs)
                if (o == vin) o = vout;
            value& vo = g.values[size_t(vout)];
            const value& vi = g.values[size_t(vin)];
            if (vo.type == dtype::undefined || vi.type != dtype::undefined) {
                vo.type = vi.type;
                vo.shape = vi.shape;
                vo.batched = vi.batched;
            }
            vo.producer = p;
            replace_uses(g, vin, vout);
            dead[i] = 1;
        } else if (g.values[size_t(vin)].data) {
            value& vo = g.values[size_t(vout)];
            vo.set_constant(g.values[size_t(vin)].constant());
            vo.producer = -1;
            dead[i] = 1;
        } else {
            n.op = op_type::Identity;  // a graph input that is also a graph output: a copy
            n.attrs.clear();
            n.outputs.resize(1);
            continue;
        }
        any = true;
    }
    if (!any) return;
    remove_nodes(g, dead);
}

void fuse_batchnorm(graph& g) {
    std::vector<char> dead(g.nodes.size(), 0);
    std::vector<int> uses(g.values.size(), 0);
    for (const node& n : g.nodes)
        for (int v : n.inputs)
            if (v >= 0) ++uses[size_t(v)];
    bool any = false;
    for (size_t bi = 0; bi < g.nodes.size(); ++bi) {
        node& bn = g.nodes[bi];
        if (bn.op != op_type::BatchNormalization || bn.inputs.size() < 5) continue;
        if (bn.i("training_mode", 0) != 0) continue;
        bool extra = false;
        for (size_t k = 1; k < bn.outputs.size(); ++k) extra |= bn.outputs[k] >= 0;
        if (extra) continue;
        int x = bn.inputs[0];
        int ci = g.values[size_t(x)].producer;
        if (ci < 0 || dead[size_t(ci)] || uses[size_t(x)] != 1 || g.is_output(x)) continue;
        node& conv = g.nodes[size_t(ci)];
        if (conv.op != op_type::Conv || conv.outputs.size() != 1) continue;
        const value& w = g.values[size_t(conv.inputs[1])];
        const value* b = conv.input(2) >= 0 ? &g.values[size_t(conv.input(2))] : nullptr;
        if (!w.data || w.type != dtype::f32 || w.shape.empty() || (b && (!b->data || b->type != dtype::f32))) continue;
        int64_t m = w.shape[0];
        bool ok = true;
        std::vector<const float*> p(5, nullptr);
        for (size_t k = 1; k <= 4; ++k) {
            const value& pv = g.values[size_t(bn.inputs[k])];
            if (!pv.data || pv.type != dtype::f32 || pv.shape != shape_t{m}) ok = false;
            else p[k] = reinterpret_cast<const float*>(pv.data->data());
        }
        if (!ok || (b && b->shape != shape_t{m})) continue;
        float eps = bn.f("epsilon", 1e-5f);
        int64_t per = element_count(w.shape) / std::max<int64_t>(m, 1);
        bytes_t wb(w.data->size()), bb(size_t(m) * 4);
        const float* wp = reinterpret_cast<const float*>(w.data->data());
        float* nw = reinterpret_cast<float*>(wb.data());
        float* nb = reinterpret_cast<float*>(bb.data());
        const float* bp = b ? reinterpret_cast<const float*>(b->data->data()) : nullptr;
        for (int64_t c = 0; c < m; ++c) {
            float factor = p[1][c] / std::sqrt(p[4][c] + eps);
            for (int64_t j = 0; j < per; ++j) nw[c * per + j] = wp[c * per + j] * factor;
            nb[c] = ((bp ? bp[c] : 0.0f) - p[3][c]) * factor + p[2][c];
        }
        auto fresh = [&](const std::string& base) {
            std::string nm = base;
            for (int k = 2; g.find(nm) >= 0; ++k) nm = base + "_" + std::to_string(k);
            return nm;
        };
        value nwv;
        nwv.name = fresh(conv.name + "/W_bn");
        nwv.set_constant(tensor::make(dtype::f32, w.shape, std::move(wb)));
        value nbv;
        nbv.name = fresh(conv.name + "/B_bn");
        nbv.set_constant(tensor::make(dtype::f32, {m}, std::move(bb)));
        int out = bn.outputs[0];
        for (size_t k = 1; k < 3; ++k)
            if (int v = conv.input(k); v >= 0) --uses[size_t(v)];
        int wid = g.add_value(std::move(nwv));
        int bid = g.add_value(std::move(nbv));
        uses.resize(g.values.size(), 0);
        node& cv = g.nodes[size_t(ci)];  // re-fetch: add_value may not move nodes, but be explicit
        cv.inputs.resize(3);
        cv.inputs[1] = wid;
        cv.inputs[2] = bid;
        cv.outputs[0] = out;
        g.values[size_t(out)].producer = ci;
        if (g.values[size_t(out)].type == dtype::undefined) g.values[size_t(out)].type = g.values[size_t(x)].type;
        g.values[size_t(x)].producer = -1;
        dead[bi] = 1;
        any = true;
    }
    if (!any) return;
    remove_nodes(g, dead);
}

// x * 0.5 * (1 + erf(x / sqrt 2)) as exporters spell it (torch.onnx for nn.GELU before opset
// 20, HuggingFace's gelu) becomes one Gelu node, which the planner fuses into the preceding
// MatMul/Gemm as its activation: one pass over the tensor instead of five launches.
void fuse_gelu(graph& g) {
    std::vector<char> dead(g.nodes.size(), 0);
    std::vector<int> uses(g.values.size(), 0);
    for (const node& n : g.nodes)
        for (int v : n.inputs)
            if (v >= 0) ++uses[size_t(v)];
    for (int v : g.outputs) ++uses[size_t(v)];  // a graph output is never an intermediate
    const auto scalar = [&](int v, double want) {
        if (v < 0) return false;
        const value& c = g.values[size_t(v)];
        if (!c.is_constant() || c.type != dtype::f32 || element_count(c.shape) != 1) return false;
        const double got = c.constant().as_f64(0);
        return std::fabs(got - want) <= 1e-5 * std::fabs(want);
    };
    const auto producer = [&](int v) -> node* {
        const int p = v >= 0 ? g.values[size_t(v)].producer : -1;
        return p >= 0 && !dead[size_t(p)] ? &g.nodes[size_t(p)] : nullptr;
    };
    // The only node that reads v, if v has exactly one reader.
    const auto sole_reader = [&](int v) -> int {
        if (v < 0 || uses[size_t(v)] != 1) return -1;
        for (size_t i = 0; i < g.nodes.size(); ++i)
            if (!dead[i] && std::find(g.nodes[i].inputs.begin(), g.nodes[i].inputs.end(), v) != g.nodes[i].inputs.end())
                return int(i);
        return -1;
    };
    // The other operand of a binary node, given one.
    const auto other = [](const node& n, int v) { return n.input(0) == v ? n.input(1) : n.input(0); };
    bool any = false;
    for (size_t ei = 0; ei < g.nodes.size(); ++ei) {
        const node& e = g.nodes[ei];
        if (dead[ei] || e.op != op_type::Erf || uses[size_t(e.input(0))] != 1) continue;
        node* d = producer(e.input(0));
        if (!d) continue;
        int x = -1;
        if (d->op == op_type::Div && scalar(d->input(1), std::sqrt(2.0))) x = d->input(0);
        if (d->op == op_type::Mul && scalar(d->input(1), std::sqrt(0.5))) x = d->input(0);
        if (d->op == op_type::Mul && scalar(d->input(0), std::sqrt(0.5))) x = d->input(1);
        // Generic graphs carry no inferred types yet; a typed one must be f32.
        if (x < 0 || (g.values[size_t(x)].type != dtype::f32 && g.values[size_t(x)].type != dtype::undefined)) continue;
        const int ai = sole_reader(e.outputs[0]);
        if (ai < 0 || g.nodes[size_t(ai)].op != op_type::Add || !scalar(other(g.nodes[size_t(ai)], e.outputs[0]), 1.0)) continue;
        const int a_out = g.nodes[size_t(ai)].outputs[0];
        const int m1 = sole_reader(a_out);
        if (m1 < 0 || g.nodes[size_t(m1)].op != op_type::Mul) continue;
        const int m1_other = other(g.nodes[size_t(m1)], a_out);
        std::vector<int> chain{int(d - g.nodes.data()), int(ei), ai, m1};
        int last = -1;
        if (m1_other == x) {
            // Mul(x, 1 + erf) then Mul(., 0.5)
            const int m2 = sole_reader(g.nodes[size_t(m1)].outputs[0]);
            if (m2 >= 0 && g.nodes[size_t(m2)].op == op_type::Mul &&
                scalar(other(g.nodes[size_t(m2)], g.nodes[size_t(m1)].outputs[0]), 0.5))
                last = m2;
        } else if (scalar(m1_other, 0.5)) {
            // Mul(1 + erf, 0.5) then Mul(x, .)
            const int m2 = sole_reader(g.nodes[size_t(m1)].outputs[0]);
            if (m2 >= 0 && g.nodes[size_t(m2)].op == op_type::Mul && other(g.nodes[size_t(m2)], g.nodes[size_t(m1)].outputs[0]) == x)
                last = m2;
        } else if (node* h = producer(m1_other); h && h->op == op_type::Mul && uses[size_t(m1_other)] == 1 &&
                                                  ((h->input(0) == x && scalar(h->input(1), 0.5)) ||
                                                   (h->input(1) == x && scalar(h->input(0), 0.5)))) {
            // Mul(x, 0.5) times (1 + erf)
            chain.push_back(int(h - g.nodes.data()));
            last = m1;
        }
        if (last < 0) continue;
        for (int n : chain)
            if (n != last) dead[size_t(n)] = 1;
        node& gelu = g.nodes[size_t(last)];
        gelu.op = op_type::Gelu;
        gelu.inputs = {x};
        gelu.attrs.clear();
        gelu.set("approximate", std::string("none"));
        any = true;
    }
    if (any) remove_nodes(g, dead);
}

void eliminate_dead_code(graph& g) {
    std::vector<char> live(g.values.size(), 0);
    for (int v : g.outputs) live[size_t(v)] = 1;
    std::vector<char> keep(g.nodes.size(), 0);
    for (size_t i = g.nodes.size(); i-- > 0;) {
        const node& n = g.nodes[i];
        for (int v : n.outputs)
            if (v >= 0 && live[size_t(v)]) keep[i] = 1;
        if (!keep[i]) continue;
        for (int v : n.inputs)
            if (v >= 0) live[size_t(v)] = 1;
    }
    std::vector<node> kept;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (keep[i]) kept.push_back(std::move(g.nodes[i]));
    g.nodes = std::move(kept);
    // Unused optional outputs are dropped; multi-output ops (Split) keep every output.
    for (node& n : g.nodes) {
        bool optional_outs = n.op == op_type::LayerNormalization || n.op == op_type::Dropout ||
                             n.op == op_type::MaxPool || n.op == op_type::BatchNormalization;
        for (size_t k = 1; k < n.outputs.size(); ++k)
            if (optional_outs && n.outputs[k] >= 0 && !live[size_t(n.outputs[k])]) n.outputs[k] = -1;
        while (n.outputs.size() > 1 && n.outputs.back() < 0) n.outputs.pop_back();
    }
    // Renumber the values that are still referenced.
    std::vector<int> remap(g.values.size(), -1);
    std::vector<value> vals;
    auto keep_value = [&](int v) {
        if (v < 0 || remap[size_t(v)] >= 0) return;
        remap[size_t(v)] = int(vals.size());
        vals.push_back(std::move(g.values[size_t(v)]));
    };
    for (int v : g.inputs) keep_value(v);
    for (const node& n : g.nodes) {
        for (int v : n.inputs) keep_value(v);
        for (int v : n.outputs) keep_value(v);
    }
    for (int v : g.outputs) keep_value(v);
    auto map = [&](int& v) {
        if (v >= 0) v = remap[size_t(v)];
    };
    for (int& v : g.inputs) map(v);
    for (int& v : g.outputs) map(v);
    for (node& n : g.nodes) {
        for (int& v : n.inputs) map(v);
        for (int& v : n.outputs) map(v);
    }
    g.values = std::move(vals);
    for (value& v : g.values) v.producer = -1;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        for (int v : g.nodes[i].outputs)
            if (v >= 0) g.values[size_t(v)].producer = int(i);
}

}  // namespace reefline::ml::detail
