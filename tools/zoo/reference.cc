#include "tools/zoo/reference.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <thread>

namespace reefline::zoo::ref {
namespace {

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t pb, int64_t pe) {
    return (in + pb + pe - k) / s + 1;
}

// Output positions o with 0 <= o * s - pad + tap < in: [lo, hi).
void valid_range(int64_t in, int64_t out, int64_t s, int64_t pad, int64_t tap, int64_t& lo,
                 int64_t& hi) {
    // o * s >= pad - tap  and  o * s <= in - 1 + pad - tap
    const int64_t a = pad - tap, b = in - 1 + pad - tap;
    lo = a <= 0 ? 0 : (a + s - 1) / s;
    hi = b < 0 ? 0 : std::min(out, b / s + 1);
    if (hi < lo) hi = lo;
}

// Runs f(0 .. n-1) on up to hardware_concurrency threads, in contiguous chunks.
void parallel_for(int64_t n, const std::function<void(int64_t)>& f) {
    const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
    if (threads <= 1 || n < 8) {
        for (int64_t i = 0; i < n; ++i) f(i);
        return;
    }
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            for (int64_t i = n * t / threads; i < n * (t + 1) / threads; ++i) f(i);
        });
    for (auto& th : pool) th.join();
}

}  // namespace

tensor conv2d(const tensor& x, const float* w, const float* bias, int64_t cout, int64_t groups,
              const window2d& k) {
    const int64_t n = x.dim(0), cin = x.dim(1), H = x.dim(2), W = x.dim(3);
    const int64_t OH = out_size(H, k.kh, k.sh, k.pt, k.pb),
                  OW = out_size(W, k.kw, k.sw, k.pl, k.pr);
    const int64_t cig = cin / groups, cog = cout / groups;
    tensor y{{n, cout, OH, OW}, std::vector<float>(static_cast<size_t>(n * cout * OH * OW))};
    // Output planes split over threads (each writes only its own planes).
    parallel_for(n * cout, [&](int64_t plane) {
        {
            const int64_t b = plane / cout, oc = plane % cout;
            float* yp = &y.data[static_cast<size_t>(((b * cout) + oc) * OH * OW)];
            std::fill(yp, yp + OH * OW, bias ? bias[oc] : 0.0f);
            const int64_t g = oc / cog;
            for (int64_t icg = 0; icg < cig; ++icg) {
                const int64_t ic = g * cig + icg;
                const float* xp = &x.data[static_cast<size_t>(((b * cin) + ic) * H * W)];
                const float* wp = &w[static_cast<size_t>(((oc * cig) + icg) * k.kh * k.kw)];
                for (int64_t th = 0; th < k.kh; ++th) {
                    int64_t oh0, oh1;
                    valid_range(H, OH, k.sh, k.pt, th, oh0, oh1);
                    for (int64_t tw = 0; tw < k.kw; ++tw) {
                        const float wv = wp[th * k.kw + tw];
                        int64_t ow0, ow1;
                        valid_range(W, OW, k.sw, k.pl, tw, ow0, ow1);
                        for (int64_t oh = oh0; oh < oh1; ++oh) {
                            const float* xr = xp + (oh * k.sh - k.pt + th) * W - k.pl + tw;
                            float* yr = yp + oh * OW;
                            if (k.sw == 1) {
                                for (int64_t ow = ow0; ow < ow1; ++ow) yr[ow] += wv * xr[ow];
                            } else {
                                for (int64_t ow = ow0; ow < ow1; ++ow) yr[ow] += wv * xr[ow * k.sw];
                            }
                        }
                    }
                }
            }
        }
    });
    return y;
}

tensor batchnorm(const tensor& x, const float* gamma, const float* beta, const float* mean,
                 const float* var, float eps) {
    tensor y = x;
    const int64_t n = x.dim(0), c = x.dim(1);
    const int64_t plane = static_cast<int64_t>(x.data.size()) / (n * c);
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch) {
            const float s = gamma[ch] / std::sqrt(var[ch] + eps), t = beta[ch] - mean[ch] * s;
            float* p = &y.data[static_cast<size_t>((b * c + ch) * plane)];
            for (int64_t i = 0; i < plane; ++i) p[i] = p[i] * s + t;
        }
    return y;
}

tensor relu(const tensor& x) { return clip(x, 0.0f, std::numeric_limits<float>::infinity()); }

tensor clip(const tensor& x, float lo, float hi) {
    tensor y = x;
    for (float& v : y.data) v = std::min(std::max(v, lo), hi);
    return y;
}

static tensor pool(const tensor& x, const window2d& k, bool is_max, bool count_include_pad) {
    const int64_t n = x.dim(0), c = x.dim(1), H = x.dim(2), W = x.dim(3);
    const int64_t OH = out_size(H, k.kh, k.sh, k.pt, k.pb),
                  OW = out_size(W, k.kw, k.sw, k.pl, k.pr);
    tensor y{{n, c, OH, OW}, std::vector<float>(static_cast<size_t>(n * c * OH * OW))};
    for (int64_t p = 0; p < n * c; ++p) {
        const float* xp = &x.data[static_cast<size_t>(p * H * W)];
        float* yp = &y.data[static_cast<size_t>(p * OH * OW)];
        for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow) {
                const int64_t h0 = oh * k.sh - k.pt, w0 = ow * k.sw - k.pl;
                float acc = is_max ? -std::numeric_limits<float>::infinity() : 0.0f;
                int64_t count = 0;
                for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h0 + k.kh, H); ++h)
                    for (int64_t w = std::max<int64_t>(w0, 0); w < std::min(w0 + k.kw, W); ++w) {
                        const float v = xp[h * W + w];
                        acc = is_max ? std::max(acc, v) : acc + v;
                        ++count;
                    }
                if (!is_max) {
                    // Window clipped to the padded input (ceil_mode 0: never past the padding).
                    const int64_t ph = std::min(h0 + k.kh, H + k.pb) - std::max(h0, -k.pt);
                    const int64_t pw = std::min(w0 + k.kw, W + k.pr) - std::max(w0, -k.pl);
                    acc /= static_cast<float>(count_include_pad ? ph * pw : count);
                }
                yp[oh * OW + ow] = acc;
            }
    }
    return y;
}

