// The CRC trailer of spec §1.7: "crc_num" + a 10-byte big-endian CRC-32 (zlib polynomial).
// Thread-safe: a pure function of its arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ckptfs::ckpt {

inline constexpr size_t kCrcTrailerBytes = 17;

// Continues a zlib-style CRC-32 (start with 0).
uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes);

}  // namespace ckptfs::ckpt
