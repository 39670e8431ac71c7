// Fetched ranges of S3 objects (remote/objects.h), shared by every file of a mount. The
// plan-driven read-ahead (source_prefetch.h) asks for the coalesced ranges a reader will need
// next (want); fetcher threads GET them, many at once, each GET with If-Match on the scanned
// ETag; READs copy their runs from here (read), waiting for a range still in flight. A range
// that several targets read is fetched once while it is held.
//
// Bounded: the bytes of the S3 path, all objects together, stay under `max_bytes` (the mount's
// share of -o readahead_max): ranges held or in flight, and the buffers READs charge (reserve)
// for the GETs of runs no range holds. With a spool (spool.h, -o s3_spool) the ranges are held
// in its file instead, under its capacity, and `max_bytes` bounds the READs' buffers alone. A new
// range first takes the room of the ranges used least recently that have arrived and that no READ
// is copying from; past that it is not fetched ahead, and its reader fetches its own runs. When the
// plan said which bytes its files will read (expect), a range whose expected bytes have all been
// copied out to READs is forgotten before any range still to be read: read least recently is no
// guide when the files that read a range come one after another (the next file needs the ranges the
// last one read first, and those were freed first). A range's bytes are pages of its own from 64
// KiB (RangeBuffer), so that a dropped range's memory leaves the daemon at once.
//
// Never a wrong byte: a range whose GET fails (after the client's retries) or whose object
// changed is logged once and dropped; the reads waiting for it fail (EIO), later reads fetch
// for themselves and meet the same answer.
//
// A READ's run may span several ranges next to each other (ranges asked for by two windows, or
// the gaps a want filled between held ones): it is copied from all of them.
//
// Thread-safety: every member may be called from any thread; `mutex_` guards the ranges, the
// queue and the counters, is a leaf, and is never held during a GET or a copy of many bytes.
#pragma once

#include <algorithm>
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
#include <utility>
#include <vector>

#include "ckptfs/remote/objects.h"
#include "ckptfs/util/anonymous_mapping.h"
#include "spool.h"

namespace ckptfs::fs {

// Bytes of one fetched range or one READ's staged GETs. From kMappedBytes on, pages mapped for
// it alone and unmapped when it is freed: from the heap, a freed range of a few MiB stays in the
// allocator's per-thread arenas, and a mount bounded at 32 MiB grew by 96 MiB. Below, the heap
// (small blocks are reused there). Or pages of a Spool's file (in()). Not zeroed. Thread-safety:
// one owner at a time.
class RangeBuffer {
 public:
  static constexpr size_t kMappedBytes = size_t{64} << 10;
  RangeBuffer() = default;
  explicit RangeBuffer(size_t size);  // throws std::bad_alloc
  // `size` bytes of `spool` (which outlives it); empty when the spool has no room for them.
  static RangeBuffer in(Spool& spool, size_t size) noexcept;
  ~RangeBuffer() { reset(); }
  RangeBuffer(RangeBuffer&& other) noexcept;
  RangeBuffer& operator=(RangeBuffer&& other) noexcept;
  RangeBuffer(const RangeBuffer&) = delete;
  RangeBuffer& operator=(const RangeBuffer&) = delete;
  uint8_t* data() const { return spooled_ ? spooled_ : heap_ ? heap_.get() : mapped_.data(); }
  size_t size() const { return size_; }
  void reset() noexcept;

 private:
  std::unique_ptr<uint8_t[]> heap_;  // below kMappedBytes
  AnonymousMapping mapped_;          // from kMappedBytes on
  Spool* spool_ = nullptr;           // in()
  uint8_t* spooled_ = nullptr;
  size_t size_ = 0;
};

// Whole blocks: a want that meets an aligned block of `size` bytes whose bytes the plan
// expects READs to copy out enough of (the block is at most `amplify` times those) fetches all
// of it, in a GET of its own. A store serves few large aligned GETs for much less than many
// small ones (SeaweedFS: 0.31 CPU seconds for 251 MiB in 8 MiB GETs, 0.62 in GETs of 1.2 MiB,
// 0.47 in 8 MiB GETs off the 8 MiB boundaries). Under kMinWholeBlock (or 0): wants are fetched as
// asked. Blocks under kMinWholeBlock are not fetched whole (a bound of a few KiB would make blocks
// of a few bytes, and the fit check walks every block of every object).
struct WholeBlocks {
  static constexpr uint64_t kMinWholeBlock = uint64_t{1} << 20;
  uint64_t size = 0;
  double amplify = 1;
};

class RemoteCache {
 public:
  // Fetcher threads; each keeps up to kInFlight GETs in flight (curl multi), sending the next
  // queued range as soon as one of its GETs ends (not a batch at a time: a slot that finished
  // early would idle until the batch's slowest GET ended), so up to kFetchers * kInFlight are in
  // flight.
  static constexpr unsigned kFetchers = 4;
  static constexpr size_t kInFlight = remote::S3Client::kInFlight;
  // Bytes of GETs in flight, all fetchers together (each its share; one GET always may go): the
  // ranges a reader needs first arrive first instead of sharing the bandwidth with all the
  // rest (then the first READ waited for the whole window).
  static constexpr uint64_t kInFlightBytes = uint64_t{64} << 20;

