#include "ckptfs/strategy/layout.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "ckptfs/error.h"

namespace ckptfs::strategy {

namespace {

// MindSpore prints one-axis dimensions as plain integers and multi-axis ones as lists.
std::string map_string(const std::vector<DimAxes>& map) {
  std::vector<std::string> dims;
  for (const DimAxes& axes : map) {
    if (axes.empty()) {
      dims.push_back("-1");
    } else if (axes.size() == 1) {
      dims.push_back(std::to_string(axes[0]));
    } else {
      dims.push_back(fmt::format("[{}]", fmt::join(axes, ",")));
    }
  }
  return fmt::format("[{}]", fmt::join(dims, ","));
}

// The optimizer split rides on the innermost replication axes (§3.2): how much of each
// original axis (outer -> inner) carries it; 1 = none. Throws when K does not factor over them.
std::vector<int64_t> optimizer_parts(const std::vector<int64_t>& dev,
                                     const std::vector<int>& used_by, int64_t k,
                                     std::string_view param) {
  std::vector<int64_t> parts(dev.size(), 1);
  int64_t rest = k;
  for (size_t i = dev.size(); i-- > 0 && rest > 1;) {
    if (used_by[i] >= 0 || dev[i] == 1) continue;
    if (rest % dev[i] == 0) {
      parts[i] = dev[i];
      rest /= dev[i];
    } else if (dev[i] % rest == 0) {
      parts[i] = rest;
      rest = 1;
    } else {
      fail(
          "parameter {}: optimizer shard size {} does not factor over the replication axes "
          "of dev_matrix [{}]",
          param, k, fmt::join(dev, ","));
    }
  }
  return parts;
}

}  // namespace

Layout Layout::unsharded(size_t tensor_rank) {
  Layout layout;
  layout.dim_axes_.assign(tensor_rank, {});
  layout.splits_.assign(tensor_rank, 1);
  return layout;
}

Layout Layout::from(const ParamLayout& in, size_t tensor_rank, std::string_view param) {
  const std::vector<int64_t>& dev = in.dev_matrix;
  if (dev.empty()) fail("parameter {}: dev_matrix is empty", param);
  int64_t devices = 1;
  for (int64_t d : dev) {
    if (d <= 0)
      fail("parameter {}: dev_matrix [{}] has a non-positive axis", param, fmt::join(dev, ","));
    if (devices > kMaxRanks / d)
      fail("parameter {}: dev_matrix [{}] spans more than {} devices", param, fmt::join(dev, ","),
           kMaxRanks);
    devices *= d;
  }
  // MindSpore's transform ignores these and produces wrong data (§3.4), so refuse.
  if (in.field > 0)
    fail("parameter {}: field-split layout (field {}) is not supported", param, in.field);
  if (!in.param_split_shape.empty())
    fail("parameter {}: manual uneven split (param_split_shape [{}]) is not supported", param,
         fmt::join(in.param_split_shape, ","));
  if (in.tensor_map.size() != tensor_rank)
    fail("parameter {}: tensor_map {} has {} dimensions but the tensor has {}", param,
         map_string(in.tensor_map), in.tensor_map.size(), tensor_rank);

  const int n = static_cast<int>(dev.size());
  std::vector<int> used_by(dev.size(), -1);
  std::vector<std::vector<int>> dim_orig(tensor_rank);
  int64_t model_split = 1;
  for (size_t j = 0; j < tensor_rank; ++j) {
    for (int32_t a : in.tensor_map[j]) {
      if (a < 0 || a >= n)
        fail(
            "parameter {}: tensor_map {} names device axis {} in dimension {}, but dev_matrix "
            "[{}] has {} axes",
            param, map_string(in.tensor_map), a, j, fmt::join(dev, ","), n);
      const int i = n - 1 - a;
      if (used_by[i] >= 0)
        fail("parameter {}: tensor_map {} uses device axis {} twice", param,
             map_string(in.tensor_map), a);
      used_by[i] = static_cast<int>(j);
      dim_orig[j].push_back(i);
      model_split *= dev[i];
    }
  }

  const int32_t step = in.opt_shard_step, size = in.opt_shard_size;
  const int64_t replicas = devices / model_split;
  if (size < -1) fail("parameter {}: opt_weight_shard_size {} is invalid", param, size);
  if (size > 0 && step == 0)
    fail("parameter {}: opt_weight_shard_size {} with opt_weight_shard_step 0 is not supported",
         param, size);
  int64_t k = 1;
  if (size != 0 && step != 0) k = size == -1 ? replicas : size;
  if (replicas % k != 0)
    fail("parameter {}: opt_weight_shard_size {} does not divide its {} replicas", param, size,
         replicas);
  if (k > 1 && tensor_rank == 0)
    fail("parameter {}: optimizer sharding (size {}) of a 0-d tensor", param, size);
  const std::vector<int64_t> parts = optimizer_parts(dev, used_by, k, param);

  Layout out;
  out.devices_ = devices;
  std::vector<int32_t> whole(dev.size(), -1), opt(dev.size(), -1);
  for (size_t i = 0; i < dev.size(); ++i) {
    const int64_t rest = dev[i] / parts[i];
    if (rest > 1) {
      whole[i] = static_cast<int32_t>(out.axes_.size());
      out.axes_.push_back(rest);
    }
    if (parts[i] > 1) {
      opt[i] = static_cast<int32_t>(out.axes_.size());
      out.axes_.push_back(parts[i]);
    }
  }
  out.dim_axes_.resize(tensor_rank);
  for (size_t j = 0; j < tensor_rank; ++j)
    for (int i : dim_orig[j])
      if (whole[i] >= 0) out.dim_axes_[j].push_back(whole[i]);
  if (k > 1)
    for (size_t i = 0; i < dev.size(); ++i)
      if (opt[i] >= 0) out.dim_axes_[0].push_back(opt[i]);
  out.splits_.assign(tensor_rank, 1);
  for (size_t j = 0; j < tensor_rank; ++j)
    for (int32_t a : out.dim_axes_[j]) out.splits_[j] *= out.axes_[a];

  // §7: MindSpore's transform re-derives a different assignment in this corner; we keep §3.2.
  if (k > 1 && std::count(used_by.begin(), used_by.end(), -1) == 1 && used_by[0] == -1) {
    std::vector<int> order;
    for (const auto& axes : dim_orig) order.insert(order.end(), axes.begin(), axes.end());
    if (!std::is_sorted(order.begin(), order.end()))
      spdlog::warn(
          "parameter {}: optimizer sharding with tensor_map {} on dev_matrix [{}]: "
          "following spec §3.2, MindSpore's transform may assign slices differently",
          param, map_string(in.tensor_map), fmt::join(dev, ","));
  }
  return out;
}

int64_t Layout::devices() const { return devices_; }

size_t Layout::tensor_rank() const { return splits_.size(); }

const std::vector<int64_t>& Layout::splits() const { return splits_; }

const std::vector<int64_t>& Layout::axes() const { return axes_; }

const std::vector<std::vector<int32_t>>& Layout::dim_axes() const { return dim_axes_; }

std::vector<int64_t> Layout::block_of(int64_t local_rank) const {
  if (local_rank < 0 || local_rank >= devices_)
    fail("local rank {} is out of range for a layout of {} devices", local_rank, devices_);
  // Row-major coordinates, last axis fastest (§3.1).
  std::vector<int64_t> coord(axes_.size());
  int64_t rest = local_rank;
  for (size_t i = axes_.size(); i-- > 0;) {
    coord[i] = rest % axes_[i];
    rest /= axes_[i];
  }
  std::vector<int64_t> block(dim_axes_.size(), 0);
  for (size_t j = 0; j < dim_axes_.size(); ++j)
    for (int32_t a : dim_axes_[j]) block[j] = block[j] * axes_[a] + coord[a];
  return block;
}

std::vector<int64_t> Layout::global_shape(std::span<const int64_t> slice_shape) const {
  if (slice_shape.size() != tensor_rank())
    fail("slice shape [{}] has {} dimensions but the layout has {}", fmt::join(slice_shape, ","),
         slice_shape.size(), tensor_rank());
  std::vector<int64_t> global(slice_shape.size());
  for (size_t j = 0; j < slice_shape.size(); ++j)
    if (slice_shape[j] < 0 || __builtin_mul_overflow(slice_shape[j], splits_[j], &global[j]))
      fail("slice shape [{}] split [{}] ways has no global shape within 64 bits",
           fmt::join(slice_shape, ","), fmt::join(splits_, ","));
  return global;
}

std::vector<int64_t> Layout::slice_shape(std::span<const int64_t> global_shape,
                                         std::string_view param) const {
  if (global_shape.size() != tensor_rank())
    fail("parameter {}: shape [{}] has {} dimensions but its layout has {}", param,
         fmt::join(global_shape, ","), global_shape.size(), tensor_rank());
  std::vector<int64_t> slice(global_shape.size());
  for (size_t j = 0; j < global_shape.size(); ++j) {
    if (global_shape[j] % splits_[j] != 0)
      fail("parameter {}: dimension {} of shape [{}] does not divide into {} blocks", param, j,
           fmt::join(global_shape, ","), splits_[j]);
    slice[j] = global_shape[j] / splits_[j];
  }
  return slice;
}

Box Layout::slice_of(int64_t local_rank, std::span<const int64_t> global_shape) const {
  if (global_shape.size() != tensor_rank())
    fail("shape [{}] has {} dimensions but the layout has {}", fmt::join(global_shape, ","),
         global_shape.size(), tensor_rank());
  const std::vector<int64_t> block = block_of(local_rank);
  Box box;
  for (size_t j = 0; j < global_shape.size(); ++j) {
    if (global_shape[j] % splits_[j] != 0)
      fail("dimension {} of shape [{}] does not divide into {} blocks", j,
           fmt::join(global_shape, ","), splits_[j]);
    const int64_t length = global_shape[j] / splits_[j];
    box.begin.push_back(block[j] * length);
    box.end.push_back((block[j] + 1) * length);
  }
  return box;
}

}  // namespace ckptfs::strategy
