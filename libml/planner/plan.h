// Graph -> kernel plan and memory plan.
//
// A plan is the ordered list of kernel launches of one inference at one batch size, each
// with its kernel, grid, resource needs and argument struct, plus a memory plan: where every
// runtime tensor lives. Memory is three regions:
//   weights  constants of the model (shared by every instance of the model: link_model)
//   arena    intermediate tensors and outputs, reused by liveness
//   inputs   the graph inputs (the gather kernel or the caller writes them)
// Argument structs hold raw pointers, so a plan is built for concrete region base addresses
// (an instance's memory); `relocate()` retargets it when the memory moves.
//
// Idempotence (an invariant of the runtime): no launch writes a byte range that it reads, and a
// range read by launch j is not written by any launch k in (j, j + restore_window], so that
// restoring a preempted task from up to `restore_window` kernels before the interrupted one
// recomputes the same values. check_idempotence() verifies both for any plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "libml/frontend/graph.h"
#include "libml/kernels/decomp.h"
#include "preempt/device.h"

namespace reefline::ml {

enum class region : uint8_t { weights, arena, inputs };

struct byte_range {
    region where;
    int64_t offset;
    int64_t bytes;
};

struct planned_launch {
    const gpu::kernel_info* kernel;
    std::vector<std::byte> args;  // the kernel's argument struct, pointers resolved
    uint32_t grid;
    size_t scratch_bytes;         // per compute unit (cpu backend)
    std::string node;             // the graph node it comes from (for errors and profiles)
    std::vector<byte_range> reads, writes;
};

// Where a runtime tensor lives.
struct tensor_location {
    region where;
    int64_t offset;  // bytes
    dtype type;
    shape_t shape;
};

struct plan_options {
    int restore_window = 4;  // REEF's c: kernels that approximate restore may re-execute
    // Roughly how much work one block should do; smaller grids preempt at finer grain.
    int64_t elements_per_block = 16384;
    // Block tiles of GEMM/conv (and the gather's block size): sized for the cpu backend's
    // OpenBLAS calls or for a GPU's 256-thread blocks. `device`: the runtime picks from the
    // device it runs on (device_caps::gpu); plan::build alone reads it as cpu.
    enum class tiles_for : uint8_t { device, cpu, gpu };
    tiles_for tiles = tiles_for::device;
    // The compute units the plan's kernels spread over (cpu tiles split small layers so that
    // each unit gets blocks). 0: the runtime takes the device's; plan::build alone reads 1.
    uint32_t compute_units = 0;
    // cpu plans at batch > 1: runs of up to image_run consecutive per-image kernels
    // (convolution, pooling, batch norm) whose outputs for the whole batch are
    // image_run_min_bytes or more launch image by image (with N compute units, N images at a
    // time where the batch is a multiple of N), so each image's activations pass from one
    // kernel to the next through the caches. image_run 0 or 1: one launch per kernel.
    int image_run = 4;
    int64_t image_run_min_bytes = int64_t(8) << 20;
    // cpu plans: a pointwise convolution whose output only a 3x3 depthwise convolution reads
    // runs with it as one launch (kernels::pointwise_depthwise), its output never written.
    bool fold_pointwise = true;
};

struct memory_bases {
    std::byte* weights = nullptr;
    std::byte* arena = nullptr;
    std::byte* inputs = nullptr;
};

class plan {
public:
    // Lays out the weights region for g's constants (independent of batch size): offsets by
    // value id. The same layout serves every batch size and instance of the model.
    // Keyed by the constant's data, which specializations of one model share, so one upload
    // serves every batch size and every instance.
    struct weight_layout {
        std::map<const bytes_t*, int64_t> offset;
        std::vector<std::shared_ptr<const bytes_t>> data;
        int64_t bytes = 0;
        // 3x3 convolution weights' Winograd filters (kernels::winograd_filters) after the
        // constants: the offset of those of each weights' data, and what fill_weights
        // transforms there.
        std::map<const bytes_t*, int64_t> winograd;
        struct winograd_source {
            int64_t offset;
            std::shared_ptr<const bytes_t> weights;  // [c_out, ci_per_group, 3, 3]
            int64_t c_out, ci_per_group, co_per_group;
        };
        std::vector<winograd_source> winograd_sources;
        // The filters of the convolutions that run on the channel-blocked layout
        // (c16_layout.h, kernels::conv2d_c16_filters), after those: where each weights' data
        // has them and for which input layout. A constant only such convolutions read is not
        // laid out itself.
        struct c16_filters {
            int64_t offset;
            bool x_c16;
            bool winograd;  // kernels::conv2d_c16_winograd_filters (3x3 at stride 1) instead
        };
        std::map<const bytes_t*, c16_filters> c16;
        struct c16_source {
            int64_t offset;
            std::shared_ptr<const bytes_t> weights;  // [c_out, c_in, kh, kw]
            int64_t c_out, c_in, kh, kw;  // c_in per group (1 for a depthwise layer)
            bool x_c16, winograd, depthwise;
        };
        std::vector<c16_source> c16_sources;
    };
    // With cpu_filters (the cpu device with AVX-512), the convolutions the cpu blocks run by
    // Winograd (kernels::winograd_filters_wanted) get their transformed filters, and those
    // that run on the channel-blocked layout (c16_layout.h) their packed ones.
    static weight_layout layout_weights(const graph& g, bool cpu_filters = false);
    // Copies the constants into a weights region laid out by `layout`.
    static void fill_weights(const weight_layout& layout, std::byte* weights);

