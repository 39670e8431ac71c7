#include "ckptfs/strategy/rank_list.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <utility>

#include "ckptfs/error.h"

namespace ckptfs::strategy {

TargetMaps::TargetMaps(const Strategy* src, const Strategy* dst, int64_t target_rank)
    : src_(src), dst_(dst) {
  n_src_ = src ? src->devices_per_stage : 1;
  n_dst_ = dst ? dst->devices_per_stage : 1;
  const int64_t stages = dst ? dst->num_stages : 1;
  if (target_rank < 0 || target_rank >= n_dst_ * stages)
    fail("target rank {} is out of range: the destination has {} device(s) x {} stage(s)",
         target_rank, n_dst_, stages);
  t_stage_ = target_rank / n_dst_;
  t_local_ = target_rank % n_dst_;
}

bool TargetMaps::in_effective_dst(std::string_view name) const {
  if (!dst_) return true;
  const StrategyParam* param = dst_->find(name);
  return param && param->stages.contains(static_cast<uint32_t>(t_stage_));
}

bool TargetMaps::in_effective_src(std::string_view name) const {
  if (!src_) return true;
  if (!src_->find(name)) return false;
  // The src map loses exactly the names the stage filter removed from the dst map.
  return !(dst_ && dst_->find(name) && !in_effective_dst(name));
}

TargetMaps::Role TargetMaps::role(std::string_view name) const {
  // The same rules as in_effective_src/dst, with one lookup per strategy: the planner asks
  // this for every name of every target.
  const StrategyParam* in_src = src_ ? src_->find(name) : nullptr;
  const StrategyParam* in_dst = dst_ ? dst_->find(name) : nullptr;
  const bool effective_dst =
      !dst_ || (in_dst && in_dst->stages.contains(static_cast<uint32_t>(t_stage_)));
  const bool filtered_from_dst = in_dst && !effective_dst;
  const bool effective_src = !src_ || (in_src && !filtered_from_dst);
  const bool src_removed = !src_ || (in_src && !effective_src);
  const bool dst_removed = !dst_ || filtered_from_dst;
  if (src_removed && dst_removed) return Role::Drop;
  if (effective_src && effective_dst) return Role::Reshard;
  return Role::Passthrough;
}

Layout TargetMaps::src_layout(std::string_view name, size_t tensor_rank) const {
  if (!src_) return Layout::unsharded(tensor_rank);
  const StrategyParam* param = src_->find(name);
  if (!param || param->stages.empty())
    fail("{}: parameter {} is not in the source strategy", src_->origin, name);
  try {
    return Layout::from(param->stages.begin()->second, tensor_rank, name);
  } catch (const Error& e) {
    fail("{}: {}", src_->origin, e.what());
  }
}

Layout TargetMaps::dst_layout(std::string_view name, size_t tensor_rank) const {
  if (!dst_) return Layout::unsharded(tensor_rank);
  const StrategyParam* param = dst_->find(name);
  if (!param) fail("{}: parameter {} is not in the destination strategy", dst_->origin, name);
  auto it = param->stages.find(static_cast<uint32_t>(t_stage_));
  if (it == param->stages.end())
    fail("{}: parameter {} is not in destination stage {}", dst_->origin, name, t_stage_);
  try {
    return Layout::from(it->second, tensor_rank, name);
  } catch (const Error& e) {
    fail("{}: {}", dst_->origin, e.what());
  }
}

std::vector<uint32_t> TargetMaps::src_stages(std::string_view name) const {
  if (!src_) return {0};
  std::vector<uint32_t> stages;
  if (const StrategyParam* param = src_->find(name))
    for (const auto& [stage, layout] : param->stages) stages.push_back(stage);
  return stages;
}

namespace {

// One side of §4.5 after padding to the common device count: axes outer -> inner and, per
// tensor dimension, its axes most significant first.
struct Side {
  std::vector<int64_t> axes;
  std::vector<std::vector<int32_t>> dims;
};

Side padded(const Layout& layout, int64_t devices) {
  Side side{layout.axes(), layout.dim_axes()};
  if (devices > layout.devices()) {
    side.axes.insert(side.axes.begin(), devices / layout.devices());
    for (auto& axes : side.dims)
      for (int32_t& a : axes) ++a;
  }
  return side;
}

void insert_suffix_products(const std::vector<int64_t>& axes, std::set<int64_t>& out) {
  int64_t product = 1;
  out.insert(product);
  for (size_t i = axes.size(); i-- > 0;) out.insert(product *= axes[i]);
}

// For each unified axis (indexed from the innermost, k = 0), the (tensor dimension, P) record of
// §4.5 d, if this side splits a dimension with it. `bounds` are the ascending suffix products.
std::vector<std::optional<std::pair<size_t, int64_t>>> records(const Side& side,
                                                               const std::vector<int64_t>& bounds) {
  std::vector<std::optional<std::pair<size_t, int64_t>>> out(bounds.size() - 1);
  // Original axis i spans the unified axes between the suffix products inner and outer of it.
  std::vector<int64_t> upper(side.axes.size());
  int64_t product = 1;
  for (size_t i = side.axes.size(); i-- > 0;) upper[i] = product *= side.axes[i];
  for (size_t j = 0; j < side.dims.size(); ++j) {
    int64_t p = 1;
    for (int32_t a : side.dims[j]) {
      const int64_t lower = upper[a] / side.axes[a];
      auto lo = std::lower_bound(bounds.begin(), bounds.end(), lower) - bounds.begin();
      auto hi = std::lower_bound(bounds.begin(), bounds.end(), upper[a]) - bounds.begin();
      for (auto k = hi; k-- > lo;) {
        p *= bounds[k + 1] / bounds[k];
        out[k] = std::pair{j, p};
      }
    }
  }
  return out;
}

// Blocks b of s parts and b2 of s2 parts overlap, compared in fractions of the dimension.
bool blocks_intersect(const std::vector<int64_t>& b, const std::vector<int64_t>& s,
                      const std::vector<int64_t>& b2, const std::vector<int64_t>& s2) {
  for (size_t j = 0; j < b.size(); ++j)
    if (!(b[j] * s2[j] < (b2[j] + 1) * s[j] && b2[j] * s[j] < (b[j] + 1) * s2[j])) return false;
  return true;
}

void check_target(const Layout& src, const Layout& dst, int64_t t_local) {
  if (src.tensor_rank() != dst.tensor_rank())
    fail("source layout has {} dimensions but destination layout has {}", src.tensor_rank(),
         dst.tensor_rank());
  if (t_local < 0 || t_local >= dst.devices())
    fail("target local rank {} is out of range for {} destination devices", t_local, dst.devices());
}

}  // namespace

NeededAnswer mindspore_answer(const Layout& src, const Layout& dst, int64_t t_local) {
  check_target(src, dst, t_local);
  const int64_t devices = std::max(src.devices(), dst.devices());
  const int64_t fewer = std::min(src.devices(), dst.devices());
  if (devices % fewer != 0)
    return {{},
            fmt::format("device counts {} and {} are not multiples of each other", src.devices(),
                        dst.devices())};
  const Side s = padded(src, devices), d = padded(dst, devices);

  std::set<int64_t> products;
  insert_suffix_products(s.axes, products);
  insert_suffix_products(d.axes, products);
  const std::vector<int64_t> bounds(products.begin(), products.end());
  for (size_t k = 0; k + 1 < bounds.size(); ++k)
    if (bounds[k + 1] % bounds[k] != 0)
      return {{},
              fmt::format("device matrices [{}] and [{}] cannot be unified: {} does not divide {}",
                          fmt::join(src.axes(), ","), fmt::join(dst.axes(), ","), bounds[k],
                          bounds[k + 1])};

  const auto src_records = records(s, bounds), dst_records = records(d, bounds);
  // Coordinates must match t_local on every axis the source does not gather; gathered axes
  // take every value.
  int64_t base = 0;
  std::vector<size_t> gathered;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    const int64_t size = bounds[k + 1] / bounds[k];
    if (src_records[k] && src_records[k] != dst_records[k]) {
      gathered.push_back(k);
    } else {
      base += (t_local / bounds[k]) % size * bounds[k];
    }
  }
  std::set<int64_t> ranks;
  std::vector<int64_t> digit(gathered.size(), 0);
  while (true) {
    int64_t rank = base;
    for (size_t g = 0; g < gathered.size(); ++g) rank += digit[g] * bounds[gathered[g]];
    ranks.insert(rank % src.devices());
    size_t g = 0;
    for (; g < gathered.size(); ++g) {
      const size_t k = gathered[g];
      if (++digit[g] < bounds[k + 1] / bounds[k]) break;
      digit[g] = 0;
    }
    if (g == gathered.size()) break;
  }
  return {{ranks.begin(), ranks.end()}, {}};
}

