// Read leases on the local sources, which make a spliced READ as trustworthy as a gathered one.
//
// A gathered READ copies the source's bytes, then checks its fingerprint: a write before the
// check fails the READ, a write after it cannot reach the copy. A spliced READ puts the source's
// page-cache pages in a pipe, and the kernel copies them out when the reply is written, after
// the check: an in-place write in between would reach the reader unseen. A read lease
// (fcntl F_SETLEASE F_RDLCK) closes that window: it can only be taken while no one holds the
// file open for writing (nor mapped writable), and while it is held, an open() for writing or a
// truncate() of the file waits (up to /proc/sys/fs/lease-break-time) until the holder lets go,
// after the kernel tells the holder. So, on that notice, a source is marked changing (its new
// READs are gathered, and fail with EIO once the writer has written), the splices already
// taken from it are waited for (their replies copied), and only then is the lease let go.
// A rename over the source or its unlink changes no byte of the open file and breaks nothing.
//
// A source that cannot be leased (open for writing at mount time, another user's file without
// CAP_LEASE, a file system without leases: many network and FUSE ones) is never leased and stays
// gathered; one that was broken stays gathered until remount. The guarantee holds while each
// spliced reply is written within lease-break-time of a writer's open (a reply takes
// milliseconds; lease-break-time below kMinBreakSeconds: no lease is taken at all).
//
// Thread-safety: hold()/Hold may be used by any number of threads at once (one atomic word per
// source); the notices are handled by the class's own thread. Construct and destroy on one
// thread while no Hold is alive.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace ckptfs::fs {

class SourceLeases {
 public:
  // Below this lease-break-time, a writer may not wait long enough for a reply to be copied.
  static constexpr int kMinBreakSeconds = 5;

  struct Source {
    int fd = -1;       // open read-only; -1: not a local file (never leased)
    std::string name;  // for the log
  };
  // Takes a read lease on each source it can (logged, with why not for the others) and starts
  // the thread that hears the kernel's notices. Never throws for a lease or a thread it cannot
  // have: those sources stay unleased.
  explicit SourceLeases(std::vector<Source> sources);
  // Stops the thread and lets go of every lease still held.
  ~SourceLeases();
  SourceLeases(const SourceLeases&) = delete;
  SourceLeases& operator=(const SourceLeases&) = delete;

  // Sources leased now (not broken).
  size_t leased() const;
  // Sources whose lease a writer broke so far.
  size_t broken() const { return broken_.load(std::memory_order_acquire); }

  // What one READ's sources are, for splicing.
  enum class State { kLeased, kUnleased, kChanging };

  // Sources a READ may splice from, held until the reply is written (destroyed): their leases
  // are not let go meanwhile.
  class Hold {
   public:
    explicit Hold(SourceLeases* leases) : leases_(leases) {}
    ~Hold() { release(); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    // Takes each of `sources` that is leased. kLeased: all of them are, and stay leased until
    // this hold is released. kChanging: one is being written (none is held then). kUnleased:
    // one was never leased (those leased are held). Without SourceLeases: kUnleased.
    State take(std::span<const uint32_t> sources);
    // Lets go of the sources held (the reply is copied, or will not be sent).
    void release() noexcept;

   private:
    SourceLeases* leases_;
    std::vector<uint32_t> held_;
  };

 private:
  // A source's word: flags and the splices in flight from it.
  static constexpr uint32_t kLeased = 1u << 31;
  static constexpr uint32_t kChanging = 1u << 30;
  static constexpr uint32_t kCount = kChanging - 1;

  bool enter(uint32_t source, State& state);
  void leave(uint32_t source) noexcept;
  void listen(int signo);
  // A writer wants source `i`: no new splice of it, wait for those in flight, let go.
  void let_go(size_t i);
  void take_leases(int signo, pid_t tid);

  std::vector<Source> sources_;
  std::unique_ptr<std::atomic<uint32_t>[]> words_;
  std::atomic<size_t> broken_{0};
  std::atomic<bool> stop_{false};
  int signo_ = 0;                // the notices' signal
  std::promise<pid_t> started_;  // the thread's id, for F_SETOWN_EX
  std::thread thread_;
};

}  // namespace ckptfs::fs
