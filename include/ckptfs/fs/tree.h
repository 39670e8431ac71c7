// The mounted tree without FUSE: fixed inodes for "/", "rank_N/" and the files of each rank,
// lookups, attributes, listings, and reads mapped to runs with a check that the sources read are
// unchanged. The FUSE adapter only translates kernel requests into calls on this. With Steps,
// "/steps/<epoch>_<step>/" holds each step's own Tree, at inodes from kStepsIno up: lookup,
// stat, list, file, target, check_file and read_into serve them; the run-level calls
// (check_sources, gather) and plan() are for this tree's own files only.
//
// Thread-safety: set_steps, set_step_index and set_owner are for before serving. After that
// every const method may be called from any thread at once: the tree itself is read-only, the
// "source seen changed" flags are atomics, and what changes underneath synchronizes itself
// (MappedSources' page-table accounting, LazyRanks' planning, Steps' set of steps), each lock a
// leaf but for LazyRanks' and Steps' planning locks, which may take the index's and a new
// Tree's (never a read path lock). Per-thread buffers: scratch.h.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/fs/lazy_ranks.h"
#include "ckptfs/fs/read_result.h"
#include "ckptfs/fs/steps.h"
#include "ckptfs/plan/planner.h"

namespace ckptfs::fs {

class MappedSources;  // src/fs/mapped_sources.h
class CheckAhead;     // src/fs/check_ahead.h

// The two names every directory lists.
inline constexpr std::string_view kDot = ".";
inline constexpr std::string_view kDotDot = "..";

class Tree {
 public:
  static constexpr uint64_t kRootIno = 1;
  // st_blksize of the files: what `cp`/`cat` size their reads by. 1 MiB is the largest READ
  // the kernel sends (max_pages_limit 256), so each such read is one round trip.
  static constexpr uint32_t kBlockSize = 1024 * 1024;
  // "/steps"; a step's inodes are kStepsIno + ((index + 1) << 32) + its own Tree's inode.
  static constexpr uint64_t kStepsIno = uint64_t{1} << 62;
  static constexpr std::string_view kStepsName = "steps";
  // Whether `ino` is "/steps" or below it: changes while mounted, and not for read-ahead or
  // splicing (their runs index this tree's sources).
  static bool in_steps(uint64_t ino) { return ino >= kStepsIno; }

  // A file is never more readable than the sources it reads (the mount always has
  // default_permissions, so the kernel enforces it): its owner and group are its sources' if
  // they all agree, else the calling user's (and then no group bit); each read bit is kept only
  // if every source grants it, counting the directories above each source (access.h); a file
  // that reads no source bytes takes the access of all the sources.
  // Directories are the calling user's, 0555. A file's mtime and atime are
  // the newest mtime of the sources it reads (so `rsync -a` of an unchanged view transfers
  // nothing after a remount), a rank directory's the newest of its files', the root's the
  // newest of all; ctime is the mount time. All are fixed for the life of the mount. Maps
  // every source file read-only (address space only: pages are touched by reads and let go
  // again).
  // Throws Error if two targets have the same rank or a source cannot be mapped.
  explicit Tree(plan::Plan plan);
  // A tree of listed, unplanned ranks (LazyRanks): sizes and mtimes are the listing's, and a
  // file's first target(), file(), check_file() or read_into() plans its rank. Such a file's
  // runs index its rank's own Tree: read it through read_into() and check_sources(ino, ...),
  // never through gather() or check_sources(runs) (own_runs() says which files those serve).
  explicit Tree(std::shared_ptr<LazyRanks> lazy);
  Tree(Tree&&) noexcept;
  Tree& operator=(Tree&&) = delete;  // ahead_'s helpers read the sources being replaced
  ~Tree();

  // Adds "/steps" (shared: the mount's Tree and the tests may both hold it), found by lookup but
  // not listed in "/" (so copying the mount root copies the served step only).
  void set_steps(std::shared_ptr<Steps> steps);
  const std::shared_ptr<Steps>& steps() const { return steps_; }
  // Which step this Tree serves under "/steps" (set by Steps).
  void set_step_index(uint32_t index) { step_index_ = index; }
  uint32_t step_index() const { return step_index_; }

  // -o uid=,gid=,umask=, on top of what the files derive from their sources (see the
  // constructor): a given uid or gid replaces every inode's, and umask takes bits away from
  // every mode, "/steps" included. Call before serving; not for /steps trees.
  void set_owner(std::optional<uid_t> uid, std::optional<gid_t> gid, mode_t umask) {
    uid_override_ = uid;
    gid_override_ = gid;
    umask_ = umask & 0777;
  }

