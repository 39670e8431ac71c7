// MindSpore tensor_type strings (spec §1.4).
#pragma once

#include <cstdint>
#include <string_view>

namespace ckptfs::ckpt {

// Bytes per element of a dense tensor of this type; 0 when content is not a dense array of
// fixed-size elements ("str", "Int4", "random_op", names MindSpore cannot load).
uint32_t element_size(std::string_view tensor_type);

}  // namespace ckptfs::ckpt