    // Builds the plan of a specialized graph. Throws model_error(unsupported_feature) for
    // what the kernel library cannot run (naming the node).
    static plan build(const graph& g, const weight_layout& weights, const plan_options& opts = {});

    int64_t arena_bytes() const { return _arena_bytes; }
    // Inputs region: the graph inputs, then constants that only this specialization has.
    int64_t input_bytes() const { return _input_bytes; }
    const std::vector<planned_launch>& launches() const { return _launches; }
    const std::vector<tensor_location>& inputs() const { return _inputs; }
    const std::vector<tensor_location>& outputs() const { return _outputs; }
    int restore_window() const { return _restore_window; }

    // Resolves every pointer in the argument structs against `bases`.
    void bind(const memory_bases& bases);
    // The constants only this specialization has, (offset in the inputs region, data): the
    // caller copies them there (device memory on GPU backends) once it is allocated.
    const std::vector<std::pair<int64_t, std::shared_ptr<const bytes_t>>>& input_constants() const {
        return _constants;
    }
    // Verifies the idempotence invariant; returns "" or a description of the first violation.
    std::string check_idempotence() const;

private:
    struct pointer_fixup {
        size_t launch;
        size_t args_offset;  // where the pointer lives in the argument struct
        region where;
        int64_t offset;
    };
    std::vector<planned_launch> _launches;
    std::vector<pointer_fixup> _fixups;
    std::vector<tensor_location> _inputs, _outputs;
    int64_t _arena_bytes = 0, _input_bytes = 0;
    std::vector<std::pair<int64_t, std::shared_ptr<const bytes_t>>> _constants;
    int _restore_window = 4;
    friend class planner;
};

// The tiles a GPU plan (plan_options::tiles_for::gpu) gives a convolution or a GEMM on a device
// of `compute_units` units: 128 x 128 or 64 x 64 output tiles, pixel tiles spanning images, and
// split-K (k_splits / k_chunk; the planner then emits the layer's two launches). Public for the
// per-layer benchmark (bench/conv_bench.cc), which times the plans' choice beside the others.
void use_gpu_tiles(kernels::conv2d_args& a, uint32_t compute_units);
void use_gpu_tiles(kernels::gemm_args& g, uint32_t compute_units);

}  // namespace reefline::ml
