// "Each distinct source once" over the runs of one request, in O(runs) however the runs
// alternate between sources: a stamp per source, and a new epoch per pass. Private to the fs
// module; keep one per thread (thread_local).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckptfs::fs::detail {

class SourceMarks {
 public:
  // Starts a pass over a plan of `sources` sources. Stamps of earlier passes, from any tree,
  // never match the new epoch.
  void begin(size_t sources) {
    if (stamps_.size() < sources) stamps_.resize(sources, 0);
    ++epoch_;
  }
  // True the first time `source` (< the count given to begin) is seen in this pass.
  bool first(uint32_t source) {
    if (stamps_[source] == epoch_) return false;
    stamps_[source] = epoch_;
    return true;
  }

 private:
  std::vector<uint64_t> stamps_;
  uint64_t epoch_ = 0;
};

}  // namespace ckptfs::fs::detail
