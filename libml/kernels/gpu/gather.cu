// The gather kernel on the GPU: packet payloads, read in place from host memory registered
// with the GPU (the data plane's hugepage mbufs), into the normalised f32 NCHW batch tensor.
// u8 HWC -> f32 NCHW and (x - mean) * inv_std are fused; no CPU copy, no per-packet memcpy.
//
// Block b converts HWC bytes [q0, q0 + bytes_per_block) of one image (decomp.h), which span
// several segments (one per packet). Every read of a payload or of the gather list crosses
// PCIe, so a block makes two round trips before it stores:
// 1. its descriptor (gather_block_desc, which the host writes beside the gather list): one
//    group's one 128-byte read gives the segments cut to the block's range. A range of more
//    segments than a descriptor holds gives their indices, and the block reads them, up to
//    gather_chunk_segments at a time; without descriptors (args.blocks null) the block finds
//    them by scanning its image's list.
// 2. the payload, a tile of up to gather_tile_bytes at a time: the threads share out the
//    aligned 32-bit words that cover the tile's segments (a group's read is one 128-byte
//    request), issue every load before they use any, then put each word's bytes in their
//    place in a staging tile in shared memory. A word may hold up to 3 bytes outside its
//    segment; they are in the same page as a byte of it, so in registered memory, and are
//    read but not used.
// 3. the stores: per channel plane, the tile's pixels as a run of 16-byte stores (scalar at
//    the run's unaligned ends), converted from the staged bytes.
// The block reads only the gather list and the payload and writes only its part of y, so it
// is idempotent. The payload must tile the image (the data plane checks that it does); a
// block with no payload in its range writes nothing.
//
// The first version (scan of the image's list, half the groups idle, a scalar store per byte
// while loads were outstanding) stays for gather_bench's comparison (bench_version_1).
#include "libml/kernels/gpu/common.cuh"

