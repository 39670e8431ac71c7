// Notices writes to open source files, for the one case stat cannot tell: a file that lost its
// last name. Unlinking a file moves its ctime, so once a source has no name its ctime no longer
// says whether someone still holding a writable descriptor rewrote it and put the mtime back.
// An inotify watch (IN_MODIFY) on the inode does: the kernel reports every write(2), truncate
// and fallocate to it, through any descriptor, named or not. Writes through a shared writable
// mapping are not reported (nor do they always move mtime or ctime).
//
// One inotify instance per process, made on the first watch; the watches are per inode and
// shared by every handle of that inode. Thread-safe: all calls may come from any thread (one
// leaf mutex). Survives fork (the child keeps the instance; only one process should read it).
#pragma once

#include <cstdint>

namespace ckptfs::source {

class WriteWatch {
 public:
  // An inactive handle: written() is always true (nothing would be noticed).
  WriteWatch() = default;
  WriteWatch(WriteWatch&& other) noexcept;
  WriteWatch& operator=(WriteWatch&& other) noexcept;
  WriteWatch(const WriteWatch&) = delete;
  WriteWatch& operator=(const WriteWatch&) = delete;
  // Removes the inode's watch when no other handle of it is left.
  ~WriteWatch();

  // Watches the file open on `fd` (through /proc/self/fd). Inactive if inotify or /proc is not
  // available, or the watch limit (fs.inotify.max_user_watches) is reached. Take it before the
  // fingerprint, so that no write after the fingerprint goes unnoticed.
  static WriteWatch of(int fd);

  bool active() const { return wd_ >= 0; }
  // Whether the file may have been written since this handle was taken: a write was reported,
  // events were lost (queue overflow), the watch went away, or the handle is inactive.
  bool written() const;

 private:
  void release();

  int wd_ = -1;
  uint64_t writes_at_start_ = 0;  // the inode's write count when this handle was taken
};

}  // namespace ckptfs::source
