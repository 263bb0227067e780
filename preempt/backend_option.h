// The --backend option of a program that parses its command line with CLI11: the build's
// backends (preempt/backend_registry.h) as its choices and in its help. --device is accepted as
// the same option (the benchmarks' older spelling). Header-only; the including program links
// CLI11.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "preempt/backend_registry.h"

namespace reefline::gpu {

inline CLI::Option* add_backend_option(CLI::App& app, std::string& backend) {
    std::string help = "device backend:";
    for (const auto& b : backends()) help += std::string("\n  ") + b.name + ": " + b.help;
    return app.add_option("--backend,--device", backend, help)
        ->capture_default_str()
        ->check(CLI::IsMember(backend_name_list()));
}

}  // namespace reefline::gpu
