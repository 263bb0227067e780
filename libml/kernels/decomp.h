// Kernel argument structs and their block decompositions, shared by every backend.
//
// This header is compiled by the host compiler and by nvcc and hipcc: plain data
// and RL_HD inline functions only. A kernel's grid and the work of block b are computed here
// and nowhere else, so the cpu backend runs exactly the block decomposition the GPU does,
// and a padded launch (DKP) can run any slice of blocks on either.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define RL_HD __host__ __device__
#else
#define RL_HD
#endif

namespace reefline::ml::kernels {

// Activation fused into the epilogue of conv, gemm and elementwise kernels.
enum class activation : uint8_t {
    none, relu, leaky_relu, sigmoid, tanh, clip, hard_sigmoid, hard_swish, gelu_erf, gelu_tanh,
};

struct epilogue {
    activation act = activation::none;
    float alpha = 0;  // leaky_relu slope, clip min, hard_sigmoid alpha
    float beta = 0;   // clip max, hard_sigmoid beta
};

RL_HD inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- GEMM: C[b] = act(alpha * op(A[b]) * op(B[b]) + bias) ---------------------------------
// Batched with strides (0 = broadcast). Bias broadcasts per column (n), per row (m), scalar or
// full (m x n), scaled by beta.
enum class bias_kind : uint8_t { none, scalar, per_col, per_row, full };

struct gemm_args {
    const float* a;
    const float* b;
    const float* bias;
    float* c;
    int64_t batch;
    int64_t m, n, k;
    int64_t lda, ldb, ldc, ldbias;
    int64_t stride_a, stride_b, stride_c, stride_bias;  // per batch item, elements
    bool trans_a, trans_b;
    bias_kind bias_mode;
    float alpha, beta;
    epilogue ep;
    int32_t tile_m, tile_n;  // output tile of one block
    int32_t tile_k;          // K chunk between preemption checks
};

RL_HD inline int64_t gemm_tiles_m(const gemm_args& g) { return ceil_div(g.m, g.tile_m); }
RL_HD inline int64_t gemm_tiles_n(const gemm_args& g) { return ceil_div(g.n, g.tile_n); }
RL_HD inline int64_t gemm_grid(const gemm_args& g) { return g.batch * gemm_tiles_m(g) * gemm_tiles_n(g); }

struct gemm_tile {
    int64_t batch, m0, m1, n0, n1;
};
RL_HD inline gemm_tile gemm_block(const gemm_args& g, int64_t block) {
    const int64_t tn = gemm_tiles_n(g), tm = gemm_tiles_m(g);
    gemm_tile t;
    t.batch = block / (tm * tn);
    const int64_t r = block % (tm * tn);
    t.m0 = (r / tn) * g.tile_m;
    t.n0 = (r % tn) * g.tile_n;
    t.m1 = t.m0 + g.tile_m < g.m ? t.m0 + g.tile_m : g.m;
    t.n1 = t.n0 + g.tile_n < g.n ? t.n0 + g.tile_n : g.n;
    return t;
}

// ---- 2-D convolution, NCHW, grouped, dilated, with fused bias and activation --------------
// A block computes a tile of output channels (within one group) over a range of output
// pixels of one image: an implicit GEMM W[co_tile, K] x cols[K, pix_tile], K = cin/g*kh*kw.
struct conv2d_args {
    const float* x;     // [n, c_in, h, w]
    const float* w;     // [c_out, c_in/groups, kh, kw]
    const float* bias;  // [c_out] or null
    const float* residual;  // [n, c_out, ho, wo] added before the activation, or null
    float* y;           // [n, c_out, ho, wo]
    int64_t n, c_in, h, w_in, c_out, kh, kw;
    int64_t stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, groups;
    int64_t h_out, w_out;
    epilogue ep;
    int32_t tile_co, tile_pix, tile_k;
    // Groups one block covers (0 reads as 1): the cpu device's depthwise blocks take several
    // small planes at once, so that claiming a block does not cost as much as its work.
    int32_t tile_groups;
    // Images one block covers (0 reads as 1; more only with whole planes, tile_pix >= h_out *
    // w_out): the cpu device's GEMM path then multiplies the weights by the columns of all of
    // them at once, reading the weights once for those images instead of once per image.
    int32_t tile_images;
    // The cpu device's Winograd filters of w (winograd_filters, cpu_winograd.h), laid out with
    // the weights at load time, or null: the blocks then compute the layer another way.
    const float* w_winograd;
    // A pointwise convolution computed block by block as this depthwise layer's input, where
    // pre_c_in > 0 (cpu plans only): x is then that layer's input [n, pre_c_in, h, w_in],
    // pre_w its weights [c_in, pre_c_in], pre_bias its bias [c_in] or null and pre_ep its
    // activation; its output, c_in planes per image, is never written to memory.
    const float* pre_w;
    const float* pre_bias;
    int64_t pre_c_in;
    epilogue pre_ep;
    // GPU plans: a block's pixel tile runs over the pixels of all images, image after image
    // (non-zero; tile_images then reads as 1), so that a layer of small planes at batch > 1
    // fills whole tiles: GEMM N = n * h_out * w_out.
    int32_t span_images;
    // Split-K (GPU plans, layers with too few output tiles to fill the device): K is cut into
    // k_splits chunks of k_chunk and the layer runs as two launches of these args, differing
    // in split_phase only. Phase 1 (k_splits blocks per output tile) writes each chunk's raw
    // sums to partial[split][n][c_out][h_out][w_out]; phase 2 (a block per output tile) adds
    // them in split order, then bias, residual and activation, into y. Both launches read
    // what they do not write, so either can re-run after a preemption. k_splits 0 or 1: none.
    int32_t k_splits, k_chunk, split_phase;
    float* partial;
};

RL_HD inline int64_t conv2d_co_per_group(const conv2d_args& c) { return c.c_out / c.groups; }
RL_HD inline int64_t conv2d_ci_per_group(const conv2d_args& c) { return c.c_in / c.groups; }
RL_HD inline int64_t conv2d_k(const conv2d_args& c) { return conv2d_ci_per_group(c) * c.kh * c.kw; }
RL_HD inline int64_t conv2d_tiles_co(const conv2d_args& c) { return ceil_div(conv2d_co_per_group(c), c.tile_co); }
// The pixel axis a tile cuts: one image's planes, or every image's (span_images).
RL_HD inline int64_t conv2d_pixels(const conv2d_args& c) {
    return c.span_images ? c.n * c.h_out * c.w_out : c.h_out * c.w_out;
}
RL_HD inline int64_t conv2d_tiles_pix(const conv2d_args& c) { return ceil_div(conv2d_pixels(c), c.tile_pix); }
RL_HD inline int64_t conv2d_group_tile(const conv2d_args& c) { return c.tile_groups > 1 ? c.tile_groups : 1; }
RL_HD inline int64_t conv2d_tiles_group(const conv2d_args& c) { return ceil_div(c.groups, conv2d_group_tile(c)); }
RL_HD inline int64_t conv2d_image_tile(const conv2d_args& c) {
    return c.span_images ? c.n : c.tile_images > 1 ? c.tile_images : 1;
}
RL_HD inline int64_t conv2d_tiles_image(const conv2d_args& c) { return ceil_div(c.n, conv2d_image_tile(c)); }
RL_HD inline bool conv2d_split(const conv2d_args& c) { return c.k_splits > 1 && c.k_chunk > 0; }
// Blocks of the launch: one per output tile, times k_splits in a split layer's first phase.
RL_HD inline int64_t conv2d_grid(const conv2d_args& c) {
    const int64_t tiles = conv2d_tiles_image(c) * conv2d_tiles_group(c) * conv2d_tiles_co(c) * conv2d_tiles_pix(c);
    return conv2d_split(c) && c.split_phase == 1 ? tiles * c.k_splits : tiles;
}

struct conv2d_tile {
    // images [image, image1), groups [group, group1); co within a group. Pixels [p0, p1) of
    // image `image`'s planes, or of all images' in turn where the tile spans them (span_images:
    // image 0, pixel q of image q / (h_out * w_out)).
    int64_t image, image1, group, group1, co0, co1, p0, p1;
    // K range of the block: [k0, k1) of its split (chunk `split`) in a split layer's first
    // phase, else all (split 0).
    int64_t k0, k1, split;
};
RL_HD inline conv2d_tile conv2d_block(const conv2d_args& c, int64_t block) {
    const int64_t tp = conv2d_tiles_pix(c), tc = conv2d_tiles_co(c), tg = conv2d_tiles_group(c);
    const int64_t tiles = conv2d_tiles_image(c) * tg * tc * tp;
    conv2d_tile t;
    const int64_t split = block / tiles;  // 0 outside a split layer's first phase
    block %= tiles;
    t.p0 = (block % tp) * c.tile_pix;
    block /= tp;
    t.co0 = (block % tc) * c.tile_co;
    block /= tc;
    t.group = (block % tg) * conv2d_group_tile(c);
    t.image = block / tg * conv2d_image_tile(c);
    t.image1 = t.image + conv2d_image_tile(c) < c.n ? t.image + conv2d_image_tile(c) : c.n;
    const int64_t npix = conv2d_pixels(c), nco = conv2d_co_per_group(c), K = conv2d_k(c);
    t.group1 = t.group + conv2d_group_tile(c) < c.groups ? t.group + conv2d_group_tile(c) : c.groups;
    t.p1 = t.p0 + c.tile_pix < npix ? t.p0 + c.tile_pix : npix;
    t.co1 = t.co0 + c.tile_co < nco ? t.co0 + c.tile_co : nco;
    t.k0 = 0;
    t.k1 = K;
    t.split = 0;
    if (conv2d_split(c) && c.split_phase == 1) {
        t.split = split;
        t.k0 = split * c.k_chunk < K ? split * c.k_chunk : K;
        t.k1 = t.k0 + c.k_chunk < K ? t.k0 + c.k_chunk : K;
    }
    return t;
}

// Floats from one split's partial sums to the next's (partial[split][n][c_out][h_out][w_out]).
RL_HD inline int64_t conv2d_split_stride(const conv2d_args& c) { return c.n * c.c_out * c.h_out * c.w_out; }

// The part of a tile that spans images (span_images) within image `image`: pixels [p0, p1)
// of that image's planes, empty (p0 == p1) where the tile has none there.
RL_HD inline conv2d_tile conv2d_image_part(const conv2d_args& c, const conv2d_tile& t, int64_t image) {
    const int64_t hw = c.h_out * c.w_out, base = image * hw;
    conv2d_tile one = t;
    one.image = image;
    one.image1 = image + 1;
    one.p0 = t.p0 > base ? t.p0 - base : 0;
    one.p1 = t.p1 - base < hw ? t.p1 - base : hw;
    if (one.p1 < one.p0) one.p1 = one.p0;
    return one;
}

// ---- gather: payload fragments -> normalised f32 NCHW batch tensor -----------------------
// One gather segment per packet payload; an image's segments tile its u8 HWC bytes. A block
// converts a contiguous range of one image's HWC bytes, which may span segments.
struct gather_segment {
    const uint8_t* data;
    uint32_t length;
    uint32_t offset;  // byte offset of this segment in its image
};

// What one block of the image gather reads, written by the host beside the gather list (GPU
// backends: gather_describe_blocks), so that a block learns where its payload is in one
// 128-byte read instead of reading its image's first[] entry, then the image's segments, each a
// round trip over PCIe, before the payload itself. Up to gather_block_slices segments are
// given cut to the block's byte range; a range that holds more (fragments of less than ~700
// bytes at the GPU's 4095-byte blocks) gives their indices in the list, and the block reads
// those segments itself.
inline constexpr uint32_t gather_block_slices = 7;
struct gather_block_desc {
    uint32_t count;          // segments with bytes in the block's range (0: none)
    uint32_t segment_begin;  // those segments: [segment_begin, segment_end) of the list
    uint32_t segment_end;
    uint32_t unused;
    // count <= gather_block_slices: the segments cut to the range ({data of the first byte in
    // the range, bytes in the range, their offset in the image}), in offset order.
    gather_segment slices[gather_block_slices];
};
static_assert(sizeof(gather_block_desc) == 128, "a block's descriptor is one 128-byte read");

struct gather_args {
    const gather_segment* segments;  // all images' segments, image i at [first[i], first[i+1])
    const uint32_t* first;           // batch + 1 entries
    float* y;                        // [batch, c, h, w]
    int64_t batch, h, w, c;
    float mean[4], inv_std[4];       // per channel
    int64_t bytes_per_block;         // HWC bytes converted by one block (multiple of c)
    // gather_grid() descriptors (gather_describe_blocks), or null: GPU blocks then find their
    // segments in the list. The cpu blocks never read them.
    const gather_block_desc* blocks;
    // Non-zero: GPU blocks run the kernel's first version (segment scan, a store per byte),
    // for gather_bench's comparison; the runtime never sets it. Same values either way.
    uint32_t bench_version_1;
};

RL_HD inline int64_t gather_blocks_per_image(const gather_args& g) {
    return ceil_div(g.h * g.w * g.c, g.bytes_per_block);
}
RL_HD inline int64_t gather_grid(const gather_args& g) { return g.batch * gather_blocks_per_image(g); }

// The descriptor of every block of g's grid (gather_grid(g) entries at `out`), from the gather
// list `segments` / `first` (g's own, or a host copy of it: the descriptors hold the segments'
// data pointers and indices as they are). Segments in offset order per image, as the gather
// list has them; empty ones are left out.
RL_HD inline void gather_describe_blocks(const gather_args& g, const gather_segment* segments, const uint32_t* first,
                                         gather_block_desc* out) {
    const int64_t per_image = gather_blocks_per_image(g), bytes = g.h * g.w * g.c;
    for (int64_t i = 0; i < g.batch; ++i) {
        uint32_t s = first[i];
        const uint32_t end = first[i + 1];
        for (int64_t k = 0; k < per_image; ++k) {
            const int64_t q0 = k * g.bytes_per_block;
            const int64_t q1 = q0 + g.bytes_per_block < bytes ? q0 + g.bytes_per_block : bytes;
            // Segments that end before the range end before every later block's too.
            while (s < end && int64_t(segments[s].offset) + int64_t(segments[s].length) <= q0) ++s;
            gather_block_desc d{};
            d.segment_begin = s;
            uint32_t t = s;
            for (; t < end && int64_t(segments[t].offset) < q1; ++t) {
                const gather_segment& seg = segments[t];
                const int64_t off = int64_t(seg.offset), stop = off + int64_t(seg.length);
                if (seg.length == 0 || stop <= q0) continue;
                const int64_t lo = off > q0 ? off : q0, hi = stop < q1 ? stop : q1;
                if (d.count < gather_block_slices)
                    d.slices[d.count] = gather_segment{seg.data + (lo - off), uint32_t(hi - lo), uint32_t(lo)};
                ++d.count;
            }
            d.segment_end = t;
            out[i * per_image + k] = d;
        }
    }
}

// ---- N-D element-wise kernels ------------------------------------------------------------
// Shapes up to 6 dims, row-major. Strides are in elements; a stride of 0 broadcasts. A block
// handles `per_block` consecutive output elements.
inline constexpr int max_dims = 6;

struct nd_shape {
    int32_t rank;
    int64_t dims[max_dims];
};

RL_HD inline int64_t nd_count(const nd_shape& s) {
    int64_t n = 1;
    for (int i = 0; i < s.rank; ++i) n *= s.dims[i];
    return n;
}

// Offset of linear output element `e` in a tensor viewed through `strides`.
RL_HD inline int64_t nd_offset(const nd_shape& s, const int64_t* strides, int64_t e) {
    int64_t off = 0;
    for (int i = s.rank - 1; i >= 0; --i) {
        off += (e % s.dims[i]) * strides[i];
        e /= s.dims[i];
    }
    return off;
}

// y[view_y(e)] = x[view_x(e)] for every e of `shape`: Transpose, Slice (strides may be
// negative or > 1), Expand, Concat/Split (one launch per part into a sub-view), Cast-free copies.
struct copy_args {
    const void* x;
    void* y;
    nd_shape shape;
    int64_t x_offset, x_strides[max_dims];
    int64_t y_offset, y_strides[max_dims];
    int32_t element_bytes;  // 1, 2, 4 or 8
    int64_t per_block;
};
RL_HD inline int64_t copy_grid(const copy_args& a) { return ceil_div(nd_count(a.shape), a.per_block); }

enum class binary_op : uint8_t { add, sub, mul, div, pow, max, min, equal, greater, less };

// Element types of the typed (non-f32) element-wise paths. f32 is 0, so zero-initialised
// argument structs select the f32 fast path.
enum class elem : uint8_t { f32 = 0, f64, f16, i64, i32, i8, u8, boolean };
enum class unary_op : uint8_t {
    identity, neg, abs, sqrt, exp, log, erf, sin, cos, reciprocal, floor, ceil,  // then ep
    scale,  // x * alpha
    fill,   // alpha (x is not read)
    clip,   // min(max(x, alpha), beta), any element type
};

// y = ep(a op b) on f32 with broadcasting through strides. `equal/greater/less` write 1.0f/0.0f.
struct binary_args {
    const float* a;
    const float* b;
    float* y;
    nd_shape shape;  // of y
    int64_t a_strides[max_dims], b_strides[max_dims];
    binary_op op;
    epilogue ep;  // f32 only
    int64_t per_block;
    elem a_type, b_type, y_type;  // all f32: the fast path
};
RL_HD inline int64_t binary_grid(const binary_args& a) { return ceil_div(nd_count(a.shape), a.per_block); }

// y = ep(op(x)) elementwise on contiguous f32.
struct unary_args {
    const float* x;
    float* y;
    int64_t count;
    unary_op op;
    float alpha;  // scale, fill, clip min
    float beta;   // clip max
    epilogue ep;
    int64_t per_block;
    elem x_type, y_type;  // identity with different types is a cast
};
RL_HD inline int64_t unary_grid(const unary_args& a) { return ceil_div(a.count, a.per_block); }

// where: y = cond ? a : b with broadcasting (cond as f32 0/1 or u8 -> given as f32 here).
struct where_args {
    const float* cond;
    const float* a;
    const float* b;
    float* y;
    nd_shape shape;
    int64_t c_strides[max_dims], a_strides[max_dims], b_strides[max_dims];
    int64_t per_block;
    elem c_type, type;  // condition (f32 or boolean), values and result
};
RL_HD inline int64_t where_grid(const where_args& a) { return ceil_div(nd_count(a.shape), a.per_block); }

// ---- payload gathers of the other request formats ----------------------------------------
// Both read requests the way the image gather does: request i's payload is the segments
// [first[i], first[i+1]), in offset order, tiling its bytes; an element may straddle two
// segments (fragments are cut at any byte). Elements are little-endian (docs/protocol.md).

// The little-endian 32-bit word at byte q of a request whose segments are [seg, seg_end),
// q + 4 <= the payload's length. `seg` is the segment holding byte q.
RL_HD inline uint32_t payload_le32(const gather_segment* seg, const gather_segment* seg_end, int64_t q) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k, ++q) {
        while (seg + 1 < seg_end && q >= int64_t(seg->offset) + int64_t(seg->length)) ++seg;
        v |= uint32_t(seg->data[q - int64_t(seg->offset)]) << (8 * k);
    }
    return v;
}

