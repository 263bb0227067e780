#include "dataplane/if_table.h"

#include <rte_malloc.h>

#include <stdexcept>

namespace reefline::dp {

if_table::if_table(uint32_t max_readers) : _max_readers(max_readers), _current(new port_map) {
    const size_t size = rte_rcu_qsbr_get_memsize(max_readers);
    _qsbr = static_cast<rte_rcu_qsbr*>(rte_zmalloc("if_table_qsbr", size, RTE_CACHE_LINE_SIZE));
    if (!_qsbr || rte_rcu_qsbr_init(_qsbr, max_readers) != 0)
        throw std::runtime_error("if_table: cannot allocate the RCU variable");
}

if_table::~if_table() {
    delete _current.load();
    rte_free(_qsbr);
}

void if_table::reader_online(uint32_t id) {
    rte_rcu_qsbr_thread_register(_qsbr, id);
    rte_rcu_qsbr_thread_online(_qsbr, id);
}

void if_table::reader_offline(uint32_t id) {
    rte_rcu_qsbr_thread_offline(_qsbr, id);
    rte_rcu_qsbr_thread_unregister(_qsbr, id);
}

void if_table::publish(std::vector<if_binding> bindings) {
    auto next = std::make_unique<port_map>();
    next->bindings = std::move(bindings);
    std::array<bool, max_ifs> slots{};
    for (const auto& b : next->bindings) {
        if (b.slot >= max_ifs || slots[b.slot])
            throw std::invalid_argument("if_table: IF '" + b.name + "' has a bad or duplicate slot");
        if (next->by_port[b.udp_port])
            throw std::invalid_argument("if_table: UDP port " + std::to_string(b.udp_port) +
                                        " is already used by IF '" +
                                        next->by_port[b.udp_port]->name + "'");
        slots[b.slot] = true;
        next->by_port[b.udp_port] = &b;
        next->by_slot[b.slot] = &b;
    }
    std::lock_guard lock(_writer);
    const port_map* old = _current.exchange(next.release(), std::memory_order_acq_rel);
    // Readers that are offline (stopped lcores) are not waited for.
    rte_rcu_qsbr_synchronize(_qsbr, RTE_QSBR_THRID_INVALID);
    delete old;
}

std::vector<if_binding> if_table::bindings() const {
    std::lock_guard lock(_writer);
    return _current.load(std::memory_order_acquire)->bindings;
}

}  // namespace reefline::dp
