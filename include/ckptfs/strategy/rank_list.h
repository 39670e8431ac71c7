// Which layouts apply to a target rank (spec §4.2, §4.4 roles) and which source ranks it needs
// (§4.5). A null Strategy pointer means "unsharded" on that side.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/strategy/layout.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::strategy {

class TargetMaps {
 public:
  enum class Role { Reshard, Passthrough, Drop };

  // Throws Error if target_rank is outside [0, N_dst * S_dst).
  TargetMaps(const Strategy* src, const Strategy* dst, int64_t target_rank);

  int64_t src_devices() const { return n_src_; }
  int64_t dst_devices() const { return n_dst_; }
  int64_t target_stage() const { return t_stage_; }
  int64_t target_local() const { return t_local_; }

  // §4.2 step 3: a null side counts as containing every name.
  bool in_effective_src(std::string_view name) const;
  bool in_effective_dst(std::string_view name) const;

  // §4.4 steps 1–3 for a parameter name found in the source files.
  Role role(std::string_view name) const;
  // Layouts of a Reshard parameter: the source layout of its lowest source stage, the
  // destination layout of the target's stage; Layout::unsharded for a null side. Throws Error
  // naming the parameter (and the strategy file).
  Layout src_layout(std::string_view name, size_t tensor_rank) const;
  Layout dst_layout(std::string_view name, size_t tensor_rank) const;
  // Source stages listing the parameter ({0} when the source is unsharded).
  std::vector<uint32_t> src_stages(std::string_view name) const;
  const Strategy* src() const { return src_; }
  const Strategy* dst() const { return dst_; }

 private:
  const Strategy* src_;
  const Strategy* dst_;
  int64_t n_src_ = 1, n_dst_ = 1, t_stage_ = 0, t_local_ = 0;
};

// Per parameter, local source ranks MindSpore's planner gathers for target local rank t_local
// (§4.5 a–f), ascending. Among the holders of one source block exactly one is listed: the
// replica MindSpore reads. Throws Error when the device counts are not multiples of each other
// or the device matrices do not unify (§4.5 c).
std::vector<int64_t> mindspore_needed(const Layout& src, const Layout& dst, int64_t t_local);

// What MindSpore's planner answers for the pair: the ranks mindspore_needed returns, or why it
// has none (the device counts are not multiples of each other, or the device matrices do not
// unify), for a caller that then falls back to another rule. Still throws Error for a target
// rank out of range or a tensor rank the layouts disagree on.
struct NeededAnswer {
  std::vector<int64_t> ranks;
  std::string no_answer;  // empty: `ranks` is MindSpore's answer
  bool found() const { return no_answer.empty(); }
};
NeededAnswer mindspore_answer(const Layout& src, const Layout& dst, int64_t t_local);

// Local source ranks whose blocks intersect the target block, ascending. Every holder of such a
// block is listed (replicas included), so this is not a subset of mindspore_needed; their
// intersection is the set of replicas whose data a MindSpore-faithful reader touches.
std::vector<int64_t> minimal_needed(const Layout& src, const Layout& dst, int64_t t_local);

// What rank_list_for_transform derives from the strategies alone for a target stage: the
// distinct (source, destination) layout pairs of its parameters. Kept across calls for targets
// of the same two strategy objects (others reset it), which must outlive its use. Not
// thread-safe: one per thread.
class TransformMemo {
 public:
  struct Pair {
    Layout src, dst;
    std::string name;                 // the first parameter with this pair, for messages
    std::set<uint32_t> first_stages;  // each parameter's lowest source stage
    std::set<uint32_t> stages;        // every source stage of those parameters
  };
  struct Stage {
    bool any_src = false;  // some parameter is in the effective source map
    std::vector<Pair> pairs;
  };
  const Stage& stage(const TargetMaps& maps);

 private:
  const Strategy* src_ = nullptr;
  const Strategy* dst_ = nullptr;
  std::map<int64_t, Stage> stages_;  // by target stage
};

// rank_list_for_transform (§4.5 steps 1–3): global source ranks, descending; [0] when `src` is
// null. Throws Error for an empty effective source map, a target rank outside the destination's
// devices x stages, or a parameter whose layouts cannot be used (message names it).
// With `minimal`: per Reshard parameter, the ranks of mindspore_needed whose blocks intersect
// the target block, in the parameter's lowest source stage (the copy whose data is used); the
// source of passthrough parameters (local t_local mod N_src) is not included, since it depends
// on which parameters the checkpoints hold. With `memo`, what depends on the strategies alone is
// computed once for all the targets of a stage.
std::vector<int64_t> rank_list_for_transform(const Strategy* src, const Strategy* dst,
                                             int64_t target_rank, bool minimal = false,
                                             TransformMemo* memo = nullptr);

}  // namespace ckptfs::strategy
