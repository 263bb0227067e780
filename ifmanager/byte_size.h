// Byte sizes as operators write and read them ("2G", "512M", "1.5 GiB"), shared by the daemon's
// flags (--memory-budget, --max-model-file), its messages and reefctl's tables.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

namespace reefline::ifm {

// "2G", "512M", "64k", "1.5GiB", "3T", "4096" (bytes); suffixes K M G T (powers of 1024), with
// an optional "i", "B" or "iB", in either case. Throws std::invalid_argument naming the text
// for anything else, for 0, and for sizes of 2^60 bytes or more.
inline uint64_t parse_byte_size(const std::string& text) {
    const auto bad = [&](const char* why) {
        return std::invalid_argument("'" + text + "' is not a size (" + why + "; e.g. 2G, 512M, 1.5GiB or bytes)");
    };
    size_t used = 0;
    double value = 0;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
        throw bad("no number");
    }
    if (text.find_first_of("xXpP") != std::string::npos || !std::isfinite(value)) throw bad("not a decimal number");
    std::string unit = text.substr(used);
    if (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
    for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
    if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
    double scale = 1;
    if (unit.empty() || unit == "B") scale = 1;
    else if (unit == "K") scale = 0x1p10;
    else if (unit == "M") scale = 0x1p20;
    else if (unit == "G") scale = 0x1p30;
    else if (unit == "T") scale = 0x1p40;
    else throw bad("unknown unit");
    const double bytes = std::floor(value * scale);
    if (!(bytes >= 1)) throw bad("must be at least 1 byte");
    if (bytes >= 0x1p60) throw bad("too large");
    return uint64_t(bytes);
}

// "512 B", "98.0 MiB", "3.1 GiB": one decimal from KiB up.
inline std::string format_byte_size(double bytes) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (std::fabs(bytes) >= 1024 && u < 5) bytes /= 1024, ++u;
    char buf[64];
    if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", bytes);
    else std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
    return buf;
}

}  // namespace reefline::ifm
