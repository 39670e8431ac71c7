#include "status.h"

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>

#include "ckptfs/error.h"
#include "ckptfs/index/deferred_check.h"
#include "ckptfs/plan/file_records.h"
#include "ckptfs/safetensors/format.h"
#include "ckptfs/safetensors/scanner.h"
#include "ckptfs/source/discover.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs::fs {

namespace {

constexpr std::string_view kSourcesName = "sources.json";
constexpr std::string_view kStatsName = "stats.json";
constexpr std::string_view kLogName = "log";
constexpr std::string_view kPlanName = "plan";
constexpr std::string_view kRootPlanName = "root.json";

// A pattern of runs repeats with at most this many runs per period (a target row assembled
// from up to this many source blocks) to be kept as groups.
constexpr size_t kMaxPeriod = 8;
// Target bytes mapped at a time: bounds the run list held while grouping.
constexpr uint64_t kMapChunk = 16 << 20;
// The extended attributes' values stay below the kernel's XATTR_SIZE_MAX (64 KiB).
constexpr size_t kMaxXattr = 60 * 1024;

Access access(const Tree::FileAccess& a) { return {a.uid, a.gid, a.read}; }

std::string json_string(std::string_view text) {
  std::string out;
  safetensors::append_json_string(out, text);
  return out;
}

std::string iso_time(int64_t ns) {
  const time_t seconds = static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm {};
  ::gmtime_r(&seconds, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:09}Z", buf, ns % 1'000'000'000);
}

struct MappedRun {
  plan::Run run;
  uint64_t at = 0;
};

bool repeats(const MappedRun& a, const MappedRun& b) {
  return a.run.mem == nullptr && b.run.mem == nullptr && a.run.source == b.run.source &&
         a.run.length == b.run.length;
}

int64_t delta(uint64_t from, uint64_t to) {
  return static_cast<int64_t>(to) - static_cast<int64_t>(from);
}

// Runs [i, i + k * p) as p groups of k repetitions, if the runs repeat with period p at least
// twice from i: the k largest with every offset step equal. Returns k (1: no repetition).
size_t repetitions(std::span<const MappedRun> runs, size_t i, size_t p) {
  const size_t n = runs.size();
  if (i + 2 * p > n) return 1;
  const uint64_t at_step = runs[i + p].at - runs[i].at;
  for (size_t j = 0; j < p; ++j)
    if (!repeats(runs[i + j], runs[i + p + j]) || runs[i + p + j].at - runs[i + j].at != at_step)
      return 1;
  size_t k = 2;
  for (; i + (k + 1) * p <= n; ++k) {
    for (size_t j = 0; j < p; ++j) {
      const MappedRun& first = runs[i + j];
      const MappedRun& prev = runs[i + (k - 1) * p + j];
      const MappedRun& next = runs[i + k * p + j];
      if (!repeats(first, next) || next.at - prev.at != at_step ||
          delta(prev.run.offset, next.run.offset) !=
              delta(first.run.offset, runs[i + p + j].run.offset))
        return k;
    }
  }
  return k;
}

void group(std::span<const MappedRun> runs, std::vector<Extent>& out) {
  const size_t n = runs.size();
  for (size_t i = 0; i < n;) {
    size_t best_p = 0, best_k = 1;
    for (size_t p = 1; p <= kMaxPeriod; ++p) {
      const size_t k = repetitions(runs, i, p);
      if (k >= 2 && k * p > best_k * std::max<size_t>(best_p, 1)) {
        best_p = p;
        best_k = k;
      }
    }
    if (best_p == 0) {
      const MappedRun& r = runs[i];
      Extent e;
      e.length = r.run.length;
      e.at = r.at;
      if (r.run.mem != nullptr) {
        e.bytes.assign(r.run.mem, r.run.length);
      } else {
        e.source = r.run.source;
        e.offset = r.run.offset;
      }
      out.push_back(std::move(e));
      ++i;
      continue;
    }
    for (size_t j = 0; j < best_p; ++j) {
      const MappedRun& r = runs[i + j];
      Extent e;
      e.source = r.run.source;
      e.offset = r.run.offset;
      e.length = r.run.length;
      e.at = r.at;
      e.count = best_k;
      e.stride = delta(r.run.offset, runs[i + best_p + j].run.offset);
      e.at_stride = runs[i + best_p + j].at - r.at;
      out.push_back(std::move(e));
    }
    i += best_p * best_k;
  }
}

// Whether `e` is the next repetition(s) of group `g`.
bool continues(const Extent& g, const Extent& e) {
  if (g.source < 0 || g.source != e.source || g.length != e.length || g.count < 2) return false;
  if (e.count > 1 && (e.stride != g.stride || e.at_stride != g.at_stride)) return false;
  return e.at == g.at + g.count * g.at_stride &&
         static_cast<int64_t>(e.offset) ==
             static_cast<int64_t>(g.offset) + static_cast<int64_t>(g.count) * g.stride;
}

// Appends `fresh` (one chunk's groups) to `out`, extending the groups the previous chunk ended
// with where the pattern goes on across the chunk boundary.
void append_groups(std::vector<Extent>& out, std::vector<Extent>& fresh, size_t first_new) {
  size_t tail_begin = first_new > kMaxPeriod ? first_new - kMaxPeriod : 0;
  for (Extent& e : fresh) {
    bool merged = false;
    for (size_t t = tail_begin; t < first_new && !merged; ++t) {
      if (continues(out[t], e)) {
        out[t].count += e.count;
        merged = true;
      }
    }
    if (!merged) {
      out.push_back(std::move(e));
      tail_begin = first_new;  // merging past a new group would break target order
    }
  }
  fresh.clear();
}

// `hide_bytes`: the view reads an encrypted source, whose memory extents (record headers, inline
// values) are plaintext: only where they are is shown.
std::string extent_json(const Extent& e, const std::vector<uint32_t>& file_sources,
                        bool hide_bytes) {
  if (e.source < 0 && hide_bytes) return fmt::format(R"({{"at":{},"length":{}}})", e.at, e.length);
  if (e.source < 0) {
    std::string hex;
    for (unsigned char c : e.bytes) hex += fmt::format("{:02x}", c);
    return fmt::format(R"({{"at":{},"length":{},"hex":"{}"}})", e.at, e.length, hex);
  }
  const auto it =
      std::lower_bound(file_sources.begin(), file_sources.end(), static_cast<uint32_t>(e.source));
  const size_t file = static_cast<size_t>(it - file_sources.begin());
  if (e.count == 1)
    return fmt::format(R"({{"file":{},"offset":{},"length":{},"at":{}}})", file, e.offset, e.length,
                       e.at);
  return fmt::format(
      R"({{"file":{},"offset":{},"length":{},"at":{},"count":{},"stride":{},"at_stride":{}}})",
      file, e.offset, e.length, e.at, e.count, e.stride, e.at_stride);
}

}  // namespace

