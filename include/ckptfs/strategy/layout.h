// Layout math (spec §3): which block of a global tensor each local rank of a stage holds, with
// optimizer weight sharding (§3.2) folded in as a further split of dimension 0.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ckptfs/strategy/strategy.h"

namespace ckptfs::strategy {

// Per-dimension half-open ranges in global element coordinates.
struct Box {
  std::vector<int64_t> begin;
  std::vector<int64_t> end;
  bool operator==(const Box&) const = default;
};

class Layout {
 public:
  // One device holding the whole tensor.
  static Layout unsharded(size_t tensor_rank);
  // Validates against `tensor_rank` (map length, axes in range and used once, opt shard size
  // dividing the replica count, step set when size is) and refuses field > 0 and manual
  // (param_split_shape) splits. Throws Error naming `param`.
  static Layout from(const ParamLayout& layout, size_t tensor_rank, std::string_view param);

  int64_t devices() const;
  size_t tensor_rank() const;
  // Blocks along each dimension; dimension 0 includes the optimizer split K.
  const std::vector<int64_t>& splits() const;
  // Block coordinates of a local rank (0 <= local_rank < devices()).
  std::vector<int64_t> block_of(int64_t local_rank) const;
  // Global shape from a stored slice shape (throws Error if its rank differs, or a dimension is
  // negative or overflows int64 once multiplied by its split).
  std::vector<int64_t> global_shape(std::span<const int64_t> slice_shape) const;
  // Stored slice shape of a global shape; throws Error naming `param` if a dimension does not
  // divide by its split.
  std::vector<int64_t> slice_shape(std::span<const int64_t> global_shape,
                                   std::string_view param) const;
  // The block of `global_shape` a local rank stores; throws Error if a dimension does not
  // divide by its split.
  Box slice_of(int64_t local_rank, std::span<const int64_t> global_shape) const;

  // The expanded form used by the needed-rank rule (spec §4.5 a): device axes outer->inner and,
  // per tensor dimension, the indices into those axes that split it, most significant first.
  // Axes of size 1 are left out (they never split anything); an axis that carries only part of
  // the optimizer split appears as two axes (rest, optimizer part), and the optimizer axes are
  // the least significant ones of dimension 0. The product of axes() is devices().
  const std::vector<int64_t>& axes() const;
  const std::vector<std::vector<int32_t>>& dim_axes() const;

  bool operator==(const Layout&) const = default;

 private:
  std::vector<int64_t> axes_;                   // device axis sizes, outer -> inner
  std::vector<std::vector<int32_t>> dim_axes_;  // per tensor dim: indices into axes_
  std::vector<int64_t> splits_;                 // per tensor dim: product of its axes
  int64_t devices_ = 1;
};

}  // namespace ckptfs::strategy
