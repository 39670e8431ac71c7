#include "remote_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <system_error>

namespace ckptfs::fs {

RemoteCache::RemoteCache(size_t max_bytes, unsigned fetchers)
    : max_bytes_(max_bytes), fetchers_(std::max(1u, fetchers)) {}

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

bool RemoteCache::make_room(uint64_t need) {
  // Freeing the ranges still to be read would not make room: keep them.
  if (stats_.held - lru_bytes_ + need > max_bytes_) return false;
  while (stats_.held + need > max_bytes_ && !lru_.empty()) {
    Entry* e = lru_.front();
    lru_.pop_front();
    e->in_lru = false;
    stats_.held -= e->end - e->begin;
    lru_bytes_ -= e->end - e->begin;
    drop(*e);
  }
  return stats_.held + need <= max_bytes_;
}

void RemoteCache::drop(const Entry& e) {
  const auto in = ranges_.find(e.object);
  if (in == ranges_.end()) return;
  const auto it = in->second.find(e.begin);
  if (it != in->second.end() && it->second.get() == &e) in->second.erase(it);
}

bool RemoteCache::want(const remote::ObjectRef* object, uint64_t begin, uint64_t end) {
  if (begin >= end) return true;
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  Ranges& held = ranges_[object];
  // The parts of [begin, end) no range covers yet.
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  uint64_t at = begin;
  auto it = held.upper_bound(begin);
  if (it != held.begin() && std::prev(it)->second->end > at) at = std::prev(it)->second->end;
  for (; at < end; ++it) {
    const uint64_t next = it == held.end() ? end : std::min(end, it->first);
    if (next > at) gaps.emplace_back(at, next);
    if (it == held.end()) break;
    at = std::max(at, it->second->end);
  }
  // Room for every gap or none is queued: a part queued here without the fetchers told of it
  // (below) would keep a READ that waits for it waiting.
  uint64_t need = 0;
  for (const auto& [b, e] : gaps) need += e - b;
  if (!make_room(need)) return false;
  bool queued = false;
  for (const auto& [b, e] : gaps) {
    auto entry = std::make_shared<Entry>();
    entry->object = object;
    entry->begin = b;
    entry->end = e;
    held.emplace(b, entry);
    queue_.push_back(std::move(entry));
    stats_.held += e - b;
    queued = true;
  }
  if (!queued) return true;
  while (threads_.size() < fetchers_) {
    try {
      threads_.emplace_back([this] { fetcher_loop(); });
    } catch (const std::system_error& e) {
      if (!threads_.empty()) break;
      // No fetcher: forget what was queued; readers fetch for themselves.
      spdlog::warn("S3 read-ahead off: cannot start a thread: {}", e.what());
      for (const auto& entry : queue_) {
        stats_.held -= entry->end - entry->begin;
        drop(*entry);
      }
      queue_.clear();
      return false;
    }
  }
  work_.notify_all();
  return true;
}

RemoteCache::Got RemoteCache::read(const remote::ObjectRef* object, uint64_t offset,
                                   std::span<uint8_t> out) {
  std::shared_ptr<Entry> entry;
  {
    std::unique_lock lock(mutex_);
    const auto in = ranges_.find(object);
    if (in != ranges_.end()) {
      auto it = in->second.upper_bound(offset);
      if (it != in->second.begin()) {
        --it;
        if (offset + out.size() <= it->second->end) entry = it->second;
      }
    }
    if (!entry) {
      ++stats_.misses;
      return Got::kMiss;
    }
    if (entry->state == State::kQueued) {
      // A reader waits for it: it goes out next.
      const auto q = std::find(queue_.begin(), queue_.end(), entry);
      if (q != queue_.end() && q != queue_.begin()) {
        queue_.erase(q);
        queue_.push_front(entry);
      }
    }
    done_.wait(lock, [&] {
      return stopping_ || entry->state == State::kReady || entry->state == State::kFailed;
    });
    if (entry->state == State::kFailed) return Got::kFailed;
    if (entry->state != State::kReady) return Got::kMiss;  // stopping
    ++stats_.hits;
    if (entry->in_lru) lru_.splice(lru_.end(), lru_, entry->lru);
  }
  // Its bytes never change once ready, and `entry` keeps them while a newer range evicts it.
  std::memcpy(out.data(), entry->bytes.data() + (offset - entry->begin), out.size());
  return Got::kCopied;
}

void RemoteCache::fetcher_loop() {
  std::vector<std::shared_ptr<Entry>> batch;
  std::vector<remote::Get> gets;
  std::vector<std::string> errors;
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    batch.clear();
    while (!queue_.empty() && batch.size() < kBatch) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
      batch.back()->state = State::kFetching;
    }
    ++busy_;
    lock.unlock();
    gets.clear();
    errors.clear();
    try {
      for (const auto& e : batch) {
        e->bytes.resize(e->end - e->begin);
        gets.push_back({e->object, e->begin, std::span(e->bytes)});
      }
      remote::client().fetch(gets, &errors, &cancel_);
    } catch (const std::exception& ex) {  // no memory, no client: the whole batch failed
      errors.assign(batch.size(), ex.what());
    }
    lock.lock();
    --busy_;
    for (size_t i = 0; i < batch.size(); ++i) {
      Entry& e = *batch[i];
      if (errors[i].empty()) {
        e.state = State::kReady;
        e.lru = lru_.insert(lru_.end(), &e);
        e.in_lru = true;
        lru_bytes_ += e.end - e.begin;
        stats_.fetched += e.end - e.begin;
        ++stats_.ranges;
        continue;
      }
      spdlog::error("{}", errors[i]);
      e.state = State::kFailed;
      e.bytes = {};
      stats_.held -= e.end - e.begin;
      ++stats_.failed;
      drop(e);
    }
    batch.clear();
    done_.notify_all();
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
