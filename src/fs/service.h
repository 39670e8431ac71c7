// The mounted file system without FUSE: every kernel request the adapter (fuse_ops.cc)
// receives is one call here, answered in plain values. The service owns what lives between
// requests: the open file handles, the choice between splicing a READ, serving it from
// read-ahead and gathering it, the reply buffers, the splice stage, the prefetcher and the
// counters, and the status tree (status.h). It is tested without a mount (service_test.cc).
//
// Thread-safety: after start() and before stop(), every method may be called from any FUSE
// worker at once; start() and stop() are called once each, by libfuse's INIT and DESTROY, while
// no other request runs. Locks: `handles_mutex_` (the open handles) and the MappedFiles and
// BufferPool mutexes are leaves, never held while calling out; a READ holds none of them while
// it gathers, splices or replies. The layers below lock on their own (tree.h, prefetcher.h).
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ckptfs/fs/read_result.h"
#include "ckptfs/fs/tree.h"
#include "prefetcher.h"
#include "read_mode.h"
#include "reply_buffer.h"
#include "source_leases.h"
#include "source_prefetch.h"
#include "splice_stage.h"
#include "status.h"

namespace ckptfs::fs {

// Where the answer to a READ goes: the adapter replies to the kernel, a test keeps the bytes.
// read() calls exactly one of these, once.
class ReadSink {
 public:
  // The reply's bytes, valid during the call only.
  virtual void bytes(std::span<const char> data) = 0;
  // `length` bytes waiting in pipe `fd` (a spliced READ): the reply must consume them.
  virtual void pipe(int fd, size_t length) = 0;
  virtual void error(int err) = 0;

 protected:
  ~ReadSink() = default;
};

// Reply buffers shared by the worker threads: allocating one per request costs more than the
// copy (perf-limits.md), and one per thread would hold memory for every idle worker.
class BufferPool {
 public:
  BufferPool() { spare_.reserve(kSpare); }
  // A spare buffer, or a new one with room for a 1 MiB READ.
  ReplyBuffer take();
  // Keeps up to kSpare buffers; the rest are freed. Never throws (it runs after a reply).
  void give(ReplyBuffer buffer) noexcept;

 private:
  static constexpr size_t kSpare = 4;
  std::mutex mutex_;
  std::vector<ReplyBuffer> spare_;
};

// The files (inodes) a reader has mapped while they were opened with direct_io. The kernel
// drops a direct_io file's page cache at every mmap of it: a second mapping, or a re-read
// through a new one, would read everything again, and a mapping being read would lose its
// pages under it. So a file that is mapped is opened with keep_cache from then on, until
// unmounted.
class MappedFiles {
 public:
  void note(uint64_t ino);
  bool has(uint64_t ino) const;

 private:
  mutable std::mutex mutex_;
  std::unordered_set<uint64_t> inos_;
};

class Service {
 public:
  // Content and attributes never change while mounted (but /steps').
  static constexpr double kTimeout = 24 * 3600.0;

