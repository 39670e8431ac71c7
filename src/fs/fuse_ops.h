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
#include <vector>

#include "ckptfs/fs/other_readers.h"
#include "ckptfs/fs/prefetcher.h"
#include "ckptfs/fs/reply_buffer.h"
#include "ckptfs/fs/splice_stage.h"
#include "ckptfs/fs/tree.h"

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

// The session's userdata. Read-only once init has run (the pool and counters synchronize
// themselves), so callbacks share it without locks.
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
  BufferPool buffers;
  // What the read path did, logged at unmount.
  std::atomic<uint64_t> reads_served{0};
  std::atomic<uint64_t> reads_failed{0};
  std::atomic<uint64_t> reads_spliced{0};
  // Who read last (file handle, or inode without one), for -o splice.
  OtherReaders readers;
};

const fuse_lowlevel_ops& lowlevel_ops();

}  // namespace ckptfs::fs::detail
