// One target rank at a time: which entries its file holds, in MindSpore's record order (spec
// §4.4-§4.6), each resharded from the source blocks that hold it or passed through from the file
// MindSpore takes it from. The core the entry points of planner.h share (planner.cc); the views
// (views.h) turn the entries into files.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/plan/planner.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/strategy/strategy.h"
#include "views.h"

namespace ckptfs::plan {

// A JSON strategy states each parameter's global shape (tensor_shape). Throws Error naming the
// strategy and the parameter if it disagrees with `global`, the checkpoint's.
void check_stated_shape(const strategy::Strategy& s, std::string_view name,
                        std::span<const int64_t> global);

class Planner;

// The name lists a memo's plans found to cover their stages (check_strategy_covered), kept with
// the memo's other derived facts.
CoveredNames& covered_names(LayoutMemo& memo);
// A name list a memo's plans found to load as saved (LoaderRules' `known`).
std::vector<std::string>& as_saved_names(LayoutMemo& memo);

// Not thread-safe: one per planning thread. Entries it returns point into it and into `plan`'s
// scans: they live until the planner and the plan are gone.
class TargetPlanner {
 public:
  // `ranks`: the rank each of plan.sources plays (plan.source_ranks, or stage-local ranks).
  // `located`: make_located_plan's sources (every file loaded, any holder as good as another).
  // `memo`: kept across plans of the same strategies (null: this planner's own).
  TargetPlanner(Plan& plan, const strategy::Strategy* src, const strategy::Strategy* dst,
                bool safetensors_rules, const std::vector<int64_t>& ranks, bool located = false,
                LayoutMemo* memo = nullptr);
  ~TargetPlanner();
  TargetPlanner(TargetPlanner&&) noexcept;
  TargetPlanner& operator=(TargetPlanner&&) noexcept;

  // The entries of target t, in the .ckpt view's record order.
  std::vector<Entry> plan_target(int64_t t);
  // Some target ranks only, from the files they read: MindSpore's other replicas are not
  // required to be present.
  void set_partial();
  // Loads the stage's files lowest rank first, as MindSpore's by-stage transform does, so that
  // records follow the lowest rank's file where the files disagree.
  void set_by_stage_load_order();

 private:
  std::unique_ptr<Planner> impl_;
};

}  // namespace ckptfs::plan
