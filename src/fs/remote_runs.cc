#include "remote_runs.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

namespace ckptfs::fs {

std::vector<MergedRange> merge_runs(std::span<const plan::Run> runs, std::vector<uint32_t>& order) {
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    if (runs[a].source != runs[b].source) return runs[a].source < runs[b].source;
    return runs[a].offset < runs[b].offset;
  });
  std::vector<MergedRange> out;
  uint64_t carried = 0, gaps = 0;  // bytes the last range's runs need, and the gaps between
  for (uint32_t k = 0; k < order.size(); ++k) {
    const plan::Run& r = runs[order[k]];
    if (!out.empty()) {
      MergedRange& m = out.back();
      const uint64_t gap = r.offset > m.end ? r.offset - m.end : 0;
      if (m.source == r.source && gaps + gap <= kMergeSlack + (carried + r.length) / 8) {
        m.end = std::max(m.end, r.offset + r.length);
        ++m.count;
        carried += r.length;
        gaps += gap;
        continue;
      }
    }
    out.push_back({r.source, r.offset, r.offset + r.length, k, 1});
    carried = r.length;
    gaps = 0;
  }
  return out;
}

bool fetch_remote_runs(std::span<const plan::Run> runs, std::span<char* const> dest,
                       std::vector<uint32_t>& order,
                       std::span<const remote::ObjectRef* const> objects) {
  thread_local std::vector<uint32_t> mine;
  thread_local std::vector<uint8_t> buffer;
  size_t kept = 0;
  mine.clear();
  for (uint32_t i : order) {
    if (objects[runs[i].source] != nullptr)
      mine.push_back(i);
    else
      order[kept++] = i;
  }
  order.resize(kept);
  if (mine.empty()) return true;
  const std::vector<MergedRange> merged = merge_runs(runs, mine);
  // A range of one run is read straight into place; the others through one buffer.
  uint64_t staged = 0;
  for (const MergedRange& m : merged)
    if (m.count > 1) staged += m.end - m.begin;
  buffer.resize(staged);
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
  // A large request's buffer is not kept for the life of the thread.
  if (buffer.capacity() > (4u << 20)) buffer = {};
  return true;
}

}  // namespace ckptfs::fs
