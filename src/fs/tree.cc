#include "ckptfs/fs/tree.h"

#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ckptfs/error.h"

namespace ckptfs::fs {

namespace {

constexpr std::string_view kDot = ".";
constexpr std::string_view kDotDot = "..";

bool is_dir_ino(uint64_t ino, size_t targets) {
  return ino >= 2 && ino % 2 == 0 && (ino - 2) / 2 < targets;
}
bool is_file_ino(uint64_t ino, size_t targets) {
  return ino >= 3 && ino % 2 == 1 && (ino - 3) / 2 < targets;
}

}  // namespace

Tree::Tree(plan::Plan plan)
    : plan_(std::move(plan)),
      uid_(::getuid()),
      gid_(::getgid()),
      reported_(new std::atomic<bool>[plan_.sources.size()]) {
  ::clock_gettime(CLOCK_REALTIME, &time_);
  dir_names_.reserve(plan_.targets.size());
  file_names_.reserve(plan_.targets.size());
  for (size_t i = 0; i < plan_.targets.size(); ++i) {
    const plan::TargetFile& target = plan_.targets[i];
    dir_names_.push_back(target.dir_name());
    file_names_.push_back(target.file_name());
    if (!root_index_.emplace(dir_names_.back(), 2 + 2 * i).second)
      fail("two target files for rank {}", target.rank);
    total_bytes_ += target.file.size();
  }
  for (size_t i = 0; i < plan_.sources.size(); ++i) reported_[i].store(false);
}

Tree::Tree(Tree&&) noexcept = default;
Tree& Tree::operator=(Tree&&) noexcept = default;
Tree::~Tree() = default;

uint64_t Tree::lookup(uint64_t parent, std::string_view name) const {
  const size_t n = plan_.targets.size();
  if (parent == kRootIno) {
    if (name == kDot || name == kDotDot) return kRootIno;
    auto it = root_index_.find(name);
    return it == root_index_.end() ? 0 : it->second;
  }
  if (!is_dir_ino(parent, n)) return 0;
  if (name == kDot) return parent;
  if (name == kDotDot) return kRootIno;
  const size_t i = (parent - 2) / 2;
  return name == file_names_[i] ? parent + 1 : 0;
}

bool Tree::stat(uint64_t ino, struct stat& st) const {
  const size_t n = plan_.targets.size();
  st = {};
  if (ino == kRootIno) {
    st.st_mode = S_IFDIR | 0555;
    // Each subdirectory's ".." links to the root; tools like find rely on this count.
    st.st_nlink = 2 + n;
  } else if (is_dir_ino(ino, n)) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2;
  } else if (is_file_ino(ino, n)) {
    const uint64_t size = plan_.targets[(ino - 3) / 2].file.size();
    st.st_mode = S_IFREG | 0444;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(size);
    st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  } else {
    return false;
  }
  st.st_ino = ino;
  st.st_uid = uid_;
  st.st_gid = gid_;
  st.st_blksize = kBlockSize;
  st.st_atim = st.st_mtim = st.st_ctim = time_;
  return true;
}

std::vector<Tree::DirEntry> Tree::list(uint64_t ino) const {
  const size_t n = plan_.targets.size();
  std::vector<DirEntry> out;
  if (ino == kRootIno) {
    out.reserve(2 + n);
    out.push_back({kRootIno, kDot, true});
    out.push_back({kRootIno, kDotDot, true});
    for (size_t i = 0; i < n; ++i) out.push_back({2 + 2 * i, dir_names_[i], true});
  } else if (is_dir_ino(ino, n)) {
    const size_t i = (ino - 2) / 2;
    out.push_back({ino, kDot, true});
    out.push_back({kRootIno, kDotDot, true});
    out.push_back({ino + 1, file_names_[i], false});
  }
  return out;
}

const plan::VirtualFile* Tree::file(uint64_t ino) const {
  if (!is_file_ino(ino, plan_.targets.size())) return nullptr;
  return &plan_.targets[(ino - 3) / 2].file;
}

void Tree::report(uint32_t source, std::string_view what) const {
  const std::string& path = plan_.sources[source].file.path.native();
  if (!reported_[source].exchange(true, std::memory_order_relaxed))
    spdlog::error("source {}: {}; reads from it fail with EIO", path, what);
  else
    spdlog::debug("source {}: {}", path, what);
}

int Tree::check_sources(std::span<const plan::Run> runs) const {
  // A stamp per source makes "each distinct source once" O(runs) even for strided reads
  // that alternate between many sources. The epoch is per thread and per call, so stamps
  // left by another tree on this thread never match.
  thread_local std::vector<uint64_t> stamps;
  thread_local uint64_t epoch = 0;
  const size_t n = plan_.sources.size();
  if (stamps.size() < n) stamps.resize(n, 0);
  ++epoch;
  for (const plan::Run& run : runs) {
    if (run.mem != nullptr) continue;
    if (run.source >= n) {
      spdlog::error("read mapped to source #{}, but the plan has {} sources", run.source, n);
      return EIO;
    }
    if (stamps[run.source] == epoch) continue;
    stamps[run.source] = epoch;
    if (int err = check_source(run.source)) return err;
  }
  return 0;
}