// The segment of [seg, seg_end) that holds byte q (segments in offset order, non-empty range).
RL_HD inline const gather_segment* payload_segment(const gather_segment* seg, const gather_segment* seg_end, int64_t q) {
    int64_t lo = 0, hi = seg_end - seg;  // the last segment whose offset <= q
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (int64_t(seg[mid].offset) <= q) lo = mid; else hi = mid;
    }
    return seg + lo;
}

// Bytes of request i's payload: the end of its last segment (0 for an empty list).
RL_HD inline int64_t payload_bytes(const gather_segment* segments, const uint32_t* first, int64_t i) {
    if (first[i + 1] <= first[i]) return 0;
    const gather_segment& last = segments[first[i + 1] - 1];
    return int64_t(last.offset) + int64_t(last.length);
}

// tokens_i32 requests -> a sequence model's inputs for one length bucket: ids [batch, length]
// (the request's tokens, then 0), attention mask (1 for each token, then 0) and token types
// (0), each in the model's element type. A token outside [0, vocab) is never written (0 is,
// so the model's embedding lookup stays in bounds); the block records the first one it saw
// in errors[block] for the host to answer the request with bad_request.
struct token_error {
    int32_t position;  // in the request; -1: none in the block's range
    int32_t token;
};

// Stores integer v as element i of an i64, i32 or f32 tensor.
RL_HD inline void store_int_as(void* base, int64_t i, elem type, int64_t v) {
    if (type == elem::i64) static_cast<int64_t*>(base)[i] = v;
    else if (type == elem::i32) static_cast<int32_t*>(base)[i] = int32_t(v);
    else static_cast<float*>(base)[i] = float(v);
}

