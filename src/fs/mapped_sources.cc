#include "mapped_sources.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "bus_guard.h"
#include "ckptfs/crypt/session_key.h"
#include "ckptfs/error.h"
#include "ckptfs/util/eintr.h"
#include "remote_runs.h"
#include "scratch.h"

namespace ckptfs::fs {

namespace {

// A fault maps the cached pages around the one touched too (a whole huge page, or the
// fault-around window), never past the 2 MiB page table it falls in: touched ranges are kept
// and dropped in whole tables.
constexpr uint64_t kTable = 2 << 20;
// Short runs (a strided layout: 1 KiB out of every 4 KiB) each start on a page the hardware
// prefetcher has not seen, so every run would wait for memory; the copy loop asks for the run
// kAhead places further on while copying this one (+3-4% on the last-dimension split).
constexpr size_t kAhead = 4;
constexpr uint64_t kPrefetchUpTo = 4096;
// Runs at least this long (on average) are read straight into their places by one preadv.
constexpr uint64_t kScatterFrom = 4096;
// Shorter ones are read through a per-thread buffer of this size.
constexpr uint64_t kBuffered = 256 << 10;

// Reads [offset, offset + total length of `iov`) of `fd` into `iov`; false on an error or at
// the end of the file (it shrank). Consumes `iov`.
bool preadv_all(int fd, std::span<iovec> iov, uint64_t offset) {
  size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t got =
        retry_eintr([&] { return ::preadv(fd, &iov[first], count, static_cast<off_t>(offset)); });
    if (got <= 0) return false;
    offset += static_cast<uint64_t>(got);
    for (size_t left = static_cast<size_t>(got); left > 0;) {
      const size_t step = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
      iov[first].iov_len -= step;
      left -= step;
      if (iov[first].iov_len == 0) ++first;
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return true;
}

// The page tables a source run lies in.
MappedSources::Range tables_of(const plan::Run& run) {
  return {run.offset & ~(kTable - 1), (run.offset + run.length + kTable - 1) & ~(kTable - 1)};
}

}  // namespace

MappedSources::MappedSources(std::span<const index::IndexedSource> sources) {
  maps_.reserve(sources.size());
  for (const index::IndexedSource& source : sources) {
    const remote::ObjectRef* object = remote::object_of(source.file.fd.get());
    objects_.push_back(source.scan.encrypted ? nullptr : object);
    if (objects_.back() != nullptr) {
      any_remote_ = true;
      streams_.push_back(nullptr);
      maps_.emplace_back();  // nothing mapped: its runs are fetched
      fds_.push_back(source.file.fd.get());
      continue;
    }
    if (source.scan.encrypted) {
      const std::string name = source.file.path.string();
      // Two pages: a read crossing a block boundary, or a read-ahead helper a block ahead of its
      // reader, does not decrypt the same block twice. An AES-GCM page is a whole block (up to
      // 64 MiB), held only once touched: memory is that times the sources being read.
      streams_.push_back(std::make_unique<crypt::DecryptedStream>(
          read_exact_from(source.file.fd.get(), name), source.file.fingerprint.size, name,
          crypt::session_key_for(name),
          crypt::StreamOptions{.mode = std::nullopt, .cache_pages = 2}));
      any_encrypted_ = true;
      maps_.emplace_back();  // nothing mapped: its runs are decrypted
      fds_.push_back(source.file.fd.get());
      continue;
    }
    streams_.push_back(nullptr);
    maps_.emplace_back(source.file.fd.get(), source.file.fingerprint.size);
    fds_.push_back(source.file.fd.get());
    if (source.file.fingerprint.size > 0 && maps_.back().data() == nullptr)
      fail("cannot map {}: {}", source.file.path.string(), std::strerror(errno));
  }
  touched_.resize(maps_.size());
}

ReadResult MappedSources::copy(std::span<const plan::Run> runs, char* out) {
  // Where each run goes, and how many sources the request reads.
  detail::Scratch& scratch = detail::scratch();
  std::vector<char*>& dest = scratch.copy_dest;
  std::vector<uint32_t>& order = scratch.copy_order;  // indexes of the source runs
  detail::SourceMarks& marks = scratch.copy_marks;
  dest.resize(runs.size());
  order.clear();
  marks.begin(maps_.size());
  size_t sources = 0;
  bool grouped = true;  // each source's runs come in one stretch
  char* to = out;
  for (size_t i = 0; i < runs.size(); ++i) {
    dest[i] = to;
    to += runs[i].length;
    if (runs[i].mem != nullptr) continue;
    if (marks.first(runs[i].source)) {
      ++sources;
    } else if (runs[order.back()].source != runs[i].source) {
      grouped = false;
    }
    order.push_back(static_cast<uint32_t>(i));
  }
  if (any_encrypted_ && !decrypt_runs(runs, dest, order)) return ReadResult::failed(EIO);
  if (any_remote_ && !fetch_remote_runs(runs, dest, order, objects_))
    return ReadResult::failed(EIO);
  // A request that interleaves many sources (a merge of column blocks) would map a page
  // table of every one at once, and a fault maps up to 2 MiB: then take one source at a time.
  const bool one_by_one = sources > kFewSources;
  if (one_by_one && !grouped) sort_by_source(runs, order);  // a counting sort, O(runs)
  // Mapping such sources costs more than it saves: each one's tables are faulted in and dropped
  // again (a TLB shootdown each) for every request, though the next request often reads on in
  // the same tables. So a source whose runs here are one stretch of its file (a column block
  // gives the next rows of its slice) is read with preadv; the others are copied from their
  // mappings, and their tables dropped before the next source.
  if (one_by_one && !read_stretches(runs, dest, order)) return ReadResult::failed(EIO);

  std::vector<std::pair<uint32_t, Range>>& done = scratch.copy_done;
  const bool copied = copy_guarded([&] {
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i].mem != nullptr) std::memcpy(dest[i], runs[i].mem, runs[i].length);
    for (size_t k = 0; k < order.size(); ++k) {
      const plan::Run& run = runs[order[k]];
      if (k + kAhead < order.size()) {
        const plan::Run& next = runs[order[k + kAhead]];
        const char* at = maps_[next.source].data() + next.offset;
        if (next.length <= kPrefetchUpTo)
          for (uint64_t b = 0; b < next.length; b += 64) __builtin_prefetch(at + b);
      }
      std::memcpy(dest[order[k]], maps_[run.source].data() + run.offset, run.length);
      if (!one_by_one) continue;
      const Range tables = tables_of(run);
      if (done.empty() || done.back().first != run.source)
        done.emplace_back(run.source, tables);
      else
        done.back().second = {std::min(done.back().second.begin, tables.begin),
                              std::max(done.back().second.end, tables.end)};
      if (k + 1 == order.size() || runs[order[k + 1]].source != run.source) let_go(done);
    }
  });
  let_go(done);  // empty unless a fault cut the copy short: then drop what it had mapped
  if (!copied) return ReadResult::failed(EIO);
  if (!one_by_one) note(runs, order);
  return ReadResult::done(static_cast<size_t>(to - out));
}