int Tree::check_source(uint32_t source) const {
  if (plan_.sources[source].file.unchanged()) return 0;
  report(source, "changed since it was mounted");
  return EIO;
}

int Tree::check_file(uint64_t ino) const {
  const plan::VirtualFile* f = file(ino);
  if (f == nullptr)
    return ino == kRootIno || is_dir_ino(ino, plan_.targets.size()) ? EISDIR : ENOENT;
  for (uint32_t s : f->sources()) {
    if (s >= plan_.sources.size()) {
      spdlog::error("{} reads source #{}, but the plan has {} sources", file_names_[(ino - 3) / 2],
                    s, plan_.sources.size());
      return EIO;
    }
    if (int err = check_source(s)) return err;
  }
  return 0;
}

namespace {

// A strided read maps to many short runs of one source file separated by short gaps (each row of
// the target is a piece of a source row). One preadv reads the whole span, the wanted pieces
// into place and the gaps into a scratch sink: one syscall per batch instead of one per run.
// Copying a gap costs about as much as a syscall when it is a few KiB, so longer gaps split
// the batch.
constexpr uint64_t kMaxGap = 16 * 1024;
constexpr size_t kMaxIov = 1024;  // IOV_MAX

// preadv until every iovec is full; false on an error or end of file (errno 0 then).
bool preadv_fully(int fd, std::vector<iovec>& iov, uint64_t offset) {
  size_t first = 0;
  while (first < iov.size()) {
    const ssize_t got = ::preadv(fd, iov.data() + first, static_cast<int>(iov.size() - first),
                                 static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    offset += static_cast<uint64_t>(got);
    for (size_t n = static_cast<size_t>(got); n > 0;) {
      const size_t take = std::min(n, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      n -= take;
      if (iov[first].iov_len == 0) ++first;
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return true;
}

}  // namespace

int Tree::gather(std::span<const plan::Run> runs, char* out) const {
  thread_local std::vector<char> sink(kMaxGap);
  thread_local std::vector<iovec> iov;
  thread_local std::vector<char*> dest;
  thread_local std::vector<std::pair<uint32_t, uint32_t>> by_source;  // (source, run index)
  dest.resize(runs.size());
  by_source.clear();
  for (size_t i = 0; i < runs.size(); ++i) {
    const plan::Run& run = runs[i];
    dest[i] = out;
    out += run.length;
    if (run.mem != nullptr) {
      std::memcpy(dest[i], run.mem, run.length);
    } else if (run.source >= plan_.sources.size()) {
      spdlog::error("read mapped to source #{}, but the plan has {} sources", run.source,
                    plan_.sources.size());
      return EIO;
    } else {
      by_source.emplace_back(run.source, static_cast<uint32_t>(i));
    }
  }
  // A target block that straddles source blocks alternates between their files run by run;
  // taken one source at a time, each file's runs are in offset order and batch again.
  std::stable_sort(by_source.begin(), by_source.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });

  for (size_t k = 0; k < by_source.size();) {
    const uint32_t source = by_source[k].first;
    const uint64_t begin = runs[by_source[k].second].offset;
    uint64_t end = begin;
    iov.clear();
    size_t j = k;
    for (; j < by_source.size() && iov.size() + 2 <= kMaxIov; ++j) {
      const auto [s, index] = by_source[j];
      const plan::Run& next = runs[index];
      if (s != source || next.offset < end || next.offset - end > kMaxGap) break;
      if (next.offset > end) iov.push_back({sink.data(), next.offset - end});
      iov.push_back({dest[index], next.length});
      end = next.offset + next.length;
    }
    if (!preadv_fully(source_fd(source), iov, begin)) {
      if (errno != 0)
        report(source, fmt::format("pread of {} bytes at {} failed: {}", end - begin, begin,
                                   std::strerror(errno)));
      else
        report(source, fmt::format("ends before {}, but bytes up to there are mapped", end));
      return EIO;
    }
    k = j;
  }
  return 0;
}

int Tree::read_into(uint64_t ino, uint64_t off, std::span<char> buf, size_t& got) const {
  got = 0;
  const plan::VirtualFile* f = file(ino);
  if (f == nullptr) return lookup(ino, kDot) != 0 ? EISDIR : ENOENT;
  if (off >= f->size() || buf.empty()) return 0;
  thread_local std::vector<plan::Run> runs;
  runs.clear();
  const uint64_t covered = f->map(off, buf.size(), runs);
  if (int err = check_sources(runs)) return err;
  if (int err = gather(runs, buf.data())) return err;
  got = covered;
  return 0;
}

}  // namespace ckptfs::fs
