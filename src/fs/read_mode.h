// How one READ is answered: gathered (the daemon copies the source runs into a buffer, the
// kernel copies the buffer into the reader's pages: two copies per byte, the first one done
// ahead by the read-ahead helpers for a sequential reader) or spliced (the runs' page-cache
// pages go into a pipe and the kernel copies them once, while the READ waits).
//
// Measured on the bench machine (docs/PERFORMANCE.md): a lone reader is faster gathered, since
// its READs come one at a time and the gather of the next block runs on the other CPU while the
// current reply is copied; the kernel's copy out of page-cache pages, on the critical path when
// spliced, is the slower one. Once two READs are served at once (two readers, or two threads of
// one reader on the same file) both CPUs are busy and one copy per byte wins. So the choice keys
// on the READs of other readers in flight on the daemon, not on which file or handle they name.
// Which READs can be spliced at all (few, long runs that fit a pipe) is SpliceStage::worth_it's
// part.
//
// Thread-safety: choose_read_mode is a pure function. ReadsInFlight may be used by any number
// of threads at once (lock-free; a heuristic, so relaxed ordering is enough).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ckptfs::fs {

enum class ReadMode { kGather, kSplice };

struct ReadModeInputs {
  // What the mount allows: no splicing (-o splice=never, encrypted or S3 sources, or pipes too
  // small for the mount's READs), splicing chosen per READ (the default; only READs whose
  // sources all hold a read lease are then spliced, source_leases.h), or every READ worth it
  // (-o splice=always).
  enum class Policy { kNever, kAuto, kAlways } policy = Policy::kAuto;
  // A READ of another reader (another calling thread) is being served now.
  bool other_reader_now = false;
  // Microseconds since that was last so (a large value: never).
  int64_t since_other_reader_us = INT64_MAX;
};

// Two readers' READs overlapping within this window mean they keep both CPUs busy: a reader
// between two READs (its reply copied, its next pread not yet sent) is still reading.
inline constexpr int64_t kOverlapWindowUs = 2000;

// kSplice means "splice if SpliceStage takes it" (else the READ is gathered).
ReadMode choose_read_mode(const ReadModeInputs& in);

// Counts the READs being served and remembers when two readers' READs were last served at
// once. A reader is its calling thread (the FUSE request's pid): a lone reader's next READ can
// reach another worker before the one that replied to its last READ has returned, so the count
// alone would see two.
class ReadsInFlight {
 public:
  // Marks one READ of `caller` served for the guard's lifetime.
  class Guard {
   public:
    Guard(ReadsInFlight& reads, uint64_t caller) : reads_(reads) {
      const unsigned before = reads_.count_.fetch_add(1, std::memory_order_relaxed);
      const uint64_t last = reads_.last_caller_.exchange(caller, std::memory_order_relaxed);
      const int64_t now = now_us();
      other_now_ = before != 0 && last != caller;
      if (other_now_) reads_.last_overlap_us_.store(now, std::memory_order_relaxed);
      since_us_ = now - reads_.last_overlap_us_.load(std::memory_order_relaxed);
    }
    ~Guard() { reads_.count_.fetch_sub(1, std::memory_order_relaxed); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    bool other_reader_now() const { return other_now_; }
    int64_t since_other_reader_us() const { return since_us_; }

   private:
    ReadsInFlight& reads_;
    bool other_now_ = false;
    int64_t since_us_ = INT64_MAX;
  };

 private:
  static int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::atomic<unsigned> count_{0};
  std::atomic<uint64_t> last_caller_{0};
  std::atomic<int64_t> last_overlap_us_{INT64_MIN / 2};
};

}  // namespace ckptfs::fs
