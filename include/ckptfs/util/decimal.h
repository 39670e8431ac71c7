// A step or iteration number as trainers write it in their tracker files and as --step takes it:
// decimal digits only, surrounding whitespace allowed, at most 18 digits (so it never wraps).
// Thread-safety: a pure function.
#pragma once

#include <cctype>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ckptfs::util {

inline std::optional<uint64_t> parse_decimal(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  if (text.empty() || text.size() > 18) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

}  // namespace ckptfs::util
