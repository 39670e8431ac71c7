#include "ckptfs/plan/fetch_cost.h"

#include <algorithm>

namespace ckptfs::plan {

void collect_runs(const VirtualFile& file, std::vector<std::vector<Run>>& runs_by_source) {
  std::vector<Run> runs;
  file.map(0, file.size(), runs);
  for (const Run& r : runs) {
    if (r.mem != nullptr || r.length == 0) continue;  // header bytes held in memory
    if (r.source >= runs_by_source.size()) runs_by_source.resize(r.source + 1);
    runs_by_source[r.source].push_back(r);
  }
}

namespace {

// Bytes of the distinct `block`-aligned blocks the sorted runs touch, cut at `size`.
uint64_t touched(const std::vector<Run>& sorted, uint64_t block, uint64_t size) {
  uint64_t total = 0;
  uint64_t next = 0;  // first block not yet counted
  for (const Run& r : sorted) {
    const uint64_t first = std::max(next, r.offset / block);
    const uint64_t last = (r.offset + r.length - 1) / block;  // inclusive
    if (first > last) continue;
    const uint64_t begin = first * block;
    const uint64_t end = std::min((last + 1) * block, std::max(size, r.offset + r.length));
    total += end > begin ? end - begin : 0;
    next = last + 1;
  }
  return total;
}

}  // namespace

std::vector<SourceCost> fetch_cost(std::vector<std::vector<Run>>& runs_by_source,
                                   std::span<const uint64_t> source_sizes,
                                   std::span<const uint64_t> blocks) {
  std::vector<SourceCost> out;
  for (size_t s = 0; s < runs_by_source.size(); ++s) {
    std::vector<Run>& runs = runs_by_source[s];
    if (runs.empty()) continue;
    std::sort(runs.begin(), runs.end(),
              [](const Run& a, const Run& b) { return a.offset < b.offset; });
    SourceCost cost;
    cost.source = static_cast<uint32_t>(s);
    for (const Run& r : runs) cost.need += r.length;
    const uint64_t size = s < source_sizes.size() ? source_sizes[s] : 0;
    for (const uint64_t block : blocks) cost.fetched.push_back(touched(runs, block, size));
    out.push_back(std::move(cost));
  }
  return out;
}

}  // namespace ckptfs::plan
