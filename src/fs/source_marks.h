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
  // The same, keeping `at` (the caller's position for it) for at(source) in this pass.
  bool first(uint32_t source, uint32_t at) {
    if (!first(source)) return false;
    if (at_.size() < stamps_.size()) at_.resize(stamps_.size());
    at_[source] = at;
    return true;
  }
  uint32_t at(uint32_t source) const { return at_[source]; }

 private:
  std::vector<uint64_t> stamps_;
  std::vector<uint32_t> at_;
  uint64_t epoch_ = 0;
};

}  // namespace ckptfs::fs::detail
