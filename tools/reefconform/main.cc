// reefconform: runs every case of a suite in the ONNX backend-test layout
// (<dir>/test_<name>/model.onnx, test_data_set_0/input_<i>.pb, output_<j>.pb) on the cpu
// backend and compares with the reference outputs: |got - want| <= atol + rtol * |want|.
// Cases the runtime cannot run are reported as skipped with the reason (operator, attribute
// or data type); the last line is "passed=P failed=F skipped=S"; exit 1 if F > 0.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "preempt/backend_option.h"
#include "libml/libml.h"

namespace fs = std::filesystem;
namespace ml = reefline::ml;

namespace {

struct outcome {
    enum { pass, fail, skip } result;
    std::string detail;
};

outcome run_case(ml::runtime& rt, const fs::path& dir, double rtol, double atol) {
    const fs::path data = dir / "test_data_set_0";
    try {
        // Import first, so that a model the runtime refuses is skipped for the model's reason
        // (operator, type) rather than for its test data.
        ml::import_options opts;
        ml::graph g;
        std::vector<std::string> input_names;
        std::map<std::string, ml::tensor> data_by_name;
        for (int attempt = 0;; ++attempt) {
            try {
                g = ml::import_onnx(dir / "model.onnx", opts);
                break;
            } catch (const ml::model_error& e) {
                // A shape parameter fed as a graph input: the test data fixes its value, as a
                // deployment would (import_options::constant_inputs).
                if (e.code() != ml::model_error::kind::dynamic || e.subject().empty() || attempt > 16) throw;
                if (data_by_name.empty()) {
                    for (int i = 0; fs::exists(data / ("input_" + std::to_string(i) + ".pb")); ++i) {
                        std::string name;
                        ml::tensor t = ml::read_tensor_file(data / ("input_" + std::to_string(i) + ".pb"), &name);
                        data_by_name[name] = t;
                    }
                }
                const auto it = data_by_name.find(e.subject());
                if (it == data_by_name.end()) throw;
                opts.constant_inputs[e.subject()] = it->second;
            }
        }
        // The remaining runtime inputs, matched to the test data by position among the inputs
        // that were not bound as constants.
        std::vector<ml::tensor> all_inputs, inputs, expected;
        std::vector<std::string> all_names;
        for (int i = 0; fs::exists(data / ("input_" + std::to_string(i) + ".pb")); ++i) {
            std::string name;
            all_inputs.push_back(ml::read_tensor_file(data / ("input_" + std::to_string(i) + ".pb"), &name));
            all_names.push_back(name);
        }
        for (size_t i = 0; i < all_inputs.size(); ++i)
            if (!opts.constant_inputs.count(all_names[i])) inputs.push_back(all_inputs[i]);
        for (int i = 0; fs::exists(data / ("output_" + std::to_string(i) + ".pb")); ++i)
            expected.push_back(ml::read_tensor_file(data / ("output_" + std::to_string(i) + ".pb")));
        if (g.inputs.size() != inputs.size())
            return {outcome::fail, "model has " + std::to_string(g.inputs.size()) + " inputs, data has " + std::to_string(inputs.size())};
        std::map<std::string, ml::shape_t> shapes;
        bool differ = false;
        for (size_t i = 0; i < inputs.size(); ++i) {
            const ml::value& v = g.values[size_t(g.inputs[i])];
            shapes[v.name] = inputs[i].shape;
            differ |= v.shape != inputs[i].shape;
        }
        if (differ) g.specialize(shapes);
        auto m = rt.load_graph(std::move(g), dir.filename());
        auto in = rt.link_model(m);
        std::string check = in->current_plan().check_idempotence();
        if (!check.empty()) return {outcome::fail, "idempotence: " + check};
        std::vector<ml::tensor> got;
        rt.infer_batch(*in, inputs, got);
        if (got.size() < expected.size()) return {outcome::fail, "fewer outputs than the reference"};
        double worst = 0;
        for (size_t o = 0; o < expected.size(); ++o) {
            if (got[o].shape != expected[o].shape)
                return {outcome::fail, "output " + std::to_string(o) + " shape " + ml::shape_str(got[o].shape) +
                                           ", expected " + ml::shape_str(expected[o].shape)};
            const int64_t n = expected[o].elements();
            for (int64_t i = 0; i < n; ++i) {
                const double a = got[o].as_f64(i), b = expected[o].as_f64(i);
                const double err = std::fabs(a - b);
                if (std::isnan(a) != std::isnan(b) || (!std::isnan(b) && err > atol + rtol * std::fabs(b))) {
                    char msg[200];
                    std::snprintf(msg, sizeof msg, "output %zu element %lld: got %.7g, expected %.7g", o,
                                  static_cast<long long>(i), a, b);
                    return {outcome::fail, msg};
                }
                if (!std::isnan(b)) worst = std::max(worst, err);
            }
        }
        char msg[64];
        std::snprintf(msg, sizeof msg, "max abs error %.3g", worst);
        return {outcome::pass, msg};
    } catch (const ml::model_error& e) {
        switch (e.code()) {
        case ml::model_error::kind::unsupported_operator:
        case ml::model_error::kind::unsupported_dtype:
        case ml::model_error::kind::unsupported_feature:
        case ml::model_error::kind::unsupported_opset:
        case ml::model_error::kind::dynamic:
            return {outcome::skip, e.what()};
        default:
            return {outcome::fail, e.what()};
        }
    } catch (const std::exception& e) {
        return {outcome::fail, e.what()};
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"reefconform: run an ONNX backend-test suite on a reefline device backend (cpu by default)"};
    std::string dir, filter;
    double rtol = 1e-3, atol = 1e-5;
    bool quiet = false;
    app.add_option("DIR", dir, "suite directory (test_*/model.onnx + test_data_set_0)")->required()->check(CLI::ExistingDirectory);
    app.add_option("--filter", filter, "only cases whose name contains this");
    app.add_option("--rtol", rtol, "relative tolerance")->capture_default_str();
    app.add_option("--atol", atol, "absolute tolerance")->capture_default_str();
    app.add_flag("--quiet", quiet, "print failures and the summary only");
    std::string backend = "cpu";
    reefline::gpu::add_backend_option(app, backend);
    CLI11_PARSE(app, argc, argv);

    std::vector<fs::path> cases;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_directory() && fs::exists(e.path() / "model.onnx") &&
            e.path().filename().string().find(filter) != std::string::npos)
            cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    auto device = reefline::gpu::make_backend(backend);
    ml::runtime rt(*device);
    int passed = 0, failed = 0, skipped = 0;
    for (const auto& c : cases) {
        const outcome o = run_case(rt, c, rtol, atol);
        const char* tag = o.result == outcome::pass ? "PASS" : o.result == outcome::fail ? "FAIL" : "SKIP";
        if (!quiet || o.result == outcome::fail)
            std::printf("%s %s: %s\n", tag, c.filename().c_str(), o.detail.c_str());
        (o.result == outcome::pass ? passed : o.result == outcome::fail ? failed : skipped)++;
    }
    std::printf("passed=%d failed=%d skipped=%d\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
