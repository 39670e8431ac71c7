// Whether the CPUs are busy with other readers: a read from another reader (an open file, or
// whatever key the caller uses) arrived in the last 2 ms. Lock-free; a heuristic, so relaxed
// ordering is enough. Thread-safety: note() may be called from any thread at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ckptfs::fs {

class OtherReaders {
 public:
  static constexpr int64_t kWindowUs = 2000;

  // Records a read by `reader` now; true if a read by another reader came within kWindowUs.
  bool note(uint64_t reader) {
    const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    const uint64_t last = last_reader_.exchange(reader, std::memory_order_relaxed);
    const int64_t last_at = last_read_us_.exchange(now, std::memory_order_relaxed);
    if (last != reader) other_read_us_.store(last_at, std::memory_order_relaxed);
    return now - other_read_us_.load(std::memory_order_relaxed) < kWindowUs;
  }

 private:
  std::atomic<uint64_t> last_reader_{0};
  std::atomic<int64_t> last_read_us_{0};
  // The last read by a reader other than the latest one.
  std::atomic<int64_t> other_read_us_{INT64_MIN / 2};
};

}  // namespace ckptfs::fs