void map_extents(const plan::VirtualFile& file, uint64_t offset, uint64_t length,
                 std::vector<Extent>& out) {
  std::vector<plan::Run> runs;
  std::vector<MappedRun> mapped;
  std::vector<Extent> fresh;
  const uint64_t end = std::min(file.size(), offset + length);
  for (uint64_t pos = offset; pos < end;) {
    const uint64_t chunk = std::min(kMapChunk, end - pos);
    runs.clear();
    file.map(pos, chunk, runs);
    mapped.clear();
    uint64_t at = pos;
    for (const plan::Run& r : runs) {
      mapped.push_back({r, at});
      at += r.length;
    }
    group(mapped, fresh);
    append_groups(out, fresh, out.size());
    pos += chunk;
  }
}

FilePlan describe_file(const Tree& tree, uint64_t ino) {
  const plan::TargetFile* target = tree.target(ino);
  if (target == nullptr) fail("inode {} is not a file", ino);
  plan::PlannedRecords planned = plan::planned_records(*target);
  FilePlan out;
  out.format = planned.format;
  out.size = target->file.size();
  out.records.reserve(planned.records.size());
  for (plan::PlannedRecord& p : planned.records) {
    RecordPlan& r = out.records.emplace_back();
    r.name = std::move(p.name);
    r.dtype = std::move(p.dtype);
    r.shape = std::move(p.shape);
    r.ranges = std::move(p.ranges);
  }
  for (RecordPlan& r : out.records)
    for (const auto& [offset, length] : r.ranges)
      map_extents(target->file, offset, length, r.extents);
  return out;
}

