#include "remote_runs.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "remote_cache.h"

namespace ckptfs::fs {

namespace {
std::atomic<RemoteCache*> g_cache{nullptr};
}  // namespace

void use_remote_cache(RemoteCache* cache) { g_cache.store(cache, std::memory_order_release); }

void sort_by_source(std::span<const plan::Run> runs, std::vector<uint32_t>& order) {
  uint32_t sources = 0;
  for (const uint32_t i : order) sources = std::max(sources, runs[i].source + 1);
  thread_local std::vector<uint32_t> ends, sorted;
  ends.assign(size_t{sources} + 1, 0);
  for (const uint32_t i : order) ++ends[runs[i].source + 1];
  for (size_t s = 1; s <= sources; ++s) ends[s] += ends[s - 1];
  sorted.resize(order.size());
  for (const uint32_t i : order) sorted[ends[runs[i].source]++] = i;  // ends[s]: end of s's runs
  const auto by_offset = [&](uint32_t a, uint32_t b) { return runs[a].offset < runs[b].offset; };
  for (size_t s = 0, begin = 0; s < sources; begin = ends[s++]) {
    const auto first = sorted.begin() + static_cast<ptrdiff_t>(begin);
    const auto last = sorted.begin() + static_cast<ptrdiff_t>(ends[s]);
    if (!std::is_sorted(first, last, by_offset)) std::sort(first, last, by_offset);
  }
  order.swap(sorted);
}

std::vector<MergedRange> merge_runs(std::span<const plan::Run> runs, std::vector<uint32_t>& order,
                                    const MergePolicy& policy) {
  sort_by_source(runs, order);
  std::vector<MergedRange> out;
  uint64_t gaps = 0;  // the gaps of the last range
  for (uint32_t k = 0; k < order.size(); ++k) {
    const plan::Run& r = runs[order[k]];
    if (!out.empty()) {
      MergedRange& m = out.back();
      const uint64_t gap = r.offset > m.end ? r.offset - m.end : 0;
      const uint64_t end = std::max(m.end, r.offset + r.length);
      if (m.source == r.source && gap <= policy.gap && end - m.begin <= policy.max_range &&
          static_cast<double>(gaps + gap) <=
              static_cast<double>(policy.slack) +
                  static_cast<double>(m.needed + r.length) * policy.extra) {
        m.end = end;
        ++m.count;
        m.lowest = std::min(m.lowest, order[k]);
        m.needed += r.length;
        gaps += gap;
        continue;
      }
    }
    out.push_back({r.source, r.offset, r.offset + r.length, k, 1, order[k], r.length});
    gaps = 0;
  }
  return out;
}

bool fetch_remote_runs(std::span<const plan::Run> runs, std::span<char* const> dest,
                       std::vector<uint32_t>& order,
                       std::span<const remote::ObjectRef* const> objects) {
  thread_local std::vector<uint32_t> mine;
  size_t kept = 0;
  mine.clear();
  for (uint32_t i : order) {
    if (objects[runs[i].source] != nullptr)
      mine.push_back(i);
    else
      order[kept++] = i;
  }
  order.resize(kept);
  RemoteCache* const cache = g_cache.load(std::memory_order_acquire);
  if (cache && !mine.empty()) {
    thread_local std::vector<remote::Get> wanted;
    thread_local std::vector<RemoteCache::Got> got;
    wanted.clear();
    for (uint32_t i : mine) {
      const plan::Run& r = runs[i];
      wanted.push_back(
          {objects[r.source], r.offset, std::span(reinterpret_cast<uint8_t*>(dest[i]), r.length)});
    }
    got.resize(wanted.size());
    cache->read(wanted, got);
    kept = 0;
    for (size_t k = 0; k < mine.size(); ++k) {
      switch (got[k]) {
        case RemoteCache::Got::kCopied:
          break;
        case RemoteCache::Got::kFailed:
          return false;  // the fetcher logged why
        case RemoteCache::Got::kMiss:
          mine[kept++] = mine[k];
          break;
      }
    }
    mine.resize(kept);
  }
  if (mine.empty()) return true;
  std::vector<MergedRange> merged = merge_runs(runs, mine);
  // A range of one run is read straight into place; the others through one buffer, charged to
  // the mount's bound on S3 bytes. One that could never fit there goes without: a GET per run.
  const auto staged_bytes = [&] {
    uint64_t n = 0;
    for (const MergedRange& m : merged)
      if (m.count > 1) n += m.end - m.begin;
    return n;
  };
  uint64_t staged = staged_bytes();
  if (cache && staged > 0 && !cache->reserve(staged)) {
    merged = merge_runs(runs, mine, MergePolicy{.gap = 0, .slack = 0, .extra = 0, .max_range = 0});
    staged = staged_bytes();
  }
  struct Charge {
    RemoteCache* cache;
    uint64_t bytes;
    ~Charge() {
      if (cache && bytes > 0) cache->release(bytes);
    }
  } charge{cache, staged};
  RangeBuffer buffer(staged);
  std::vector<remote::Get> gets;
  gets.reserve(merged.size());
  uint64_t at = 0;
  for (const MergedRange& m : merged) {
    uint8_t* to = reinterpret_cast<uint8_t*>(dest[mine[m.first]]);
    if (m.count > 1) {
      to = buffer.data() + at;
      at += m.end - m.begin;
    }
    gets.push_back({objects[m.source], m.begin, std::span(to, m.end - m.begin)});
  }
  try {
    remote::client().fetch(gets);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return false;
  }
  at = 0;
  for (const MergedRange& m : merged) {
    if (m.count == 1) continue;
    for (uint32_t k = m.first; k < m.first + m.count; ++k) {
      const plan::Run& r = runs[mine[k]];
      std::memcpy(dest[mine[k]], buffer.data() + at + (r.offset - m.begin), r.length);
    }
    at += m.end - m.begin;
  }
  return true;
}

}  // namespace ckptfs::fs