  // When READs of few long runs are staged in a pipe (see SpliceStage): never (-o splice=never,
  // nosplice); chosen per READ while other readers' READs are served too (read_mode.h), from
  // sources that hold a read lease (source_leases.h says why that makes it as safe as a
  // gather), if pipes may hold a 1 MiB READ (the default, -o splice); always, in 512 KiB READs
  // if they may not, also from sources that could not be leased (-o splice=always: there an
  // in-place write between the check and the kernel's copy would reach the reader unseen).
  enum class Splice { kOff, kAuto, kAlways };
  struct Options {
    bool cache = false;       // keep_cache instead of direct_io
    bool read_ahead = false;  // start a Prefetcher (direct_io mode)
    unsigned max_read = 0;    // -o max_read: the largest READ (0: max_write decides)
    Splice splice = Splice::kAuto;
    // -o readahead_max: the bytes all open files may hold read ahead together (below one
    // block: no read-ahead).
    size_t read_ahead_max = Prefetcher::kDefaultMaxBytes;
    // -o s3_amplify: for S3 sources, the most bytes a coalesced GET may fetch per byte its runs
    // need (1: one GET per run; see RemoteCache).
    double s3_amplify = kDefaultS3Amplify;
    // -o s3_spool: where S3 sources' fetched ranges are held (null: in memory, under
    // read_ahead_max).
    std::shared_ptr<Spool> s3_spool = nullptr;
  };
  static constexpr double kDefaultS3Amplify = 8.0;
  // -o readahead_max when the sources are S3 objects held in memory (no spool: -o s3_spool=off,
  // or no local disk for one) and the option is not given: 1 GiB, or an eighth of the memory
  // this process may use (memory_limit.h) if that is less, never below the 256 MiB of other
  // mounts. The S3 path's cache is then the only place their bytes are kept (an S3 filesystem
  // keeps them in the kernel's page cache, unbounded), and it fetches whole blocks only while
  // the plan's blocks fit (RemoteCache, WholeBlocks).
  static size_t default_s3_read_ahead_max();
  // S3 sources: target bytes fetched ahead of a reader, the widest gap two runs of one GET may
  // have (a GET's latency times one connection's bandwidth, measured on the bench server), and
  // the largest GET. A server spends CPU per GET besides its cost per byte, so ranges grow to
  // 8 MiB; 16 MiB fetched more bytes than the plan needs (docs/PERFORMANCE.md, the ceiling).
  static constexpr uint64_t kS3AheadBytes = uint64_t{32} << 20;
  static constexpr uint64_t kS3GapBytes = uint64_t{256} << 10;
  static constexpr uint64_t kS3MaxRange = uint64_t{8} << 20;
  // With S3 sources, the part of -o readahead_max the served files' read-ahead (Prefetcher)
  // takes: an eighth, at least 4 blocks (a reader keeps 3 ahead) if that is at most half; the
  // S3 path (RemoteCache: ranges fetched ahead, GETs in flight, READs' own GETs) has the rest.
  static size_t files_read_ahead_share(size_t max_bytes, size_t block);

  // `tree` must outlive the service; `chosen` is what was mounted and why (Status).
  Service(const Tree& tree, std::string chosen, Options options);
  // Frees what is left without logging (stop() logs, at DESTROY).
  ~Service() = default;
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // What the kernel offers at INIT, and what the service settles from it.
  struct Offer {
    bool can_splice = false;  // the connection may take replies from a pipe
    unsigned max_write = 0;   // the largest READ the connection allows now
  };
  struct Settled {
    bool splice = false;     // ask for spliced replies
    unsigned max_write = 0;  // the largest READ, lowered to 512 KiB for 1 MiB pipes
    unsigned max_read = 0;   // to set as the connection's max_read (0: leave it)
  };
  // In the serving process (threads do not survive the fork): hooks the status log to the
  // logger, makes the splice stage and starts read-ahead. Never throws for a part that cannot
  // start (it is logged and left off: the same bytes are served without it).
  Settled start(const Offer& offer);
  // How this mount serves, for the INIT log line ("direct_io mode, splice when busy ...").
  std::string mode(bool direct_io_mmap_offered) const;
  // Stops read-ahead, frees the handles still open (at unmount the kernel drops the RELEASEs it
  // has not sent yet), unhooks the status log and logs the totals. Once; never throws.
  void stop() noexcept;

  // Page-cache mode: the mount's read_ahead_kb file, raised at the first open (INIT, which
  // resets it, is over by then). Empty: leave it. Call before serving.
  void set_readahead_knob(std::string path) { readahead_knob_ = std::move(path); }
  Status& status() { return *status_; }

  struct Entry {
    int err = 0;       // ENOENT, ENOTDIR
    uint64_t ino = 0;  // 0 with err 0: a negative entry (cached for entry_timeout)
    struct stat attr {};
    double attr_timeout = kTimeout;
    double entry_timeout = kTimeout;
  };
  Entry lookup(uint64_t parent, const char* name) const;
  struct Attr {
    int err = 0;  // ENOENT
    struct stat st {};
    double timeout = kTimeout;
  };
  Attr getattr(uint64_t ino) const;

  // What the kernel is to do with an open file or directory.
  struct Opened {
    int err = 0;
    uint64_t fh = 0;  // the handle to pass to read() and release()
    bool direct_io = false;
    bool keep_cache = false;
    bool cache_readdir = false;
    bool noflush = false;
  };
  // `flags`: the open(2) flags. `mappable`: direct_io files may be mapped shared (INIT granted
  // FUSE_DIRECT_IO_ALLOW_MMAP).
  Opened open(uint64_t ino, int flags, bool mappable);
  Opened opendir(uint64_t ino, int flags) const;
  // Frees the handle of an open (0: none). Never throws.
  void release(uint64_t fh) noexcept;

  struct Listing {
    int err = 0;  // ENOENT, ENOTDIR
    std::vector<Tree::DirEntry> entries;
  };
  Listing list(uint64_t ino) const;