  // 0 if not found (or `parent` is not a directory).
  uint64_t lookup(uint64_t parent, std::string_view name) const;
  // False if no such inode.
  bool stat(uint64_t ino, struct stat& st) const;
  struct DirEntry {
    uint64_t ino;
    std::string_view name;  // NUL-terminated: points into the tree or a literal
    bool is_dir;
  };
  // Entries of a directory inode ("." and ".." included); empty if not a directory.
  std::vector<DirEntry> list(uint64_t ino) const;
  // Null unless `ino` is a checkpoint file.
  const plan::VirtualFile* file(uint64_t ino) const;
  // The same file with its name and read mode; null unless `ino` is a checkpoint file.
  const plan::TargetFile* target(uint64_t ino) const;
  const plan::Plan& plan() const { return plan_; }
  // Some source is an encrypted checkpoint read through its decrypted stream: every file is then
  // 0400 and owned by the mounting user, and the mount serves it without splice or page cache.
  bool encrypted() const { return encrypted_; }
  // Some source is an S3 object (remote/objects.h): its runs are fetched, never spliced.
  bool remote() const { return remote_; }
  // The Tree that serves `ino` itself (this one, or a step's under /steps, then held by `keep`)
  // and the inode there; {nullptr, 0} if none. Its plan().sources is the table the file's runs
  // index: every Tree that serves files from another table must answer here.
  std::pair<const Tree*, uint64_t> resolve(uint64_t ino, std::shared_ptr<const Tree>& keep) const;
  // File inodes plus directories, and the bytes of all files (for statfs).
  uint64_t inode_count() const { return 1 + nodes_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }
  // The inode of plan().targets[i].
  uint64_t target_ino(size_t i) const { return file_ino_[i]; }
  // The mtime stat gives `ino` (see the constructor).
  struct timespec mtime(uint64_t ino) const;

  // 0, or EIO (after logging which source changed) if a source `runs` read differs from its
  // fingerprint at mount, or from the structure its scan was taken from (a source whose scan
  // the index gave unchecked has its structure bytes read up to the runs' end: check_source).
  int check_sources(std::span<const plan::Run> runs) const;
  // The same for every source a file reads from (at open): 0, ENOENT, EISDIR or EIO.
  int check_file(uint64_t ino) const;
  // Copies the bytes of `runs` to `out` (which holds their total length) from the header
  // buffers and the source mappings: done(their length), or failed(EIO) (logged) if a run lies
  // past its source's size at mount or the file has shrunk under the mapping since. Does not
  // check fingerprints; call check_sources after it, before the bytes are used.
  ReadResult gather(std::span<const plan::Run> runs, char* out) const;
  // Serves a read of file `ino` into `buf`: maps [off, off + buf.size()), gathers, then checks
  // the sources, so bytes copied while a source changed are never served. done(bytes) (short
  // only at end of file), or failed: ENOENT/EISDIR for a bad inode, EIO for a changed or shrunk
  // source. With `sources`, sets it to the sources read, each once.
  ReadResult read_into(uint64_t ino, uint64_t off, std::span<char> buf,
                       std::vector<uint32_t>* sources = nullptr) const;
  // 0, or EIO (logged) if one of `sources` (as read_into lists them) changed since the mount:
  // for bytes read_into gathered, whose structure it checked then.
  int check_sources(std::span<const uint32_t> sources) const;
  // The same for sources read_into listed for file `ino`, which may be served by another Tree
  // (a lazily planned rank).
  int check_sources(uint64_t ino, std::span<const uint32_t> sources) const;
  // Whether the runs of file `ino` index this tree's own sources (gather, check_sources(runs),
  // plan().sources): not for /steps or lazily planned ranks.
  bool own_runs(uint64_t ino) const { return !in_steps(ino) && !lazy_; }
  // The listing's ranks, if this tree plans them lazily (else null).
  const LazyRanks* lazy() const { return lazy_.get(); }

  // Who may read a file, before the mount options: its owner, group and read bits (0444 at
  // most), as the constructor derives them from its sources.
  struct FileAccess {
    uid_t uid;
    gid_t gid;
    mode_t read;
  };
  // That of file `ino` of this tree (not one under /steps); nullopt if it is no such file.
  std::optional<FileAccess> file_access(uint64_t ino) const;
  // That of every source together, as a file reading all of them would have it: for what
  // describes them all (the status tree). For a lazy tree, every source the listing names.
  const FileAccess& sources_access() const { return sources_access_; }
  // -o uid=, gid=, umask= on `st`, as stat applies them to every inode.
  void apply_options(struct stat& st) const;

