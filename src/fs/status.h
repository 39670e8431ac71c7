// What a mount is doing, without FUSE: the read-only tree MOUNTPOINT/.ckptfs/ (sources.json,
// plan/<dir>.json, stats.json, log), the user.ckptfs.* extended attributes of the served files,
// the per-file read counters behind stats.json, and the info lines for first opens and failed
// reads. The FUSE adapter only routes inodes and calls here. ".ckptfs" is found by name but not
// listed in the root (as ZFS's hidden .zfs): listings of the mount, `find`, `rsync -a` and
// loaders walking the rank directories never meet it.
//
// Nothing is generated ahead: a status file's bytes are made when it is opened (the caller
// keeps them for that open handle), an attribute's when it is asked for; both walk one target
// file's record headers (in memory) and map its records onto source runs, so memory is bounded
// per target file, never proportional to the checkpoint. plan/ covers the mount's own files,
// not those under steps/; the attributes cover every served file.
//
// Who may read it (the mount always has default_permissions, so the kernel enforces this): each
// entry is no more readable than the sources it tells about, as the files it describes. A
// plan/<dir>.json takes the access the files of <dir> have together (access.h's
// combine_access); sources.json and both directories that of every source of the mount; the
// log and stats.json that of every source the mount has planned, /steps included, which can
// only narrow while mounted (so the kernel is told not to cache their attributes). Directories
// get a search bit for each read bit. -o uid=, gid=, umask= apply on top, as to the files.
//
// Thread-safe: every method may be called from any FUSE worker at once.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "access.h"
#include "ckptfs/fs/tree.h"

namespace spdlog::sinks {
class sink;
}

namespace ckptfs::fs {

// The read path's own totals, which the Status does not see (for stats.json).
struct ReadTotals {
  uint64_t spliced = 0;
  uint64_t read_ahead_hits = 0;
  uint64_t read_ahead_blocks = 0;
};

class Status {
 public:
  static constexpr std::string_view kDirName = ".ckptfs";
  // The status inodes: kDirIno and up, below Tree::kStepsIno.
  static constexpr uint64_t kDirIno = uint64_t{1} << 61;
  static bool owns(uint64_t ino) { return ino >= kDirIno && ino < Tree::kStepsIno; }
  // Lines the log file keeps.
  static constexpr size_t kLogLines = 256;
  static constexpr std::string_view kSourcesXattr = "user.ckptfs.sources";
  static constexpr std::string_view kLayoutXattr = "user.ckptfs.layout";

  // `chosen`: what was mounted and why, in one line. Takes the source paths as absolute now
  // (the daemon changes directory to /).
  Status(const Tree& tree, std::string chosen);
  ~Status();
  Status(const Status&) = delete;
  Status& operator=(const Status&) = delete;

  // The sink that keeps the last kLogLines lines: add it to the logger the server logs to.
  std::shared_ptr<spdlog::sinks::sink> log_sink() const;

  // ".ckptfs" under the root, and the names below it; 0 if none.
  uint64_t lookup(uint64_t parent, std::string_view name) const;
  // False unless `ino` is a status inode. Files show size 0: their bytes are made at open and
  // must be read with direct I/O, to end of file. Owner, group and mode: see the top.
  bool stat(uint64_t ino, struct stat& st) const;
  // Whether stat(ino) may change while mounted (then its attributes must not be cached).
  bool attributes_change(uint64_t ino) const { return ino == kLogIno || ino == kStatsIno; }
  // The entries of a status directory ("." and ".." included); empty if not one.
  std::vector<Tree::DirEntry> list(uint64_t ino) const;
  bool is_file(uint64_t ino) const;
  // A status file's bytes as of now. Throws Error if they cannot be made (a source changed).
  std::string content(uint64_t ino, const ReadTotals& totals) const;

  // Counters. opened: at each open of a served file (logs the first at info). served / failed:
  // for each read, before its reply; failed logs the file, offset, errno and the sources at
  // info. open_failed: an open refused with EIO (a source the file reads changed), counted with
  // the failed reads ("eio") and logged at info with the changed sources. Never throw (a failure
  // to count or log is itself logged).
  void opened(uint64_t ino) noexcept;
  void open_failed(uint64_t ino, int err) noexcept;
  void served(uint64_t ino, uint64_t bytes) noexcept;
  void failed(uint64_t ino, uint64_t offset, uint64_t size, int err) noexcept;

  // The attribute names of `ino`, each NUL-terminated (empty for directories and status files).
  std::string xattr_names(uint64_t ino) const;
  // nullopt: `ino` has no attribute `name`. Throws Error if it cannot be made.
  std::optional<std::string> xattr(uint64_t ino, std::string_view name) const;

