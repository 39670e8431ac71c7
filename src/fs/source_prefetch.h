// Plan-driven read-ahead of the sources, for sources on a remote filesystem (util/remote_fs.h:
// s3fs, NFS, ...). A target file reads small runs spread over many sources; read in file order,
// it faults one source at a time, and over an S3 filesystem each fault waits for a large
// download, one after another. When a file is read, this maps the next kAheadBytes of it to its
// source runs (the plan), joins each source's runs closer than kGapBytes into stretches, and has
// helper threads read those stretches (spliced to /dev/null: no copy), many sources at once, into
// the kernel's page cache; the reader's own gathers then find their pages there. Bytes are
// discarded after the read: nothing here is served, so a fetch that fails costs only its time
// (the reader's gather reports it).
//
// Bounded: bytes queued or being fetched, all files together, stay under `max_bytes` (the
// mount's -o readahead_max); a stretch past the bound is left for the reader to fault in. Each
// source byte is fetched once per mount (the fetched ranges are remembered per source path).
// Local sources are never fetched: their page cache and the kernel's read-ahead serve well.
//
// Sources that are S3 objects (remote/objects.h) are fetched into a RemoteCache instead, when
// the options give one: each object's runs of the window coalesced into ranged GETs
// (remote_runs.h's merge_runs with Options::merge), asked for in the order the file needs them.
// Before the first read is served the cache is told every run of every file the tree serves
// (expect), so that it frees first the ranges no file still needs (a tree of lazily planned
// ranks does not know them all; its cache frees the least recently read). A thread started with
// this object tells it, from the mount on; the first read waits for it to finish: told while
// reads went on, the plan came after the first ranges and reads (1.45x the bytes again), and
// told by the first read, the mapping of every run (440k for one rank of 63 MiB, 1.65M for a
// whole 0.25 GiB view: some 50 ms) delayed the first GETs.
//
// Thread-safety: note() may be called from any number of FUSE workers at once; `mutex_` guards
// the per-file and per-source state and the job queue, is a leaf, and is never held during a
// mapping of runs or a pread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckptfs/fs/tree.h"
#include "remote_cache.h"
#include "remote_runs.h"

namespace ckptfs::fs {

class SourcePrefetch {
 public:
  // Target bytes mapped ahead of a reader; a new stretch is planned once the reader is within
  // half of it from the end of the last one.
  static constexpr uint64_t kAheadBytes = uint64_t{64} << 20;
  // Runs of one source closer than this are fetched as one stretch: a remote read costs a
  // round trip, and an S3 filesystem downloads whole parts of several MiB anyway.
  static constexpr uint64_t kGapBytes = uint64_t{4} << 20;
  // One job: a helper's pread of at most this much, so that the sources interleave.
  static constexpr uint64_t kPieceBytes = uint64_t{8} << 20;
  static constexpr unsigned kDefaultHelpers = 8;

  struct Options {
    size_t max_bytes = 0;  // bound on bytes queued or being fetched; 0: nothing is fetched
    unsigned helpers = kDefaultHelpers;
    bool local_too = false;        // for tests: fetch sources on local filesystems as well
    uint64_t ahead = kAheadBytes;  // target bytes mapped ahead of a reader
    // Where S3 objects' ranges go (null: their runs are left to the reader), and how their runs
    // are coalesced.
    RemoteCache* cache = nullptr;
    MergePolicy merge = MergePolicy();
  };
  // Whether any source of `tree` is on a remote filesystem (for a tree of lazily planned ranks:
  // any source its listing names) or an S3 object; a mount without one needs no SourcePrefetch.
  static bool any_remote(const Tree& tree);
  // `tree` must outlive this object. Helpers start at the first fetch; with a cache, a thread
  // tells it the plan's runs.
  SourcePrefetch(const Tree& tree, Options options);
  // Drops the queued fetches and joins the helpers (a pread under way finishes first) and the
  // thread telling the plan (which stops at the next file).
  ~SourcePrefetch();
  SourcePrefetch(const SourcePrefetch&) = delete;
  SourcePrefetch& operator=(const SourcePrefetch&) = delete;

  // A READ of [off, off + len) of file `ino` (of the mount's tree, not /steps) is being served:
  // queue the source stretches of the file's next kAheadBytes if they are not yet. Never throws
  // (it is a hint: a failure only means no read-ahead).
  void note(uint64_t ino, uint64_t off, size_t len) noexcept;

  // Waits until no fetch is queued or running (tests, bench).
  void wait_idle();
  // Bytes fetched so far, and the ranges of the source at `path` queued or fetched ({begin,
  // end}, sorted, disjoint).
  uint64_t fetched_bytes() const { return fetched_.load(std::memory_order_relaxed); }
  std::vector<std::pair<uint64_t, uint64_t>> covered_ranges(const std::string& path) const;

 private:
  struct Source {
    int fd = -1;          // the plan's descriptor (lives as long as the tree serving it)
    bool remote = false;  // worth fetching
    std::map<uint64_t, uint64_t> covered;  // begin -> end, disjoint: queued or fetched
  };
  struct Job {
    int fd = -1;
    uint64_t begin = 0, end = 0;
  };
  // The tree whose sources the runs of `ino` index, and the inode there; {nullptr, 0} if none.
  std::pair<const Tree*, uint64_t> serving(uint64_t ino) const;
  // Takes the runs of S3 objects out of `runs` and asks the cache for their coalesced ranges.
  void want_objects(std::vector<plan::Run>& runs,
                    const std::vector<index::IndexedSource>& sources) const;
  // Tells the cache every S3 run of every file of the tree (once, on `teller_`), then lets the
  // waiting notes go on.
  void expect_all();
  // Waits until the cache has been told the plan (or this object is stopping).
  void wait_told();
  // Under mutex_: whether every source in `sources` is local or queued or fetched whole, so that
  // a window has nothing left to queue and need not be mapped to runs (the ranks read after the
  // first one of a tensor-parallel view mapped 64 MiB windows of ~500-byte runs for nothing).
  bool all_covered(const std::vector<index::IndexedSource>& sources) const;
  // Under mutex_: queues the parts of [begin, end) of `source` not covered yet, within the bound.
  void queue(Source& source, uint64_t begin, uint64_t end);
  void helper_loop();

  const Tree& tree_;
  const Options options_;
  std::unordered_map<uint64_t, size_t> lazy_files_;  // inode -> LazyRanks::files() index
  std::atomic<bool> told_{true};  // false while the plan is being told to the cache
  std::thread teller_;

  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_, told_cv_;
  std::unordered_map<uint64_t, uint64_t> planned_to_;  // per file inode: target bytes mapped
  std::unordered_map<std::string, Source> sources_;    // by path: ranks may share sources
  std::deque<Job> jobs_;
  uint64_t pending_bytes_ = 0;  // queued or being fetched
  unsigned running_ = 0;
  std::atomic<bool> stopping_{false};  // written under mutex_; read by the teller without it
  std::vector<std::thread> helpers_;
  std::atomic<uint64_t> fetched_{0};
};

}  // namespace ckptfs::fs
