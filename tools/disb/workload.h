// DISB workloads (REEF, OSDI'22, §7.1 Table 2): which clients send what, and when.
//
//   A     1 RT client (VGG-19, uniform) + 1 BE client (ResNet-50, closed loop)
//   B     A with the RT client at 2.2x A's rate
//   C     1 RT client (VGG-19, uniform) + 5 BE clients (ResNet-50, VGG-19, DenseNet-201,
//         Inception-v3, BERT)
//   D     5 RT clients, one per model, uniform + the 5 BE clients of C
//   E     D with Poisson arrivals
//   REAL  a synthetic perception stack: cameras at 10-30 Hz with jitter and bursts (RT), plus the
//         BE clients of C
//
// REEF chose its rates for an AMD MI50 (VGG-19 at 100 req/s is ~40% of that GPU, 220 req/s
// saturates it run back to back). Here a client's rate comes from the share of the device it
// should take (its `utilisation`): rate = utilisation / its model's isolated latency on this
// device (`--scale auto`), so that every workload loads the device as it loaded REEF's GPU.
//
// A workload can also come from a file: CSV lines `client,model,class,pattern,value` where
// pattern is uniform|poisson (value: requests per second, or `u0.4` for a utilisation),
// closed (value ignored), or trace (value: space-separated arrival times in seconds); or JSON
// {"clients": [{"name", "model", "class", "pattern", "rate" | "utilisation" | "trace": [...]}]}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace reefline::disb {

enum class pattern : uint8_t { uniform, poisson, closed, trace, camera };

struct client_spec {
    std::string name;          // "rt0", "be2", ...
    std::string model;         // zoo name: vgg19, resnet50, densenet201, inception_v3, bert, ...
    bool rt = false;
    pattern arrivals = pattern::closed;
    double rate = 0;           // requests per second (uniform, poisson, camera); 0: from utilisation
    double utilisation = 0;    // the device share the client's load should take (--scale auto)
    std::vector<double> trace; // arrival times, seconds (trace)
};

struct workload {
    std::string name;
    std::vector<client_spec> clients;
};

// A, B, C, D, E or REAL. Throws std::invalid_argument for another name.
workload builtin(const std::string& name);
// The names of the built-in workloads, in order.
const std::vector<std::string>& builtin_names();
// A workload from a CSV or JSON file (by extension). Throws std::invalid_argument naming the
// line or field that is wrong.
workload from_file(const std::string& path);

// Arrival times (seconds from 0, ascending) of an open-loop client over [0, seconds), from
// `seed` (the same for every policy). Closed-loop clients have none.
std::vector<double> arrivals(const client_spec& c, double seconds, uint64_t seed);

const char* pattern_name(pattern p);

}  // namespace reefline::disb
