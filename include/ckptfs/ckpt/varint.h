// Protobuf base-128 varints, as the checkpoint and strategy wire formats use them.
// Thread-safe: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace ckptfs::ckpt {

namespace detail {
void put_long_varint(std::string& out, uint64_t value);
}

// Appends the varint encoding of `value` (a negative int64 takes 10 bytes, as protobuf writes it).
// Index build writes millions of them, most one byte long: that case is inline.
inline void put_varint(std::string& out, uint64_t value) {
  if (value < 0x80)
    out.push_back(static_cast<char>(value));
  else
    detail::put_long_varint(out, value);
}

// Bytes put_varint would append.
inline size_t varint_size(uint64_t value) {
  size_t n = 1;
  for (; value >= 0x80; value >>= 7) ++n;
  return n;
}

namespace detail {
std::optional<uint64_t> get_long_varint(std::span<const uint8_t> in, size_t& used);
}

// Decodes one varint at the start of `in`; nullopt if `in` ends first or it is longer than 10
// bytes. On success `used` is the number of bytes consumed. Most varints of a header walk (tags,
// lengths, small values) are one byte: that case is inline.
inline std::optional<uint64_t> get_varint(std::span<const uint8_t> in, size_t& used) {
  if (!in.empty() && in[0] < 0x80) {
    used = 1;
    return in[0];
  }
  return detail::get_long_varint(in, used);
}

}  // namespace ckptfs::ckpt
