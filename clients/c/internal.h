// libreefline-client internals shared by its translation units (not installed).
#pragma once

#include <cstdarg>
#include <cstdint>
#include <string>

#include "clients/c/reefline_client.h"
#include "clients/c/wire_header.h"
#include "clients/c/wire/protocol.h"

namespace reefline::client {

// Records the message for reefline_last_error() on this thread and returns `code`, so that
// failures read `return fail(REEFLINE_E_..., "what: %s", ...)`.
[[gnu::format(printf, 2, 3)]] int fail(int code, const char* format, ...);

inline uint32_t load_be32(const uint8_t* p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

}  // namespace reefline::client
