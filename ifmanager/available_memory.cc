#include "ifmanager/available_memory.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "ifmanager/byte_size.h"

namespace reefline::ifm {

namespace fs = std::filesystem;

namespace {

// A limit at or above this is "no limit" (v1 writes PAGE_COUNTER_MAX pages, ~2^63 bytes).
constexpr uint64_t unlimited = uint64_t(1) << 60;

std::optional<uint64_t> read_number(const fs::path& file) {
    std::ifstream in(file);
    std::string word;
    if (!(in >> word)) return std::nullopt;
    if (word == "max") return unlimited;
    try {
        size_t used = 0;
        const uint64_t v = std::stoull(word, &used);
        if (used != word.size()) return std::nullopt;
        return v;
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

// A key's value in a "key value" file (memory.stat).
std::optional<uint64_t> stat_value(const fs::path& file, const std::string& key) {
    std::ifstream in(file);
    std::string k;
    uint64_t v = 0;
    while (in >> k >> v)
        if (k == key) return v;
    return std::nullopt;
}

// mountinfo escapes blanks and backslashes in paths as \ooo.
std::string unescape(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
            out += char(std::stoi(s.substr(i + 1, 3), nullptr, 8));
            i += 3;
        } else {
            out += s[i];
        }
    }
    return out;
}

struct hierarchy {
    bool v2 = false;
    std::string mount_root, mount_point;
};

std::vector<hierarchy> memory_mounts(const std::string& proc) {
    std::vector<hierarchy> out;
    std::ifstream in(proc + "/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::vector<std::string> w;
        for (std::string x; f >> x;) w.push_back(x);
        const auto dash = std::find(w.begin(), w.end(), "-");
        if (w.size() < 5 || dash == w.end() || dash + 1 == w.end()) continue;
        const std::string type = *(dash + 1);
        const std::string super = dash + 3 < w.end() ? *(dash + 3) : "";
        hierarchy h;
        h.mount_root = unescape(w[3]);
        h.mount_point = unescape(w[4]);
        if (type == "cgroup2") {
            h.v2 = true;
        } else if (type == "cgroup") {
            std::istringstream opts(super);
            bool memory = false;
            for (std::string o; std::getline(opts, o, ',');) memory |= o == "memory";
            if (!memory) continue;
        } else {
            continue;
        }
        out.push_back(h);
    }
    return out;
}

// The daemon's cgroup path in each hierarchy: (v2, path).
std::vector<std::pair<bool, std::string>> own_cgroups(const std::string& proc) {
    std::vector<std::pair<bool, std::string>> out;
    std::ifstream in(proc + "/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
        const auto a = line.find(':'), b = line.find(':', a == std::string::npos ? a : a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (id == "0" && controllers.empty()) {
            out.emplace_back(true, path);
            continue;
        }
        std::istringstream c(controllers);
        for (std::string x; std::getline(c, x, ',');)
            if (x == "memory") out.emplace_back(false, path);
    }
    return out;
}

}  // namespace

uint64_t available_memory::bytes() const {
    if (cgroup_bytes && (host_bytes == 0 || *cgroup_bytes < host_bytes)) return *cgroup_bytes;
    return host_bytes;
}

const char* available_memory::source() const {
    return cgroup_bytes && (host_bytes == 0 || *cgroup_bytes < host_bytes) ? "cgroup" : "host";
}

std::string available_memory::describe() const {
    std::string s;
    if (cgroup_bytes) {
        s = format_byte_size(double(*cgroup_bytes)) + " available in cgroup " + cgroup + " (limit " +
            format_byte_size(double(cgroup_limit.value_or(0))) + "); the host has " + format_byte_size(double(host_bytes));
    } else {
        s = format_byte_size(double(host_bytes)) + " available on the host (MemAvailable; no memory cgroup limit)";
    }
    return s;
}

available_memory read_available_memory(const std::string& proc) {
    available_memory m;
    {
        std::ifstream in(proc + "/meminfo");
        std::string key, unit;
        uint64_t kib = 0;
        while (in >> key >> kib) {
            std::getline(in, unit);
            if (key == "MemAvailable:") {
                m.host_bytes = kib * 1024;
                break;
            }
        }
    }
    const std::vector<hierarchy> mounts = memory_mounts(proc);
    for (const auto& [v2, path] : own_cgroups(proc)) {
        for (const hierarchy& h : mounts) {
            if (h.v2 != v2) continue;
            // The part of the hierarchy this mount shows starts at its root (a container sees
            // its own cgroup as "/").
            std::string rel = path;
            if (h.mount_root != "/" && rel.rfind(h.mount_root, 0) == 0) rel = rel.substr(h.mount_root.size());
            fs::path dir = fs::path(h.mount_point) / fs::path(rel).relative_path();
            std::error_code ec;
            if (!fs::is_directory(dir, ec)) dir = h.mount_point;
            const fs::path top = fs::path(h.mount_point).lexically_normal();
            for (fs::path d = dir.lexically_normal();; d = d.parent_path()) {
                std::optional<uint64_t> limit, usage, reclaimable;
                if (v2) {
                    limit = read_number(d / "memory.max");
                    usage = read_number(d / "memory.current");
                    reclaimable = stat_value(d / "memory.stat", "inactive_file");
                } else {
                    limit = read_number(d / "memory.limit_in_bytes");
                    usage = read_number(d / "memory.usage_in_bytes");
                    reclaimable = stat_value(d / "memory.stat", "total_inactive_file");
                    // Ancestors a container's mount does not show.
                    if (const auto h_limit = stat_value(d / "memory.stat", "hierarchical_memory_limit");
                        h_limit && (!limit || *h_limit < *limit))
                        limit = h_limit;
                }
                if (limit && *limit < unlimited && usage) {
                    const uint64_t used = *usage - std::min(*usage, reclaimable.value_or(0));
                    const uint64_t free = *limit > used ? *limit - used : 0;
                    if (!m.cgroup_bytes || free < *m.cgroup_bytes) {
                        m.cgroup_bytes = free;
                        m.cgroup_limit = *limit;
                        m.cgroup = std::string(v2 ? "v2 " : "v1 ") + d.string();
                    }
                }
                if (d == top || d == d.parent_path() || d.string().size() <= top.string().size()) break;
            }
        }
    }
    return m;
}

}  // namespace reefline::ifm
