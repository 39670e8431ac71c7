#include "check_ahead.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <string>

namespace ckptfs::fs {

CheckAhead::~CheckAhead() {
  stop_.store(true, std::memory_order_relaxed);
  std::vector<std::thread> helpers;
  {
    std::lock_guard lock(mutex_);
    queue_.clear();
    helpers.swap(helpers_);
  }
  // A helper may be waiting for another tree's reads of a check both share (OpenFiles::
  // shared_check), which may go on to the end of the file.
  for (const index::DeferredCheck* check : queued_) check->wake();
  for (std::thread& t : helpers) t.join();
}

void CheckAhead::add(const index::IndexedSource& source) noexcept {
  try {
    std::lock_guard lock(mutex_);
    if (stop_.load(std::memory_order_relaxed) || !queued_.insert(source.deferred.get()).second)
      return;
    queue_.push_back(&source);
    // A helper per queued source, up to the bound: each check is one source's reads in turn.
    if (running_ < max_helpers_ && running_ < queue_.size()) {
      helpers_.emplace_back([this] { loop(); });
      ++running_;
    }
  } catch (const std::exception& e) {  // no memory or thread: the reads check for themselves
    spdlog::debug("checking sources' headers ahead of reads: {}", e.what());
  }
}

void CheckAhead::loop() {
  for (;;) {
    const index::IndexedSource* source = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty() || stop_.load(std::memory_order_relaxed)) {
        --running_;
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
