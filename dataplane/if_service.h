// What the daemon needs of an IF that consumes complete requests from its ring: the built-in
// crc32 IF and model IFs (ifmanager/model_if.h) both implement it. The data plane itself only
// sees the if_binding (port -> ring).
#pragma once

#include <cstdint>
#include <string>

#include "dataplane/counters.h"
#include "dataplane/if_table.h"

namespace reefline::dp {

class if_service {
public:
    virtual ~if_service() = default;
    virtual if_binding binding() const = 0;
    // Answers what is queued (up to one batch); returns how many requests it consumed.
    virtual uint32_t poll() = 0;
    virtual uint32_t queued() const = 0;
    virtual const if_counters& counters() const = 0;
    virtual const std::string& name() const = 0;
};

}  // namespace reefline::dp
