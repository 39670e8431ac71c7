// Pushes the pages ahead of a reader into the kernel's page cache of a file read through it
// (a mapped .safetensors view, or any file in page-cache mode). Such a reader gets its bytes by
// page faults or buffered reads, each miss a READ served while the reader's one thread waits:
// one core works at a time. Here helper threads gather the next chunks of the file as a READ
// would (Tree::read_into: the sources are checked after the copy) and hand them to the kernel
// unasked (`Store`, FUSE's notify_store), so the reader's next faults find them cached while the
// helpers fill the ones after, on the other core.
//
// Bounded: per file, at most `window` bytes past the end of the latest READ the kernel sent for
// it. A reader that finds every page cached sends no READs, so every `tripwire` bytes one page
// is left out: its fault is a small READ that says where the reader is, and moves the window on.
// The pages pushed are page cache, which the kernel may reclaim like any other; the daemon holds
// one chunk buffer per helper.
//
// Stops for a file at its release (forget), when a gather fails (a source changed: nothing of
// it is pushed, and the READs that follow fail with EIO as they would without pushing) or when
// the kernel refuses a store; a reader that jumps elsewhere moves the window with it.
//
// Thread-safety: every public method may be called from any thread. `mutex_` guards the files'
// state and is never held while gathering or storing.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckptfs/fs/tree.h"

namespace ckptfs::fs {

class PushAhead {
 public:
  // Hands [off, off + bytes.size()) of file `ino` to the kernel's page cache: 0 or an errno.
  using Store = std::function<int(uint64_t ino, uint64_t off, std::span<const char> bytes)>;
  struct Options {
    size_t window = size_t{64} << 20;
    size_t chunk = size_t{1} << 20;
    size_t tripwire = size_t{8} << 20;  // 0: none (the window moves only at READs of misses)
    unsigned helpers = 1;
  };
  // Starts the helpers; throws std::system_error (with none left running) if one cannot start.
  // `tree` must outlive this.
  PushAhead(const Tree& tree, Store store, Options options);
  ~PushAhead();  // lets the pushes under way finish
  PushAhead(const PushAhead&) = delete;
  PushAhead& operator=(const PushAhead&) = delete;

  // The kernel sent a READ of [off, off + size) of `ino` from its page cache: push ahead of it.
  // Never throws (a file it cannot track is not pushed).
  void paged(uint64_t ino, uint64_t off, size_t size) noexcept;
  // The file was released: stop pushing it.
  void forget(uint64_t ino) noexcept;

  uint64_t pushed_bytes() const;
  uint64_t failed() const;

 private:
  struct File {
    uint64_t size = 0;
    uint64_t next = 0;   // the first byte not pushed yet
    uint64_t limit = 0;  // push below this
    bool failed = false;
  };
  struct Job {
    uint64_t ino = 0, off = 0, len = 0;
  };
  bool take(Job& job);  // under mutex_
  void run();

  const Tree& tree_;
  const Store store_;
  const Options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::unordered_map<uint64_t, File> files_;
  uint64_t pushed_ = 0, failed_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace ckptfs::fs
