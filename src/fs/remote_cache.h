// Fetched ranges of S3 objects (remote/objects.h), shared by every file of a mount. The
// plan-driven read-ahead (source_prefetch.h) asks for the coalesced ranges a reader will need
// next (want); fetcher threads GET them, many at once, each GET with If-Match on the scanned
// ETag; READs copy their runs from here (read), waiting for a range still in flight. A range
// that several targets read is fetched once while it is held.
//
// Bounded: ranges held or in flight, all objects together, stay under `max_bytes` (the mount's
// -o readahead_max). A new range first takes the room of the ranges used least recently that
// have arrived; past that it is not fetched ahead, and its reader fetches its own runs.
//
// Never a wrong byte: a range whose GET fails (after the client's retries) or whose object
// changed is logged once and dropped; the reads waiting for it fail (EIO), later reads fetch
// for themselves and meet the same answer.
//
// Thread-safety: every member may be called from any thread; `mutex_` guards the ranges, the
// queue and the counters, is a leaf, and is never held during a GET or a copy of many bytes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckptfs/remote/objects.h"

namespace ckptfs::fs {

class RemoteCache {
 public:
  // Fetcher threads; each sends its batch of up to kBatch GETs at once (curl multi), so up to
  // kFetchers * kBatch GETs are in flight.
  static constexpr unsigned kFetchers = 4;
  static constexpr size_t kBatch = remote::S3Client::kInFlight;

  explicit RemoteCache(size_t max_bytes, unsigned fetchers = kFetchers);
  // Drops the queued ranges, wakes the waiting readers (they fetch for themselves) and joins the
  // fetchers (a batch under way finishes first).
  ~RemoteCache();
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  // Queues [begin, end) of `object` (which outlives this cache) unless a held or queued range
  // overlaps it; false when the bound leaves no room (nothing queued).
  bool want(const remote::ObjectRef* object, uint64_t begin, uint64_t end);

  enum class Got { kCopied, kMiss, kFailed };
  // Copies out.size() bytes at `offset` of `object` from one held range, waiting while that
  // range is in flight: kMiss when no range holds them all, kFailed when the range failed.
  Got read(const remote::ObjectRef* object, uint64_t offset, std::span<uint8_t> out);

  struct Stats {
    uint64_t fetched = 0;           // bytes of ranges that arrived
    uint64_t ranges = 0;            // ranges that arrived
    uint64_t failed = 0;            // ranges that failed
    uint64_t hits = 0, misses = 0;  // reads
    uint64_t held = 0;              // bytes held or in flight now
  };
  Stats stats() const;
  // Waits until nothing is queued or in flight (tests, bench).
  void wait_idle();

 private:
  enum class State { kQueued, kFetching, kReady, kFailed };
  struct Entry {
    const remote::ObjectRef* object = nullptr;
    uint64_t begin = 0, end = 0;
    State state = State::kQueued;
    std::vector<uint8_t> bytes;
    std::list<Entry*>::iterator lru;  // valid while in_lru
    bool in_lru = false;              // ready and not evicted
  };
  using Ranges = std::map<uint64_t, std::shared_ptr<Entry>>;  // begin -> range, disjoint

  // Under mutex_: frees ready ranges, least recently used first, until `need` more bytes fit;
  // false, and nothing freed, when they would not fit even with every ready range freed.
  bool make_room(uint64_t need);
  void drop(const Entry& e);  // under mutex_: forgets a range (not in the LRU list)
  void fetcher_loop();

  const size_t max_bytes_;
  const unsigned fetchers_;
  mutable std::mutex mutex_;
  std::condition_variable work_, done_;
  std::unordered_map<const remote::ObjectRef*, Ranges> ranges_;
  std::deque<std::shared_ptr<Entry>> queue_;
  std::list<Entry*> lru_;   // ready ranges, least recently read first
  uint64_t lru_bytes_ = 0;  // their bytes: what make_room may free
  unsigned busy_ = 0;       // fetchers with a batch
  bool stopping_ = false;
  // Set with stopping_, read by the fetchers' GETs in flight, which give up (no wait for a
  // stalled store at unmount).
  std::atomic<bool> cancel_{false};
  Stats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace ckptfs::fs