  // Serves a READ of [off, off + size) of `ino` through handle `fh` (0: none) into `sink`.
  // `paged`: the READ comes from the page cache (no lock owner); where direct_io files may be
  // mapped (`mappable`, as for open), such a READ of a direct_io file comes from the faults of
  // a mapping. `caller`: the reading thread (the request's pid), which tells two readers from
  // one (read_mode.h). Counted, and a failure logged, before the sink replies. Throws only
  // before the sink was called (out of memory); the adapter then answers EIO.
  void read(uint64_t ino, uint64_t fh, int64_t off, size_t size, bool paged, bool mappable,
            ReadSink& sink, uint64_t caller = 0);

  struct statvfs statfs() const;
  struct Xattr {
    int err = 0;  // ENODATA, ENOENT
    std::string value;
  };
  Xattr getxattr(uint64_t ino, const char* name) const;
  Xattr listxattr(uint64_t ino) const;  // the names, each NUL-terminated
  // 0, ENOENT, or EROFS when writing is asked for.
  int access(uint64_t ino, int mask) const;

  // What the read path did so far (stats.json, the unmount line, tests).
  struct Counters {
    uint64_t served = 0, failed = 0, spliced = 0, paged = 0;
    uint64_t read_ahead_hits = 0, read_ahead_blocks = 0;
  };
  Counters counters() const;
  // Handles open now.
  size_t open_handles() const;

 private:
  // What an open file handle (fh) points to: the read-ahead stream of a direct_io file, or the
  // bytes of a status file as of its open. Both shared: a READ keeps its own reference, since
  // once its reply is out the reader may close the file and the RELEASE free the handle on
  // another worker while this one is still returning from the write.
  struct Handle {
    std::shared_ptr<Prefetcher::Stream> stream;
    std::shared_ptr<const std::string> status_bytes;
  };
  static const Handle* handle_of(uint64_t fh) { return reinterpret_cast<const Handle*>(fh); }
  uint64_t keep(std::unique_ptr<Handle> handle);

  bool stat_any(uint64_t ino, struct stat& st) const;
  // Why an inode cannot be opened or read: not there, a directory, or a file whose rank could
  // not be planned (lazily planned ranks).
  int not_a_file(uint64_t ino) const;
  // 0 for a directory, else ENOENT or ENOTDIR.
  int not_a_dir(uint64_t ino) const;
  Opened open_status(uint64_t ino, int flags);
  void raise_readahead() const;

  // The steps of a READ.
  void read_status(const Handle& handle, int64_t off, size_t size, ReadSink& sink) const;
  // At start(), once READs may be spliced: a read lease on each local source it can have.
  void start_leases();
  // At start(): the sources' read-ahead, if one is remote and -o readahead_max allows it; S3
  // objects' ranges and READs' own GETs within `s3_bytes`.
  void start_source_prefetch(size_t s3_bytes) noexcept;
  bool splice_wanted(uint64_t ino, const ReadsInFlight::Guard& reading) const;
  // Stages the READ in this thread's pipe and replies from it; declined: nothing replied.
  ReadResult reply_spliced(uint64_t ino, uint64_t off, size_t size, ReadSink& sink);
  void reply_gathered(uint64_t ino, uint64_t off, size_t size,
                      const std::shared_ptr<Prefetcher::Stream>& stream, ReadSink& sink);

  const Tree& tree_;
  const Options options_;
  std::unique_ptr<Status> status_;
  // Made by start() when READs may be spliced, with the leases on the local sources.
  std::unique_ptr<SpliceStage> stage_;
  std::unique_ptr<SourceLeases> leases_;
  // Started by start() and stopped by stop(). In page-cache mode the kernel reads ahead itself.
  std::unique_ptr<Prefetcher> prefetcher_;
  std::unique_ptr<RemoteCache> remote_cache_;        // when a source is an S3 object
  std::unique_ptr<SourcePrefetch> source_prefetch_;  // when a source is remote
  std::string readahead_knob_;
  std::once_flag readahead_once_;
  MappedFiles mapped_;
  BufferPool buffers_;
  std::atomic<uint64_t> served_{0}, failed_{0}, spliced_{0}, paged_{0};
  // The READs served now, for the per-READ choice between splicing and gathering.
  ReadsInFlight reads_;
  mutable std::mutex handles_mutex_;
  std::unordered_map<uint64_t, std::unique_ptr<Handle>> handles_;
  bool stopped_ = false;
};

}  // namespace ckptfs::fs
