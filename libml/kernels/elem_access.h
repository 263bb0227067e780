// Typed element access of the general (non-f32) element-wise paths, shared by the cpu kernels
// (cpu_elementwise.cc) and the GPU kernels (gpu/common.cuh): one definition of f16 rounding and
// of the load/store conversions, so both backends give the same bits. Plain RL_HD inline code;
// bits are reinterpreted with memcpy on the host and __uint_as_float / __float_as_uint in device
// code (hipcc refuses memcpy there).
#pragma once

#include <stdint.h>
#include <string.h>

#include "libml/kernels/decomp.h"

namespace reefline::ml::kernels {

RL_HD inline float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __uint_as_float(bits);
#else
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

RL_HD inline uint32_t bits_of_float(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __float_as_uint(f);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
#endif
}

RL_HD inline float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            uint32_t m = man;
            do { m <<= 1; ++e; } while (!(m & 0x400));
            bits = sign | uint32_t(127 - 15 - e) << 23 | (m & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    return float_from_bits(bits);
}

RL_HD inline uint16_t float_to_half(float f) {
    const uint32_t x = bits_of_float(f);
    const uint32_t sign = (x >> 16) & 0x8000;
    const int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return uint16_t(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return uint16_t(sign);
        man |= 0x800000;
        const int shift = 14 - exp;
        uint32_t h = man >> shift;
        const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) ++h;
        return uint16_t(sign | h);
    }
    uint32_t h = sign | uint32_t(exp) << 10 | man >> 13;
    const uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // round to nearest even
    return uint16_t(h);
}

RL_HD inline bool is_integral(elem t) {
    return t == elem::i64 || t == elem::i32 || t == elem::i8 || t == elem::u8 || t == elem::boolean;
}

RL_HD inline double load_f(const void* p, elem t, int64_t i) {
    switch (t) {
    case elem::f32: return static_cast<const float*>(p)[i];
    case elem::f64: return static_cast<const double*>(p)[i];
    case elem::f16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case elem::i64: return double(static_cast<const int64_t*>(p)[i]);
    case elem::i32: return static_cast<const int32_t*>(p)[i];
    case elem::i8: return static_cast<const int8_t*>(p)[i];
    case elem::u8: case elem::boolean: return static_cast<const uint8_t*>(p)[i];
    }
    return 0;
}

RL_HD inline int64_t load_i(const void* p, elem t, int64_t i) {
    switch (t) {
    case elem::i64: return static_cast<const int64_t*>(p)[i];
    case elem::i32: return static_cast<const int32_t*>(p)[i];
    case elem::i8: return static_cast<const int8_t*>(p)[i];
    case elem::u8: case elem::boolean: return static_cast<const uint8_t*>(p)[i];
    default: return int64_t(load_f(p, t, i));
    }
}

RL_HD inline void store_f(void* p, elem t, int64_t i, double v) {
    switch (t) {
    case elem::f32: static_cast<float*>(p)[i] = float(v); break;
    case elem::f64: static_cast<double*>(p)[i] = v; break;
    case elem::f16: static_cast<uint16_t*>(p)[i] = float_to_half(float(v)); break;
    case elem::i64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
    case elem::i32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case elem::i8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
    case elem::u8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case elem::boolean: static_cast<uint8_t*>(p)[i] = v != 0; break;
    }
}

RL_HD inline void store_i(void* p, elem t, int64_t i, int64_t v) {
    switch (t) {
    case elem::i64: static_cast<int64_t*>(p)[i] = v; break;
    case elem::i32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case elem::i8: static_cast<int8_t*>(p)[i] = int8_t(v); break;  // wraps, as ONNX Runtime
    case elem::u8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case elem::boolean: static_cast<uint8_t*>(p)[i] = v != 0; break;
    default: store_f(p, t, i, double(v));
    }
}

}  // namespace reefline::ml::kernels