struct token_gather_args {
    const gather_segment* segments;
    const uint32_t* first;  // batch + 1 entries
    void* ids;              // [batch, length]
    void* mask;             // [batch, length] or null
    void* types;            // [batch, length] or null
    token_error* errors;    // token_gather_grid() entries
    int64_t batch, length, vocab;
    int64_t tokens_per_block;  // positions of one request per block
    elem ids_type, mask_type, types_type;  // i64 or i32 (the mask also f32)
};
RL_HD inline int64_t token_blocks_per_request(const token_gather_args& a) { return ceil_div(a.length, a.tokens_per_block); }
RL_HD inline int64_t token_gather_grid(const token_gather_args& a) { return a.batch * token_blocks_per_request(a); }

// tensor_f32 requests -> a model's f32 input [batch, elements...], bytes as they are.
struct tensor_gather_args {
    const gather_segment* segments;
    const uint32_t* first;  // batch + 1 entries
    float* y;               // [batch, elements]
    int64_t batch, elements;
    int64_t elements_per_block;
};
RL_HD inline int64_t tensor_blocks_per_request(const tensor_gather_args& a) { return ceil_div(a.elements, a.elements_per_block); }
RL_HD inline int64_t tensor_gather_grid(const tensor_gather_args& a) { return a.batch * tensor_blocks_per_request(a); }