Status::Status(const Tree& tree, std::string chosen)
    : tree_(tree),
      chosen_(std::move(chosen)),
      uid_(::getuid()),
      gid_(::getgid()),
      all_access_(access(tree.sources_access())),
      log_access_(all_access_),
      ring_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(kLogLines)) {
  for (const index::IndexedSource& s : tree.plan().sources) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::absolute(s.file.path, ec);
    paths_.push_back((ec ? s.file.path : p).lexically_normal().string());
  }
  if (const LazyRanks* lazy = tree.lazy())
    for (size_t i = 0; i < lazy->files().size(); ++i) lazy_files_.emplace(tree.target_ino(i), i);
  bool root_files = false;
  for (const Tree::DirEntry& e : tree.list(Tree::kRootIno)) {
    if (!e.is_dir) {
      root_files = true;
    } else if (e.ino != Tree::kRootIno && e.ino != Tree::kStepsIno) {
      plan_names_.push_back(fmt::format("{}.json", e.name));
      plan_dirs_.push_back(e.ino);
    }
  }
  if (root_files) {
    plan_names_.emplace_back(kRootPlanName);
    plan_dirs_.push_back(Tree::kRootIno);
  }
  for (uint64_t dir : plan_dirs_) {
    std::vector<Access> files;
    for (const Tree::DirEntry& e : tree.list(dir))
      if (const auto a = e.is_dir ? std::nullopt : tree.file_access(e.ino))
        files.push_back(access(*a));
    plan_access_.push_back(files.empty() ? all_access_ : combine_access(files, uid_, gid_));
  }
}

Access Status::log_access() const {
  std::vector<Access> seen;
  const std::shared_ptr<Steps>& steps = tree_.steps();
  if (steps)
    for (const Steps::Entry& e : steps->list())
      if (const std::shared_ptr<const Tree> step = steps->planned(e.index))
        seen.push_back(access(step->sources_access()));
  std::lock_guard lock(log_mutex_);
  seen.push_back(log_access_);
  log_access_ = combine_access(seen, uid_, gid_);
  return log_access_;
}

Access Status::access_of(uint64_t ino) const {
  if (ino == kStatsIno || ino == kLogIno) return log_access();
  if (ino >= kFirstPlanIno && ino - kFirstPlanIno < plan_access_.size())
    return plan_access_[ino - kFirstPlanIno];
  return all_access_;
}

Status::~Status() = default;

std::shared_ptr<spdlog::sinks::sink> Status::log_sink() const { return ring_; }

uint64_t Status::lookup(uint64_t parent, std::string_view name) const {
  if (parent == Tree::kRootIno) return name == kDirName ? kDirIno : 0;
  if (parent == kDirIno) {
    if (name == kDot) return kDirIno;
    if (name == kDotDot) return Tree::kRootIno;
    if (name == kSourcesName) return kSourcesIno;
    if (name == kStatsName) return kStatsIno;
    if (name == kLogName) return kLogIno;
    if (name == kPlanName) return kPlanDirIno;
    return 0;
  }
  if (parent == kPlanDirIno) {
    if (name == kDot) return kPlanDirIno;
    if (name == kDotDot) return kDirIno;
    for (size_t i = 0; i < plan_names_.size(); ++i)
      if (plan_names_[i] == name) return kFirstPlanIno + i;
  }
  return 0;
}

bool Status::is_file(uint64_t ino) const {
  return ino == kSourcesIno || ino == kStatsIno || ino == kLogIno ||
         (ino >= kFirstPlanIno && ino - kFirstPlanIno < plan_names_.size());
}

