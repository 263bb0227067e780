// CRC32C (Castagnoli, iSCSI polynomial 0x1EDC6F41, reflected, init and final xor ~0).
// Incremental: crc32c_extend(crc32c_extend(0, a), b) == crc32c(a ++ b), so a gather list
// is hashed segment by segment without reassembling it. Uses SSE4.2 when the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace reefline {

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t length);
inline uint32_t crc32c(const void* data, size_t length) { return crc32c_extend(0, data, length); }

}  // namespace reefline
