#include "ckptfs/fs/tree.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <system_error>
#include <thread>

#include "access.h"
#include "check_ahead.h"
#include "ckptfs/error.h"
#include "ckptfs/remote/objects.h"
#include "mapped_sources.h"
#include "scratch.h"

namespace ckptfs::fs {

Tree::Tree(plan::Plan plan)
    : plan_(std::move(plan)),
      uid_(::getuid()),
      gid_(::getgid()),
      reported_(new std::atomic<bool>[plan_.sources.size()]) {
  ::clock_gettime(CLOCK_REALTIME, &time_);
  // Inodes in order: each directory, then its files. With one file per rank that is the old
  // fixed layout (2 + 2i, 3 + 2i), which tests and tools may rely on.
  for (size_t i = 0; i < plan_.targets.size(); ++i) {
    const plan::TargetFile& target = plan_.targets[i];
    if (target.rank == plan::kRootRank) {
      // A file at the root (a merged hfai checkpoint's views).
      std::string name = target.file_name();
      if (!root_index_.emplace(name, 2 + nodes_.size()).second)
        fail("two entries named {} at the root", name);
      root_files_.push_back(i);
      file_names_.push_back(std::move(name));
      file_ino_.push_back(2 + nodes_.size());
      nodes_.push_back({false, i});
      total_bytes_ += target.file.size();
      continue;
    }
    if (dirs_.empty() || dirs_.back().rank != target.rank) {
      std::string name = target.dir_name();
      if (!root_index_.emplace(name, 2 + nodes_.size()).second)
        fail("the target files of rank {} are not listed together", target.rank);
      dirs_.push_back({target.rank, std::move(name), 2 + nodes_.size(), {}});
      nodes_.push_back({true, dirs_.size() - 1});
    }
    Dir& dir = dirs_.back();
    std::string name = target.file_name();
    for (size_t other : dir.files)
      if (file_names_[other] == name) fail("two target files {} for rank {}", name, target.rank);
    dir.files.push_back(i);
    file_names_.push_back(std::move(name));
    file_ino_.push_back(2 + nodes_.size());
    nodes_.push_back({false, i});
    total_bytes_ += target.file.size();
  }
  for (size_t i = 0; i < plan_.sources.size(); ++i) {
    reported_[i].store(false);
    encrypted_ = encrypted_ || plan_.sources[i].scan.encrypted;
    remote_ = remote_ || plan_.sources[i].file.fingerprint.dev == remote::kIdentityDev;
  }
  set_mtimes();
  set_access();
  mapped_ = std::make_unique<MappedSources>(plan_.sources);
  if (std::any_of(plan_.sources.begin(), plan_.sources.end(),
                  [](const index::IndexedSource& s) { return s.deferred && !s.deferred->whole(); }))
    ahead_ = std::make_unique<CheckAhead>(kDeferredChecks);
}

namespace {

// Placeholders for the listed files: their names and read modes, no content.
plan::Plan listed_plan(const LazyRanks& lazy) {
  plan::Plan plan;
  for (const LazyRanks::File& f : lazy.files())
    plan.targets.push_back(plan::TargetFile{f.rank, plan::VirtualFile(), f.name, f.page_cache});
  return plan;
}

}  // namespace

Tree::Tree(std::shared_ptr<LazyRanks> lazy) : Tree(listed_plan(*lazy)) {
  lazy_ = std::move(lazy);
  total_bytes_ = 0;
  for (const LazyRanks::File& f : lazy_->files()) total_bytes_ += f.size;
  set_mtimes();
  set_access();
}

uint64_t Tree::file_size(size_t target) const {
  return lazy_ ? lazy_->files()[target].size : plan_.targets[target].file.size();
}

std::pair<const Tree*, uint64_t> Tree::lazy_of(uint64_t ino, bool plan) const {
  const Node* n = lazy_ ? node(ino) : nullptr;
  if (n == nullptr || n->is_dir) return {nullptr, 0};
  return plan ? lazy_->resolve(n->index) : lazy_->planned(n->index);
}

namespace {

bool later(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec != b.tv_sec ? a.tv_sec > b.tv_sec : a.tv_nsec > b.tv_nsec;
}

}  // namespace

namespace {

// The access of the source at `path`. One that cannot be stat'ed now (gone since the scan)
// grants nothing but to the mounter; reading it fails anyway.
Access stat_access(const std::filesystem::path& path, DirStats& dirs, uid_t uid, gid_t gid) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {uid, gid, S_IRUSR};
  return source_access(path, st, dirs);
}

}  // namespace

