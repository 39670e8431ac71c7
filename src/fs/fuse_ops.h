// The libfuse low-level callbacks: a thin adapter from kernel requests to calls on a Tree.
// Private to the fs module (mount.cc builds the session around it).
#pragma once

// 3.12 is the first API version with fuse_loop_cfg_*, which lets mount.cc bound the thread pool.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ckptfs/fs/tree.h"
#include "other_readers.h"
#include "prefetcher.h"
#include "reply_buffer.h"
#include "splice_stage.h"
#include "status.h"

namespace ckptfs::fs::detail {

// Content and attributes never change while mounted.
constexpr double kTimeout = 24 * 3600.0;

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

// What the INIT exchange settled about FUSE_DIRECT_IO_ALLOW_MMAP (device_io.h). Written by the
// thread that answers INIT before the kernel sends anything else.
struct DirectIoMmap {
  std::atomic<uint64_t> init_unique{0};  // the INIT request being answered (0: none pending)
  std::atomic<bool> offered{false};      // the kernel offers the flag
  std::atomic<bool> granted{false};      // our INIT reply asked for it: direct_io files map
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

// The session's userdata. Read-only once init has run (the pool, counters and `mapped`
// synchronize themselves), so callbacks share it without locks.
struct Server {
  const Tree* tree = nullptr;
  bool cache = false;       // keep_cache instead of direct_io
  bool read_ahead = false;  // start a Prefetcher (direct_io mode)
  unsigned max_read = 0;    // -o max_read: the largest READ (0: max_write decides)
  // When READs of few long runs are staged in a pipe (see SpliceStage): never (the default);
  // while other files are being read too, if pipes may hold a 1 MiB READ (-o splice); always,
  // in 512 KiB READs if they may not (-o splice=always).
  enum class Splice { kOff, kAuto, kAlways } splice = Splice::kOff;
  // Made by init when READs may be spliced.
  std::unique_ptr<SpliceStage> stage;
  // Started by init, in the server process (threads do not survive the fork), and stopped by
  // destroy. In page-cache mode the kernel reads ahead itself.
  std::unique_ptr<Prefetcher> prefetcher;
  // Page-cache mode: the mount's read_ahead_kb file, raised at the first open (INIT, which
  // resets it, is over by then). Empty: leave it.
  std::string readahead_knob;
  std::once_flag readahead_once;
  DirectIoMmap direct_io_mmap;
  MappedFiles mapped;
  BufferPool buffers;
  // What the read path did, logged at unmount.
  std::atomic<uint64_t> reads_served{0};
  std::atomic<uint64_t> reads_failed{0};
  std::atomic<uint64_t> reads_spliced{0};
  std::atomic<uint64_t> reads_paged{0};  // asked for by the page cache (no lock owner)
  // Who read last (file handle, or inode without one), for -o splice.
  OtherReaders readers;
  // MOUNTPOINT/.ckptfs/, the extended attributes and the per-file counters.
  std::unique_ptr<Status> status;
};

const fuse_lowlevel_ops& lowlevel_ops();

}  // namespace ckptfs::fs::detail
