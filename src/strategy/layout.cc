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

// The number of devices dev_matrix spans; refuses a non-positive axis and more than kMaxRanks.
int64_t device_count(const std::vector<int64_t>& dev, std::string_view param) {
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
  return devices;
}

// MindSpore's transform ignores field and manual splits and produces wrong data (§3.4), so they
// are refused, as is a tensor_map whose length is not the tensor's rank.
void refuse_unsupported(const ParamLayout& in, size_t tensor_rank, std::string_view param) {
  if (in.field > 0)
    fail("parameter {}: field-split layout (field {}) is not supported", param, in.field);
  if (!in.param_split_shape.empty())
    fail("parameter {}: manual uneven split (param_split_shape [{}]) is not supported", param,
         fmt::join(in.param_split_shape, ","));
  if (in.tensor_map.size() != tensor_rank)
    fail("parameter {}: tensor_map {} has {} dimensions but the tensor has {}", param,
         map_string(in.tensor_map), in.tensor_map.size(), tensor_rank);
}

// The tensor_map read against dev_matrix. Original axes are indexed outer -> inner (tensor_map
// counts them inner -> outer).
struct AxisUse {
  std::vector<int> used_by;                // per original axis: the tensor dim it splits, or -1
  std::vector<std::vector<int>> dim_orig;  // per tensor dim: the original axes splitting it
  int64_t model_split = 1;                 // product of the axes that split some dim
};

AxisUse map_axes(const ParamLayout& in, size_t tensor_rank, std::string_view param) {
  const std::vector<int64_t>& dev = in.dev_matrix;
  const int n = static_cast<int>(dev.size());
  AxisUse use{std::vector<int>(dev.size(), -1), std::vector<std::vector<int>>(tensor_rank), 1};
  for (size_t j = 0; j < tensor_rank; ++j) {
    for (int32_t a : in.tensor_map[j]) {
      if (a < 0 || a >= n)
        fail(
            "parameter {}: tensor_map {} names device axis {} in dimension {}, but dev_matrix "
            "[{}] has {} axes",
            param, map_string(in.tensor_map), a, j, fmt::join(dev, ","), n);
      const int i = n - 1 - a;
      if (use.used_by[i] >= 0)
        fail("parameter {}: tensor_map {} uses device axis {} twice", param,
             map_string(in.tensor_map), a);
      use.used_by[i] = static_cast<int>(j);
      use.dim_orig[j].push_back(i);
      use.model_split *= dev[i];
    }
  }
  return use;
}

// K, the optimizer split of dimension 0 over the replicas (1 = none), from
// opt_weight_shard_size (-1 = all replicas) and opt_weight_shard_step.
int64_t optimizer_split(const ParamLayout& in, int64_t replicas, size_t tensor_rank,
                        std::string_view param) {
  const int32_t step = in.opt_shard_step, size = in.opt_shard_size;
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
  return k;
}

// The expanded device axes (Layout::axes): each original axis of size > 1 becomes its
// non-optimizer rest and its optimizer part, each kept only when larger than 1.
struct ExpandedAxes {
  std::vector<int64_t> axes;  // sizes, outer -> inner
  std::vector<int32_t> rest;  // per original axis: index of its rest in axes, or -1
  std::vector<int32_t> opt;   // per original axis: index of its optimizer part in axes, or -1
};

ExpandedAxes expand_axes(const std::vector<int64_t>& dev, const std::vector<int64_t>& parts) {
  ExpandedAxes x{{}, std::vector<int32_t>(dev.size(), -1), std::vector<int32_t>(dev.size(), -1)};
  for (size_t i = 0; i < dev.size(); ++i) {
    const int64_t rest = dev[i] / parts[i];
    if (rest > 1) {
      x.rest[i] = static_cast<int32_t>(x.axes.size());
      x.axes.push_back(rest);
    }
    if (parts[i] > 1) {
      x.opt[i] = static_cast<int32_t>(x.axes.size());
      x.axes.push_back(parts[i]);
    }
  }
  return x;
}

// Per tensor dim, the expanded axes splitting it, most significant first; the optimizer parts
// are the least significant axes of dimension 0 (§3.2).
std::vector<std::vector<int32_t>> dim_axes_of(const AxisUse& use, const ExpandedAxes& x,
                                              int64_t k) {
  std::vector<std::vector<int32_t>> dim_axes(use.dim_orig.size());
  for (size_t j = 0; j < use.dim_orig.size(); ++j)
    for (int i : use.dim_orig[j])
      if (x.rest[i] >= 0) dim_axes[j].push_back(x.rest[i]);
  if (k > 1)
    for (int32_t o : x.opt)
      if (o >= 0) dim_axes[0].push_back(o);
  return dim_axes;
}

std::vector<int64_t> splits_of(const std::vector<std::vector<int32_t>>& dim_axes,
                               const std::vector<int64_t>& axes) {
  std::vector<int64_t> splits(dim_axes.size(), 1);
  for (size_t j = 0; j < dim_axes.size(); ++j)
    for (int32_t a : dim_axes[j]) splits[j] *= axes[a];
  return splits;
}

// §7: MindSpore's transform re-derives a different assignment in one corner (optimizer sharding
// on the one free axis, the outermost, with the map not in axis order); we keep §3.2 and say so.
void warn_if_transform_differs(const ParamLayout& in, const AxisUse& use, int64_t k,
                               std::string_view param) {
  if (k <= 1 || std::count(use.used_by.begin(), use.used_by.end(), -1) != 1 || use.used_by[0] != -1)
    return;
  std::vector<int> order;
  for (const auto& axes : use.dim_orig) order.insert(order.end(), axes.begin(), axes.end());
  if (!std::is_sorted(order.begin(), order.end()))
    spdlog::warn(
        "parameter {}: optimizer sharding with tensor_map {} on dev_matrix [{}]: "
        "following spec §3.2, MindSpore's transform may assign slices differently",
        param, map_string(in.tensor_map), fmt::join(in.dev_matrix, ","));
}

}  // namespace

Layout Layout::unsharded(size_t tensor_rank) {
  Layout layout;
  layout.dim_axes_.assign(tensor_rank, {});
  layout.splits_.assign(tensor_rank, 1);
  return layout;
}

Layout Layout::from(const ParamLayout& in, size_t tensor_rank, std::string_view param) {
  const int64_t devices = device_count(in.dev_matrix, param);
  refuse_unsupported(in, tensor_rank, param);
  const AxisUse use = map_axes(in, tensor_rank, param);
  const int64_t k = optimizer_split(in, devices / use.model_split, tensor_rank, param);
  const std::vector<int64_t> parts = optimizer_parts(in.dev_matrix, use.used_by, k, param);
  ExpandedAxes expanded = expand_axes(in.dev_matrix, parts);

  Layout out;
  out.devices_ = devices;
  out.dim_axes_ = dim_axes_of(use, expanded, k);
  out.axes_ = std::move(expanded.axes);
  out.splits_ = splits_of(out.dim_axes_, out.axes_);
  warn_if_transform_differs(in, use, k, param);
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
