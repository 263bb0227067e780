// Synthetic inputs for a model's instance, in the right dtypes, for benchmarks, tools and tests
// that run a model without real data: f32 tensors N(0, 1); integer token inputs as a sequence
// model expects them (an attention mask of ones, token types 0, ids below 1000, which every
// vocabulary of the zoo and of real tokenizers holds).
#pragma once

#include <random>
#include <string>
#include <vector>

#include "libml/libml.h"

namespace reefline::ml {

inline std::vector<tensor> synthetic_inputs(const std::vector<tensor_desc>& descs, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n;
    std::vector<tensor> out;
    for (const auto& d : descs) {
        const int64_t count = element_count(d.shape);
        if (d.type == dtype::f32) {
            bytes_t b(size_t(count) * 4);
            auto* f = reinterpret_cast<float*>(b.data());
            for (int64_t i = 0; i < count; ++i) f[i] = n(rng);
            out.push_back(tensor::make(d.type, d.shape, std::move(b)));
        } else {
            std::vector<int64_t> v(static_cast<size_t>(count));
            const bool mask = d.name.find("mask") != std::string::npos, types = d.name.find("type") != std::string::npos;
            for (auto& x : v) x = mask ? 1 : types ? 0 : int64_t(rng() % 1000);
            out.push_back(tensor::from_i64(v, d.shape, d.type));
        }
    }
    return out;
}

}  // namespace reefline::ml