namespace reefline::ml::kernels::gpu_impl {

namespace {

// One segment's part of the tile being staged, as the threads read it.
struct gather_run {
    const uint8_t* src;   // the part's first byte
    uint32_t word_begin;  // its first aligned word's index among the tile's words
    uint16_t stage_at;    // where its first byte goes in the stage
    uint16_t bytes;
};

// Shared memory of a block: gather_shared_bytes. head and slices have a descriptor's layout,
// so the descriptor is copied in as it is.
struct gather_shared {
    uint32_t head[4];  // the descriptor's count, segment_begin, segment_end; [3]: the tile's words
    gather_segment slices[gather_chunk_segments];
    gather_run runs[gather_chunk_segments];
    unsigned char stage[gather_tile_bytes];  // the tile's HWC bytes
};
static_assert(sizeof(gather_run) == 16 && sizeof(gather_shared) == gather_shared_bytes, "the gather's shared memory");
static_assert(offsetof(gather_shared, slices) == offsetof(gather_block_desc, slices) &&
                  gather_block_slices <= gather_chunk_segments,
              "a descriptor is copied into shared memory as it is");

// Words a thread loads before it uses them: a tile's runs span at most its bytes / 4 words
// plus 2 per run, so one round covers a tile.
constexpr uint32_t kGatherWords = (gather_tile_bytes / 4 + 2 * gather_chunk_segments + kThreads - 1) / kThreads;

// Segment s's bytes in the tile [a, e): the first's address, how many, where in the stage.
struct tile_part {
    uintptr_t src;
    uint32_t bytes, stage_at;
};
__device__ __forceinline__ tile_part part_of(const gather_segment& s, int64_t a, int64_t e) {
    const int64_t off = int64_t(s.offset), stop = off + int64_t(s.length);
    const int64_t lo = off > a ? off : a, hi = stop < e ? stop : e;
    tile_part p{reinterpret_cast<uintptr_t>(s.data) + uintptr_t(lo - off), 0, 0};
    if (hi > lo) {
        p.bytes = uint32_t(hi - lo);
        p.stage_at = uint32_t(lo - a);
    }
    return p;
}
// The aligned words that hold a part's bytes.
__device__ __forceinline__ uint32_t part_words(const tile_part& p) {
    return p.bytes ? uint32_t(((p.src + p.bytes + 3) >> 2) - (p.src >> 2)) : 0u;
}

// Stages the bytes that slices [0, n) hold of the tile [a, e), by every thread.
__device__ void stage_tile(gather_shared& sh, uint32_t n, int64_t a, int64_t e) {
    __syncthreads();  // the slices are in place; the last tile's stage and runs are used up
    if (threadIdx.x < n) {
        // Where the run's words start: the words of the runs before it, added up by each thread
        // (a few runs: cheaper than a scan's barriers).
        uint32_t begin = 0;
        for (uint32_t j = 0; j < threadIdx.x; ++j) begin += part_words(part_of(sh.slices[j], a, e));
        const tile_part p = part_of(sh.slices[threadIdx.x], a, e);
        sh.runs[threadIdx.x] = gather_run{reinterpret_cast<const uint8_t*>(p.src), begin, uint16_t(p.stage_at),
                                          uint16_t(p.bytes)};
        if (threadIdx.x == n - 1) sh.head[3] = begin + part_words(p);
    }
    __syncthreads();
    const uint32_t total = sh.head[3];
    for (uint32_t base = 0; base < total; base += kThreads * kGatherWords) {
        // Every load first, so that they are all in flight together.
        uint32_t word[kGatherWords], run[kGatherWords];
#pragma unroll
        for (uint32_t k = 0; k < kGatherWords; ++k) {
            const uint32_t w = base + k * kThreads + threadIdx.x;
            word[k] = 0;
            run[k] = n;
            if (w < total) {
                // The last run starting at or before word w (an empty run starts where the
                // next does, so this is never one).
                uint32_t lo = 0, hi = n - 1;
                while (lo < hi) {
                    const uint32_t mid = (lo + hi + 1) / 2;
                    if (sh.runs[mid].word_begin <= w) lo = mid;
                    else hi = mid - 1;
                }
                run[k] = lo;
                const uintptr_t at = (reinterpret_cast<uintptr_t>(sh.runs[lo].src) & ~uintptr_t(3)) +
                                     uintptr_t(w - sh.runs[lo].word_begin) * 4;
                word[k] = *reinterpret_cast<const uint32_t*>(at);
            }
        }
#pragma unroll
        for (uint32_t k = 0; k < kGatherWords; ++k) {
            if (run[k] >= n) continue;
            const gather_run r = sh.runs[run[k]];
            const uint32_t w = base + k * kThreads + threadIdx.x;
            // The run's index of the word's first byte (negative: before the run).
            const int32_t first = int32_t(w - r.word_begin) * 4 - int32_t(reinterpret_cast<uintptr_t>(r.src) & 3);
#pragma unroll
            for (int32_t j = 0; j < 4; ++j) {
                const int32_t i = first + j;
                if (i >= 0 && i < int32_t(r.bytes))
                    sh.stage[uint32_t(r.stage_at) + uint32_t(i)] = uint8_t(word[k] >> (8 * j));
            }
        }
    }
}

// Channel ch's entry of a per-channel array in the kernel's arguments, without indexing it
// (an indexed argument array goes through local memory).
__device__ __forceinline__ float of_channel(const float (&v)[4], int64_t ch) {
    return ch == 0 ? v[0] : ch == 1 ? v[1] : ch == 2 ? v[2] : v[3];
}

// Stores the staged tile [a, e) of an image into its planes y (normalised), by every thread.
__device__ void store_tile(const gather_args& g, float* __restrict__ y, const unsigned char* __restrict__ stage,
                           int64_t a, int64_t e) {
    const int64_t c = g.c, plane = g.h * g.w;
    for (int64_t ch = 0; ch < c; ++ch) {
        // The pixels whose byte of channel ch is in the tile.
        const int64_t p0 = (a + c - 1 - ch) / c, p1 = (e + c - 1 - ch) / c;
        if (p1 <= p0) continue;
        const float mean = of_channel(g.mean, ch), inv_std = of_channel(g.inv_std, ch);
        float* __restrict__ out = y + ch * plane + p0;
        const unsigned char* __restrict__ in = stage + (p0 * c + ch - a);
        const uint32_t n = uint32_t(p1 - p0), step = uint32_t(c);
        // Scalar stores up to the first 16-byte boundary and after the last.
        const uint32_t to_aligned = uint32_t(0u - uint32_t(reinterpret_cast<uintptr_t>(out) >> 2)) & 3u;
        const uint32_t head = to_aligned < n ? to_aligned : n;
        const uint32_t quads = (n - head) / 4, tail = head + 4 * quads;
        float_x4* __restrict__ out4 = reinterpret_cast<float_x4*>(out + head);
        for (uint32_t i = threadIdx.x; i < quads; i += kThreads) {
            const uint32_t p = head + 4 * i;
            float_x4 v;
            v.x = (float(in[p * step]) - mean) * inv_std;
            v.y = (float(in[(p + 1) * step]) - mean) * inv_std;
            v.z = (float(in[(p + 2) * step]) - mean) * inv_std;
            v.w = (float(in[(p + 3) * step]) - mean) * inv_std;
            out4[i] = v;
        }
        for (uint32_t i = threadIdx.x; i < n - 4 * quads; i += kThreads) {
            const uint32_t p = i < head ? i : tail + (i - head);
            out[p] = (float(in[p * step]) - mean) * inv_std;
        }
    }
}

// The first version's block: gather_args::bench_version_1. Shared memory: 4 words.
__device__ bool gather_block_v1(const gather_args& g, int64_t block, unsigned char* smem) {
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
    if (lo > hi) return true;

    const uint32_t c = uint32_t(g.c);
    const int64_t plane = g.h * g.w;
    float* y = g.y + image * g.c * plane;
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
                y[int64_t(ch) * plane + pixel] = (float((word >> (8 * j)) & 0xffu) - of_channel(g.mean, ch)) *
                                                 of_channel(g.inv_std, ch);
            }
        }
    }
    return true;
}

