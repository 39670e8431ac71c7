#include "ckptfs/fs/tree.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ckptfs/error.h"
#include "source_marks.h"

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
  mapped_ = std::make_unique<MappedSources>(plan_.sources);
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

int Tree::distinct_sources(std::span<const plan::Run> runs, std::vector<uint32_t>& out) const {
  thread_local detail::SourceMarks marks;
  const size_t n = plan_.sources.size();
  marks.begin(n);
  out.clear();
  for (const plan::Run& run : runs) {
    if (run.mem != nullptr) continue;
    if (run.source >= n) {
      spdlog::error("read mapped to source #{}, but the plan has {} sources", run.source, n);
      return EIO;
    }
    if (marks.first(run.source)) out.push_back(run.source);
  }
  return 0;
}

int Tree::check_sources(std::span<const plan::Run> runs) const {
  thread_local std::vector<uint32_t> sources;
  if (int err = distinct_sources(runs, sources)) return err;
  return check_sources(std::span<const uint32_t>(sources));
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

int Tree::gather(std::span<const plan::Run> runs, char* out) const {
  for (const plan::Run& run : runs) {
    if (run.mem != nullptr) continue;
    if (run.source >= mapped_->count()) {
      spdlog::error("read mapped to source #{}, but the plan has {} sources", run.source,
                    mapped_->count());
      return EIO;
    }
    const uint64_t size = mapped_->mapped_size(run.source);
    if (run.offset > size || run.length > size - run.offset) {
      report(run.source, fmt::format("ends before {}, but bytes up to there are mapped",
                                     run.offset + run.length));
      return EIO;
    }
  }
  if (mapped_->copy(runs, out)) return 0;
  // The fault does not say which source shrank; the fingerprint check names it.
  if (check_sources(runs) != 0) return EIO;
  spdlog::error("a source shrank during a read (SIGBUS on its mapping)");
  return EIO;
}

int Tree::check_sources(std::span<const uint32_t> sources) const {
  for (uint32_t source : sources) {
    if (source >= plan_.sources.size()) return EIO;
    if (int err = check_source(source)) return err;
  }
  return 0;
}

int Tree::read_into(uint64_t ino, uint64_t off, std::span<char> buf, size_t& got,
                    std::vector<uint32_t>* sources) const {
  got = 0;
  const plan::VirtualFile* f = file(ino);
  if (f == nullptr) return lookup(ino, kDot) != 0 ? EISDIR : ENOENT;
  if (off >= f->size() || buf.empty()) return 0;
  thread_local std::vector<plan::Run> runs;
  runs.clear();
  const uint64_t covered = f->map(off, buf.size(), runs);
  if (int err = gather(runs, buf.data())) return err;
  // After the copy, not before: write() updates a file's mtime before its bytes, so a source
  // found unchanged now was not written while it was copied.
  thread_local std::vector<uint32_t> read_from;
  std::vector<uint32_t>& list = sources != nullptr ? *sources : read_from;
  if (int err = distinct_sources(runs, list)) return err;
  if (int err = check_sources(std::span<const uint32_t>(list))) return err;
  got = covered;
  if (sources != nullptr) std::sort(sources->begin(), sources->end());
  return 0;
}

}  // namespace ckptfs::fs