  // Where `ino` shows in the mount ("rank_0/checkpoint_0.ckpt"), for messages.
  std::string path_of(uint64_t ino) const;

 private:
  struct FileCounters {
    std::string path;
    std::atomic<uint64_t> opens{0}, reads{0}, bytes{0}, failed{0};
  };
  FileCounters* counters(uint64_t ino) const;
  void log_failed(const FileCounters& c, uint64_t ino, uint64_t offset, uint64_t size,
                  int err) const;
  void count_failed(uint64_t ino, const std::function<void(const FileCounters&)>& log) noexcept;
  std::string changed_sources(uint64_t ino, uint64_t offset, uint64_t size) const;
  std::string sources_json() const;
  std::string stats_json(const ReadTotals& totals) const;
  std::string plan_json(size_t index) const;
  std::string log_text() const;
  // The source paths of `tree` (the mount's, made absolute at construction, or a step's or a
  // lazily planned rank's).
  std::string source_path(const Tree& tree, uint32_t source) const;
  // The Tree whose plan().sources file `ino`'s runs index, and the inode there (tree_.resolve,
  // and for a rank listed from a shipped index its own Tree, planning it now if need be);
  // {nullptr, 0} if none.
  std::pair<const Tree*, uint64_t> serving(uint64_t ino, std::shared_ptr<const Tree>& keep) const;
  // Who may read status inode `ino`, before the mount options (see the top).
  Access access_of(uint64_t ino) const;
  // The log's and stats.json's: every source planned so far, narrowed for good.
  Access log_access() const;

  static constexpr uint64_t kSourcesIno = kDirIno + 1;
  static constexpr uint64_t kStatsIno = kDirIno + 2;
  static constexpr uint64_t kLogIno = kDirIno + 3;
  static constexpr uint64_t kPlanDirIno = kDirIno + 4;
  static constexpr uint64_t kFirstPlanIno = kDirIno + 16;

  const Tree& tree_;
  std::string chosen_;
  std::vector<std::string> paths_;  // absolute, by source of tree_
  // For a tree of lazily planned ranks: each file's inode -> its index in lazy()->files().
  std::unordered_map<uint64_t, size_t> lazy_files_;
  std::vector<std::string> plan_names_;  // "rank_0.json", ..., "root.json"
  std::vector<uint64_t> plan_dirs_;      // the tree directory each describes (root: kRootIno)
  uid_t uid_;                            // the mounter's, for sources of several owners
  gid_t gid_;
  Access all_access_;                // of every source of tree_
  std::vector<Access> plan_access_;  // by plan_names_
  mutable std::mutex log_mutex_;     // guards log_access_
  mutable Access log_access_;        // only narrows
  std::shared_ptr<spdlog::sinks::sink> ring_;
  std::atomic<uint64_t> reads_{0}, bytes_{0}, failed_{0};
  mutable std::shared_mutex mutex_;  // guards files_ (the counters are atomic)
  mutable std::unordered_map<uint64_t, std::unique_ptr<FileCounters>> files_;
};

// One target file as a loader may read it without the mount: each record's name, dtype, shape,
// byte ranges in the file, and the source extents that fill them. Bounded per file: runs that
// repeat with a fixed stride (a resharded tensor's rows) are kept as one group.
struct Extent {
  int64_t source = -1;     // index into the plan's sources; -1: bytes held in memory (`bytes`)
  uint64_t offset = 0;     // in the source
  uint64_t length = 0;     // of each repetition
  uint64_t at = 0;         // in the target file
  uint64_t count = 1;      // repetitions
  int64_t stride = 0;      // source offset step between repetitions
  uint64_t at_stride = 0;  // target offset step between repetitions
  std::string bytes;       // source == -1: the bytes themselves
};
struct RecordPlan {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (offset, length) in the target file
  std::vector<Extent> extents;                        // in target order of their first byte
};
struct FilePlan {
  std::string format;  // "ckpt", "safetensors", or "other" (no records)
  uint64_t size = 0;
  std::vector<RecordPlan> records;
};
// The records of file `ino` of `tree` (which must serve it itself, not through /steps) as
// planning laid them out (plan/file_records.h: read from the plan, no source is read), each
// mapped onto source extents. Throws Error if the file is not laid out as its format is.
FilePlan describe_file(const Tree& tree, uint64_t ino);

// Appends the extents of target bytes [offset, offset + length) of `file` to `out`, grouping
// strided repetitions.
void map_extents(const plan::VirtualFile& file, uint64_t offset, uint64_t length,
                 std::vector<Extent>& out);

}  // namespace ckptfs::fs
