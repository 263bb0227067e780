// The gather kernel on the GPU: packet payloads, read in place from host memory registered
// with the GPU (the data plane's hugepage mbufs), into the normalised f32 NCHW batch tensor.
// u8 HWC -> f32 NCHW and (x - mean) * inv_std are fused; no CPU copy, no per-packet memcpy.
//
// Block b converts HWC bytes [q0, q0 + bytes_per_block) of one image (decomp.h), which span
// several segments (one per packet). Every read of a payload or of the gather list crosses
// PCIe, so the kernel keeps many independent reads in flight instead of walking a list:
// 1. the block's threads read the image's segment descriptors side by side and mark the
//    ones that overlap its byte range (one round trip for up to 256 segments);
// 2. each 32-lane group takes whole segments; its lanes read the payload as aligned 32-bit
//    words (a group's read is one 128-byte request) and convert each byte of the range.
//    A word may hold up to 3 bytes outside the segment; they are in the same page as a byte
//    of it, so in registered memory, and are read but not used.
#include "libml/kernels/gpu/common.cuh"

namespace reefline::ml::kernels::gpu_impl {

namespace {

// Shared memory: gather_shared_bytes.
__device__ bool gather_block_gpu(const gather_args& g, int64_t block, unsigned char* smem) {
    uint32_t& s_seg0 = reinterpret_cast<uint32_t*>(smem)[0];
    uint32_t& s_seg1 = reinterpret_cast<uint32_t*>(smem)[1];
    uint32_t& s_lo = reinterpret_cast<uint32_t*>(smem)[2];
    uint32_t& s_hi = reinterpret_cast<uint32_t*>(smem)[3];
    const int64_t per_image = gather_blocks_per_image(g);
    const int64_t image = block / per_image;
    const int64_t bytes = g.h * g.w * g.c;
    const int64_t q0 = (block % per_image) * g.bytes_per_block;
    const int64_t q1 = q0 + g.bytes_per_block < bytes ? q0 + g.bytes_per_block : bytes;
    if (threadIdx.x == 0) {
        s_seg0 = g.first[image];
        s_seg1 = g.first[image + 1];
        s_lo = 0xffffffffu;
        s_hi = 0;
    }
    __syncthreads();
    const uint32_t seg0 = s_seg0, seg1 = s_seg1;
    for (uint32_t i = seg0 + threadIdx.x; i < seg1; i += kThreads) {
        const int64_t off = g.segments[i].offset, len = g.segments[i].length;
        if (len > 0 && off < q1 && off + len > q0) {
            atomicMin(&s_lo, i);
            atomicMax(&s_hi, i);
        }
    }
    __syncthreads();
    const uint32_t lo = s_lo, hi = s_hi;
    if (lo > hi) return true;  // no payload in this range (an incomplete list converts nothing)

    const uint32_t c = uint32_t(g.c);
    const int64_t plane = g.h * g.w;
    float* y = g.y + image * g.c * plane;
    float mean[4], inv_std[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        mean[k] = g.mean[k];
        inv_std[k] = g.inv_std[k];
    }
    const unsigned group = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
    for (uint32_t s = lo + group; s <= hi; s += kGroups) {
        const gather_segment seg = g.segments[s];
        const int64_t a = q0 > int64_t(seg.offset) ? q0 : int64_t(seg.offset);
        const int64_t e = q1 < int64_t(seg.offset) + seg.length ? q1 : int64_t(seg.offset) + seg.length;
        if (a >= e) continue;
        const uintptr_t src = reinterpret_cast<uintptr_t>(seg.data) + uintptr_t(a - seg.offset);
        const uintptr_t src_end = src + uintptr_t(e - a);
        const uintptr_t w0 = src & ~uintptr_t(3);
        const uint32_t words = uint32_t((src_end - w0 + 3) / 4);
#pragma unroll 4
        for (uint32_t w = lane; w < words; w += kLanes) {
            const uintptr_t at = w0 + uintptr_t(w) * 4;
            const uint32_t word = *reinterpret_cast<const uint32_t*>(at);
#pragma unroll
            for (uint32_t j = 0; j < 4; ++j) {
                const uintptr_t p = at + j;
                if (p < src || p >= src_end) continue;
                const uint32_t q = uint32_t(a + int64_t(p - src));  // byte index in the image (HWC)
                const uint32_t pixel = q / c, ch = q - pixel * c;
                y[int64_t(ch) * plane + pixel] = (float((word >> (8 * j)) & 0xffu) - mean[ch]) * inv_std[ch];
            }
        }
    }
    return true;
}

__global__ void __launch_bounds__(kThreads) gather_kernel(gather_args g, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    RL_DYNAMIC_SHARED(smem);
    if (ok) ok = gather_block_gpu(g, int64_t(blockIdx.x) + ctx.offset, smem);
    block_end(ctx, ok);
}

}  // namespace

int launch_gather(const gpu_launch_params& p) { return launch_kernel<gather_args>(p, gather_kernel, gather_shared_bytes); }
RL_KERNEL_RESOURCES(gather, gather_kernel, gather_shared_bytes)

}  // namespace reefline::ml::kernels::gpu_impl