bool MappedSources::decrypt_runs(std::span<const plan::Run> runs, std::span<char* const> dest,
                                 std::vector<uint32_t>& order) {
  size_t kept = 0;
  for (uint32_t i : order) {
    crypt::DecryptedStream* stream = streams_[runs[i].source].get();
    if (stream == nullptr) {
      order[kept++] = i;
      continue;
    }
    try {
      stream->read(runs[i].offset, std::span(reinterpret_cast<uint8_t*>(dest[i]), runs[i].length));
    } catch (const std::exception& e) {
      // The message names the file and the block, never its bytes.
      spdlog::error("{}", e.what());
      return false;
    }
  }
  order.resize(kept);
  return true;
}

bool MappedSources::read_stretches(std::span<const plan::Run> runs, std::span<char* const> dest,
                                   std::vector<uint32_t>& order) const {
  std::vector<iovec>& iov = detail::scratch().stretch_iov;
  std::vector<char>& bytes = detail::scratch().stretch_bytes;
  size_t kept = 0;
  for (size_t k = 0, end = 0; k < order.size(); k = end) {
    const int fd = fds_[runs[order[k]].source];
    bool stretch = true;
    for (end = k + 1; end < order.size() && runs[order[end]].source == runs[order[k]].source;
         ++end) {
      const plan::Run& prev = runs[order[end - 1]];
      stretch = stretch && runs[order[end]].offset == prev.offset + prev.length;
    }
    if (!stretch) {
      for (size_t i = k; i < end; ++i) order[kept++] = order[i];
      continue;
    }
    const plan::Run& first = runs[order[k]];
    const plan::Run& last = runs[order[end - 1]];
    iov.clear();
    if ((last.offset + last.length - first.offset) / (end - k) >= kScatterFrom) {
      for (size_t i = k; i < end; ++i) iov.push_back({dest[order[i]], runs[order[i]].length});
      if (!preadv_all(fd, iov, first.offset)) return false;
      continue;
    }
    // Short runs: the kernel pays per segment, so read the stretch a buffer at a time and
    // place the runs from there, out of the cache. A run longer than the buffer is read alone,
    // straight into place.
    auto end_of = [&](size_t j) { return runs[order[j]].offset + runs[order[j]].length; };
    for (size_t i = k, next = k; i < end; i = next) {
      const uint64_t from = runs[order[i]].offset;
      next = i + 1;
      while (next < end && end_of(next) - from <= kBuffered) ++next;
      const uint64_t length = end_of(next - 1) - from;
      const bool alone = length > kBuffered;
      if (!alone && bytes.size() < length) bytes.resize(kBuffered);
      iov.assign(1, {alone ? dest[order[i]] : bytes.data(), length});
      if (!preadv_all(fd, iov, from)) return false;
      if (alone) continue;
      for (size_t j = i; j < next; ++j)
        std::memcpy(dest[order[j]], bytes.data() + (runs[order[j]].offset - from),
                    runs[order[j]].length);
    }
  }
  order.resize(kept);
  return true;
}

void MappedSources::note(std::span<const plan::Run> runs, std::span<const uint32_t> source_runs) {
  std::vector<std::pair<uint32_t, Range>>& due = detail::scratch().note_due;
  {
    std::lock_guard lock(mutex_);
    for (uint32_t i : source_runs) {
      Range& r = touched_[runs[i].source];
      const uint64_t before = r.end - r.begin;
      const Range tables = tables_of(runs[i]);
      r = r.begin == r.end ? tables
                           : Range{std::min(r.begin, tables.begin), std::max(r.end, tables.end)};
      spanned_ += (r.end - r.begin) - before;
    }
    if (spanned_ < kBudget) return;
    for (uint32_t i = 0; i < touched_.size(); ++i)
      if (touched_[i].begin != touched_[i].end) due.emplace_back(i, touched_[i]);
    std::fill(touched_.begin(), touched_.end(), Range{});
    spanned_ = 0;
  }
  let_go(due);
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
