#include "dataplane/counters.h"

#include <string>

namespace reefline::dp {

void counter_snapshot::add(const rx_counters& c) {
    // Drops before rx_packets: the lcore counts packets in rx_packets before it drops any of
    // them (struct counter), so reading in this order keeps drops_total() <= rx_packets.
    for (size_t i = 0; i < drop_reason_count; ++i) drops[i] += c.drops[i].get();
#define X(name, help) name += c.name.get();
    REEFLINE_RX_COUNTERS(X)
#undef X
}

void counter_snapshot::add(const tx_counters& c) {
#define X(name, help) name += c.name.get();
    REEFLINE_TX_COUNTERS(X)
#undef X
}

void counter_snapshot::add(const if_counters& c) {
#define X(name) name += c.name.get();
    REEFLINE_IF_COUNTERS(X)
#undef X
}

uint64_t counter_snapshot::drops_total() const {
    uint64_t t = 0;
    for (auto d : drops) t += d;
    return t;
}

std::string counter_snapshot::to_json() const {
    std::string s = "{";
    auto field = [&](std::string_view key, uint64_t v) {
        if (s.size() > 1) s += ',';
        s += '"';
        s += key;
        s += "\":";
        s += std::to_string(v);
    };
#define X(name, ...) field(#name, name);
    REEFLINE_RX_COUNTERS(X)
    REEFLINE_TX_COUNTERS(X)
    REEFLINE_IF_COUNTERS(X)
#undef X
    for (size_t i = 0; i < drop_reason_count; ++i)
        field(std::string("drop_") + std::string(drop_reason_names[i]), drops[i]);
    field("drops_total", drops_total());
    s += '}';
    return s;
}

}  // namespace reefline::dp
