// Local disk room for the ranges an S3 mount fetches (RemoteCache). The S3 path keeps the bytes
// it fetched so that the files read after the first one find theirs: held in the daemon's own
// memory, a view larger than -o readahead_max pushed its own ranges out and fetched them again
// (0.59x the s3fs path for a 1 GiB view), while an S3 filesystem keeps everything in the
// kernel's page cache. A spool is an unlinked file on a local disk, mapped shared: the pages
// of the ranges it holds are page cache the kernel may write back and reclaim under pressure,
// not the daemon's memory, and the bound is disk space.
//
// Each allocation is given its disk blocks up front (fallocate), so that a store through the
// mapping never faults for lack of room (that would be SIGBUS); a freed one has them taken
// back (a hole punched), which also drops its pages from the page cache at once. The file is
// gone with the process, even one killed.
//
// Thread-safety: allocate and free may be called from any thread; `mutex_` guards the free
// extents and is a leaf (no syscall but fallocate is made under it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "ckptfs/util/fd.h"

namespace ckptfs::fs {

class Spool {
 public:
  // An unlinked file in `dir` with room for `capacity` bytes (rounded down to pages). Throws
  // std::runtime_error naming `dir` and what went wrong.
  Spool(const std::filesystem::path& dir, uint64_t capacity);
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  // The bytes it may hold at once, and where its file is.
  uint64_t capacity() const { return capacity_; }
  const std::filesystem::path& dir() const { return dir_; }
  // Its file, and where in it the bytes at `p` (of an allocation) are: an allocation may be
  // filled with pwrite as well as through the mapping.
  int fd() const { return fd_.get(); }
  uint64_t offset_of(const uint8_t* p) const { return static_cast<uint64_t>(p - base_); }
  // `size` bytes of its mapping (whole pages), or nullptr when no free extent is that large or
  // the disk has no blocks left for it.
  uint8_t* allocate(uint64_t size);
  // Gives back `size` bytes at `p` from allocate(p's size).
  void free(uint8_t* p, uint64_t size) noexcept;
  // `size` rounded up to whole pages: what allocate(size) takes.
  static uint64_t round_up(uint64_t size);
  // Bytes allocated now, and the bytes of disk its file takes.
  uint64_t used() const;
  uint64_t disk_bytes() const;

  // Whether files in `dir` live in memory (tmpfs, ramfs): a spool there would be the daemon's
  // memory under another name.
  static bool in_memory(const std::filesystem::path& dir);
  // A quarter of the space free for unprivileged users on the filesystem of `dir` (0 if it
  // cannot be read): the default -o s3_spool_max.
  static uint64_t default_capacity(const std::filesystem::path& dir);

 private:
  // Under mutex_: files [offset, offset + size) as free, joined with the free extents it
  // touches; the free extent it is part of now.
  std::pair<uint64_t, uint64_t> add_free(uint64_t offset, uint64_t size);
  void remove_free(std::map<uint64_t, uint64_t>::iterator it);

  std::filesystem::path dir_;
  uint64_t capacity_ = 0;
  // The file's size and mapping: twice the capacity, so that the free extents left between
  // ranges of many sizes still hold every range the bound lets in (the room beyond capacity
  // costs address space only: the file is sparse).
  uint64_t span_ = 0;
  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> free_;              // offset -> size, disjoint, not touching
  std::set<std::pair<uint64_t, uint64_t>> sizes_;  // {size, offset} of each: the best fit
  uint64_t used_ = 0;
};

}  // namespace ckptfs::fs