std::vector<int64_t> mindspore_needed(const Layout& src, const Layout& dst, int64_t t_local) {
  NeededAnswer answer = mindspore_answer(src, dst, t_local);
  if (!answer.found()) fail("{}", answer.no_answer);
  return std::move(answer.ranks);
}

std::vector<int64_t> minimal_needed(const Layout& src, const Layout& dst, int64_t t_local) {
  check_target(src, dst, t_local);
  const std::vector<int64_t> target = dst.block_of(t_local);
  std::vector<int64_t> out;
  for (int64_t r = 0; r < src.devices(); ++r)
    if (blocks_intersect(src.block_of(r), src.splits(), target, dst.splits())) out.push_back(r);
  return out;
}

const TransformMemo::Stage& TransformMemo::stage(const TargetMaps& maps) {
  if (src_ != maps.src() || dst_ != maps.dst()) {
    stages_.clear();
    src_ = maps.src();
    dst_ = maps.dst();
  }
  if (auto it = stages_.find(maps.target_stage()); it != stages_.end()) return it->second;
  Stage out;  // kept only once complete: a layout that cannot be used throws
  // Many parameters share a layout pair: each distinct pair is kept once, with the first
  // parameter that has it (named if the pair cannot be used) and the stages of all of them.
  for (const auto& [name, param] : src_->params) {
    out.any_src = out.any_src || maps.in_effective_src(name);
    if (!maps.in_effective_src(name) || !maps.in_effective_dst(name)) continue;
    const size_t rank = param.stages.begin()->second.tensor_map.size();
    Layout s = maps.src_layout(name, rank), d = maps.dst_layout(name, rank);
    size_t k = 0;
    while (k < out.pairs.size() && !(out.pairs[k].src == s && out.pairs[k].dst == d)) ++k;
    if (k == out.pairs.size()) out.pairs.push_back({std::move(s), std::move(d), name, {}, {}});
    out.pairs[k].first_stages.insert(param.stages.begin()->first);
    for (const auto& [st, layout] : param.stages) out.pairs[k].stages.insert(st);
  }
  return stages_.emplace(maps.target_stage(), std::move(out)).first->second;
}

