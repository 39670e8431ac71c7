// A request's runs of sources that are S3 objects (remote/objects.h), read with ranged GETs:
// each object's runs are sorted and merged into one GET where the gap between them is small next
// to what they carry (so the bytes fetched stay within ~1/8 over the bytes needed), and all the
// request's GETs go out at once. Nothing is kept after the request: memory is the request's
// merged ranges, bounded by its size plus the gaps.
// Thread-safety: stateless but for per-thread buffers; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ckptfs/plan/virtual_file.h"
#include "ckptfs/remote/objects.h"

namespace ckptfs::fs {

// Merging neighbouring runs of one object costs the gaps between them in bytes fetched; a range's
// gaps together stay within kMergeSlack plus an eighth of the bytes its runs need.
inline constexpr uint64_t kMergeSlack = 512;

struct MergedRange {
  uint32_t source = 0;
  uint64_t begin = 0, end = 0;    // [begin, end) of the object
  uint32_t first = 0, count = 0;  // its runs: `order[first .. first + count)` once sorted
};

// Sorts `order` (indexes into `runs`, all of remote sources) by source and offset and merges
// them into ranges.
std::vector<MergedRange> merge_runs(std::span<const plan::Run> runs, std::vector<uint32_t>& order);

// Reads the runs in `order` whose source has an object in `objects` into `dest` and drops them
// from `order`; false (the reason logged, naming the object) when a GET fails or an object
// changed.
bool fetch_remote_runs(std::span<const plan::Run> runs, std::span<char* const> dest,
                       std::vector<uint32_t>& order,
                       std::span<const remote::ObjectRef* const> objects);

}  // namespace ckptfs::fs