  explicit RemoteCache(size_t max_bytes, unsigned fetchers = kFetchers, WholeBlocks blocks = {},
                       std::shared_ptr<Spool> spool = nullptr);
  // Drops the queued ranges, wakes the waiting readers (they fetch for themselves) and joins the
  // fetchers (their GETs in flight are given up).
  ~RemoteCache();
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  // Queues the parts of [begin, end) of `object` (which outlives this cache) no held or queued
  // range covers, widened to whole blocks where they pay (WholeBlocks) and cut at block boundaries,
  // and marks the held ones it overlaps as the most recently used; false when the bound leaves no
  // room (nothing queued).
  bool want(const remote::ObjectRef* object, uint64_t begin, uint64_t end);

  // The plan's word on what READs will copy out: `length` bytes at `offset` of `object`, once
  // more (call it per run of every file the mount serves, before they are read; a byte several
  // files read is expected that many times). Kept per block of at least 4 KiB, at most 8,192
  // blocks an object.
  void expect(const remote::ObjectRef* object, uint64_t offset, uint64_t length) {
    const std::pair<uint64_t, uint64_t> run{offset, length};
    expect(object, std::span(&run, 1));
  }
  // The same for many runs ({offset, length}) of one object, under one lock.
  void expect(const remote::ObjectRef* object, std::span<const std::pair<uint64_t, uint64_t>> runs);

  // Whether every want is widened to whole blocks now (WholeBlocks, whole_blocks() below): every
  // block the plan reads pays whole, so wants need not name each run, only the blocks.
  bool fetches_whole_blocks() {
    std::lock_guard lock(mutex_);
    return whole_blocks() && all_pay_;
  }

  enum class Got { kCopied, kMiss, kFailed };
  // Copies out.size() bytes at `offset` of `object` from the held ranges that cover them (one,
  // or several end to end), waiting while one is in flight: kMiss when the ranges held leave a
  // byte out, kFailed when one of them failed.
  Got read(const remote::ObjectRef* object, uint64_t offset, std::span<uint8_t> out);
  // The same for many runs under one lock (a READ's runs of ~500 bytes are thousands): got[i]
  // (got.size() >= gets.size()) is read()'s answer for gets[i]. Waits for every range in flight
  // that holds a byte of them.
  void read(std::span<const remote::Get> gets, std::span<Got> got);

  // Charges `bytes` of a READ's own buffers to the bound, taking the room of ranges read least
  // recently, and waiting while the room is taken by ranges in flight or other READs' charges;
  // false (nothing charged) when `bytes` could never fit, or the cache is stopping. A charge is
  // given back with release().
  bool reserve(uint64_t bytes);
  void release(uint64_t bytes);

  struct Stats {
    uint64_t fetched = 0;           // bytes of ranges that arrived
    uint64_t ranges = 0;            // ranges that arrived
    uint64_t failed = 0;            // ranges that failed
    uint64_t gone = 0;              // ranges not fetched: no room in the spool
    uint64_t hits = 0, misses = 0;  // reads
    uint64_t held = 0;            // bytes held, in flight or charged by READs (without a spool) now
    uint64_t peak = 0;            // the most `held` has been
    uint64_t evicted = 0;         // bytes of arrived ranges forgotten to make room
    uint64_t evicted_needed = 0;  // of those, bytes of ranges the plan still expected READs of
  };
  Stats stats() const;
  // Waits until nothing is queued or in flight (tests, bench).
  void wait_idle();

 private:
  // kGone: never fetched, the spool had no room (its readers fetch for themselves).
  enum class State { kQueued, kFetching, kReady, kFailed, kGone };
  struct Entry {
    const remote::ObjectRef* object = nullptr;
    uint64_t begin = 0, end = 0;
    uint64_t cost = 0;  // its charge on the bound: end - begin, in whole pages in a spool
    State state = State::kQueued;
    RangeBuffer bytes;
    std::list<Entry*>::iterator lru;  // valid while in_lru
    bool in_lru = false;              // ready and not evicted
    bool planned = false;             // its object has expectations: `expected` means something
    uint64_t expected = 0;            // bytes READs are still expected to copy out of it
    uint64_t read_by = 0;             // the last read() call that met it (its number)
    // All its expected bytes were copied out (within what the blocks' rounding leaves).
    bool spent() const { return planned && expected * 16 < end - begin; }
  };
  // Per object: bytes READs are still expected to copy out of each block of 1 << shift bytes.
  struct Needs {
    unsigned shift = 12;
    std::vector<uint64_t> bytes;
    // Calls fn(bytes of the block, bytes of [begin, end) in it) for each block it touches.
    template <typename Fn>
    void each(uint64_t begin, uint64_t end, Fn fn) {
      for (uint64_t at = begin; at < end;) {
        const uint64_t block = at >> shift;
        const uint64_t to = std::min(end, (block + 1) << shift);
        if (block < bytes.size()) fn(bytes[block], to - at);
        at = to;
      }
    }
    // [begin, end) was copied out: expected no more (never below 0).
    void take(uint64_t begin, uint64_t end) {
      each(begin, end, [](uint64_t& block, uint64_t part) { block -= std::min(block, part); });
    }
  };
  using Ranges = std::map<uint64_t, std::shared_ptr<Entry>>;  // begin -> range, disjoint
  // read()'s place in one object: its maps (null: none) and the last range a run was met in.
  struct Cursor {
    const remote::ObjectRef* object = nullptr;
    Ranges* ranges = nullptr;
    Needs* needs = nullptr;
    Entry* last = nullptr;
  };
  static constexpr size_t kCursors = 16;
  // Under mutex_: the index in `cursors` of `object`'s cursor, made (or put in the place of
  // another, past kCursors of them) if it has none.
  size_t cursor(std::vector<Cursor>& cursors, const remote::ObjectRef* object);

