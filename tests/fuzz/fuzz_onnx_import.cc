// libFuzzer target for the ONNX loader: any input must import or throw model_error, never
// crash, hang or leak. Built only with clang (-fsanitize=fuzzer); run e.g.
//   ./tests/fuzz_onnx_import -max_len=65536 ../shared/conformance/onnx-node/*/model.onnx
#include <cstddef>
#include <cstdint>

#include "libml/frontend/graph.h"
#include "libml/frontend/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    reefline::ml::import_options opts;
    opts.max_fold_bytes = int64_t{64} << 20;  // keep each run small
    opts.max_total_fold_bytes = int64_t{256} << 20;
    try {
        reefline::ml::graph g = reefline::ml::import_onnx_buffer(data, size, opts, "fuzz");
        g.validate();
    } catch (const reefline::ml::model_error&) {
    }
    return 0;
}