// ---- Row kernels: tensor viewed as [outer, axis, inner] ------------------------------------
enum class row_op : uint8_t { softmax, log_softmax, layer_norm, reduce_mean, reduce_sum, reduce_max };

// softmax / log_softmax along `axis` (y same shape as x); layer_norm normalises each
// [outer] row over axis*inner elements with scale/bias of axis*inner; reductions write
// y[outer, inner].
struct row_args {
    const float* x;
    const float* scale;  // layer_norm
    const float* bias;   // layer_norm, may be null
    float* y;
    float* mean_out;     // layer_norm: per-row mean, may be null
    float* inv_std_out;  // layer_norm: per-row 1/sqrt(var + eps), may be null
    int64_t outer, axis, inner;
    float epsilon;
    row_op op;
    int64_t rows_per_block;  // of the outer dimension (times inner for softmax-like ops)
};
RL_HD inline int64_t row_units(const row_args& a) {
    return a.op == row_op::layer_norm ? a.outer : a.outer * a.inner;
}
RL_HD inline int64_t row_grid(const row_args& a) { return ceil_div(row_units(a), a.rows_per_block); }

// ---- 2-D pooling, NCHW --------------------------------------------------------------------
enum class pool_op : uint8_t { max, average };
struct pool2d_args {
    const float* x;
    float* y;
    int64_t n, c, h, w, h_out, w_out;
    int64_t kh, kw, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w;
    pool_op op;
    bool count_include_pad;
    int64_t pad_bottom, pad_right;  // count_include_pad counts the window within the padding
    int64_t planes_per_block;       // of n*c
    // 3-D pooling: a depth dimension in front of h, w (all 1 / 0 for 1-D and 2-D pooling).
    int64_t d, d_out, kd, stride_d, pad_front, pad_back, dil_d;
    // MaxPool's optional Indices output: the flat index of each maximum in x (int64), row
    // major over the whole tensor, or column major over the spatial dims (storage_order 1).
    int64_t* indices;
    bool column_major;
};
RL_HD inline int64_t pool2d_grid(const pool2d_args& a) { return ceil_div(a.n * a.c, a.planes_per_block); }