 private:
  // Logs one error line for a source the first time it fails, debug lines after that: a
  // changed file fails every read that touches it and must not flood the log.
  void report(uint32_t source, std::string_view what) const;
  // 0, or EIO (reported) if source `source` (in range) no longer has its mount fingerprint, or
  // its deferred structure check (index/deferred_check.h) up to byte `upto` fails, or it was
  // found changed once before (sticky until remount). A deferred source's structure bytes are
  // read the first time a call needs them (`upto` 0: only a check of the whole file, made
  // before its first byte is served); an I/O error there fails only that call.
  int check_source(uint32_t source, uint64_t upto = 0) const;
  // check_source of each of `sources`, up to ends[i] (none: 0).
  int check_sources(std::span<const uint32_t> sources, std::span<const uint64_t> ends) const;
  // Makes the whole-file deferred structure checks of `sources` still to be made, several at
  // once.
  void verify_deferred(std::span<const uint32_t> sources) const;
  static constexpr size_t kDeferredChecks = 8;
  // Sets `out` to each source `runs` read from, once, in the order first read, and `ends` (if
  // given) to how far into each they read. 0, or EIO (logged) if a run names a source the plan
  // does not have.
  int distinct_sources(std::span<const plan::Run> runs, std::vector<uint32_t>& out,
                       std::vector<uint64_t>* ends = nullptr) const;

  struct Node {
    bool is_dir = false;
    size_t index = 0;  // into dirs_, or into plan_.targets
  };
  struct Dir {
    int64_t rank = 0;
    std::string name;
    uint64_t ino = 0;
    std::vector<size_t> files;  // indexes into plan_.targets
  };
  void set_mtimes();  // at construction, once the nodes are laid out
  void set_access();  // likewise: file_access_ from the sources' stat
  uint64_t file_size(size_t target) const;
  // The lazily planned Tree and inode serving `ino`; {nullptr, 0} if `ino` is not such a file
  // or its rank cannot be planned. `plan`: plan it now if need be.
  std::pair<const Tree*, uint64_t> lazy_of(uint64_t ino, bool plan) const;
  // Null for the root and for inodes that do not exist.
  const Node* node(uint64_t ino) const;

  // The step Tree and its own inode for an inode below "/steps/<name>/"; null if none.
  std::pair<std::shared_ptr<const Tree>, uint64_t> step_of(uint64_t ino, bool plan) const;
  static uint64_t step_ino(uint32_t index, uint64_t local) {
    return kStepsIno + ((uint64_t{index} + 1) << 32) + local;
  }

  plan::Plan plan_;
  std::shared_ptr<Steps> steps_;
  std::shared_ptr<LazyRanks> lazy_;
  uint32_t step_index_ = 0;
  // inode layout: 1 = root, then each rank directory followed by its files
  std::vector<Node> nodes_;  // inode 2 + k
  std::vector<Dir> dirs_;
  std::vector<std::string> file_names_;                      // by target
  std::vector<size_t> root_files_;                           // targets shown at the root
  std::vector<uint64_t> file_ino_;                           // by target
  std::map<std::string, uint64_t, std::less<>> root_index_;  // dir name -> ino
  uint64_t total_bytes_ = 0;
  bool encrypted_ = false;
  bool remote_ = false;
  uid_t uid_ = 0;  // the calling user: directories, and files of sources of several owners
  gid_t gid_ = 0;
  std::optional<uid_t> uid_override_;
  std::optional<gid_t> gid_override_;
  mode_t umask_ = 0;
  std::vector<FileAccess> file_access_;  // by target
  FileAccess sources_access_{};
  struct timespec time_ {};
  std::vector<struct timespec> file_mtimes_;  // by target
  std::vector<struct timespec> dir_mtimes_;   // by dir
  struct timespec root_mtime_ {};
  std::unique_ptr<std::atomic<bool>[]> reported_;  // per source
  std::unique_ptr<MappedSources> mapped_;
  // The deferred checks of an opened file's sources, run ahead of its reads (null: no source
  // is checked by prefix). Last: its helpers stop before the sources they read are closed.
  std::unique_ptr<CheckAhead> ahead_;
};

}  // namespace ckptfs::fs
