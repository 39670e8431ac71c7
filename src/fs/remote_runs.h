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

// When two runs of one object share a GET: the gap between them must cost less than another
// request (`gap`: a GET's latency times the bandwidth of one connection), and a range's gaps
// together stay within `slack` plus `extra` times the bytes its runs need (the cap on bytes
// fetched over bytes needed is 1 + extra). A range stops growing at `max_range` bytes, so that
// a window's ranges are fetched in parallel.
struct MergePolicy {
  uint64_t gap = UINT64_MAX;
  uint64_t slack = kMergeSlack;
  double extra = 0.125;
  uint64_t max_range = UINT64_MAX;
};

struct MergedRange {
  uint32_t source = 0;
  uint64_t begin = 0, end = 0;    // [begin, end) of the object
  uint32_t first = 0, count = 0;  // its runs: `order[first .. first + count)` once sorted
  uint32_t lowest = 0;            // the smallest index in `runs` of its runs (target order)
  uint64_t needed = 0;            // bytes its runs copy
};

// Sorts `order` (indexes into `runs`) by source, then offset: one counting pass by source, then
// each source's runs sorted only if they are not in offset order already. A file's runs mostly
// come in offset order per source, and a comparison sort of a read-ahead window's 65k-130k runs
// was a tenth of the daemon's CPU in a cold read from S3 or over s3fs.
void sort_by_source(std::span<const plan::Run> runs, std::vector<uint32_t>& order);

// Sorts `order` (indexes into `runs`, all of remote sources) by source and offset and merges
// them into ranges.
std::vector<MergedRange> merge_runs(std::span<const plan::Run> runs, std::vector<uint32_t>& order,
                                    const MergePolicy& policy = {});

class RemoteCache;
// The mount's cache of fetched ranges, which fetch_remote_runs reads first; null (the default):
// every request fetches its own runs. Set by the service for the life of its mount.
void use_remote_cache(RemoteCache* cache);

// Reads the runs in `order` whose source has an object in `objects` into `dest` and drops them
// from `order`: from the cache where it holds them, else with the request's own GETs; false
// (the reason logged, naming the object) when a GET fails or an object changed.
bool fetch_remote_runs(std::span<const plan::Run> runs, std::span<char* const> dest,
                       std::vector<uint32_t>& order,
                       std::span<const remote::ObjectRef* const> objects);

}  // namespace ckptfs::fs