  // Under mutex_: forgets ready ranges no READ is copying from, least recently used first, until
  // `need` more bytes fit, and moves them to `freed` (to free once mutex_ is let go). False when
  // they do not fit: nothing is forgotten when even every ready range would not make room, but
  // some may be when the ranges READs are copying from hold the rest.
  bool make_room(uint64_t need, std::vector<std::shared_ptr<Entry>>& freed);
  // Under mutex_: forgets a range (not in the LRU list; its owner, the queue or a fetcher's
  // batch, still holds it).
  void drop(const Entry& e);
  void charge(uint64_t bytes);  // under mutex_: `held` grows (and its peak)
  uint64_t cost_of(uint64_t size) const { return spool_ ? Spool::round_up(size) : size; }
  // Under mutex_: the bytes of [begin, end) of `object` READs are still expected to copy out (a
  // block's share in proportion to the part of it inside).
  uint64_t expected_in(const remote::ObjectRef* object, uint64_t begin, uint64_t end);
  // Whether a block of `size` bytes, `expected` of which READs are still expected to copy out,
  // is worth a GET of its own (WholeBlocks).
  bool pays(uint64_t size, uint64_t expected) const {
    return static_cast<double>(size) <= blocks_.amplify * static_cast<double>(expected);
  }
  // Under mutex_: pays() for the block of `object` starting at `start`.
  bool block_pays(const remote::ObjectRef* object, uint64_t start);
  // Under mutex_: whether wants are widened to whole blocks. Only when the plan's blocks all fit
  // the bound at once: blocks fetched whole hold the bytes later files read from the start, and
  // past the bound they push each other out (a view 1.1x the bound fetched 3.3x its bytes,
  // where ranges as needed fetch 1.07x).
  bool whole_blocks();
  // Takes mutex_: the ranges want() would queue for [begin, end) of `object`, put in the maps
  // and charged (not queued yet); the ranges freed for their room go to `freed`. False when
  // they do not fit (nothing is planned) or the cache is stopping.
  bool plan_ranges(const remote::ObjectRef* object, uint64_t begin, uint64_t end,
                   std::vector<std::shared_ptr<Entry>>& freed,
                   std::vector<std::shared_ptr<Entry>>& fresh);
  // Under mutex_: starts the fetchers not running yet; false when none can be.
  bool start_fetchers();
  class Feed;
  void fetcher_loop();

  const size_t max_bytes_;
  const unsigned fetchers_;
  const WholeBlocks blocks_;
  // Declared before the ranges: their buffers give their pages back to it.
  const std::shared_ptr<Spool> spool_;
  const uint64_t range_bound_;  // the bound on ranges: the spool's capacity, or max_bytes_
  uint64_t reserved_ = 0;       // with a spool: bytes READs charged (without, in stats_.held)
  int fits_ = -1;               // whole_blocks()'s answer; -1: not known since the last expect()
  bool all_pay_ = false;        // with fits_: every block the plan reads pays whole
  mutable std::mutex mutex_;
  std::condition_variable work_, done_;
  std::unordered_map<const remote::ObjectRef*, Ranges> ranges_;
  std::unordered_map<const remote::ObjectRef*, Needs> needs_;
  std::deque<std::shared_ptr<Entry>> queue_;
  // Ready ranges, least recently read first. A READ copying from one holds a reference to it,
  // taken under mutex_ only, so a use count of 1 (the map's) under mutex_ means no READ is.
  std::list<Entry*> lru_;
  uint64_t lru_bytes_ = 0;  // their bytes: what make_room may free
  unsigned busy_ = 0;       // ranges in flight
  uint64_t reads_ = 0;      // read() calls so far (Entry::read_by)
  size_t cursors_replaced_ = 0;
  bool stopping_ = false;
  // Set with stopping_, read by the fetchers' GETs in flight, which give up (no wait for a
  // stalled store at unmount).
  std::atomic<bool> cancel_{false};
  Stats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace ckptfs::fs