tensor maxpool(const tensor& x, const window2d& k) { return pool(x, k, true, false); }
tensor avgpool(const tensor& x, const window2d& k, bool count_include_pad) {
    return pool(x, k, false, count_include_pad);
}

tensor global_avgpool(const tensor& x) {
    const int64_t n = x.dim(0), c = x.dim(1), plane = x.dim(2) * x.dim(3);
    tensor y{{n, c, 1, 1}, std::vector<float>(static_cast<size_t>(n * c))};
    for (int64_t p = 0; p < n * c; ++p) {
        double s = 0;
        for (int64_t i = 0; i < plane; ++i) s += x.data[static_cast<size_t>(p * plane + i)];
        y.data[static_cast<size_t>(p)] = static_cast<float>(s / static_cast<double>(plane));
    }
    return y;
}

tensor lrn(const tensor& x, int64_t size, float alpha, float beta, float bias) {
    const int64_t n = x.dim(0), c = x.dim(1);
    const int64_t plane = static_cast<int64_t>(x.data.size()) / (n * c);
    tensor y = x;
    const int64_t before = (size - 1) / 2, after = size / 2;  // floor / ceil of (size - 1) / 2
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t i = 0; i < plane; ++i) {
                double sq = 0;
                for (int64_t j = std::max<int64_t>(0, ch - before);
                     j <= std::min(c - 1, ch + after); ++j) {
                    const float v = x.data[static_cast<size_t>((b * c + j) * plane + i)];
                    sq += static_cast<double>(v) * v;
                }
                const size_t at = static_cast<size_t>((b * c + ch) * plane + i);
                y.data[at] =
                    static_cast<float>(x.data[at] / std::pow(bias + alpha / size * sq, beta));
            }
    return y;
}

tensor flatten(const tensor& x) {
    tensor y = x;
    y.shape = {x.dim(0), static_cast<int64_t>(x.data.size()) / x.dim(0)};
    return y;
}

tensor gemm(const tensor& x, const float* w, const float* bias, int64_t out) {
    const int64_t n = x.dim(0), in = x.dim(1);
    tensor y{{n, out}, std::vector<float>(static_cast<size_t>(n * out))};
    for (int64_t b = 0; b < n; ++b)
        for (int64_t o = 0; o < out; ++o) {
            const float* xr = &x.data[static_cast<size_t>(b * in)];
            const float* wr = &w[static_cast<size_t>(o * in)];
            float acc = 0;
            for (int64_t i = 0; i < in; ++i) acc += xr[i] * wr[i];
            y.data[static_cast<size_t>(b * out + o)] = acc + (bias ? bias[o] : 0.0f);
        }
    return y;
}

tensor concat(const std::vector<const tensor*>& xs, int64_t axis) {
    tensor y{xs[0]->shape, {}};
    y.shape[axis] = 0;
    for (const tensor* x : xs) y.shape[axis] += x->shape[axis];
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= y.shape[d];
    for (size_t d = axis + 1; d < y.shape.size(); ++d) inner *= y.shape[d];
    y.data.reserve(static_cast<size_t>(outer * y.shape[axis] * inner));
    for (int64_t o = 0; o < outer; ++o)
        for (const tensor* x : xs) {
            const size_t len = static_cast<size_t>(x->shape[axis] * inner);
            const float* p = &x->data[o * len];
            y.data.insert(y.data.end(), p, p + len);
        }
    return y;
}

tensor add(const tensor& a, const tensor& b) {
    if (a.shape != b.shape) throw std::logic_error("ref::add: shapes differ");
    tensor y = a;
    for (size_t i = 0; i < y.data.size(); ++i) y.data[i] += b.data[i];
    return y;
}

void channel_stats(const tensor& x, std::vector<double>& mean, std::vector<double>& var) {
    const int64_t n = x.dim(0), c = x.dim(1);
    const int64_t plane = static_cast<int64_t>(x.data.size()) / (n * c);
    mean.assign(static_cast<size_t>(c), 0.0);
    var.assign(static_cast<size_t>(c), 0.0);
    for (int64_t ch = 0; ch < c; ++ch) {
        double s = 0, s2 = 0;
        for (int64_t b = 0; b < n; ++b) {
            const float* p = &x.data[static_cast<size_t>((b * c + ch) * plane)];
            for (int64_t i = 0; i < plane; ++i) {
                s += p[i];
                s2 += static_cast<double>(p[i]) * p[i];
            }
        }
        const double cnt = static_cast<double>(n * plane);
        mean[ch] = s / cnt;
        var[ch] = std::max(0.0, s2 / cnt - mean[ch] * mean[ch]);
    }
}

double rms(const tensor& x) {
    double s2 = 0;
    for (float v : x.data) s2 += static_cast<double>(v) * v;
    return x.data.empty() ? 0.0 : std::sqrt(s2 / static_cast<double>(x.data.size()));
}

}  // namespace reefline::zoo::ref
