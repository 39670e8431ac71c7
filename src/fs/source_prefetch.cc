#include "source_prefetch.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/sendfile.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <memory>
#include <string_view>
#include <system_error>
#include <unordered_set>

#include "ckptfs/remote/objects.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/remote_fs.h"

namespace ckptfs::fs {

namespace {

// A helper's read: the bytes are only brought into the page cache, then dropped.
constexpr size_t kReadBytes = size_t{1} << 20;

// Brings [at, at + n) of `fd` into the page cache: spliced to /dev/null (`null`), which takes
// the pages without copying them (the copy into a buffer was a seventh of the daemon's time
// reading a view over s3fs), else read into `buf` where splicing is refused. The kernel reads
// ahead the same either way. Bytes brought, or <= 0 as pread.
ssize_t bring(int fd, int null, char* buf, size_t n, uint64_t at) {
  if (null >= 0) {
    off_t pos = static_cast<off_t>(at);
    const ssize_t got = retry_eintr([&] { return ::sendfile(null, fd, &pos, n); });
    if (got >= 0 || (errno != EINVAL && errno != ENOSYS)) return got;
  }
  if (buf == nullptr) return -1;
  return retry_eintr([&] { return ::pread(fd, buf, n, static_cast<off_t>(at)); });
}

struct Stretch {
  uint32_t source;
  uint64_t begin, end;
};

// The runs' source bytes, per source, joined where they are less than kGapBytes apart.
std::vector<Stretch> stretches(std::vector<plan::Run>& runs) {
  std::erase_if(runs, [](const plan::Run& r) { return r.mem != nullptr || r.length == 0; });
  thread_local std::vector<uint32_t> order;
  order.resize(runs.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  sort_by_source(runs, order);
  std::vector<Stretch> out;
  for (const uint32_t i : order) {
    const plan::Run& r = runs[i];
    if (!out.empty() && out.back().source == r.source &&
        r.offset <= out.back().end + SourcePrefetch::kGapBytes) {
      out.back().end = std::max(out.back().end, r.offset + r.length);
      continue;
    }
    out.push_back({r.source, r.offset, r.offset + r.length});
  }
  return out;
}

}  // namespace

bool SourcePrefetch::any_remote(const Tree& tree) {
  if (remote::any_registered()) return true;
  for (const index::IndexedSource& s : tree.plan().sources)
    if (on_remote_filesystem(s.file.fd.get())) return true;
  if (const LazyRanks* lazy = tree.lazy()) {
    std::unordered_set<std::string_view> seen;
    for (const LazyRanks::File& f : lazy->files())
      for (const std::string& path : f.sources) {
        if (!seen.insert(path).second) continue;
        struct statfs st;
        if (::statfs(path.c_str(), &st) == 0 &&
            is_remote_fs_magic(static_cast<uint64_t>(static_cast<uint32_t>(st.f_type))))
          return true;
      }
  }
  return false;
}

SourcePrefetch::SourcePrefetch(const Tree& tree, Options options) : tree_(tree), options_(options) {
  if (const LazyRanks* lazy = tree.lazy())
    for (size_t i = 0; i < lazy->files().size(); ++i) lazy_files_.emplace(tree.target_ino(i), i);
  if (options_.max_bytes == 0 || options_.cache == nullptr || tree_.lazy() != nullptr) return;
  told_ = false;
  try {
    teller_ = std::thread([this] { expect_all(); });
  } catch (const std::system_error&) {
    expect_all();  // no thread: told here, before any read
  }
}

SourcePrefetch::~SourcePrefetch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    jobs_.clear();
  }
  wake_.notify_all();
  told_cv_.notify_all();
  if (teller_.joinable()) teller_.join();
  for (std::thread& t : helpers_) t.join();
  if (!helpers_.empty())
    spdlog::info("source read-ahead: {} MiB fetched ahead", fetched_.load() >> 20);
}

std::pair<const Tree*, uint64_t> SourcePrefetch::serving(uint64_t ino) const {
  if (Tree::in_steps(ino)) return {nullptr, 0};
  if (tree_.lazy() == nullptr) return {&tree_, ino};
  const auto it = lazy_files_.find(ino);
  return it == lazy_files_.end() ? std::pair<const Tree*, uint64_t>{nullptr, 0}
                                 : tree_.lazy()->planned(it->second);
}

