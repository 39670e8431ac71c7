#include "ckptfs/fs/prefetcher.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace ckptfs::fs {

class Prefetcher::Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(uint64_t ino, uint64_t size) : ino(ino), size(size) {}

  enum class Ahead { kNone, kQueued, kRunning, kReady, kFailed };

  const uint64_t ino;
  const uint64_t size;
  std::mutex mutex;
  std::condition_variable done;  // signalled when a running block is ready or failed
  uint64_t next = 0;             // where the previous read ended
  Ahead state = Ahead::kNone;
  // Bumped whenever the block ahead is retargeted or taken over, so a queued job that was
  // overtaken finds it is no longer wanted.
  uint64_t generation = 0;
  uint64_t off = 0;  // the block ahead: [off, off + len), `got` bytes of it valid
  size_t len = 0;
  size_t got = 0;
  std::vector<char> block;  // owned by the helper while kRunning
};

Prefetcher::Prefetcher(const Tree& tree, unsigned helpers) : tree_(tree) {
  helpers = std::max(helpers, 1u);
  for (unsigned i = 0; i < helpers; ++i) helpers_.emplace_back([this] { helper_loop(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    jobs_.clear();
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

std::shared_ptr<Prefetcher::Stream> Prefetcher::open(uint64_t ino) const {
  const plan::VirtualFile* file = tree_.file(ino);
  if (file == nullptr) return nullptr;
  return std::make_shared<Stream>(ino, file->size());
}

int Prefetcher::read(Stream& s, uint64_t off, size_t len, std::vector<char>& buf, size_t& got) {
  using Ahead = Stream::Ahead;
  bool hit = false;
  bool sequential = false;
  {
    std::unique_lock lock(s.mutex);
    sequential = off == s.next;
    if (s.state != Ahead::kNone && s.off == off && s.len == len) {
      if (s.state == Ahead::kQueued) {
        // Not started: gathering it here is sooner than waiting for a helper.
        s.state = Ahead::kNone;
        ++s.generation;
      } else {
        s.done.wait(lock, [&] { return s.state != Ahead::kRunning; });
        if (s.state == Ahead::kReady) {
          buf.swap(s.block);
          got = s.got;
          hit = true;
        }
        s.state = Ahead::kNone;
      }
    }
  }
  int err = 0;
  if (hit) {
    // The block was gathered a moment ago: its sources must still be what was mounted, or
    // what it holds may be a mix of old and new bytes.
    err = tree_.check_file(s.ino);
    if (err == 0) hits_.fetch_add(1, std::memory_order_relaxed);
  } else {
    buf.resize(len);
    err = tree_.read_into(s.ino, off, std::span<char>(buf.data(), len), got);
  }
  if (err != 0) return err;
  {
    std::lock_guard lock(s.mutex);
    s.next = off + got;
  }
  if (sequential && got == len && off + got < s.size && !others_reading(s))
    queue(s.shared_from_this(), off + got, len);
  return 0;
}

bool Prefetcher::others_reading(const Stream& s) {
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  const Stream* last = last_reader_.exchange(&s, std::memory_order_relaxed);
  const int64_t last_at = last_read_us_.exchange(now, std::memory_order_relaxed);
  if (last != &s) other_at_ = last_at;
  return now - other_at_.load(std::memory_order_relaxed) < kBusyWindowUs;
}

void Prefetcher::queue(const std::shared_ptr<Stream>& s, uint64_t off, size_t len) {
  using Ahead = Stream::Ahead;
  uint64_t generation = 0;
  {
    std::lock_guard lock(s->mutex);
    if (s->state == Ahead::kRunning) return;  // one block ahead at a time
    // A queued block for another range is retargeted; a ready one nobody took is dropped.
    s->state = Ahead::kQueued;
    s->off = off;
    s->len = len;
    generation = ++s->generation;
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    jobs_.emplace_back(s, generation);
  }
  wake_.notify_one();
}

void Prefetcher::helper_loop() {
  for (;;) {
    std::pair<std::shared_ptr<Stream>, uint64_t> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    gather_ahead(*job.first, job.second);
  }
}

void Prefetcher::gather_ahead(Stream& s, uint64_t generation) {
  using Ahead = Stream::Ahead;
  uint64_t off = 0;
  size_t len = 0;
  {
    std::lock_guard lock(s.mutex);
    if (s.state != Ahead::kQueued || s.generation != generation) return;
    s.state = Ahead::kRunning;
    off = s.off;
    len = s.len;
  }
  s.block.resize(len);
  size_t got = 0;
  const int err = tree_.read_into(s.ino, off, std::span<char>(s.block.data(), len), got);
  {
    std::lock_guard lock(s.mutex);
    s.got = got;
    s.state = err == 0 ? Ahead::kReady : Ahead::kFailed;
  }
  s.done.notify_all();
  gathered_ahead_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ckptfs::fs
