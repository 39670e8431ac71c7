// The planner (spec §4.2–§4.6): which records every target rank's file holds, in MindSpore's
// order, each as header bytes plus content mapped onto source files. It reads no tensor bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckptfs/index/store.h"
#include "ckptfs/plan/virtual_file.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::plan {

struct TargetFile {
  int64_t rank = 0;
  VirtualFile file;
  std::string dir_name() const;   // "rank_<rank>"
  std::string file_name() const;  // "checkpoint_<rank>.ckpt"
};

struct Plan {
  std::vector<index::IndexedSource> sources;  // Run::source indexes this
  std::vector<int64_t> source_ranks;          // global rank of each source
  std::vector<TargetFile> targets;            // ascending rank
};

// Plans every target rank. A null strategy is the unsharded side. Throws Error naming the file
// or parameter at fault: a needed rank without a file, a dimension that does not divide, slice
// shapes that disagree across ranks, a map that does not fit the tensor, and so on.
Plan make_plan(std::map<int64_t, index::IndexedSource> sources, const strategy::Strategy* src,
               const strategy::Strategy* dst);

}  // namespace ckptfs::plan
