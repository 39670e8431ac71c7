#include "ckptfs/fs/mapped_sources.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ckptfs/error.h"
#include "ckptfs/fs/bus_guard.h"

namespace ckptfs::fs {

namespace {

// A fault maps the cached pages around the one touched too (a whole huge page, or the
// fault-around window), never past the 2 MiB page table it falls in: touched ranges are kept
// and dropped in whole tables.
constexpr uint64_t kTable = 2 << 20;

}  // namespace

MappedSources::MappedSources(std::span<const index::IndexedSource> sources) {
  maps_.reserve(sources.size());
  for (const index::IndexedSource& source : sources) {
    maps_.emplace_back(source.file.fd.get(), source.file.fingerprint.size);
    if (source.file.fingerprint.size > 0 && maps_.back().data() == nullptr)
      fail("cannot map {}: {}", source.file.path.string(), std::strerror(errno));
  }
  touched_.resize(maps_.size());
}

bool MappedSources::copy(std::span<const plan::Run> runs, char* out) {
  const bool copied = copy_guarded([&] {
    char* to = out;
    for (const plan::Run& run : runs) {
      const char* from = run.mem != nullptr ? run.mem : maps_[run.source].data() + run.offset;
      std::memcpy(to, from, run.length);
      to += run.length;
    }
  });
  thread_local std::vector<std::pair<uint32_t, Range>> done;
  {
    std::lock_guard lock(mutex_);
    for (const plan::Run& run : runs) {
      if (run.mem != nullptr) continue;
      // Counted in whole page tables, as they are mapped and dropped.
      Range& r = touched_[run.source];
      const uint64_t before = r.end - r.begin;
      const uint64_t begin = run.offset & ~(kTable - 1);
      const uint64_t end = (run.offset + run.length + kTable - 1) & ~(kTable - 1);
      r = r.begin == r.end ? Range{begin, end}
                           : Range{std::min(r.begin, begin), std::max(r.end, end)};
      spanned_ += (r.end - r.begin) - before;
    }
    if (spanned_ >= kBudget) {
      for (uint32_t i = 0; i < touched_.size(); ++i)
        if (touched_[i].begin != touched_[i].end) done.emplace_back(i, touched_[i]);
      std::fill(touched_.begin(), touched_.end(), Range{});
      spanned_ = 0;
    }
  }
  let_go(done);
  return copied;
}

void MappedSources::let_go(std::vector<std::pair<uint32_t, Range>>& ranges) const {
  // Outside the lock: another thread may be copying from these pages right now, which is
  // fine, it maps them again.
  for (const auto& [source, r] : ranges) {
    const uint64_t end = std::min(r.end, maps_[source].size());
    ::madvise(const_cast<char*>(maps_[source].data()) + r.begin, end - r.begin, MADV_DONTNEED);
  }
  ranges.clear();
}

}  // namespace ckptfs::fs