void Tree::set_access() {
  DirStats dirs;
  if (lazy_) {
    // Listed files: from the sources the summary names, each stat'ed once.
    std::map<std::string, Access, std::less<>> by_path;
    std::vector<Access> of_file;
    file_access_.clear();
    for (const LazyRanks::File& f : lazy_->files()) {
      of_file.clear();
      for (const std::string& path : f.sources) {
        auto it = by_path.find(path);
        if (it == by_path.end())
          it = by_path.emplace(path, stat_access(path, dirs, uid_, gid_)).first;
        of_file.push_back(it->second);
      }
      const Access a = combine_access(of_file, uid_, gid_);
      file_access_.push_back({a.uid, a.gid, a.read});
    }
    std::vector<Access> all;
    for (const auto& [path, a] : by_path) all.push_back(a);
    const Access a = combine_access(all, uid_, gid_);
    sources_access_ = {a.uid, a.gid, a.read};
    return;
  }
  std::vector<Access> sources(plan_.sources.size());
  for (size_t s = 0; s < plan_.sources.size(); ++s)
    sources[s] = stat_access(plan_.sources[s].file.path, dirs, uid_, gid_);
  file_access_.clear();
  file_access_.reserve(plan_.targets.size());
  // A file that reads no source bytes (names, shapes and inline values only) still tells what
  // the sources hold: it takes the access of all of them.
  const Access of_all = combine_access(sources, uid_, gid_);
  sources_access_ = {of_all.uid, of_all.gid, of_all.read};
  std::vector<Access> of_file;
  for (const plan::TargetFile& target : plan_.targets) {
    of_file.clear();
    for (uint32_t s : target.file.sources())
      if (s < sources.size()) of_file.push_back(sources[s]);
    const Access a = of_file.empty() ? of_all : combine_access(of_file, uid_, gid_);
    file_access_.push_back({a.uid, a.gid, a.read});
  }
  // Decrypted bytes are the mounting user's alone, whoever may read the ciphertext.
  if (encrypted_) {
    for (FileAccess& a : file_access_) a = {uid_, gid_, S_IRUSR};
    sources_access_ = {uid_, gid_, S_IRUSR};
  }
}