// Shared memory: gather_shared_bytes.
__device__ bool gather_block_gpu(const gather_args& g, int64_t block, unsigned char* smem) {
    if (g.bench_version_1) return gather_block_v1(g, block, smem);
    gather_shared& sh = *reinterpret_cast<gather_shared*>(smem);
    const int64_t per_image = gather_blocks_per_image(g);
    const int64_t image = block / per_image;
    const int64_t bytes = g.h * g.w * g.c;
    const int64_t q0 = (block % per_image) * g.bytes_per_block;
    const int64_t q1 = q0 + g.bytes_per_block < bytes ? q0 + g.bytes_per_block : bytes;
    if (g.blocks) {
        // One group's one read.
        const auto* desc = reinterpret_cast<const uint32_t*>(g.blocks + block);
        auto* head = reinterpret_cast<uint32_t*>(&sh);
        if (threadIdx.x < sizeof(gather_block_desc) / 4) head[threadIdx.x] = desc[threadIdx.x];
    } else {
        // The image's segments with bytes in the range: [head[1], head[2]).
        if (threadIdx.x == 0) {
            sh.head[1] = 0xffffffffu;
            sh.head[2] = 0;
        }
        __syncthreads();
        const uint32_t seg0 = g.first[image], seg1 = g.first[image + 1];
        for (uint32_t i = seg0 + threadIdx.x; i < seg1; i += kThreads) {
            const int64_t off = g.segments[i].offset, len = g.segments[i].length;
            if (len > 0 && off < q1 && off + len > q0) {
                atomicMin(&sh.head[1], i);
                atomicMax(&sh.head[2], i + 1);
            }
        }
    }
    __syncthreads();
    const uint32_t seg_begin = sh.head[1], seg_end = sh.head[2];
    const uint32_t count = g.blocks ? sh.head[0] : seg_end > seg_begin ? seg_end - seg_begin : 0;
    if (count == 0) return true;
    const bool described = g.blocks && count <= gather_block_slices;
    float* __restrict__ y = g.y + image * g.c * g.h * g.w;
    for (int64_t a = q0; a < q1; a += gather_tile_bytes) {
        const int64_t e = a + gather_tile_bytes < q1 ? a + gather_tile_bytes : q1;
        if (described) {
            stage_tile(sh, count, a, e);
        } else {
            // The segments, a chunk at a time (stage_tile's barriers keep a chunk until it is used).
            for (uint32_t s0 = seg_begin; s0 < seg_end; s0 += gather_chunk_segments) {
                const uint32_t n = seg_end - s0 < gather_chunk_segments ? seg_end - s0 : gather_chunk_segments;
                if (threadIdx.x < n) sh.slices[threadIdx.x] = g.segments[s0 + threadIdx.x];
                stage_tile(sh, n, a, e);
            }
        }
        __syncthreads();
        store_tile(g, y, sh.stage, a, e);
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

// Shared memory: token_gather_shared_bytes.
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
    return launch_kernel<token_gather_args>(p, token_gather_kernel, token_gather_shared_bytes);
}
int launch_tensor_gather(const gpu_launch_params& p) { return launch_kernel<tensor_gather_args>(p, tensor_gather_kernel); }
RL_KERNEL_RESOURCES(token_gather, token_gather_kernel, token_gather_shared_bytes)
RL_KERNEL_RESOURCES(tensor_gather, tensor_gather_kernel, 0)

}  // namespace reefline::ml::kernels::gpu_impl