// One output element of the general pooling path (every backend): the window over the
// (padded, dilated) input, max with its index or the average, stored to y (and indices).
RL_HD inline void pool_output(const pool2d_args& a, int64_t plane, int64_t od, int64_t oy, int64_t ox) {
    const int64_t D = a.d > 1 ? a.d : 1, Do = a.d_out > 1 ? a.d_out : 1, KD = a.kd > 1 ? a.kd : 1;
    const int64_t SD = a.stride_d > 1 ? a.stride_d : 1, DD = a.dil_d > 1 ? a.dil_d : 1;
    const int64_t in_plane = D * a.h * a.w, out_plane = Do * a.h_out * a.w_out;
    const float* x = a.x + plane * in_plane;
    const int64_t z0 = od * SD - a.pad_front;
    const int64_t y0 = oy * a.stride_h - a.pad_top, x0 = ox * a.stride_w - a.pad_left;
    float m = -INFINITY;
    int64_t at = -1;
    double s = 0;
    int64_t inside = 0, in_padded = 0;
    for (int64_t t = 0; t < KD; ++t) {
        const int64_t iz = z0 + t * DD;
        for (int64_t r = 0; r < a.kh; ++r) {
            const int64_t iy = y0 + r * a.dil_h;
            for (int64_t q = 0; q < a.kw; ++q) {
                const int64_t ix = x0 + q * a.dil_w;
                // Window positions inside the padded input count when count_include_pad;
                // positions beyond it (ceil_mode) never do.
                if (iz < D + a.pad_back && iy < a.h + a.pad_bottom && ix < a.w + a.pad_right) ++in_padded;
                if (iz < 0 || iz >= D || iy < 0 || iy >= a.h || ix < 0 || ix >= a.w) continue;
                const int64_t off = (iz * a.h + iy) * a.w + ix;
                const float v = x[off];
                if (v > m || at < 0) {
                    m = v;
                    at = a.column_major ? (ix * a.h + iy) * D + iz : off;
                }
                s += v;
                ++inside;
            }
        }
    }
    const int64_t o = (od * a.h_out + oy) * a.w_out + ox;
    float* y = a.y + plane * out_plane;
    if (a.op == pool_op::max) {
        y[o] = m;
        if (a.indices) a.indices[plane * out_plane + o] = at < 0 ? 0 : plane * in_plane + at;
    } else {
        const int64_t div = a.count_include_pad ? in_padded : inside;
        y[o] = div ? float(s / double(div)) : 0.0f;
    }
}

