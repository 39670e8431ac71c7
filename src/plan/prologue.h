// The prologue the entry points of planner.h share before planning: the views asked for, one
// format for all sources, MindSpore's loader rules on .ckpt sources, and the sources moved into
// a new Plan. `Sources` is a range of (rank, IndexedSource) pairs: a map by rank, or a vector in
// the order given.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/error.h"
#include "ckptfs/plan/planner.h"

namespace ckptfs::plan {

inline void check_views_chosen(const ViewOptions& views) {
  if (!views.ckpt && !views.safetensors) fail("no view chosen: give ckpt, safetensors or both");
}

// All sources one format; MindSpore refuses to transform a mix (spec mindspore-safetensors.md
// §2.1). True for safetensors.
template <typename Sources>
bool safetensors_rules(const Sources& sources) {
  const index::IndexedSource& first = sources.begin()->second;
  for (const auto& [rank, source] : sources)
    if (source.scan.format != first.scan.format)
      fail("{} and {}: the sources mix .ckpt and .safetensors checkpoints; keep one format",
           first.file.path.string(), source.file.path.string());
  return first.scan.format == scan::SourceFormat::Safetensors;
}

// MindSpore's loader rules (ckpt::loaded_params), file after file. A file listing the same names
// in the same order as the last one that loads as saved loads as saved too: comparing its names
// is cheaper than hashing them, and a checkpoint's files nearly always list the same names. The
// scans must stay where they are while rules are applied. `known` (optional, kept by the caller
// across plans: index build's per-thread memo) holds the names of a list found to load as saved
// before, so that the next plan's files are compared with it, not hashed again.
class LoaderRules {
 public:
  explicit LoaderRules(std::vector<std::string>* known = nullptr) : known_(known) {}

  void apply(scan::FileScan& scan) {
    if (as_saved_ && ckpt::same_names(*as_saved_, scan.params)) return;
    // Whether a list loads as saved depends on its names alone.
    if (known_ && !known_->empty() && ckpt::same_names(*known_, scan.params)) {
      as_saved_ = &scan.params;
      return;
    }
    if (ckpt::loads_as_saved(scan.params)) {
      as_saved_ = &scan.params;
      if (known_) {
        known_->clear();
        known_->reserve(scan.params.size());
        for (const scan::Param& p : scan.params) known_->push_back(p.name);
      }
    } else {
      scan.params = ckpt::loaded_params(std::move(scan));
    }
  }

 private:
  std::vector<std::string>* known_;
  const std::vector<scan::Param>* as_saved_ = nullptr;
};

// Whether MindSpore's safetensors rules apply (all sources .safetensors; a mix is refused), with
// the loader rules applied to .ckpt sources if `loader_rules` (`known` as LoaderRules takes it).
template <typename Sources>
bool apply_source_rules(Sources& sources, bool loader_rules,
                        std::vector<std::string>* known = nullptr) {
  const bool st_rules = safetensors_rules(sources);
  if (loader_rules && !st_rules) {
    LoaderRules rules(known);
    for (auto& [rank, source] : sources) rules.apply(source.scan);
  }
  return st_rules;
}

// A Plan of `sources`, moved in, in their order.
template <typename Sources>
Plan plan_of(Sources& sources) {
  Plan plan;
  for (auto& [rank, source] : sources) {
    plan.source_ranks.push_back(rank);
    plan.sources.push_back(std::move(source));
  }
  return plan;
}

}  // namespace ckptfs::plan
