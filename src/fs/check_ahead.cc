#include "check_ahead.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <string>

namespace ckptfs::fs {

CheckAhead::~CheckAhead() {
  stop_.store(true, std::memory_order_relaxed);
  std::list<Helper> helpers;
  {
    std::lock_guard lock(mutex_);
    queue_.clear();
    helpers.swap(helpers_);
  }
  // A helper may be waiting for another tree's reads of a check both share (OpenFiles::
  // shared_check), which may go on to the end of the file.
  for (const index::DeferredCheck* check : queued_) check->wake();
  for (Helper& h : helpers) h.thread.join();
}

void CheckAhead::join_ended() {
  for (auto it = helpers_.begin(); it != helpers_.end();) {
    if (!it->done) {
      ++it;
      continue;
    }
    // It set `done` as its last step under mutex_, which it no longer needs: the join is short.
    it->thread.join();
    it = helpers_.erase(it);
  }
}

void CheckAhead::add(const index::IndexedSource& source) noexcept {
  try {
    std::lock_guard lock(mutex_);
    if (stop_.load(std::memory_order_relaxed) || !queued_.insert(source.deferred.get()).second)
      return;
    queue_.push_back(&source);
    join_ended();
    // A helper per queued source, up to the bound: each check is one source's reads in turn.
    if (running_ < max_helpers_ && running_ < queue_.size()) {
      Helper& helper = helpers_.emplace_back();
      try {
        helper.thread = std::thread([this, &helper] { loop(helper); });
      } catch (...) {
        helpers_.pop_back();
        throw;
      }
      ++running_;
    }
  } catch (const std::exception& e) {  // no memory or thread: the reads check for themselves
    spdlog::debug("checking sources' headers ahead of reads: {}", e.what());
  }
}

void CheckAhead::loop(Helper& self) {
  for (;;) {
    const index::IndexedSource* source = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty() || stop_.load(std::memory_order_relaxed)) {
        --running_;
        self.done = true;
        return;
      }
      source = queue_.front();
      queue_.pop_front();
    }
    try {
      // A mismatch is logged, and answered with EIO, by the reads that meet it (fs::Tree).
      std::string why;
      source->deferred->verify(source->file.fd.get(), source->file.path.native(), source->scan,
                               source->scan.file_size, why, &stop_);
    } catch (const std::exception& e) {
      spdlog::debug("{}: checking its headers ahead of reads: {}", source->file.path.native(),
                    e.what());
    }
  }
}

}  // namespace ckptfs::fs
