// The scheduling policies, one entry each: the list the daemon's --policy, disb's --policies,
// their help and errors, the docs check (tests/registry_docs_test.sh) and the scheduler tests
// read.
//
// Adding a policy touches three files: preempt/policies/<name>.cc (a scheduling_policy,
// preempt/policy.h, and its make_<name>_policy), this header (its enumerator, factory and
// entry), and its line in preempt/meson.build.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace reefline::gpu {

enum class policy : uint8_t { reef, rt_only, seq, streams, prema, abacus };

class scheduler;
class scheduling_policy;  // preempt/policy.h: what a policy implements

// The policies (preempt/policies/*.cc).
std::unique_ptr<scheduling_policy> make_reef_policy(scheduler& s);
std::unique_ptr<scheduling_policy> make_rt_only_policy(scheduler& s);
std::unique_ptr<scheduling_policy> make_seq_policy(scheduler& s);
std::unique_ptr<scheduling_policy> make_streams_policy(scheduler& s);
std::unique_ptr<scheduling_policy> make_prema_policy(scheduler& s);
std::unique_ptr<scheduling_policy> make_abacus_policy(scheduler& s);

struct policy_entry {
    policy id;
    const char* name;
    const char* help;  // one line
    bool preempts;     // an RT arrival stops running BE work
    bool pads;         // may fill idle units with BE work (DKP: reef only)
    std::unique_ptr<scheduling_policy> (*make)(scheduler& s);
};

inline const std::vector<policy_entry>& policies() {
    static const std::vector<policy_entry> table = {
        {.id = policy::reef, .name = "reef", .help = "RT runs at once: BE work is reset (preempted) and restored later; DKP pads",
         .preempts = true, .pads = true, .make = make_reef_policy},
        {.id = policy::rt_only, .name = "rt_only", .help = "BE tasks rejected: the RT latency reference",
         .preempts = false, .pads = false, .make = make_rt_only_policy},
        {.id = policy::seq, .name = "seq", .help = "one task at a time, RT first, never preempts",
         .preempts = false, .pads = false, .make = make_seq_policy},
        {.id = policy::streams, .name = "streams", .help = "everything concurrent on streams (RT highest priority), never preempts",
         .preempts = false, .pads = false, .make = make_streams_policy},
        {.id = policy::prema, .name = "prema", .help = "PREMA's token scheduling, one task at a time; drains or kills",
         .preempts = true, .pads = false, .make = make_prema_policy},
        {.id = policy::abacus, .name = "abacus", .help = "Abacus's deadline-aware operator groups (predictor: abacus_train)",
         .preempts = true, .pads = false, .make = make_abacus_policy},
    };
    return table;
}

const policy_entry* find_policy(const std::string& name);
std::string policy_names();  // "reef, rt_only, ...", for help and errors
const char* policy_name(policy p);
bool parse_policy(const char* s, policy& out);

}  // namespace reefline::gpu
