// Refusals of sources that do not fit the source strategy, each in one line naming what is
// wrong and what to do. Checked before planning, so that a wrong strategy is not served as
// tensors of the wrong shape. Stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/index/store.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::plan {

// The global source ranks found must be exactly 0 .. devices x stages - 1 of the source
// strategy (only 0 with a null strategy: one full checkpoint). Throws Error naming `src_dir`,
// the strategy, and the extra or missing rank directories. `unusable` (source::Listing's): why
// a rank whose entry is there gave no checkpoint ("rank_5/ is empty"), said instead of
// "missing". With `needed` (the source ranks some exposed target ranks read), only those must be
// present: a node's copy may hold just its share. A rank the strategy has no place for is
// refused either way, as its name alone shows the strategy is not the one saved with.
void check_rank_count(const std::vector<int64_t>& ranks, const strategy::Strategy* src,
                      const std::string& src_dir,
                      const std::map<int64_t, std::string>& unusable = {},
                      const std::set<int64_t>* needed = nullptr);

// Name lists found to cover a stage of one source strategy, kept by a caller that checks many
// plans of the same files (index build's summaries): a stage with a file listing the same names
// in the same order is covered without hashing them again. Not thread-safe: one per thread.
struct CoveredNames {
  const strategy::Strategy* src = nullptr;  // the strategy the lists were checked against
  std::map<int64_t, std::vector<std::string>> by_stage;
};

// Every parameter the source strategy lists for a stage must be in some file of that stage,
// except those a save may lack (accu_grads*, *_cache*, *expert_load*, and the optimizer states
// adam_m.*, adam_v.*, moment1.*, moment2.*). Throws Error naming
// the strategy, the stage, the first missing parameters and how many there are. `covered`
// (optional) is read and added to; it must outlive no strategy it was used with.
void check_strategy_covered(const std::map<int64_t, index::IndexedSource>& sources,
                            const strategy::Strategy& src, CoveredNames* covered = nullptr);

}  // namespace ckptfs::plan
