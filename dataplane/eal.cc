#include "dataplane/eal.h"

#include <fcntl.h>
#include <pthread.h>
#include <rte_eal.h>
#include <rte_lcore.h>
#include <sched.h>
#include <rte_errno.h>
#include <rte_log.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
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

// EAL's log while rte_eal_init runs: written on to stderr as usual, and the tail kept, because
// some failures (a file prefix in use) leave rte_errno at 0 and say why only in the log.
struct log_tee {
    std::string tail;

    static ssize_t write(void* cookie, const char* buf, size_t n) {
        auto& t = *static_cast<log_tee*>(cookie);
        std::fwrite(buf, 1, n, stderr);
        t.tail.append(buf, n);
        constexpr size_t keep = 4096;
        if (t.tail.size() > keep) t.tail.erase(0, t.tail.size() - keep);
        return ssize_t(n);
    }
};

// The value of an EAL option given as "--opt VALUE" or "--opt=VALUE", or `otherwise`.
std::string option_value(const std::vector<std::string>& args, const std::string& opt,
                         const std::string& otherwise) {
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == opt && i + 1 < args.size()) return args[i + 1];
        if (args[i].rfind(opt + "=", 0) == 0) return args[i].substr(opt.size() + 1);
    }
    return otherwise;
}

// The pid of another process that holds the lock on this file prefix's runtime configuration
// (what a primary process takes for its lifetime), or 0.
pid_t prefix_owner() {
    const char* dir = rte_eal_get_runtime_dir();
    if (!dir || !*dir) return 0;
    const std::string config = std::string(dir) + "/config";
    const int fd = ::open(config.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct flock probe{};
    probe.l_type = F_WRLCK;
    probe.l_whence = SEEK_SET;
    const bool locked = ::fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
    ::close(fd);
    return locked ? probe.l_pid : 0;
}

// The last line of EAL's log that says something, without the "EAL: " prefix.
std::string last_log_line(const std::string& log) {
    std::istringstream in(log);
    std::string line, last;
    while (std::getline(in, line))
        if (line.find_first_not_of(" \t") != std::string::npos) last = line;
    if (last.rfind("EAL: ", 0) == 0) last.erase(0, 5);
    return last;
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
    log_tee tee;
    FILE* log = fopencookie(&tee, "w", {nullptr, &log_tee::write, nullptr, nullptr});
    if (log) {
        std::setvbuf(log, nullptr, _IOLBF, 0);
        rte_openlog_stream(log);
    }
    cpu_set_t before;
    CPU_ZERO(&before);
    const bool had_mask = pthread_getaffinity_np(pthread_self(), sizeof before, &before) == 0;
    rte_errno = 0;
    const int rc = rte_eal_init(int(storage.size()), argv.data());
    const int err = rte_errno;
    if (log) {
        rte_openlog_stream(nullptr);  // back to EAL's own stream
        std::fclose(log);
    }
    if (rc >= 0) {
        if (had_mask) {
            cpu_set_t spread = before;
            unsigned lc;
            RTE_LCORE_FOREACH_WORKER(lc) {
                const rte_cpuset_t worker = rte_lcore_cpuset(lc);
                for (int c = 0; c < CPU_SETSIZE; ++c)
                    if (CPU_ISSET(c, &worker)) CPU_CLR(c, &spread);
            }
            // Workers on every CPU: the main lcore keeps EAL's pinning.
            if (CPU_COUNT(&spread) > 0) (void)pthread_setaffinity_np(pthread_self(), sizeof spread, &spread);
        }
        return;
    }

    std::string why;
    if (const pid_t owner = prefix_owner(); owner > 0 && owner != ::getpid()) {
        why = "the file prefix '" + option_value(args, "--file-prefix", "rte") +
              "' is in use by process " + std::to_string(owner) +
              " (another DPDK primary process); give this one its own with --file-prefix NAME, or "
              "share no files with --in-memory (--no-shconf with --no-huge)";
    } else if (err != 0) {
        why = rte_strerror(err);
        if (const std::string said = last_log_line(tee.tail); !said.empty()) why += " (" + said + ")";
    } else {
        why = last_log_line(tee.tail);
        if (why.empty()) why = "EAL gave no reason (rte_errno 0, nothing logged)";
    }
    throw std::runtime_error("EAL initialisation failed: " + why);
}

void eal_cleanup() { rte_eal_cleanup(); }

}  // namespace reefline::dp
