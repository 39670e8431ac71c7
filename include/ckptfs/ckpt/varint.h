// Protobuf base-128 varints, as the checkpoint and strategy wire formats use them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace ckptfs::ckpt {

// Appends the varint encoding of `value` (a negative int64 takes 10 bytes, as protobuf writes it).
void put_varint(std::string& out, uint64_t value);

// Bytes put_varint would append.
size_t varint_size(uint64_t value);

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
