// CPU implementation of the gather block: u8 HWC bytes straight from packet payloads (the
// data plane's gather list) into the normalised f32 NCHW batch tensor, in one pass.
#include <algorithm>

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

}  // namespace

const gpu::kernel_info gather_kernel = {"gather", gather_block_cpu, nullptr, 256, 32, 0, 0};

}  // namespace reefline::ml::kernels
