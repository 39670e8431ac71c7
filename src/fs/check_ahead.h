// Structure checks run ahead of reads (index/deferred_check.h). When a file is opened, each of
// its sources whose scan an index gave unchecked, in a format parsed from its start, is checked
// to its end by a helper, several sources at once, while reads wait only for the regions they
// need. Over an S3 filesystem these checks' reads are what fetch the objects, every source at
// once as parallel `cat`s of them would; the file is served as the regions arrive. Left to the
// reads, each source's next window would be fetched when a read first needs it, one source
// after another.
//
// Thread-safety: add() may be called from any thread. The destructor has the checks stop after
// the region each is reading (those waiting for another tree's reads of a shared check, at
// once), and joins the helpers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "ckptfs/index/store.h"

namespace ckptfs::fs {

class CheckAhead {
 public:
  explicit CheckAhead(size_t helpers) : max_helpers_(helpers) {}
  ~CheckAhead();
  CheckAhead(const CheckAhead&) = delete;
  CheckAhead& operator=(const CheckAhead&) = delete;

  // Queues the check of `source` (whose `deferred` is set) to its end, once: a source queued
  // before is not queued again. `source` must outlive this object. Never throws: a helper that
  // cannot be started leaves the checks to the reads.
  void add(const index::IndexedSource& source) noexcept;

 private:
  struct Helper {
    std::thread thread;
    bool done = false;  // its loop has ended (mutex_): to be joined
  };
  void loop(Helper& self);
  // Joins the helpers whose loop has ended: an ended thread not joined keeps its stack, and a
  // tree of many sources starts a helper for many of them over its life. Under mutex_.
  void join_ended();

  const size_t max_helpers_;
  std::mutex mutex_;
  std::deque<const index::IndexedSource*> queue_;
  std::unordered_set<const index::DeferredCheck*> queued_;  // ever
  std::list<Helper> helpers_;  // each runs until the queue is empty; a list: loop holds its own
  size_t running_ = 0;         // helpers still looping
  std::atomic<bool> stop_{false};
};

}  // namespace ckptfs::fs
