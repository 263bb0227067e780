// CPU implementations of the gather blocks: request payloads straight from the packets (the
// data plane's gather list) into a model's input tensors, in one pass. Images: u8 HWC ->
// normalised f32 NCHW; token sequences: ids, attention mask and token types of one length
// bucket; tensors: f32 as they are.
#include <algorithm>
#include <cstring>

#include "libml/kernels/kernels.h"

namespace reefline::ml::kernels {

namespace {

bool gather_block_cpu(const void* p, const gpu::block_context& ctx) {
    const auto& g = *static_cast<const gather_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t per_image = gather_blocks_per_image(g);
    const int64_t image = ctx.block / per_image;
    const int64_t bytes = g.h * g.w * g.c;
    int64_t q = (ctx.block % per_image) * g.bytes_per_block;
    const int64_t end = std::min(bytes, q + g.bytes_per_block);
    const gather_segment* seg = g.segments + g.first[image];
    const gather_segment* seg_end = g.segments + g.first[image + 1];
    // The segment holding byte q: segments are in offset order.
    seg = std::upper_bound(seg, seg_end, q,
                           [](int64_t v, const gather_segment& s) { return v < int64_t(s.offset); }) - 1;
    const int64_t plane = g.h * g.w;
    float* y = g.y + image * g.c * plane;
    int64_t pixel = q / g.c, ch = q % g.c;
    while (q < end) {
        const int64_t in_seg = std::min<int64_t>(end, int64_t(seg->offset) + seg->length) - q;
        const uint8_t* src = seg->data + (q - seg->offset);
        for (int64_t i = 0; i < in_seg; ++i) {
            y[ch * plane + pixel] = (float(src[i]) - g.mean[ch]) * g.inv_std[ch];
            if (++ch == g.c) { ch = 0; ++pixel; }
        }
        q += in_seg;
        ++seg;
    }
    return true;
}

bool token_gather_block_cpu(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const token_gather_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t per_request = token_blocks_per_request(a);
    const int64_t r = ctx.block / per_request;
    const int64_t p0 = (ctx.block % per_request) * a.tokens_per_block;
    const int64_t p1 = std::min(a.length, p0 + a.tokens_per_block);
    const gather_segment* seg = a.segments + a.first[r];
    const gather_segment* seg_end = a.segments + a.first[r + 1];
    const int64_t tokens = std::min(a.length, payload_bytes(a.segments, a.first, r) / 4);
    token_error err{-1, 0};
    if (p0 < tokens) seg = payload_segment(seg, seg_end, p0 * 4);
    for (int64_t i = p0; i < p1; ++i) {
        const int64_t at = r * a.length + i;
        int64_t id = 0;
        if (i < tokens) {
            while (seg + 1 < seg_end && i * 4 >= int64_t(seg->offset) + seg->length) ++seg;
            const int32_t t = int32_t(payload_le32(seg, seg_end, i * 4));
            if (t >= 0 && t < a.vocab) {
                id = t;
            } else if (err.position < 0) {
                err = {int32_t(i), t};
            }
        }
        store_int_as(a.ids, at, a.ids_type, id);
        if (a.mask) store_int_as(a.mask, at, a.mask_type, i < tokens ? 1 : 0);
        if (a.types) store_int_as(a.types, at, a.types_type, 0);
    }
    a.errors[ctx.block] = err;
    return true;
}

bool tensor_gather_block_cpu(const void* p, const gpu::block_context& ctx) {
    const auto& a = *static_cast<const tensor_gather_args*>(p);
    if (ctx.preempted()) return false;
    const int64_t per_request = tensor_blocks_per_request(a);
    const int64_t r = ctx.block / per_request;
    int64_t q = (ctx.block % per_request) * a.elements_per_block * 4;
    const int64_t end = std::min(a.elements * 4, q + a.elements_per_block * 4);
    const gather_segment* seg = a.segments + a.first[r];
    const gather_segment* seg_end = a.segments + a.first[r + 1];
    auto* y = reinterpret_cast<uint8_t*>(a.y + r * a.elements);
    // Little-endian f32 on a little-endian host: the bytes as they are, a run per segment.
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
    if (seg == seg_end) return true;
    seg = payload_segment(seg, seg_end, q);
    while (q < end && seg < seg_end) {
        const int64_t stop = std::min<int64_t>(end, int64_t(seg->offset) + seg->length);
        if (stop > q) std::memcpy(y + q, seg->data + (q - seg->offset), size_t(stop - q));
        q = std::max(q, stop);
        ++seg;
    }
    return true;
}

}  // namespace

const gpu::kernel_info gather_kernel = {"gather", gather_block_cpu, 256, 32, 0, 0};
const gpu::kernel_info token_gather_kernel = {"token_gather", token_gather_block_cpu, 256, 32, 0, 0};
const gpu::kernel_info tensor_gather_kernel = {"tensor_gather", tensor_gather_block_cpu, 256, 32, 0, 0};

}  // namespace reefline::ml::kernels
