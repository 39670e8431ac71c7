// MindSpore tensor_type strings (spec §1.4): the one table of them. The safetensors codes
// (safetensors/format.h) and metadata.json's dtype names map onto these.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ckptfs::ckpt {

struct DenseType {
  std::string_view name;  // as MindSpore writes it: "Float32"
  uint32_t size;          // bytes per element
};

// Every tensor_type whose content is a dense array of fixed-size elements.
inline constexpr std::array<DenseType, 13> kDenseTypes{{{"Bool", 1},
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
                                                        {"BFloat16", 2}}};

// Bytes per element of a dense tensor of this type; 0 when content is not a dense array of
// fixed-size elements ("str", "Int4", "random_op", names MindSpore cannot load).
constexpr uint32_t element_size(std::string_view tensor_type) {
  for (const DenseType& t : kDenseTypes)
    if (t.name == tensor_type) return t.size;
  return 0;
}

}  // namespace ckptfs::ckpt
