#include "dataplane/eal.h"

#include <rte_eal.h>
#include <rte_errno.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace reefline::dp {

namespace {

bool hugetlbfs_mounted() {
    std::ifstream mounts("/proc/mounts");
    std::string dev, dir, type;
    std::string rest;
    while (mounts >> dev >> dir >> type && std::getline(mounts, rest))
        if (type == "hugetlbfs") return true;
    return false;
}

long free_hugepages_mb() {
    std::ifstream info("/proc/meminfo");
    std::string key;
    long value = 0, free_pages = 0, page_kb = 0;
    std::string unit;
    while (info >> key >> value) {
        std::getline(info, unit);
        if (key == "HugePages_Free:") free_pages = value;
        if (key == "Hugepagesize:") page_kb = value;
    }
    return free_pages * page_kb / 1024;
}

}  // namespace

std::vector<std::string> eal_memory_args(unsigned no_huge_mb) {
    if (hugetlbfs_mounted() && free_hugepages_mb() >= long(no_huge_mb) / 2) return {};
    return {"--no-huge", "-m", std::to_string(no_huge_mb)};
}

std::vector<std::string> eal_default_args(const std::string& lcores) {
    std::vector<std::string> a = {"-l", lcores, "--no-pci", "--no-telemetry",
                                  "--log-level", "lib.eal:error"};
    const auto mem = eal_memory_args();
    // --no-huge implies legacy memory, which --in-memory refuses; --no-shconf keeps such
    // processes from sharing (or colliding on) a runtime config file instead.
    a.push_back(mem.empty() ? "--in-memory" : "--no-shconf");
    a.insert(a.end(), mem.begin(), mem.end());
    return a;
}

std::vector<std::string> eal_split(const std::string& args) {
    std::istringstream in(args);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

void eal_init(const std::string& program, const std::vector<std::string>& args) {
    std::vector<std::string> storage;
    storage.push_back(program);
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    if (rte_eal_init(int(storage.size()), argv.data()) < 0)
        throw std::runtime_error(std::string("EAL initialisation failed: ") + rte_strerror(rte_errno));
}

void eal_cleanup() { rte_eal_cleanup(); }

}  // namespace reefline::dp
