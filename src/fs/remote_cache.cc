#include "remote_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <system_error>

#include "bus_guard.h"

namespace ckptfs::fs {

RangeBuffer::RangeBuffer(size_t size) : size_(size) {
  if (size == 0) return;
  if (size < kMappedBytes)
    heap_ = std::make_unique_for_overwrite<uint8_t[]>(size);
  else
    mapped_ = AnonymousMapping(size, AnonymousMapping::Pages::kNow);  // every byte is written
}

RangeBuffer RangeBuffer::in(Spool& spool, size_t size) noexcept {
  RangeBuffer out;
  out.spooled_ = spool.allocate(size);
  if (out.spooled_ == nullptr) return out;
  out.spool_ = &spool;
  out.size_ = size;
  return out;
}

RangeBuffer::RangeBuffer(RangeBuffer&& other) noexcept
    : heap_(std::move(other.heap_)),
      mapped_(std::move(other.mapped_)),
      spool_(std::exchange(other.spool_, nullptr)),
      spooled_(std::exchange(other.spooled_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

RangeBuffer& RangeBuffer::operator=(RangeBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    heap_ = std::move(other.heap_);
    mapped_ = std::move(other.mapped_);
    spool_ = std::exchange(other.spool_, nullptr);
    spooled_ = std::exchange(other.spooled_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void RangeBuffer::reset() noexcept {
  heap_.reset();
  mapped_.reset();
  if (spool_ != nullptr) spool_->free(spooled_, size_);
  spool_ = nullptr;
  spooled_ = nullptr;
  size_ = 0;
}

RemoteCache::RemoteCache(size_t max_bytes, unsigned fetchers, WholeBlocks blocks,
                         std::shared_ptr<Spool> spool)
    : max_bytes_(max_bytes),
      fetchers_(std::max(1u, fetchers)),
      blocks_(blocks),
      spool_(std::move(spool)),
      range_bound_(spool_ ? spool_->capacity() : max_bytes_) {}

RemoteCache::~RemoteCache() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  cancel_.store(true, std::memory_order_relaxed);
  work_.notify_all();
  done_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool RemoteCache::make_room(uint64_t need, std::vector<std::shared_ptr<Entry>>& freed) {
  // Freeing the ranges still to be read would not make room: keep them.
  if (stats_.held - lru_bytes_ + need > range_bound_) return false;
  // First the ranges whose expected bytes were all copied out, then the least recently read.
  for (const bool spent_only : {true, false}) {
    for (auto it = lru_.begin(); stats_.held + need > range_bound_ && it != lru_.end();) {
      Entry* e = *it;
      if (spent_only && !e->spent()) {
        ++it;
        continue;
      }
      Ranges& held = ranges_[e->object];
      const auto at = held.find(e->begin);  // a ready range is in the map until forgotten here
      if (at != held.end() && at->second.use_count() > 1) {  // a READ copies from it: keep it
        ++it;
        continue;
      }
      it = lru_.erase(it);
      e->in_lru = false;
      stats_.held -= e->cost;
      lru_bytes_ -= e->cost;
      stats_.evicted += e->end - e->begin;
      if (!e->spent() && e->planned) stats_.evicted_needed += e->end - e->begin;
      if (at != held.end()) {
        freed.push_back(std::move(at->second));
        held.erase(at);
      }
    }
  }
  return stats_.held + need <= range_bound_;
}

void RemoteCache::expect(const remote::ObjectRef* object,
                         std::span<const std::pair<uint64_t, uint64_t>> runs) {
  if (runs.empty() || object == nullptr) return;
  std::lock_guard lock(mutex_);
  auto [it, added] = needs_.try_emplace(object);
  Needs& needs = it->second;
  if (added) {
    while ((uint64_t{8192} << needs.shift) < object->info.size) ++needs.shift;
    needs.bytes.assign(((object->info.size + (uint64_t{1} << needs.shift) - 1) >> needs.shift) + 1,
                       0);
  }
  for (const auto& [offset, length] : runs)
    needs.each(offset, offset + length, [](uint64_t& block, uint64_t part) { block += part; });
  fits_ = -1;
}

uint64_t RemoteCache::expected_in(const remote::ObjectRef* object, uint64_t begin, uint64_t end) {
  const auto it = needs_.find(object);
  if (it == needs_.end()) return 0;
  Needs& needs = it->second;
  const unsigned shift = needs.shift;
  uint64_t out = 0;
  needs.each(begin, end, [&](const uint64_t& block, uint64_t part) {
    out += static_cast<uint64_t>(static_cast<unsigned __int128>(block) * part >> shift);
  });
  return out;
}

bool RemoteCache::block_pays(const remote::ObjectRef* object, uint64_t start) {
  const uint64_t end = std::min(object->info.size, start + blocks_.size);
  return end > start && pays(end - start, expected_in(object, start, end));
}

bool RemoteCache::whole_blocks() {
  if (blocks_.size < WholeBlocks::kMinWholeBlock || needs_.empty()) return false;
  if (fits_ >= 0) return fits_ == 1;
  // What the plan's blocks would hold at once: each block that pays whole, the bytes expected
  // of each other one.
  uint64_t bytes = 0;
  all_pay_ = true;
  for (const auto& [object, needs] : needs_) {
    for (uint64_t start = 0; start < object->info.size; start += blocks_.size) {
      const uint64_t size = std::min(blocks_.size, object->info.size - start);
      const uint64_t expected = expected_in(object, start, start + size);
      if (expected == 0) continue;
      const bool whole = pays(size, expected);
      bytes += whole ? size : expected;
      all_pay_ = all_pay_ && whole;
      if (bytes > range_bound_) break;  // does not fit: the rest cannot change that
    }
    if (bytes > range_bound_) break;
  }
  fits_ = bytes <= range_bound_ ? 1 : 0;
  spdlog::debug("S3 read-ahead: the plan's blocks hold {} MiB: {}", bytes >> 20,
                fits_ ? "whole blocks" : "ranges as needed");
  return fits_ == 1;
}

void RemoteCache::drop(const Entry& e) {
  const auto in = ranges_.find(e.object);
  if (in == ranges_.end()) return;
  const auto it = in->second.find(e.begin);
  if (it != in->second.end() && it->second.get() == &e) in->second.erase(it);
}

void RemoteCache::charge(uint64_t bytes) {
  stats_.held += bytes;
  stats_.peak = std::max(stats_.peak, stats_.held);
}

bool RemoteCache::reserve(uint64_t bytes) {
  if (bytes > max_bytes_) return false;
  std::vector<std::shared_ptr<Entry>> freed;
  std::unique_lock lock(mutex_);
  if (spool_) {  // the ranges are on disk: READs' buffers have the memory bound to themselves
    done_.wait(lock, [&] { return stopping_ || reserved_ + bytes <= max_bytes_; });
    if (stopping_) return false;
    reserved_ += bytes;
    return true;
  }
  // Ranges in flight arrive (and may then be freed) and other READs give their charges back, so
  // the wait ends.
  done_.wait(lock, [&] { return stopping_ || make_room(bytes, freed); });
  if (stopping_) return false;
  charge(bytes);
  lock.unlock();
  return true;  // `freed` goes here, with mutex_ let go
}

void RemoteCache::release(uint64_t bytes) {
  {
    std::lock_guard lock(mutex_);
    (spool_ ? reserved_ : stats_.held) -= bytes;
  }
  done_.notify_all();
}

bool RemoteCache::want(const remote::ObjectRef* object, uint64_t begin, uint64_t end) {
  if (begin >= end) return true;
  std::vector<std::shared_ptr<Entry>> freed;  // freed after the lock is let go
  std::vector<std::shared_ptr<Entry>> fresh;  // the new ranges, queued once `freed` is freed
  if (!plan_ranges(object, begin, end, freed, fresh)) return false;
  if (fresh.empty()) return true;
  // The ranges freed for room give their memory (or spool blocks) back before a fetcher can
  // take the new ones': freed after the fetchers were told, the bound was passed for a moment
  // (the spool's file by 2 MiB of 32 in a test).
  freed.clear();
  std::vector<std::shared_ptr<Entry>> forgotten;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      forgotten = std::move(fresh);
    } else {
      for (std::shared_ptr<Entry>& entry : fresh) queue_.push_back(std::move(entry));
      if (!start_fetchers()) {  // nothing was ever fetched: forget the whole queue
        forgotten.assign(queue_.begin(), queue_.end());
        queue_.clear();
      }
    }
    // Readers that found one of them waiting wake and fetch for themselves.
    for (const std::shared_ptr<Entry>& entry : forgotten) {
      entry->state = State::kGone;
      stats_.held -= entry->cost;
      drop(*entry);
    }
  }
  work_.notify_all();
  done_.notify_all();
  return forgotten.empty();
}

bool RemoteCache::start_fetchers() {
  while (threads_.size() < fetchers_) {
    try {
      threads_.emplace_back([this] { fetcher_loop(); });
    } catch (const std::system_error& e) {
      if (!threads_.empty()) return true;
      spdlog::warn("S3 read-ahead off: cannot start a thread: {}", e.what());
      return false;
    }
  }
  return true;
}

bool RemoteCache::plan_ranges(const remote::ObjectRef* object, uint64_t begin, uint64_t end,
                              std::vector<std::shared_ptr<Entry>>& freed,
                              std::vector<std::shared_ptr<Entry>>& fresh) {
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  Ranges& held = ranges_[object];
  const uint64_t block = blocks_.size;
  const bool whole = whole_blocks() && needs_.contains(object);
  if (whole) {
    const uint64_t first = begin / block * block, last = (end - 1) / block * block;
    if (first < begin && block_pays(object, first)) begin = first;
    if (last + block > end && block_pays(object, last))
      end = std::max(end, std::min(object->info.size, last + block));
  }
  // The parts of [begin, end) no range covers yet (cut where blocks begin if they are fetched
  // whole), and their bytes.
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  const auto add_gap = [&](uint64_t b, uint64_t e) {
    for (; whole && b / block != (e - 1) / block; b = (b / block + 1) * block)
      gaps.emplace_back(b, (b / block + 1) * block);
    gaps.emplace_back(b, e);
  };
  uint64_t at = begin;
  auto it = held.upper_bound(begin);
  if (it != held.begin() && std::prev(it)->second->end > at) at = std::prev(it)->second->end;
  for (; at < end; ++it) {
    const uint64_t next = it == held.end() ? end : std::min(end, it->first);
    if (next > at) add_gap(at, next);
    if (it == held.end()) break;
    at = std::max(at, it->second->end);
  }
  // The held ranges it overlaps will be read again soon: they become the most recently used, so
  // that room is made from ranges no reader is coming back to (a range one file read long ago
  // that the next file's window needs was freed first, and that file's READs fetched their runs
  // alone: 15k GETs instead of 300 for a checkpoint a little larger than the bound).
  auto touched = held.upper_bound(begin);
  if (touched != held.begin() && std::prev(touched)->second->end > begin) --touched;
  for (; touched != held.end() && touched->first < end; ++touched)
    if (touched->second->in_lru) lru_.splice(lru_.end(), lru_, touched->second->lru);
  uint64_t need = 0;
  for (const auto& [b, e] : gaps) need += cost_of(e - b);
  // Room for every gap or none is queued: a part queued here without the fetchers told of it
  // (below) would keep a READ that waits for it waiting.
  if (!make_room(need, freed)) return false;
  for (const auto& [b, e] : gaps) {
    auto entry = std::make_shared<Entry>();
    entry->object = object;
    entry->begin = b;
    entry->end = e;
    entry->cost = cost_of(e - b);
    entry->planned = needs_.contains(object);
    entry->expected = expected_in(object, b, e);
    held.emplace(b, entry);
    charge(entry->cost);
    fresh.push_back(std::move(entry));
  }
  return true;
}

size_t RemoteCache::cursor(std::vector<Cursor>& cursors, const remote::ObjectRef* object) {
  for (size_t k = 0; k < cursors.size(); ++k)
    if (cursors[k].object == object) return k;
  Cursor c;
  c.object = object;
  if (const auto r = ranges_.find(object); r != ranges_.end()) c.ranges = &r->second;
  if (const auto n = needs_.find(object); n != needs_.end()) c.needs = &n->second;
  // A READ over more objects than this reuses a slot: the search stays short.
  if (cursors.size() < kCursors) {
    cursors.push_back(c);
    return cursors.size() - 1;
  }
  const size_t k = cursors_replaced_++ % kCursors;
  cursors[k] = c;
  return k;
}

RemoteCache::Got RemoteCache::read(const remote::ObjectRef* object, uint64_t offset,
                                   std::span<uint8_t> out) {
  const remote::Get get{object, offset, out};
  Got got = Got::kMiss;
  read(std::span(&get, 1), std::span(&got, 1));
  return got;
}

void RemoteCache::read(std::span<const remote::Get> gets, std::span<Got> got) {
  // Per get, its ranges end to end (mostly one), as parts[first[i] .. first[i + 1]); `held`
  // keeps each range met once (one reference per range, not per run: a READ's thousands of runs
  // each took and dropped one, on a count other threads' READs of the same range shared), so
  // none is freed before its bytes are copied out. Cleared before returning: a reference kept
  // would keep its range from being freed.
  thread_local std::vector<Entry*> parts;
  thread_local std::vector<size_t> first;
  thread_local std::vector<std::shared_ptr<Entry>> held;
  thread_local std::vector<Cursor> cursors;
  parts.clear();
  first.clear();
  held.clear();
  cursors.clear();
  {
    std::unique_lock lock(mutex_);
    const uint64_t call = ++reads_;
    // A READ's runs come object by object or alternating among a few objects, in offset order
    // per object, many from one range: each object's maps and the last range met in it are
    // looked at before any lookup.
    size_t cur = 0;
    for (size_t i = 0; i < gets.size(); ++i) {
      first.push_back(parts.size());
      const remote::Get& g = gets[i];
      got[i] = Got::kCopied;
      if (g.out.empty()) continue;
      const uint64_t end = g.offset + g.out.size();
      if (cur >= cursors.size() || cursors[cur].object != g.object) cur = cursor(cursors, g.object);
      Cursor& c = cursors[cur];
      // Copied out here, or by the READ's own GET after a miss: expected no more.
      if (c.needs) c.needs->take(g.offset, end);
      if (c.last != nullptr && c.last->begin <= g.offset && end <= c.last->end) {
        parts.push_back(c.last);
        continue;
      }
      bool covered = false;
      if (c.ranges != nullptr) {
        auto it = c.ranges->upper_bound(g.offset);
        if (it != c.ranges->begin()) {
          --it;
          for (uint64_t at = g.offset; it != c.ranges->end() && it->first <= at && at < end; ++it) {
            Entry* e = it->second.get();
            if (e->read_by != call) {
              e->read_by = call;
              held.push_back(it->second);
            }
            parts.push_back(e);
            c.last = e;
            at = e->end;
            if (at >= end) {
              covered = true;
              break;
            }
          }
        }
      }
      if (!covered) {
        parts.resize(first.back());
        got[i] = Got::kMiss;
        ++stats_.misses;
      }
    }
    first.push_back(parts.size());
    for (const std::shared_ptr<Entry>& entry : held) {
      if (entry->state != State::kQueued) continue;
      // A reader waits for it: it goes out next.
      const auto q = std::find(queue_.begin(), queue_.end(), entry);
      if (q != queue_.end() && q != queue_.begin()) {
        queue_.erase(q);
        queue_.push_front(entry);
      }
    }
    done_.wait(lock, [&] {
      return stopping_ || std::all_of(held.begin(), held.end(), [](const auto& e) {
               return e->state != State::kQueued && e->state != State::kFetching;
             });
    });
    for (size_t i = 0; i < gets.size(); ++i) {
      if (got[i] != Got::kCopied || gets[i].out.empty()) continue;
      for (size_t k = first[i]; k < first[i + 1]; ++k) {
        const State state = parts[k]->state;
        if (state == State::kFailed) got[i] = Got::kFailed;
        if (state != State::kReady && got[i] != Got::kFailed) got[i] = Got::kMiss;  // stopping
      }
      if (got[i] != Got::kCopied) continue;
      ++stats_.hits;
      const uint64_t begin = gets[i].offset, end = begin + gets[i].out.size();
      for (size_t k = first[i]; k < first[i + 1]; ++k) {
        Entry& entry = *parts[k];
        const uint64_t copied = std::min(end, entry.end) - std::max(begin, entry.begin);
        entry.expected -= std::min(entry.expected, copied);
      }
    }
    for (const std::shared_ptr<Entry>& entry : held)
      if (entry->in_lru) lru_.splice(lru_.end(), lru_, entry->lru);
  }
  // Their bytes never change once ready, and no range is freed while a READ holds it.
  const auto copy = [&] {
    for (size_t i = 0; i < gets.size(); ++i) {
      if (got[i] != Got::kCopied) continue;
      const remote::Get& g = gets[i];
      uint64_t at = g.offset;
      for (size_t k = first[i]; k < first[i + 1]; ++k) {
        const Entry& entry = *parts[k];
        const uint64_t to = std::min<uint64_t>(entry.end, g.offset + g.out.size());
        std::memcpy(g.out.data() + (at - g.offset), entry.bytes.data() + (at - entry.begin),
                    to - at);
        at = to;
      }
    }
  };
  // A spooled page the kernel wrote back and cannot read again (a disk error) is SIGBUS: the
  // READ fails, the daemon lives.
  if (!spool_) {
    copy();
  } else if (!copy_guarded(copy)) {
    spdlog::error("S3 read-ahead: the spool in {} could not be read back (a disk error?)",
                  spool_->dir().string());
    for (size_t i = 0; i < gets.size(); ++i)
      if (got[i] == Got::kCopied) got[i] = Got::kFailed;
  }
  held.clear();
}

// Hands the queue's ranges to one fetcher's stream of GETs, front first, and files each range
// as its GET ends.
class RemoteCache::Feed : public remote::GetFeed {
 public:
  explicit Feed(RemoteCache& cache)
      : cache_(cache), max_in_flight_(kInFlightBytes / cache.fetchers_) {}

  bool next(remote::Get& get, uint64_t& tag) override {
    for (;;) {
      std::shared_ptr<Entry> e;
      {
        std::lock_guard lock(cache_.mutex_);
        if (cache_.stopping_ || cache_.queue_.empty()) return false;
        const uint64_t size = cache_.queue_.front()->end - cache_.queue_.front()->begin;
        if (in_flight_ > 0 && in_flight_ + size > max_in_flight_) return false;
        e = std::move(cache_.queue_.front());
        cache_.queue_.pop_front();
        e->state = State::kFetching;
        ++cache_.busy_;
      }
      try {
        e->bytes = cache_.spool_ ? RangeBuffer::in(*cache_.spool_, e->end - e->begin)
                                 : RangeBuffer(e->end - e->begin);
      } catch (const std::exception& ex) {  // no memory: this range fails, the next may not
        finish(std::move(e), ex.what());
        continue;
      }
      if (e->bytes.size() == 0) {  // no room in the spool: its readers fetch for themselves
        finish(std::move(e), {}, /*gone=*/true, "no room left in the spool");
        continue;
      }
      get = {e->object, e->begin, std::span(e->bytes.data(), e->bytes.size())};
      if (cache_.spool_) {
        get.file = cache_.spool_->fd();
        get.file_offset = cache_.spool_->offset_of(e->bytes.data());
      }
      in_flight_ += e->end - e->begin;
      tag = ++last_tag_;
      sent_.emplace(tag, std::move(e));
      return true;
    }
  }

  void done(uint64_t tag, std::string error, Failure why) override {
    const auto it = sent_.find(tag);
    if (it == sent_.end()) return;
    std::shared_ptr<Entry> e = std::move(it->second);
    sent_.erase(it);
    in_flight_ -= e->end - e->begin;
    // A changed object is EIO as any failure of the store; bytes this host could not keep
    // (the spool's disk) are no answer about the object: its readers fetch for themselves.
    if (why == Failure::kLocal)
      finish(std::move(e), {}, /*gone=*/true, error);
    else
      finish(std::move(e), error);
  }

  // Every range sent and not yet filed fails with `why` (the stream ended by an exception).
  void fail_sent(const std::string& why) {
    for (auto& [tag, e] : sent_) finish(std::move(e), why);
    sent_.clear();
    in_flight_ = 0;
  }

 private:
  // Files the range and lets go of this fetcher's reference to it before the range counts as
  // arrived: held on past that, a range just read could not be freed for room for a moment (a
  // READ seemed to be copying from it).
  void finish(std::shared_ptr<Entry> owned, const std::string& error, bool gone = false,
              const std::string& gone_why = {}) {
    RangeBuffer dropped;  // a failed range's bytes, freed once the lock is let go
    bool first_gone = false;
    {
      Entry& e = *owned;
      std::lock_guard lock(cache_.mutex_);
      --cache_.busy_;
      if (gone) {
        e.state = State::kGone;
        dropped = std::move(e.bytes);
        cache_.stats_.held -= e.cost;
        first_gone = cache_.stats_.gone++ == 0;
        cache_.drop(e);
      } else if (error.empty()) {
        e.state = State::kReady;
        e.lru = cache_.lru_.insert(cache_.lru_.end(), &e);
        e.in_lru = true;
        cache_.lru_bytes_ += e.cost;
        cache_.stats_.fetched += e.end - e.begin;
        ++cache_.stats_.ranges;
      } else {
        spdlog::error("{}", error);
        e.state = State::kFailed;
        dropped = std::move(e.bytes);
        cache_.stats_.held -= e.cost;
        ++cache_.stats_.failed;
        cache_.drop(e);
      }
      owned.reset();
    }
    // Once a mount: past it the unmount line counts them.
    if (first_gone)
      spdlog::warn(
          "S3 read-ahead: a range was not kept ({}); its readers fetch their runs themselves, as "
          "for every range the spool cannot hold",
          gone_why);
    cache_.done_.notify_all();
  }

  RemoteCache& cache_;
  const uint64_t max_in_flight_;
  uint64_t in_flight_ = 0;                                     // bytes of the GETs in sent_
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> sent_;  // by tag: in flight
  uint64_t last_tag_ = 0;
};

void RemoteCache::fetcher_loop() {
  Feed feed(*this);
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    const remote::S3Client* client = nullptr;
    try {
      client = &remote::client();
    } catch (const std::exception& ex) {  // no client: every queued range fails
      for (const std::shared_ptr<Entry>& e : queue_) {
        spdlog::error("{}", ex.what());
        e->state = State::kFailed;
        stats_.held -= e->cost;
        ++stats_.failed;
        drop(*e);
      }
      queue_.clear();
      done_.notify_all();
      continue;
    }
    lock.unlock();
    try {
      client->stream(feed, &cancel_);
    } catch (const std::exception& ex) {  // no memory: the ranges in flight failed
      feed.fail_sent(ex.what());
    }
    lock.lock();
  }
}

RemoteCache::Stats RemoteCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void RemoteCache::wait_idle() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return stopping_ || (queue_.empty() && busy_ == 0); });
}

}  // namespace ckptfs::fs
