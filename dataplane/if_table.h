// The table from UDP destination port to IF, read by every rx lcore on every packet and
// replaced by the control side while traffic flows. Readers load one pointer; the writer
// builds a new map, swaps the pointer and waits (RCU quiescent-state based reclamation,
// rte_rcu_qsbr) until every reader has passed a quiescent point before freeing the old one.
#pragma once

#include <rte_rcu_qsbr.h>
#include <rte_ring.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace reefline::dp {

inline constexpr uint16_t max_ifs = 256;

// What the data plane needs of an IF: where to put its complete requests.
struct if_binding {
    std::string name;
    uint16_t udp_port = 0;
    uint16_t slot = 0;       // stable small index for per-IF counters
    rte_ring* ring = nullptr;  // multi-producer (rx lcores), single consumer (the IF)
};

struct port_map {
    std::vector<if_binding> bindings;
    std::array<const if_binding*, 65536> by_port{};
    std::array<const if_binding*, max_ifs> by_slot{};
};

class if_table {
public:
    explicit if_table(uint32_t max_readers);
    ~if_table();
    if_table(const if_table&) = delete;
    if_table& operator=(const if_table&) = delete;

    // Readers: one id per rx lcore, in [0, max_readers).
    void reader_online(uint32_t id);
    void reader_offline(uint32_t id);
    void quiescent(uint32_t id) { rte_rcu_qsbr_quiescent(_qsbr, id); }
    const port_map* current() const { return _current.load(std::memory_order_acquire); }
    static const if_binding* lookup(const port_map* m, uint16_t port) { return m->by_port[port]; }

    // Writer: replaces the whole table; returns once no reader can still see the old one.
    // Throws std::invalid_argument on duplicate ports or slots.
    void publish(std::vector<if_binding> bindings);
    std::vector<if_binding> bindings() const;

private:
    rte_rcu_qsbr* _qsbr = nullptr;
    uint32_t _max_readers;
    std::atomic<const port_map*> _current;
    mutable std::mutex _writer;
};

}  // namespace reefline::dp
