// Read-ahead for sequential readers. A loader reads a checkpoint front to back, one READ at a
// time, and each READ costs two copies in turn: gathering the source runs, then the kernel's
// copy of the reply into the reader's pages. When a READ continues the previous one on the
// same open file, a helper thread gathers the next block of the same length while the current
// reply is being copied, so the next READ finds its bytes ready.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ckptfs/fs/tree.h"

namespace ckptfs::fs {

class Prefetcher {
 public:
  // State of one open file: where its last read ended and the block read ahead.
  class Stream;

  // Starts `helpers` (at least 1) threads. `tree` must outlive the prefetcher.
  Prefetcher(const Tree& tree, unsigned helpers);
  // Lets the gathers under way finish and drops the queued ones.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // A stream for file inode `ino` (one per open file handle); null if `ino` is not a file.
  std::shared_ptr<Stream> open(uint64_t ino) const;

  // Serves [off, off + len) of the stream's file into `buf` (resized to len; `got` is short
  // only at end of file): from the block read ahead when it is that range and its sources are
  // unchanged, else gathered now. Then, if this read continued the previous one, queues the
  // next block. 0, or an errno as Tree::read_into.
  int read(Stream& stream, uint64_t off, size_t len, std::vector<char>& buf, size_t& got);

  // Reads served from a block read ahead, and blocks read ahead in all.
  uint64_t hits() const { return hits_; }
  uint64_t gathered_ahead() const { return gathered_ahead_; }

 private:
  // Whether another stream read in the last kBusyWindowUs. Then the CPUs are busy serving
  // readers, and gathering ahead would only move work between them, at the cost of a handoff.
  bool others_reading(const Stream& stream);
  void queue(const std::shared_ptr<Stream>& stream, uint64_t off, size_t len);
  void helper_loop();
  void gather_ahead(Stream& stream, uint64_t generation);

  const Tree& tree_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::shared_ptr<Stream>, uint64_t>> jobs_;  // (stream, generation)
  bool stopping_ = false;
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> gathered_ahead_{0};
  static constexpr int64_t kBusyWindowUs = 2000;
  std::atomic<const Stream*> last_reader_{nullptr};
  std::atomic<int64_t> last_read_us_{0};
  std::atomic<int64_t> other_at_{INT64_MIN / 2};  // last read by a stream other than the latest
  std::vector<std::thread> helpers_;
};

}  // namespace ckptfs::fs