void SourcePrefetch::note(uint64_t ino, uint64_t off, size_t len) noexcept {
  if (options_.max_bytes == 0) return;
  try {
    const auto [tree, local] = serving(ino);
    const plan::VirtualFile* file = tree ? tree->file(local) : nullptr;
    if (file == nullptr) return;
    if (!told_.load(std::memory_order_acquire)) wait_told();
    uint64_t begin = 0;
    const uint64_t ahead = options_.ahead;
    const uint64_t end = std::min(file->size(), off + len + ahead);
    {
      std::lock_guard lock(mutex_);
      uint64_t& planned = planned_to_[ino];
      // Far enough ahead already; a reader that jumped beyond (or back) plans from where it is.
      if (planned >= off && planned >= std::min(file->size(), off + len + ahead / 2)) return;
      begin = planned >= off && planned <= end ? planned : off;
      if (begin >= end) return;
      planned = end;
      if (all_covered(tree->plan().sources)) return;
    }
    std::vector<plan::Run> runs;
    const auto& sources = tree->plan().sources;
    if (options_.cache) {
      // The S3 path fetches the runs themselves (coalesced), so it needs them all; but when the
      // cache widens them to whole blocks anyway, the block rows they lie in name the same
      // blocks for a fraction of the mapping.
      if (options_.cache->fetches_whole_blocks())
        file->cover(begin, end - begin, runs);
      else
        file->map(begin, end - begin, runs);
      want_objects(runs, sources);
    } else {
      // Only the stretches matter here, and runs less than kGapBytes apart join into one
      // anyway: whole block rows name them too, and mapping each window's runs was a sixth of
      // the daemon's time reading a view over s3fs.
      file->cover(begin, end - begin, runs);
    }
    const std::vector<Stretch> wanted = stretches(runs);
    std::lock_guard lock(mutex_);
    for (const Stretch& s : wanted) {
      if (s.source >= sources.size()) continue;
      const source::SourceFile& f = sources[s.source].file;
      auto [it, added] = sources_.try_emplace(f.path.string());
      if (added) {
        it->second.fd = f.fd.get();
        it->second.remote = options_.local_too || on_remote_filesystem(it->second.fd);
      }
      if (it->second.remote) queue(it->second, s.begin, s.end);
    }
  } catch (const std::exception& e) {
    spdlog::debug("source read-ahead skipped: {}", e.what());
  }
}

bool SourcePrefetch::all_covered(const std::vector<index::IndexedSource>& sources) const {
  for (const index::IndexedSource& s : sources) {
    const auto it = sources_.find(s.file.path.string());
    if (it == sources_.end()) return false;  // never seen (or an S3 object: its cache decides)
    if (!it->second.remote) continue;
    const std::map<uint64_t, uint64_t>& covered = it->second.covered;
    if (covered.size() != 1 || covered.begin()->first != 0 ||
        covered.begin()->second < s.file.fingerprint.size)
      return false;
  }
  return true;
}

void SourcePrefetch::want_objects(std::vector<plan::Run>& runs,
                                  const std::vector<index::IndexedSource>& sources) const {
  std::vector<const remote::ObjectRef*> objects(sources.size(), nullptr);
  std::vector<bool> looked(sources.size(), false);
  std::vector<uint32_t> order;
  for (size_t i = 0; i < runs.size(); ++i) {
    const plan::Run& r = runs[i];
    if (r.mem == nullptr && r.length > 0 && r.source < sources.size()) {
      if (!looked[r.source]) {
        looked[r.source] = true;
        // An encrypted object is read through its decrypting stream, not from ranges.
        if (!sources[r.source].scan.encrypted)
          objects[r.source] = remote::object_of(sources[r.source].file.fd.get());
      }
      if (objects[r.source] != nullptr) {
        order.push_back(static_cast<uint32_t>(i));
      }
    }
  }
  if (order.empty()) return;
  std::vector<MergedRange> merged = merge_runs(runs, order, options_.merge);
  // The ranges the file needs first go out first.
  std::sort(merged.begin(), merged.end(),
            [](const MergedRange& a, const MergedRange& b) { return a.lowest < b.lowest; });
  for (const MergedRange& m : merged)
    if (!options_.cache->want(objects[m.source], m.begin, m.end)) break;
  std::erase_if(runs, [&](const plan::Run& r) {
    return r.mem == nullptr && r.source < objects.size() && objects[r.source] != nullptr;
  });
}

void SourcePrefetch::wait_told() {
  std::unique_lock lock(mutex_);
  told_cv_.wait(lock, [&] { return stopping_ || told_.load(std::memory_order_relaxed); });
}

