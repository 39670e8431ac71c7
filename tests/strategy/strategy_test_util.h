// Layout helpers shared by the strategy tests.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ckptfs/strategy/layout.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::testsupport {

// Classic map: one value per dimension, -1 = not split.
inline strategy::ParamLayout classic(std::vector<int64_t> dev, std::vector<int32_t> map,
                                     int32_t step = 0, int32_t size = 0) {
  strategy::ParamLayout layout;
  layout.dev_matrix = std::move(dev);
  for (int32_t a : map)
    layout.tensor_map.push_back(a == -1 ? strategy::DimAxes{} : strategy::DimAxes{a});
  layout.opt_shard_step = step;
  layout.opt_shard_size = size;
  return layout;
}

// The layout of parameter "w", of as many dimensions as the tensor map has.
inline strategy::Layout make(const strategy::ParamLayout& layout) {
  return strategy::Layout::from(layout, layout.tensor_map.size(), "w");
}

}  // namespace ckptfs::testsupport
