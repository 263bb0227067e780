// The tiny zoo's models for a test fixture: build/tools/zoo (REEFLINE_ZOO, set by meson test)
// writes them into a fresh directory of its own.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace reefline::testing {

// Writes the tiny variants of `models` (comma-separated zoo names) into <tmp>/<name>.<pid>
// with the zoo tool at `zoo`; returns that directory, or an empty path when the tool failed.
inline std::filesystem::path write_tiny_zoo(const char* zoo, const std::string& name, const std::string& models) {
    const auto dir = std::filesystem::temp_directory_path() / (name + "." + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string cmd = std::string(zoo) + " --out " + dir.string() + " --tiny --only " + models + " -q";
    if (std::system(cmd.c_str()) != 0) return {};
    return dir;
}

}  // namespace reefline::testing
