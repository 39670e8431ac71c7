// The libfuse low-level callbacks: a thin adapter from kernel requests to calls on a Tree.
// Private to the fs module (mount.cc builds the session around it).
#pragma once

// 3.12 is the first API version with fuse_loop_cfg_*, which lets mount.cc bound the thread pool.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "ckptfs/fs/tree.h"

namespace ckptfs::fs::detail {

// Largest READ reply. libfuse derives max_pages (the largest READ the kernel sends) from
// max_write, and a reply it splices needs a pipe of reply + a page per buffer + 2 pages;
// pipe-max-size is 1 MiB here, so 1 MiB replies would silently fall back to malloc+pread.
constexpr uint32_t kMaxReply = 1008 * 1024;
// A reply of more runs than this is gathered into a per-thread buffer: splicing many tiny
// pieces costs more than copying them, and each buffer takes a pipe slot.
constexpr size_t kMaxSpliceRuns = 32;
// Content and attributes never change while mounted.
constexpr double kTimeout = 24 * 3600.0;

// The session's userdata. Read-only once init has run, so callbacks share it without locks.
struct Server {
  const Tree* tree = nullptr;
  bool cache = false;         // keep_cache instead of direct_io
  bool splice = false;        // FUSE_CAP_SPLICE_WRITE negotiated
  bool splice_move = false;   // FUSE_CAP_SPLICE_MOVE negotiated
  size_t pipe_max = 1 << 20;  // /proc/sys/fs/pipe-max-size
  // Page-cache mode: the mount's read_ahead_kb file, raised at the first open (INIT, which
  // resets it, is over by then). Empty: leave it.
  std::string readahead_knob;
  std::once_flag readahead_once;
  // What the read path did, logged at unmount.
  std::atomic<uint64_t> reads_spliced{0};
  std::atomic<uint64_t> reads_gathered{0};
  std::atomic<uint64_t> reads_failed{0};
};

const fuse_lowlevel_ops& lowlevel_ops();

// Whether libfuse (3.14's fuse_send_data_iov_splice) would really splice a reply of these
// runs rather than fall back to allocating and copying per request.
bool splice_fits(std::span<const plan::Run> runs, uint64_t length, size_t pipe_max);

}  // namespace ckptfs::fs::detail