void Tree::set_mtimes() {
  file_mtimes_.assign(plan_.targets.size(), time_);
  for (size_t i = 0; i < plan_.targets.size(); ++i) {
    if (lazy_) {
      const int64_t ns = lazy_->files()[i].mtime_ns;
      if (ns < 0) continue;  // reads no source: the mount time
      file_mtimes_[i] = {static_cast<time_t>(ns / 1'000'000'000),
                         static_cast<long>(ns % 1'000'000'000)};
      continue;
    }
    const int64_t ns = plan::sources_read(plan_, plan_.targets[i].file).newest_mtime_ns;
    if (ns >= 0)
      file_mtimes_[i] = {static_cast<time_t>(ns / 1'000'000'000),
                         static_cast<long>(ns % 1'000'000'000)};
  }
  dir_mtimes_.assign(dirs_.size(), time_);
  root_mtime_ = time_;
  for (size_t d = 0; d < dirs_.size(); ++d) {
    for (size_t k = 0; k < dirs_[d].files.size(); ++k) {
      const struct timespec& t = file_mtimes_[dirs_[d].files[k]];
      if (k == 0 || later(t, dir_mtimes_[d])) dir_mtimes_[d] = t;
    }
    if (d == 0 || later(dir_mtimes_[d], root_mtime_)) root_mtime_ = dir_mtimes_[d];
  }
}

std::optional<Tree::FileAccess> Tree::file_access(uint64_t ino) const {
  const Node* n = in_steps(ino) ? nullptr : node(ino);
  if (n == nullptr || n->is_dir) return std::nullopt;
  return file_access_[n->index];
}

void Tree::apply_options(struct stat& st) const {
  if (uid_override_) st.st_uid = *uid_override_;
  if (gid_override_) st.st_gid = *gid_override_;
  st.st_mode &= ~umask_;
}

struct timespec Tree::mtime(uint64_t ino) const {
  const Node* n = node(ino);
  if (n == nullptr) return root_mtime_;
  return n->is_dir ? dir_mtimes_[n->index] : file_mtimes_[n->index];
}

Tree::Tree(Tree&&) noexcept = default;
Tree::~Tree() = default;

const Tree::Node* Tree::node(uint64_t ino) const {
  return ino >= 2 && ino - 2 < nodes_.size() ? &nodes_[ino - 2] : nullptr;
}

void Tree::set_steps(std::shared_ptr<Steps> steps) { steps_ = std::move(steps); }

std::pair<std::shared_ptr<const Tree>, uint64_t> Tree::step_of(uint64_t ino, bool plan) const {
  if (!steps_ || ino <= kStepsIno) return {nullptr, 0};
  const uint64_t rel = ino - kStepsIno;
  const uint64_t index = (rel >> 32) - 1;
  const uint64_t local = rel & 0xffffffffu;
  if (index > UINT32_MAX || local == 0) return {nullptr, 0};
  const auto i = static_cast<uint32_t>(index);
  return {plan ? steps_->tree(i) : steps_->planned(i), local};
}

std::pair<const Tree*, uint64_t> Tree::resolve(uint64_t ino,
                                               std::shared_ptr<const Tree>& keep) const {
  if (!in_steps(ino)) return {this, ino};
  auto [tree, local] = step_of(ino, false);
  keep = std::move(tree);
  return keep ? std::pair<const Tree*, uint64_t>{keep.get(), local}
              : std::pair<const Tree*, uint64_t>{nullptr, 0};
}

uint64_t Tree::lookup(uint64_t parent, std::string_view name) const {
  if (in_steps(parent)) {
    if (!steps_) return 0;
    if (parent == kStepsIno) {
      if (name == kDot) return kStepsIno;
      if (name == kDotDot) return kRootIno;
      const std::optional<uint32_t> index = steps_->find(name);
      // The first lookup of a step plans it.
      return index && steps_->tree(*index) ? step_ino(*index, kRootIno) : 0;
    }
    const auto [tree, local] = step_of(parent, false);
    if (!tree) return 0;
    if (local == kRootIno && name == kDotDot) return kStepsIno;
    const uint64_t found = tree->lookup(local, name);
    return found == 0 ? 0 : step_ino(tree->step_index(), found);
  }
  if (parent == kRootIno) {
    if (name == kDot || name == kDotDot) return kRootIno;
    if (steps_ && name == kStepsName) return kStepsIno;
    auto it = root_index_.find(name);
    return it == root_index_.end() ? 0 : it->second;
  }
  const Node* n = node(parent);
  if (n == nullptr || !n->is_dir) return 0;
  if (name == kDot) return parent;
  if (name == kDotDot) return kRootIno;
  for (size_t f : dirs_[n->index].files)
    if (file_names_[f] == name) return file_ino_[f];
  return 0;
}

bool Tree::stat(uint64_t ino, struct stat& st) const {
  st = {};
  if (in_steps(ino) && ino != kStepsIno) {
    const auto [tree, local] = step_of(ino, false);
    if (!tree || !tree->stat(local, st)) return false;
    st.st_ino = ino;
    apply_options(st);
    return true;
  }
  const Node* n = node(ino);
  if (ino == kRootIno) {
    st.st_mode = S_IFDIR | 0555;
    // Each listed subdirectory's ".." links to the root; tools like find rely on this count.
    // "/steps" is not listed (below), so not counted, as ".ckptfs" is not.
    st.st_nlink = 2 + dirs_.size();
  } else if (ino == kStepsIno) {
    if (!steps_) return false;
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2 + steps_->list().size();
  } else if (n != nullptr && n->is_dir) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2;
  } else if (n != nullptr) {
    const uint64_t size = file_size(n->index);
    const FileAccess& access = file_access_[n->index];
    st.st_mode = S_IFREG | access.read;
    st.st_uid = access.uid;
    st.st_gid = access.gid;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(size);
    st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  } else {
    return false;
  }
  st.st_ino = ino;
  if (n == nullptr || n->is_dir) {
    st.st_uid = uid_;
    st.st_gid = gid_;
  }
  apply_options(st);
  st.st_blksize = kBlockSize;
  st.st_atim = st.st_mtim = mtime(ino);
  st.st_ctim = time_;
  return true;
}

std::vector<Tree::DirEntry> Tree::list(uint64_t ino) const {
  std::vector<DirEntry> out;
  if (in_steps(ino)) {
    if (!steps_) return out;
    if (ino == kStepsIno) {
      out.push_back({kStepsIno, kDot, true});
      out.push_back({kRootIno, kDotDot, true});
      for (const Steps::Entry& e : steps_->list())
        out.push_back({step_ino(e.index, kRootIno), e.name, true});
      return out;
    }
    const auto [tree, local] = step_of(ino, false);
    if (!tree) return out;
    out = tree->list(local);
    for (DirEntry& e : out)
      e.ino =
          local == kRootIno && e.name == kDotDot ? kStepsIno : step_ino(tree->step_index(), e.ino);
    return out;
  }
  const Node* n = node(ino);
  if (ino == kRootIno) {
    out.reserve(3 + dirs_.size());
    out.push_back({kRootIno, kDot, true});
    out.push_back({kRootIno, kDotDot, true});
    for (const Dir& d : dirs_) out.push_back({d.ino, d.name, true});
    for (size_t f : root_files_) out.push_back({file_ino_[f], file_names_[f], false});
    // "/steps" is reached by its name only: listed, it would make `cp -r MOUNTPOINT`, rsync or
    // du walk every saved step (N times the served checkpoint's bytes).
  } else if (n != nullptr && n->is_dir) {
    out.push_back({ino, kDot, true});
    out.push_back({kRootIno, kDotDot, true});
    for (size_t f : dirs_[n->index].files) out.push_back({file_ino_[f], file_names_[f], false});
  }
  return out;
}

const plan::VirtualFile* Tree::file(uint64_t ino) const {
  const plan::TargetFile* t = target(ino);
  return t == nullptr ? nullptr : &t->file;
}

const plan::TargetFile* Tree::target(uint64_t ino) const {
  if (in_steps(ino)) {
    // The step's Tree outlives this pointer's use: Steps keeps a dropped one for its grace
    // period.
    const auto [tree, local] = step_of(ino, false);
    return tree ? tree->target(local) : nullptr;
  }
  const Node* n = node(ino);
  if (n == nullptr || n->is_dir) return nullptr;
  if (lazy_) {
    const auto [tree, local] = lazy_->resolve(n->index);
    return tree ? tree->target(local) : nullptr;
  }
  return &plan_.targets[n->index];
}

void Tree::report(uint32_t source, std::string_view what) const {
  const std::string& path = plan_.sources[source].file.path.native();
  if (!reported_[source].exchange(true, std::memory_order_relaxed))
    spdlog::error("source {}: {}; reads from it fail with EIO", path, what);
  else
    spdlog::debug("source {}: {}", path, what);
}

int Tree::distinct_sources(std::span<const plan::Run> runs, std::vector<uint32_t>& out,
                           std::vector<uint64_t>* ends) const {
  detail::SourceMarks& marks = detail::scratch().check_marks;
  const size_t n = plan_.sources.size();
  marks.begin(n);
  out.clear();
  if (ends) ends->clear();
  for (const plan::Run& run : runs) {
    if (run.mem != nullptr) continue;
    if (run.source >= n) {
      spdlog::error("read mapped to source #{}, but the plan has {} sources", run.source, n);
      return EIO;
    }
    if (!ends) {
      if (marks.first(run.source)) out.push_back(run.source);
    } else if (marks.first(run.source, static_cast<uint32_t>(out.size()))) {
      out.push_back(run.source);
      ends->push_back(run.offset + run.length);
    } else {
      uint64_t& end = (*ends)[marks.at(run.source)];
      end = std::max(end, run.offset + run.length);
    }
  }
  return 0;
}

int Tree::check_sources(std::span<const plan::Run> runs) const {
  detail::Scratch& scratch = detail::scratch();
  if (int err = distinct_sources(runs, scratch.check_sources, &scratch.check_ends)) return err;
  return check_sources(std::span<const uint32_t>(scratch.check_sources),
                       std::span<const uint64_t>(scratch.check_ends));
}

int Tree::check_source(uint32_t source, uint64_t upto) const {
  // Once seen changed, always refused: putting the mtime (or even the bytes) back does not make
  // the views planned from the old bytes right for whatever was read in between.
  if (reported_[source].load(std::memory_order_relaxed)) return EIO;
  const index::IndexedSource& s = plan_.sources[source];
  if (s.deferred) {
    std::string why;
    switch (s.deferred->verify(s.file.fd.get(), s.file.path.native(), s.scan, upto, why)) {
      case index::DeferredCheck::Result::kMatched:
        break;
      case index::DeferredCheck::Result::kDiffers:
        report(source, why);
        return EIO;
      case index::DeferredCheck::Result::kUnreadable:  // asked again by the next read
        spdlog::error("source {}: {}; this read fails with EIO", s.file.path.native(), why);
        return EIO;
    }
  }
  if (s.file.unchanged()) return 0;
  report(source, "changed since it was mounted");
  return EIO;
}

void Tree::verify_deferred(std::span<const uint32_t> sources) const {
  std::vector<uint32_t> pending;
  for (uint32_t s : sources)
    if (s < plan_.sources.size() && plan_.sources[s].deferred &&
        plan_.sources[s].deferred->whole() && plan_.sources[s].deferred->pending())
      pending.push_back(s);
  if (pending.size() < 2) return;  // check_source does one on its own
  // Over an S3 filesystem each check fetches a whole .ckpt: one at a time, a file of a
  // tensor-parallel view (which reads every source) would wait for them in turn.
  std::atomic<size_t> next{0};
  // Only a head start: whatever one of these fails to check (out of memory), the caller's own
  // check_source of each source makes again, on its thread.
  const auto work = [&]() noexcept {
    try {
      for (size_t k; (k = next.fetch_add(1)) < pending.size();) check_source(pending[k]);
    } catch (const std::exception& e) {
      spdlog::debug("checking sources' headers: {}", e.what());
    }
  };
  std::vector<std::thread> threads;
  const size_t count = std::min(pending.size(), kDeferredChecks) - 1;
  try {
    threads.reserve(count);
    for (size_t i = 0; i < count; ++i) threads.emplace_back(work);
  } catch (const std::exception& e) {  // no thread (or memory) to be had: fewer at once
    spdlog::debug("checking sources' headers with {} threads: {}", threads.size() + 1, e.what());
  }
  work();
  for (std::thread& t : threads) t.join();
}

int Tree::check_file(uint64_t ino) const {
  if (ino == kStepsIno) return steps_ ? EISDIR : ENOENT;
  if (in_steps(ino)) {
    const auto [tree, local] = step_of(ino, false);
    return tree ? tree->check_file(local) : ENOENT;
  }
  if (const Node* n = node(ino); lazy_ && n != nullptr && !n->is_dir) {
    const auto [tree, local] = lazy_of(ino, true);
    return tree ? tree->check_file(local) : EIO;
  }
  const plan::VirtualFile* f = file(ino);
  if (f == nullptr) return ino == kRootIno || node(ino) != nullptr ? EISDIR : ENOENT;
  verify_deferred(f->sources());
  for (uint32_t s : f->sources())
    if (ahead_ && s < plan_.sources.size() && plan_.sources[s].deferred &&
        plan_.sources[s].deferred->pending())
      ahead_->add(plan_.sources[s]);
  for (uint32_t s : f->sources()) {
    if (s >= plan_.sources.size()) {
      spdlog::error("{} reads source #{}, but the plan has {} sources",
                    file_names_[node(ino)->index], s, plan_.sources.size());
      return EIO;
    }
    if (int err = check_source(s)) return err;
  }
  return 0;
}

ReadResult Tree::gather(std::span<const plan::Run> runs, char* out) const {
  for (const plan::Run& run : runs) {
    if (run.mem != nullptr) continue;
    if (run.source >= mapped_->count()) {
      spdlog::error("read mapped to source #{}, but the plan has {} sources", run.source,
                    mapped_->count());
      return ReadResult::failed(EIO);
    }
    const uint64_t size = mapped_->mapped_size(run.source);
    if (run.offset > size || run.length > size - run.offset) {
      report(run.source, fmt::format("ends before {}, but bytes up to there are mapped",
                                     run.offset + run.length));
      return ReadResult::failed(EIO);
    }
  }
  const ReadResult copied = mapped_->copy(runs, out);
  if (copied.ok()) return copied;
  // The fault does not say which source shrank; the fingerprint check names it. A failed GET
  // of an S3 object was logged with its reason already.
  if (check_sources(runs) == 0 && !remote_)
    spdlog::error("a source shrank during a read (SIGBUS on its mapping)");
  return copied;
}

int Tree::check_sources(uint64_t ino, std::span<const uint32_t> sources) const {
  if (lazy_) {
    const auto [tree, local] = lazy_of(ino, false);
    return tree ? tree->check_sources(sources) : EIO;
  }
  return check_sources(sources);
}

int Tree::check_sources(std::span<const uint32_t> sources) const {
  return check_sources(sources, {});
}

int Tree::check_sources(std::span<const uint32_t> sources, std::span<const uint64_t> ends) const {
  verify_deferred(sources);
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i] >= plan_.sources.size()) return EIO;
    if (int err = check_source(sources[i], i < ends.size() ? ends[i] : 0)) return err;
  }
  return 0;
}

ReadResult Tree::read_into(uint64_t ino, uint64_t off, std::span<char> buf,
                           std::vector<uint32_t>* sources) const {
  if (in_steps(ino) && ino != kStepsIno) {
    // A step dropped after its grace period: its sources are closed, the bytes gone.
    const auto [tree, local] = step_of(ino, false);
    return tree ? tree->read_into(local, off, buf, sources) : ReadResult::failed(EIO);
  }
  if (const Node* n = node(ino); lazy_ && n != nullptr && !n->is_dir) {
    const auto [tree, local] = lazy_of(ino, true);
    return tree ? tree->read_into(local, off, buf, sources) : ReadResult::failed(EIO);
  }
  const plan::VirtualFile* f = file(ino);
  if (f == nullptr) return ReadResult::failed(lookup(ino, kDot) != 0 ? EISDIR : ENOENT);
  if (off >= f->size() || buf.empty()) return ReadResult::done(0);
  std::vector<plan::Run>& runs = detail::scratch().read_runs;
  runs.clear();
  const uint64_t covered = f->map(off, buf.size(), runs);
  if (const ReadResult gathered = gather(runs, buf.data()); !gathered.ok()) return gathered;
  // After the copy, not before: write() updates a file's mtime before its bytes, so a source
  // found unchanged now was not written while it was copied.
  detail::Scratch& scratch = detail::scratch();
  std::vector<uint32_t>& list = sources != nullptr ? *sources : scratch.read_sources;
  if (int err = distinct_sources(runs, list, &scratch.read_ends)) return ReadResult::failed(err);
  if (int err = check_sources(std::span<const uint32_t>(list),
                              std::span<const uint64_t>(scratch.read_ends)))
    return ReadResult::failed(err);
  if (sources != nullptr) std::sort(sources->begin(), sources->end());
  return ReadResult::done(covered);
}

}  // namespace ckptfs::fs
