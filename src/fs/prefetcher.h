// Read-ahead for sequential readers. A loader reads a checkpoint front to back, one READ at a
// time, and each READ costs two copies in turn: gathering the source runs, then the kernel's
// copy of the reply into the reader's pages. When a READ continues the previous one on the
// same open file, helper threads gather the next 1 MiB blocks of the file while the current
// reply is being copied, so the following READs find their bytes ready. A READ that is one
// whole block takes the block's buffer; one inside a block (a reader whose buffer is not
// page-aligned gets READs of 1 MiB minus a few bytes, then the few bytes) is copied out of it.
//
// Memory is bounded for the whole daemon: every block a stream holds (a buffer of up to 1 MiB,
// read ahead or kept for the next one) is charged to one budget of `max_bytes` / block size
// blocks. A stream that finds the budget spent reads ahead what it may, and once its reply is
// sent (start()) takes back the blocks of the streams read least recently, then plans again; so
// few streams read ahead as before, and files left open half-read hold no more than the budget.
//
// Thread-safety: every public method may be called from any thread; one Stream may be read by
// several FUSE workers at once (a reader with two threads on one file handle). Locks: `mutex_`
// (the job queue, each stream's `gathering`) and each Stream's own mutex (its slots, `next`,
// `planned`) are never held together, nor two streams' mutexes. The budget's mutex is a leaf:
// it may be taken under either, and no other lock is taken under it. Under any of them, only the
// reply buffers' page pool (reply_buffer.h) may be locked, when a block's buffer is freed. A helper
// gathers without holding any lock; the slot it fills is its own while kRunning, and is never taken
// back then.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ckptfs/fs/tree.h"
#include "other_readers.h"
#include "reply_buffer.h"
#include "splice_stage.h"

namespace ckptfs::fs {

class Prefetcher {
 public:
  // State of one open file: where its last read ended and the blocks read ahead.
  class Stream;
  // Default size of a block read ahead: the largest READ the kernel sends.
  static constexpr size_t kBlockBytes = 1 << 20;
  // Default bound on the blocks of all streams (-o readahead_max): 256 blocks of 1 MiB, enough
  // for 85 files read at once, three blocks ahead each.
  static constexpr size_t kDefaultMaxBytes = size_t{256} << 20;

  // Starts `helpers` (at least 1) threads; throws std::system_error (with none left running) if
  // one cannot start. Blocks are `block_bytes` long (the mount's largest READ). With `splice`,
  // blocks it would stage are not read ahead: their READs are spliced, and read-ahead stops
  // at the first such block. All streams together hold at most `max_bytes` / block size blocks
  // (none: nothing is read ahead). `tree` and `splice` must outlive the prefetcher; its streams
  // may outlive it.
  Prefetcher(const Tree& tree, unsigned helpers, size_t block_bytes = kBlockBytes,
             const SpliceStage* splice = nullptr, size_t max_bytes = kDefaultMaxBytes);
  // Lets the gathers under way finish and drops the queued ones.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // A stream for file inode `ino` (one per open file handle); null if `ino` is not a file.
  std::shared_ptr<Stream> open(uint64_t ino) const;

  // Serves [off, off + len) of the stream's file into `buf` (resized to len; the bytes served
  // are short only at end of file): from a block read ahead when one holds that range and the
  // file's sources are unchanged, else gathered now. Then, if this read continued the previous
  // one, plans blocks so that the one holding the reader's position and the two after it are
  // read ahead. Answers as Tree::read_into.
  ReadResult read(Stream& stream, uint64_t off, size_t len, ReplyBuffer& buf);
  // Hands the blocks the last read planned to the helpers. Called once the reply is sent, so
  // that waking them does not delay it; never throws, as the request is answered by then. If
  // the budget was spent when the read planned, first takes back blocks of the streams read
  // least recently, and plans again.
  void start(Stream& stream) noexcept;
  // Notes a READ of [off, off + got) served without the prefetcher (spliced), and if `plan`,
  // plans ahead from its end as read() does. Never throws (it runs after the reply): a failure
  // only means no read-ahead.
  void passed(Stream& stream, uint64_t off, size_t got, bool plan) noexcept;

  // Reads served from a block read ahead, and gathers ahead finished in all. A failed one
  // counts too; the READ of its block then gathers for itself.
  uint64_t hits() const { return hits_; }
  uint64_t gathered_ahead() const { return gathered_ahead_; }
  // The budget in blocks, the blocks all streams hold now, and the blocks taken back from
  // streams read less recently so far.
  size_t max_blocks() const;
  size_t blocks_held() const;
  uint64_t blocks_taken_back() const { return taken_back_; }

 private:
  // Whether another stream read in the last 2 ms (OtherReaders). Then the CPUs are busy
  // serving readers, and gathering ahead would only move work between them, at the cost of a
  // handoff.
  bool others_reading(const Stream& stream) {
    return readers_.note(reinterpret_cast<uintptr_t>(&stream));
  }
  // The steps of read(): take_ready serves the READ from the blocks read ahead if they hold it
  // (gathering a queued one itself, waiting for a running one) and lists the sources they were
  // read from; note_read records where the reader is and plans the blocks after it.
  struct Taken {
    bool hit = false;         // served from blocks read ahead: `bytes` are in the buffer
    bool sequential = false;  // the READ continued the previous one
    size_t bytes = 0;
  };
  Taken take_ready(Stream& stream, uint64_t off, size_t len, ReplyBuffer& buf,
                   std::vector<uint32_t>& served_from);
  void note_read(Stream& stream, uint64_t off, size_t bytes, bool sequential);
  // Under the stream's lock: takes back the slots the reader has left behind and queues free
  // ones for the blocks from `at` on, appending (slot, generation) to `queued`.
  void plan_ahead(Stream& stream, uint64_t at, std::vector<std::pair<size_t, uint64_t>>& queued);
  // Drops the queued jobs, lets the running gathers finish and joins the helpers.
  void stop();
  void helper_loop();
  // Gathers the block of slot `index` if it is still queued with `generation`.
  void fill(Stream& stream, size_t index, uint64_t generation);
  // With no lock held: takes back up to `want` blocks from the streams read least recently
  // (not `stream`), all the blocks of each one that no helper is filling.
  void take_back(const Stream& stream, size_t want);

  // The blocks charged to streams, and which streams hold them, least recently planned first.
  class Budget;

  struct Job {
    std::shared_ptr<Stream> stream;
    size_t slot = 0;
    uint64_t generation = 0;
  };

  const Tree& tree_;
  const size_t block_bytes_;
  const SpliceStage* splice_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> gathered_ahead_{0};
  std::atomic<uint64_t> taken_back_{0};
  // Shared with the streams, which give their blocks back when they go (after the prefetcher,
  // at unmount).
  std::shared_ptr<Budget> budget_;
  // Reads a stream stays "lagging" after one of them had to wait for its block.
  static constexpr unsigned kLagReads = 16;
  OtherReaders readers_;
  std::vector<std::thread> helpers_;
};

}  // namespace ckptfs::fs
