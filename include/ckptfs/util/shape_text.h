// A tensor shape (or any list of dimensions) as "[2,3,4]", the one spelling used by messages,
// the status JSON and the CLI's tables.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <span>
#include <string>

namespace ckptfs {

inline std::string shape_text(std::span<const int64_t> dims) {
  return fmt::format("[{}]", fmt::join(dims, ","));
}

}  // namespace ckptfs
