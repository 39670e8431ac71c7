// Shared by the strategy fuzz targets: read a strategy file, then put every layout it holds
// through the layout math a mount would apply, with slice shapes taken from the input.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/strategy/layout.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::fuzz {

inline void check_strategy(const std::filesystem::path& path) {
  strategy::Strategy s;
  try {
    s = strategy::read_strategy(path);
  } catch (const Error&) {
    return;
  }
  for (const auto& [name, param] : s.params) {
    for (const auto& [stage, in] : param.stages) {
      try {
        const auto layout = strategy::Layout::from(in, in.tensor_map.size(), name);
        // A slice shape as a checkpoint could claim it: the JSON tensor_shape when given, read
        // as a slice, else ones.
        std::vector<int64_t> slice(layout.tensor_rank(), 1);
        if (in.tensor_shape.size() == slice.size()) slice = in.tensor_shape;
        const std::vector<int64_t> global = layout.global_shape(slice);
        layout.slice_shape(global, name);
        layout.slice_of(0, global);
        layout.slice_of(layout.devices() - 1, global);
      } catch (const Error&) {
      }
    }
  }
}

}  // namespace ckptfs::fuzz