// ---- token sequences and f32 tensors --------------------------------------------------------
// Requests of a few hundred tokens or a sensor window: small next to images, so a thread per
// element finds its segment by binary search over the request's gather list and reads its 4
// bytes (which may straddle two packets).
namespace reefline::ml::kernels::gpu_impl {

namespace {

// Shared memory: gather_shared_bytes.
__device__ bool token_gather_block_gpu(const token_gather_args& a, int64_t block, unsigned char* smem) {
    uint32_t& s_pos = *reinterpret_cast<uint32_t*>(smem);
    const int64_t per_request = token_blocks_per_request(a);
    const int64_t r = block / per_request;
    const int64_t p0 = (block % per_request) * a.tokens_per_block;
    const int64_t p1 = p0 + a.tokens_per_block < a.length ? p0 + a.tokens_per_block : a.length;
    const gather_segment* seg0 = a.segments + a.first[r];
    const gather_segment* seg_end = a.segments + a.first[r + 1];
    const int64_t bytes = payload_bytes(a.segments, a.first, r) / 4;
    const int64_t tokens = bytes < a.length ? bytes : a.length;
    if (threadIdx.x == 0) s_pos = 0xffffffffu;
    __syncthreads();
    for (int64_t i = p0 + threadIdx.x; i < p1; i += kThreads) {
        const int64_t at = r * a.length + i;
        int64_t id = 0;
        if (i < tokens) {
            const int32_t t = int32_t(payload_le32(payload_segment(seg0, seg_end, i * 4), seg_end, i * 4));
            if (t >= 0 && t < a.vocab) id = t;
            else atomicMin(&s_pos, uint32_t(i));
        }
        store_int_as(a.ids, at, a.ids_type, id);
        if (a.mask) store_int_as(a.mask, at, a.mask_type, i < tokens ? 1 : 0);
        if (a.types) store_int_as(a.types, at, a.types_type, 0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        token_error e{-1, 0};
        if (s_pos != 0xffffffffu) {
            const int64_t q = int64_t(s_pos) * 4;
            e.position = int32_t(s_pos);
            e.token = int32_t(payload_le32(payload_segment(seg0, seg_end, q), seg_end, q));
        }
        a.errors[block] = e;
    }
    return true;
}

__device__ bool tensor_gather_block_gpu(const tensor_gather_args& a, int64_t block) {
    const int64_t per_request = tensor_blocks_per_request(a);
    const int64_t r = block / per_request;
    const int64_t e0 = (block % per_request) * a.elements_per_block;
    const int64_t e1 = e0 + a.elements_per_block < a.elements ? e0 + a.elements_per_block : a.elements;
    const gather_segment* seg0 = a.segments + a.first[r];
    const gather_segment* seg_end = a.segments + a.first[r + 1];
    if (seg0 == seg_end) return true;
    auto* y = reinterpret_cast<uint32_t*>(a.y + r * a.elements);
    for (int64_t i = e0 + threadIdx.x; i < e1; i += kThreads)
        y[i] = payload_le32(payload_segment(seg0, seg_end, i * 4), seg_end, i * 4);
    return true;
}

__global__ void __launch_bounds__(kThreads) token_gather_kernel(token_gather_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    RL_DYNAMIC_SHARED(smem);
    if (ok) ok = token_gather_block_gpu(a, int64_t(blockIdx.x) + ctx.offset, smem);
    block_end(ctx, ok);
}

__global__ void __launch_bounds__(kThreads) tensor_gather_kernel(tensor_gather_args a, launch_ctx ctx) {
    bool ok = block_begin(ctx);
    if (ok) ok = tensor_gather_block_gpu(a, int64_t(blockIdx.x) + ctx.offset);
    block_end(ctx, ok);
}

}  // namespace

int launch_token_gather(const gpu_launch_params& p) {
    return launch_kernel<token_gather_args>(p, token_gather_kernel, gather_shared_bytes);
}
int launch_tensor_gather(const gpu_launch_params& p) { return launch_kernel<tensor_gather_args>(p, tensor_gather_kernel); }
RL_KERNEL_RESOURCES(token_gather, token_gather_kernel, gather_shared_bytes)
RL_KERNEL_RESOURCES(tensor_gather, tensor_gather_kernel, 0)

}  // namespace reefline::ml::kernels::gpu_impl
