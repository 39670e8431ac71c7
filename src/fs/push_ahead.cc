#include "push_ahead.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <system_error>

#include "reply_buffer.h"

namespace ckptfs::fs {

namespace {
constexpr uint64_t kPage = 4096;
}

PushAhead::PushAhead(const Tree& tree, Store store, Options options)
    : tree_(tree), store_(std::move(store)), options_(options) {
  try {
    for (unsigned i = 0; i < std::max(options_.helpers, 1u); ++i)
      helpers_.emplace_back([this] { run(); });
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : helpers_) t.join();
    throw;
  }
}

PushAhead::~PushAhead() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void PushAhead::paged(uint64_t ino, uint64_t off, size_t size) noexcept {
  const plan::TargetFile* target = tree_.target(ino);
  if (target == nullptr || options_.window == 0) return;
  const uint64_t end = off + size;
  try {
    std::lock_guard lock(mutex_);
    File& f = files_[ino];
    if (f.failed) return;
    f.size = target->file.size();
    // The reader passed the pushes, or went back before the window: push from here.
    if (end > f.next || end + options_.window < f.next) f.next = (end + kPage - 1) / kPage * kPage;
    f.limit = std::min(f.size, end + options_.window);
  } catch (const std::exception&) {
    return;  // out of memory: not pushed
  }
  wake_.notify_all();
}

void PushAhead::forget(uint64_t ino) noexcept {
  std::lock_guard lock(mutex_);
  files_.erase(ino);
}

uint64_t PushAhead::pushed_bytes() const {
  std::lock_guard lock(mutex_);
  return pushed_;
}

uint64_t PushAhead::failed() const {
  std::lock_guard lock(mutex_);
  return failed_;
}

bool PushAhead::take(Job& job) {
  for (auto& [ino, f] : files_) {
    if (f.failed || f.next >= f.limit) continue;
    uint64_t off = f.next;
    const uint64_t end = std::min(f.limit, (off / options_.chunk + 1) * options_.chunk);
    f.next = end;
    // The tripwire page: left for the reader's fault to ask for.
    if (options_.tripwire != 0 && off % options_.tripwire == 0 && off != 0) off += kPage;
    if (off >= end) continue;
    job = Job{ino, off, end - off};
    return true;
  }
  return false;
}

void PushAhead::run() {
  ReplyBuffer buf = make_reply_buffer();
  std::unique_lock lock(mutex_);
  while (true) {
    Job job;
    wake_.wait(lock, [&] { return stopping_ || take(job); });
    if (stopping_) return;
    lock.unlock();
    int err = 0;
    try {
      buf.resize(job.len);
      const ReadResult r = tree_.read_into(job.ino, job.off, std::span<char>(buf.data(), job.len));
      if (!r.ok())
        err = r.error();
      else if (r.bytes() > 0)
        err = store_(job.ino, job.off, std::span<const char>(buf.data(), r.bytes()));
    } catch (const std::exception&) {
      err = ENOMEM;
    }
    lock.lock();
    if (err == 0) {
      pushed_ += job.len;
    } else {
      ++failed_;
      if (auto it = files_.find(job.ino); it != files_.end()) it->second.failed = true;
      spdlog::info("push-ahead of inode {} stopped at byte {}: {}", job.ino, job.off,
                   std::strerror(err));
    }
  }
}

}  // namespace ckptfs::fs
