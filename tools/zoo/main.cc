// zoo: writes ONNX models with deterministic, Kaiming-scaled (untrained) weights.
//
//   zoo --out DIR [--tiny] [--seed S] [--only NAME,...] [--list]
//
// For each model NAME it writes DIR/NAME.onnx and DIR/NAME.json (inputs, outputs, suggested
// image normalisation, parameter count, op histogram); --tiny writes the tiny variants as
// DIR/NAME_tiny.onnx and DIR/NAME_tiny.json, so both sets can share a directory. --only also
// takes NAME_tiny. Exit status: 0 success, 1 a model could not be written, 2 bad usage.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "tools/zoo/zoo.h"

int main(int argc, char** argv) {
    using namespace reefline::zoo;
    CLI::App app{
        "Writes ONNX models (vgg19, resnet152, densenet201, densenet121, inception_v3, distilbert, bert, "
        "resnet50, alexnet, mobilenet_v2, sensor_tcn) with deterministic weights from a seed"};
    std::string out;
    bool tiny = false, list = false, quiet = false;
    uint64_t seed = 1;
    std::vector<std::string> only;
    app.add_option("--out", out, "Output directory (created if missing)");
    app.add_flag("--tiny", tiny,
                 "Write the tiny variants (same topology, small widths and inputs) as NAME_tiny");
    app.add_option("--seed", seed, "Seed: every weight follows from it and the tensor's name")
        ->capture_default_str();
    app.add_option("--only", only, "Models to write (comma-separated); default all")
        ->delimiter(',');
    bool no_calibration = false;
    app.add_flag("--no-calibration", no_calibration,
                 "Plain Kaiming weights and random BN statistics: skip the calibration run that "
                 "rescales layers and sets BN statistics (faster, worse-conditioned models)");
    bool write_calibration = false;
    app.add_flag("--write-calibration", write_calibration,
                 "Also write NAME.calib_input.pb and NAME.calib_output.pb: the calibration batch "
                 "and the zoo's own reference output for it (CNNs only)");
    app.add_flag("--list", list, "List the model names and exit");
    app.add_flag("-q,--quiet", quiet, "Print nothing on success");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (list) {
        for (const zoo_entry& e : registry()) std::cout << e.name << "\t" << e.description << "\n";
        return 0;
    }
    if (out.empty()) {
        std::cerr << "zoo: --out DIR is required\n";
        return 2;
    }

    // Resolve --only into (entry, tiny) pairs, keeping the registry's order.
    std::vector<std::pair<const zoo_entry*, bool>> to_write;
    if (only.empty()) {
        for (const zoo_entry& e : registry()) to_write.emplace_back(&e, tiny);
    } else {
        for (const std::string& raw : only) {
            std::string name = raw;
            bool t = tiny;
            if (name.size() > 5 && name.ends_with("_tiny")) {
                name.resize(name.size() - 5);
                t = true;
            }
            const zoo_entry* e = find(name);
            if (!e) {
                std::cerr << "zoo: unknown model '" << raw << "' (zoo --list names them)\n";
                return 2;
            }
            to_write.emplace_back(e, t);
        }
    }

    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) {
        std::cerr << "zoo: cannot create " << out << ": " << ec.message() << "\n";
        return 2;
    }
    for (const auto& [e, t] : to_write) {
        variant_options v;
        v.tiny = t;
        v.calibrate = !no_calibration;
        v.write_calibration = write_calibration;
        try {
            const write_result r = write_model(*e, out, v, seed);
            if (!quiet) {
                std::ostringstream line;
                line.setf(std::ios::fixed);
                line.precision(2);
                line << file_stem(e->name, t) << ".onnx: " << r.params << " params, " << r.nodes
                     << " nodes, " << static_cast<double>(r.onnx_bytes) / 1e6 << " MB, built in "
                     << r.build_s << " s, written in " << r.write_s << " s";
                std::cout << line.str() << std::endl;
            }
        } catch (const std::exception& ex) {
            std::cerr << "zoo: " << file_stem(e->name, t) << ": " << ex.what() << "\n";
            return 1;
        }
    }
    return 0;
}