// ---- Inference batch normalisation, NCHW: y = ep((x - mean) / sqrt(var + eps) * scale + bias)
// For a BatchNormalization that no Conv precedes (DenseNet's BN-ReLU-Conv).
struct batchnorm_args {
    const float* x;
    const float* scale;
    const float* bias;
    const float* mean;
    const float* var;
    float* y;
    int64_t n, c, hw;
    float epsilon;
    epilogue ep;
    int64_t planes_per_block;
};
RL_HD inline int64_t batchnorm_grid(const batchnorm_args& a) { return ceil_div(a.n * a.c, a.planes_per_block); }

// ---- LRN across channels, NCHW ------------------------------------------------------------
struct lrn_args {
    const float* x;
    float* y;
    int64_t n, c, hw;
    int64_t size;
    float alpha, beta, bias;
    int64_t planes_per_block;
};
RL_HD inline int64_t lrn_grid(const lrn_args& a) { return ceil_div(a.n * a.c, a.planes_per_block); }

// ---- Gather along an axis: x viewed [outer, axis, inner], indices [count] -> y [outer, count, inner]
// Indices are int64 or int32 (index_bytes 4); an index outside [-axis, axis) writes zeros
// (ONNX calls it an error; a kernel must never turn it into a wild read).
struct gather_axis_args {
    const void* x;
    const void* indices;
    void* y;
    int64_t outer, axis, inner, count;
    int32_t element_bytes;
    int32_t index_bytes;     // 4: int32 indices; anything else: int64
    int64_t rows_per_block;  // of outer*count
};
RL_HD inline int64_t gather_axis_index(const gather_axis_args& a, int64_t j) {
    return a.index_bytes == 4 ? int64_t(static_cast<const int32_t*>(a.indices)[j])
                              : static_cast<const int64_t*>(a.indices)[j];
}
RL_HD inline int64_t gather_axis_grid(const gather_axis_args& a) {
    return ceil_div(a.outer * a.count, a.rows_per_block);
}

}  // namespace reefline::ml::kernels