void SourcePrefetch::expect_all() {
  try {
    const auto& sources = tree_.plan().sources;
    std::vector<const remote::ObjectRef*> objects(sources.size(), nullptr);
    for (size_t i = 0; i < sources.size(); ++i)
      if (!sources[i].scan.encrypted) objects[i] = remote::object_of(sources[i].file.fd.get());
    std::vector<plan::Run> runs;
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> per_source(sources.size());
    for (size_t i = 0; i < tree_.plan().targets.size(); ++i) {
      if (stopping_.load(std::memory_order_relaxed)) break;
      const plan::VirtualFile* file = tree_.file(tree_.target_ino(i));
      if (file == nullptr) continue;
      runs.clear();
      file->map(0, file->size(), runs);
      for (const plan::Run& r : runs)
        if (r.mem == nullptr && r.source < objects.size() && objects[r.source] != nullptr)
          per_source[r.source].emplace_back(r.offset, r.length);
      for (size_t s = 0; s < per_source.size(); ++s) {
        options_.cache->expect(objects[s], per_source[s]);
        per_source[s].clear();
      }
    }
  } catch (const std::exception& e) {  // the ranges not expected are freed least recent first
    spdlog::debug("S3 read-ahead: the plan was not all told to the cache: {}", e.what());
  }
  {
    std::lock_guard lock(mutex_);
    told_.store(true, std::memory_order_release);
  }
  told_cv_.notify_all();
}

void SourcePrefetch::queue(Source& source, uint64_t begin, uint64_t end) {
  auto& covered = source.covered;
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  uint64_t at = begin;
  auto it = covered.upper_bound(begin);
  if (it != covered.begin() && std::prev(it)->second > at) at = std::prev(it)->second;
  for (; at < end; ++it) {
    const uint64_t next = it == covered.end() ? end : std::min(end, it->first);
    if (next > at) gaps.emplace_back(at, next);
    if (it == covered.end()) break;
    at = std::max(at, it->second);
  }
  bool queued = false;
  for (auto [b, e] : gaps) {
    if (pending_bytes_ >= options_.max_bytes) break;
    e = std::min(e, b + (options_.max_bytes - pending_bytes_));
    for (uint64_t p = b; p < e; p += kPieceBytes) {
      const uint64_t q = std::min(e, p + kPieceBytes);
      jobs_.push_back({source.fd, p, q});
    }
    pending_bytes_ += e - b;
    queued = true;
    spdlog::debug("source read-ahead: fd {} bytes {}-{} queued", source.fd, b, e);
    // Record [b, e), joined with its neighbours so the map stays small.
    uint64_t nb = b, ne = e;
    auto after = covered.lower_bound(b);
    if (after != covered.begin() && std::prev(after)->second >= b) --after;
    while (after != covered.end() && after->first <= ne) {
      nb = std::min(nb, after->first);
      ne = std::max(ne, after->second);
      after = covered.erase(after);
    }
    covered.emplace(nb, ne);
  }
  if (!queued) return;
  while (helpers_.size() < std::max(1u, options_.helpers)) {
    try {
      helpers_.emplace_back([this] { helper_loop(); });
    } catch (const std::system_error& e) {
      if (helpers_.empty()) {
        spdlog::warn("source read-ahead off: cannot start a thread: {}", e.what());
        jobs_.clear();
        pending_bytes_ = 0;
        return;
      }
      break;
    }
  }
  wake_.notify_all();
}

void SourcePrefetch::helper_loop() {
  std::unique_ptr<char[]> buf(new (std::nothrow) char[kReadBytes]);
  const UniqueFd null(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    const Job job = jobs_.front();
    jobs_.pop_front();
    ++running_;
    lock.unlock();
    uint64_t done = 0;
    for (uint64_t at = job.begin; (buf || null) && at < job.end;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kReadBytes, job.end - at));
      const ssize_t got = bring(job.fd, null.get(), buf.get(), n, at);
      if (got <= 0) break;  // the reader's own gather meets and reports what went wrong
      at += static_cast<uint64_t>(got);
      done += static_cast<uint64_t>(got);
    }
    fetched_.fetch_add(done, std::memory_order_relaxed);
    lock.lock();
    --running_;
    pending_bytes_ -= job.end - job.begin;
    if (jobs_.empty() && running_ == 0) idle_.notify_all();
  }
}

void SourcePrefetch::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return stopping_ || (jobs_.empty() && running_ == 0); });
}

std::vector<std::pair<uint64_t, uint64_t>> SourcePrefetch::covered_ranges(
    const std::string& path) const {
  std::lock_guard lock(mutex_);
  const auto it = sources_.find(path);
  if (it == sources_.end()) return {};
  return {it->second.covered.begin(), it->second.covered.end()};
}

}  // namespace ckptfs::fs
