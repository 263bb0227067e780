#include "tools/reefgen/reassembly.h"

#include <new>

#include "tools/reefgen/packet.h"

namespace reefline::reefgen {
namespace {

reefline_flow to_flow(const flow_key& k) { return reefline_flow{k.ip, k.port, k.request_id}; }

}  // namespace

std::string_view to_string(message_assembler::outcome o) { return reefline_add_outcome_name(int(o)); }

message_assembler::message_assembler(bool remember_completed, assembler_limits limits) {
    const reefline_assembler_options o{limits.max_pending, limits.max_pending_bytes, remember_completed ? 1 : 0};
    _assembler.reset(reefline_assembler_create(&o));
    if (!_assembler) throw std::bad_alloc();
}

message_assembler::outcome message_assembler::add(const flow_key& key, const wire::fields& f,
                                                  std::span<const uint8_t> fragment,
                                                  assembled_message& completed) {
    const reefline_flow flow = to_flow(key);
    const reefline_header h = to_client(f);
    reefline_message m;
    const int rc = reefline_assembler_add(_assembler.get(), &flow, &h, fragment.data(), fragment.size(), &m);
    if (rc < 0) throw std::bad_alloc();  // every argument is valid: memory ran out
    if (rc == REEFLINE_ADD_COMPLETED) {
        completed.key = key;
        completed.head = from_client(m.head);
        completed.payload.assign(m.payload, m.payload + m.length);
        completed.tiles = m.tiles != 0;
    }
    return static_cast<outcome>(rc);
}

std::vector<message_assembler::pending_info> message_assembler::pending() const {
    std::vector<reefline_pending> raw(reefline_assembler_pending(_assembler.get(), nullptr, 0));
    raw.resize(reefline_assembler_pending(_assembler.get(), raw.data(), raw.size()));
    std::vector<pending_info> out;
    out.reserve(raw.size());
    for (const reefline_pending& p : raw)
        out.push_back({flow_key{p.flow.ip, p.flow.port, p.flow.request_id}, from_client(p.head), p.received});
    return out;
}

bool message_assembler::is_completed(const flow_key& key) const {
    const reefline_flow flow = to_flow(key);
    return reefline_assembler_is_completed(_assembler.get(), &flow) != 0;
}

}  // namespace reefline::reefgen