bool Status::stat(uint64_t ino, struct stat& st) const {
  const bool dir = ino == kDirIno || ino == kPlanDirIno;
  if (!dir && !is_file(ino)) return false;
  // Times as the root shows them.
  if (!tree_.stat(Tree::kRootIno, st)) return false;
  const Access a = access_of(ino);
  st.st_ino = ino;
  st.st_size = 0;
  st.st_blocks = 0;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  if (dir) {
    st.st_mode = S_IFDIR | a.read | (a.read >> 2);  // r-x for each class that may read
    st.st_nlink = ino == kDirIno ? 3 : 2;
  } else {
    st.st_mode = S_IFREG | a.read;
    st.st_nlink = 1;
  }
  tree_.apply_options(st);
  return true;
}

std::vector<Tree::DirEntry> Status::list(uint64_t ino) const {
  std::vector<Tree::DirEntry> out;
  if (ino == kDirIno) {
    out.push_back({kDirIno, kDot, true});
    out.push_back({Tree::kRootIno, kDotDot, true});
    out.push_back({kSourcesIno, kSourcesName, false});
    out.push_back({kPlanDirIno, kPlanName, true});
    out.push_back({kStatsIno, kStatsName, false});
    out.push_back({kLogIno, kLogName, false});
  } else if (ino == kPlanDirIno) {
    out.push_back({kPlanDirIno, kDot, true});
    out.push_back({kDirIno, kDotDot, true});
    for (size_t i = 0; i < plan_names_.size(); ++i)
      out.push_back({kFirstPlanIno + i, plan_names_[i], false});
  }
  return out;
}

std::string Status::content(uint64_t ino, const ReadTotals& totals) const {
  if (ino == kSourcesIno) return sources_json();
  if (ino == kStatsIno) return stats_json(totals);
  if (ino == kLogIno) return log_text();
  if (ino >= kFirstPlanIno && ino - kFirstPlanIno < plan_names_.size())
    return plan_json(ino - kFirstPlanIno);
  fail("inode {} is not a status file", ino);
}

std::string Status::source_path(const Tree& tree, uint32_t source) const {
  if (&tree == &tree_ && source < paths_.size()) return paths_[source];
  const auto& sources = tree.plan().sources;
  return source < sources.size() ? sources[source].file.path.string() : std::string("?");
}

std::pair<const Tree*, uint64_t> Status::serving(uint64_t ino,
                                                 std::shared_ptr<const Tree>& keep) const {
  const auto [tree, local] = tree_.resolve(ino, keep);
  if (tree != &tree_ || tree_.lazy() == nullptr) return {tree, local};
  const auto it = lazy_files_.find(ino);
  // target() plans the file's rank, as any first use of it does.
  if (it == lazy_files_.end() || tree_.target(ino) == nullptr) return {nullptr, 0};
  return tree_.lazy()->planned(it->second);
}

std::string Status::sources_json() const {
  // The mount's sources, or those of the ranks planned so far when they are listed from a
  // shipped index, each once (ranks may share sources), in the order of the ranks.
  struct Listed {
    const index::IndexedSource* source;
    std::string path;
    std::string rank;
  };
  std::vector<Listed> listed;
  const auto add = [&](const Tree& tree) {
    const plan::Plan& plan = tree.plan();
    for (size_t i = 0; i < plan.sources.size(); ++i) {
      std::string path = source_path(tree, static_cast<uint32_t>(i));
      if (std::any_of(listed.begin(), listed.end(),
                      [&](const Listed& l) { return l.path == path; }))
        continue;
      listed.push_back({&plan.sources[i], std::move(path),
                        i < plan.source_ranks.size() ? std::to_string(plan.source_ranks[i])
                                                     : std::string("null")});
    }
  };
  add(tree_);
  if (const LazyRanks* lazy = tree_.lazy()) {
    const Tree* last = nullptr;
    for (size_t f = 0; f < lazy->files().size(); ++f)
      if (const Tree* rank = lazy->planned(f).first; rank != nullptr && rank != last) {
        add(*rank);
        last = rank;
      }
  }
  std::string out = fmt::format("{{\n\"chosen\": {},\n\"sources\": [", json_string(chosen_));
  for (size_t i = 0; i < listed.size(); ++i) {
    const index::IndexedSource& s = *listed[i].source;
    const std::string name = s.file.path.filename().string();
    std::string step = "null";
    bool breakpoint = false;
    if (name.ends_with(".ckpt") || safetensors::is_safetensors_name(name)) {
      const source::Candidate c = source::make_candidate(name);
      if (c.step) step = json_string(c.step->str());
      breakpoint = c.breakpoint;
    }
    const std::string& rank = listed[i].rank;
    out += fmt::format(
        "{}\n {{\"rank\": {}, \"path\": {}, \"format\": \"{}\", \"size\": {}, \"mtime\": \"{}\", "
        "\"mtime_ns\": {}, \"step\": {}, \"breakpoint\": {}, \"records\": {}, \"from_index\": {}}}",
        i == 0 ? "" : ",", rank, json_string(listed[i].path), format_name(s.scan.format),
        s.file.fingerprint.size, iso_time(s.file.fingerprint.mtime_ns), s.file.fingerprint.mtime_ns,
        step, breakpoint, s.scan.params.size(), s.from_index);
  }
  out += "\n]\n}\n";
  return out;
}

