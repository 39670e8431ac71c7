#include "ckptfs/ckpt/crc32.h"

#include <zlib.h>

#include <algorithm>
#include <climits>

namespace ckptfs::ckpt {

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes) {
  uLong value = crc;
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), UINT_MAX);
    value = ::crc32(value, bytes.data(), static_cast<uInt>(n));
    bytes = bytes.subspan(n);
  }
  return static_cast<uint32_t>(value);
}

}  // namespace ckptfs::ckpt