std::vector<int64_t> rank_list_for_transform(const Strategy* src, const Strategy* dst,
                                             int64_t target_rank, bool minimal,
                                             TransformMemo* memo) {
  const TargetMaps maps(src, dst, target_rank);
  if (!src) return {0};
  TransformMemo own;
  const TransformMemo::Stage& stage = (memo ? *memo : own).stage(maps);
  if (!stage.any_src)
    fail("The src_strategy_file is empty: {} has no parameter for target rank {}", src->origin,
         target_rank);

  std::set<int64_t> locals;
  std::set<uint32_t> stages;
  std::set<int64_t, std::greater<>> global;
  for (const TransformMemo::Pair& pair : stage.pairs) {
    std::vector<int64_t> ranks;
    try {
      ranks = mindspore_needed(pair.src, pair.dst, maps.target_local());
      if (minimal) {
        const std::vector<int64_t> overlap =
            minimal_needed(pair.src, pair.dst, maps.target_local());
        std::vector<int64_t> both;
        std::set_intersection(ranks.begin(), ranks.end(), overlap.begin(), overlap.end(),
                              std::back_inserter(both));
        ranks = std::move(both);
      }
    } catch (const Error& e) {
      fail("parameter {}: {}", pair.name, e.what());
    }
    if (minimal) {
      for (uint32_t st : pair.first_stages)
        for (int64_t local : ranks) global.insert(st * maps.src_devices() + local);
    } else {
      locals.insert(ranks.begin(), ranks.end());
      stages.insert(pair.stages.begin(), pair.stages.end());
    }
  }
  // MindSpore takes the cross product of stages and local ranks (§4.5 step 3, example G5).
  for (uint32_t st : stages)
    for (int64_t local : locals) global.insert(st * maps.src_devices() + local);
  return {global.begin(), global.end()};
}

}  // namespace ckptfs::strategy