std::string Status::plan_json(size_t index) const {
  const uint64_t dir = plan_dirs_[index];
  std::string out =
      fmt::format("{{\n\"dir\": {},\n\"files\": [",
                  dir == Tree::kRootIno
                      ? std::string("\"\"")
                      : json_string(plan_names_[index].substr(0, plan_names_[index].size() - 5)));
  bool first_file = true;
  for (const Tree::DirEntry& e : tree_.list(dir)) {
    if (e.is_dir) continue;
    // The tree whose source table the file's runs index.
    std::shared_ptr<const Tree> keep;
    const auto [tree, local] = serving(e.ino, keep);
    const plan::TargetFile* target = tree ? tree->target(local) : nullptr;
    if (target == nullptr) continue;
    const FilePlan fp = describe_file(*tree, local);
    const std::vector<uint32_t>& sources = target->file.sources();
    out += fmt::format("{}\n{{\"file\": {}, \"format\": \"{}\", \"size\": {},\n \"sources\": [",
                       first_file ? "" : ",", json_string(path_of(e.ino)), fp.format, fp.size);
    first_file = false;
    for (size_t i = 0; i < sources.size(); ++i)
      out += fmt::format("{}{}", i == 0 ? "" : ", ", json_string(source_path(*tree, sources[i])));
    out += "],\n \"records\": [";
    for (size_t r = 0; r < fp.records.size(); ++r) {
      const RecordPlan& rec = fp.records[r];
      out += fmt::format("{}\n  {{\"name\": {}, \"dtype\": {}, \"shape\": {}, \"ranges\": [",
                         r == 0 ? "" : ",", json_string(rec.name), json_string(rec.dtype),
                         shape_text(rec.shape));
      for (size_t k = 0; k < rec.ranges.size(); ++k)
        out +=
            fmt::format("{}[{},{}]", k == 0 ? "" : ",", rec.ranges[k].first, rec.ranges[k].second);
      out += "], \"extents\": [";
      for (size_t k = 0; k < rec.extents.size(); ++k) {
        if (k != 0) out += ',';
        out += extent_json(rec.extents[k], sources, tree->encrypted());
      }
      out += "]}";
    }
    out += "\n ]}";
  }
  out += "\n]\n}\n";
  return out;
}

Status::FileCounters* Status::counters(uint64_t ino) const {
  {
    std::shared_lock lock(mutex_);
    auto it = files_.find(ino);
    if (it != files_.end()) return it->second.get();
  }
  std::unique_lock lock(mutex_);
  auto& slot = files_[ino];
  if (!slot) {
    slot = std::make_unique<FileCounters>();
    slot->path = path_of(ino);
  }
  return slot.get();
}

