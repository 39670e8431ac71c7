#include "ckptfs/ckpt/dtype.h"

#include <array>
#include <utility>

namespace ckptfs::ckpt {

uint32_t element_size(std::string_view tensor_type) {
  static constexpr std::array<std::pair<std::string_view, uint32_t>, 13> kSizes{{
      {"Bool", 1},
      {"Int8", 1},
      {"UInt8", 1},
      {"Int16", 2},
      {"UInt16", 2},
      {"Int32", 4},
      {"UInt32", 4},
      {"Int64", 8},
      {"UInt64", 8},
      {"Float16", 2},
      {"Float32", 4},
      {"Float64", 8},
      {"BFloat16", 2},
  }};
  for (const auto& [name, size] : kSizes)
    if (name == tensor_type) return size;
  return 0;
}

}  // namespace ckptfs::ckpt
