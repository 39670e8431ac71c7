#include "ckptfs/ckpt/varint.h"

namespace ckptfs::ckpt {

void detail::put_long_varint(std::string& out, uint64_t value) {
  // Built on the stack and appended once: a push_back per byte checks capacity every time.
  char bytes[10];
  size_t n = 0;
  while (value >= 0x80) {
    bytes[n++] = static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  bytes[n++] = static_cast<char>(value);
  out.append(bytes, n);
}

std::optional<uint64_t> detail::get_long_varint(std::span<const uint8_t> in, size_t& used) {
  uint64_t value = 0;
  for (size_t i = 0; i < in.size() && i < 10; ++i) {
    value |= static_cast<uint64_t>(in[i] & 0x7F) << (7 * i);
    if ((in[i] & 0x80) == 0) {
      // The tenth byte may only carry the top bit of a 64-bit value.
      if (i == 9 && in[i] > 1) return std::nullopt;
      used = i + 1;
      return value;
    }
  }
  return std::nullopt;
}

}  // namespace ckptfs::ckpt