void Status::opened(uint64_t ino) noexcept {
  try {
    FileCounters* c = counters(ino);
    if (c->opens.fetch_add(1, std::memory_order_relaxed) == 0) {
      const plan::VirtualFile* f = tree_.file(ino);
      spdlog::info("first open of {} ({} bytes from {} source files)", c->path, f ? f->size() : 0,
                   f ? f->sources().size() : 0);
    }
  } catch (const std::exception& e) {
    spdlog::warn("status: {}", e.what());
  }
}

void Status::served(uint64_t ino, uint64_t bytes) noexcept {
  reads_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  try {
    FileCounters* c = counters(ino);
    c->reads.fetch_add(1, std::memory_order_relaxed);
    c->bytes.fetch_add(bytes, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    spdlog::warn("status: {}", e.what());
  }
}

void Status::count_failed(uint64_t ino,
                          const std::function<void(const FileCounters&)>& log) noexcept {
  failed_.fetch_add(1, std::memory_order_relaxed);
  try {
    FileCounters* c = counters(ino);
    c->failed.fetch_add(1, std::memory_order_relaxed);
    log(*c);
  } catch (const std::exception& e) {
    spdlog::warn("status: {}", e.what());
  }
}

void Status::failed(uint64_t ino, uint64_t offset, uint64_t size, int err) noexcept {
  count_failed(ino, [&](const FileCounters& c) { log_failed(c, ino, offset, size, err); });
}

void Status::open_failed(uint64_t ino, int err) noexcept {
  // Only EIO is a failure of the mount's (a changed source); ENOENT or EISDIR are the caller's.
  if (err != EIO) return;
  count_failed(ino, [&](const FileCounters& c) {
    spdlog::info("open of {} failed: {} (EIO){}", c.path, std::strerror(err),
                 changed_sources(ino, 0, 0));
  });
}

// "; changed since mounted: ..." (or "; sources: ..." when none changed) for the bytes
// [offset, offset + size) of `ino`, or of the whole file when `size` is 0.
std::string Status::changed_sources(uint64_t ino, uint64_t offset, uint64_t size) const {
  std::string sources;
  std::shared_ptr<const Tree> keep;
  const auto [tree, local] = serving(ino, keep);
  if (const plan::VirtualFile* f = tree ? tree->file(local) : nullptr) {
    std::vector<plan::Run> runs;
    f->map(offset, size == 0 ? f->size() : size, runs);
    std::vector<uint32_t> read;
    for (const plan::Run& r : runs)
      if (r.mem == nullptr && std::find(read.begin(), read.end(), r.source) == read.end())
        read.push_back(r.source);
    std::vector<std::string> changed, rewritten, others;
    for (uint32_t s : read) {
      const index::IndexedSource* source =
          s < tree->plan().sources.size() ? &tree->plan().sources[s] : nullptr;
      if (source && source->deferred && source->deferred->differs())
        rewritten.push_back(source_path(*tree, s));
      else
        (source && source->file.unchanged() ? others : changed).push_back(source_path(*tree, s));
    }
    if (!rewritten.empty())
      sources = fmt::format("; headers not those indexed: {}", fmt::join(rewritten, ", "));
    if (!changed.empty())
      sources += fmt::format("; changed since mounted: {}", fmt::join(changed, ", "));
    else if (!others.empty() && rewritten.empty())
      sources = fmt::format(
          "; sources: {}{}",
          fmt::join(others.begin(), others.begin() + std::min<size_t>(4, others.size()), ", "),
          others.size() > 4 ? fmt::format(" and {} more", others.size() - 4) : "");
  }
  return sources;
}

void Status::log_failed(const FileCounters& c, uint64_t ino, uint64_t offset, uint64_t size,
                        int err) const {
  // Which sources the range reads, changed ones first: those are why it failed.
  const std::string sources = changed_sources(ino, offset, std::max<uint64_t>(size, 1));
  spdlog::info("read of {} at byte offset {} ({} bytes) failed: {} ({}){}", c.path, offset, size,
               std::strerror(err), err == EIO ? "EIO" : std::to_string(err), sources);
}

std::string Status::stats_json(const ReadTotals& totals) const {
  std::string out = fmt::format(
      "{{\n\"reads\": {},\n\"bytes\": {},\n\"read_ahead_hits\": {},\n\"read_ahead_blocks\": "
      "{},\n\"spliced\": {},\n\"eio\": {},\n\"files\": {{",
      reads_.load(), bytes_.load(), totals.read_ahead_hits, totals.read_ahead_blocks,
      totals.spliced, failed_.load());
  std::vector<const FileCounters*> files;
  {
    std::shared_lock lock(mutex_);
    for (const auto& [ino, c] : files_) files.push_back(c.get());
  }
  std::sort(files.begin(), files.end(),
            [](const FileCounters* a, const FileCounters* b) { return a->path < b->path; });
  for (size_t i = 0; i < files.size(); ++i)
    out += fmt::format("{}\n {}: {{\"opens\": {}, \"reads\": {}, \"bytes\": {}, \"eio\": {}}}",
                       i == 0 ? "" : ",", json_string(files[i]->path), files[i]->opens.load(),
                       files[i]->reads.load(), files[i]->bytes.load(), files[i]->failed.load());
  out += "\n}\n}\n";
  return out;
}

std::string Status::log_text() const {
  auto* ring = static_cast<spdlog::sinks::ringbuffer_sink_mt*>(ring_.get());
  std::string out;
  for (const std::string& line : ring->last_formatted()) out += line;
  return out;
}

std::string Status::path_of(uint64_t ino) const {
  const plan::TargetFile* t = tree_.target(ino);
  if (t == nullptr) return fmt::format("inode {}", ino);
  std::string path = t->path();
  if (!Tree::in_steps(ino)) return path;
  std::string step = "?";
  std::shared_ptr<const Tree> keep;
  if (const Tree* tree = tree_.resolve(ino, keep).first; tree && tree_.steps())
    for (const Steps::Entry& e : tree_.steps()->list())
      if (e.index == tree->step_index()) step = e.name;
  return fmt::format("{}/{}/{}", Tree::kStepsName, step, path);
}

std::string Status::xattr_names(uint64_t ino) const {
  if (tree_.target(ino) == nullptr) return {};
  std::string out(kSourcesXattr);
  out += '\0';
  out += kLayoutXattr;
  out += '\0';
  return out;
}

std::optional<std::string> Status::xattr(uint64_t ino, std::string_view name) const {
  if (name != kSourcesXattr && name != kLayoutXattr) return std::nullopt;
  std::shared_ptr<const Tree> keep;
  const auto [tree, local] = serving(ino, keep);
  const plan::TargetFile* target = tree ? tree->target(local) : nullptr;
  if (target == nullptr) return std::nullopt;
  const std::vector<uint32_t>& sources = target->file.sources();
  if (name == kSourcesXattr) {
    std::string out;
    for (size_t i = 0; i < sources.size(); ++i) {
      std::string line = source_path(*tree, sources[i]);
      if (out.size() + line.size() + 64 > kMaxXattr) {
        out += fmt::format("\n... and {} more (see {}/plan/)", sources.size() - i, kDirName);
        break;
      }
      if (i != 0) out += '\n';
      out += line;
    }
    return out;
  }
  const FilePlan fp = describe_file(*tree, local);
  size_t copied = 0, assembled = 0, groups = 0;
  for (const RecordPlan& r : fp.records) {
    if (r.extents.size() <= 1 && (r.extents.empty() || r.extents[0].count == 1)) {
      ++copied;
    } else {
      ++assembled;
      groups += r.extents.size();
    }
  }
  std::string where =
      Tree::in_steps(ino) ? std::string()
      : target->rank == plan::kRootRank
          ? fmt::format("; extents in {}/plan/{}", kDirName, kRootPlanName)
          : fmt::format("; extents in {}/plan/{}.json", kDirName, target->dir_name());
  return fmt::format(
      "{} {} bytes, {} records: {} copied from one source extent, {} assembled from {} extent "
      "groups; {} source files{}",
      fp.format, fp.size, fp.records.size(), copied, assembled, groups, sources.size(), where);
}

}  // namespace ckptfs::fs
