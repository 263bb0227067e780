// The wire header as the protocol declares it (wire/protocol.h: wire::fields) and as the client
// library's C API does (reefline_header): the same fields, host order. Not installed;
// shared by the library's sources and the in-tree tools built on it (reefgen).
#pragma once

#include "clients/c/reefline_client.h"
#include "clients/c/wire/protocol.h"

namespace reefline::client {

inline wire::fields to_wire(const reefline_header& h) {
    wire::fields f;
    f.kind = h.kind;
    f.format = h.format;
    f.status = h.status;
    f.request_id = h.request_id;
    f.frag_index = h.frag_index;
    f.frag_count = h.frag_count;
    f.payload_offset = h.payload_offset;
    f.total_length = h.total_length;
    for (int i = 0; i < 4; ++i) f.dims[i] = h.dims[i];
    return f;
}

inline reefline_header from_wire(const wire::fields& f) {
    reefline_header h{};
    h.kind = f.kind;
    h.format = f.format;
    h.status = f.status;
    h.request_id = f.request_id;
    h.frag_index = f.frag_index;
    h.frag_count = f.frag_count;
    h.payload_offset = f.payload_offset;
    h.total_length = f.total_length;
    for (int i = 0; i < 4; ++i) h.dims[i] = f.dims[i];
    return h;
}

}  // namespace reefline::client
