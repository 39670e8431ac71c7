// What reading planned files costs in source bytes, from the plan alone (no source is read):
// the bytes each file needs from each source, and the bytes a reader fetches when every source
// is read in aligned blocks of a given size (a page cache's 4 KiB, an S3 filesystem's MiB-sized
// parts), each touched block once. Their ratio is the read amplification an operator sees before
// reading: resharded runs of a few hundred bytes spread over a whole source cost whole blocks.
// Thread-safe: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ckptfs/plan/virtual_file.h"

namespace ckptfs::plan {

// The block sizes `ckptfs plan` reports: 4 KiB, 1 MiB, 8 MiB.
inline constexpr uint64_t kCostBlocks[] = {uint64_t{4} << 10, uint64_t{1} << 20, uint64_t{8} << 20};

struct SourceCost {
  uint32_t source = 0;            // index into the plan's sources
  uint64_t need = 0;              // bytes the files copy from it (counted once per use)
  std::vector<uint64_t> fetched;  // per block size: bytes of the distinct blocks touched,
                                  // the last block cut at the source's end
};

// Adds the source runs of `file` (all of it) to `runs_by_source` (indexed by source; grown as
// needed). Several files' runs may be gathered before costing them together.
void collect_runs(const VirtualFile& file, std::vector<std::vector<Run>>& runs_by_source);

// The cost of the gathered runs, one entry per source with any run, in source order.
// `source_sizes[i]` is source i's size; `blocks` the block sizes (each > 0).
std::vector<SourceCost> fetch_cost(std::vector<std::vector<Run>>& runs_by_source,
                                   std::span<const uint64_t> source_sizes,
                                   std::span<const uint64_t> blocks);

}  // namespace ckptfs::plan
