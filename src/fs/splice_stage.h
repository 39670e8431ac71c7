// Staging a READ's bytes in a pipe with splice(2), so that the reply is copied once, by the
// kernel, from the sources' page cache into the reader's buffer; the copy path copies twice
// (gather into a buffer, then the reply). Only READs made of a few long runs are staged: each
// run costs a syscall and at least one pipe slot, and short strided runs gather faster by
// memcpy. Staged bytes are checked as copied ones are: once they are in the pipe, every source
// they came from must still match its mount fingerprint, or the READ fails with EIO.
//
// Measured on the bench machine (docs/PERFORMANCE.md): the kernel's copy out of page-cache pages
// (split where source and target offsets are not page-aligned alike) costs about three times
// its copy out of the daemon's freshly written buffer, and a spliced READ cannot be prepared
// while the previous reply is copied. So a lone reader is served faster by gathering ahead, and
// splicing pays only while other readers keep the CPUs busy: that is when -o splice uses it,
// if pipes may hold a 1 MiB READ (fs.pipe-max-size >= 2 MiB). -o splice=always uses it always.
// It is opt-in because its check is weaker than a gather's: the pipe holds the cached pages,
// not a copy, so an in-place write between the check and the kernel's copy would show. And
// where libfuse cannot grow its own reply pipe (a user over pipe-user-pages-soft), it copies
// ours with read(), which stops short at a page truncated away meanwhile: a short reply, not
// EIO.
//
// Thread-safety: a SpliceStage is read-only once made: any thread may call it at once. A
// StagePipe is one thread's (scratch.h keeps each FUSE worker's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ckptfs/fs/read_result.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/util/fd.h"
#include "source_leases.h"

namespace ckptfs::fs {

// A non-blocking pipe of a given number of page slots. One per FUSE worker thread.
class StagePipe {
 public:
  // The most slots a pipe may get here, as a power of two: 512 (2 MiB) if fs.pipe-max-size
  // allows it (or the process may pass it), else 256 (1 MiB, the usual limit), 0 if not even
  // that.
  static size_t max_slots();
  // A pipe of `slots` slots, or, if it cannot be made or sized, none: error() says why.
  explicit StagePipe(size_t slots) noexcept;
  // 0 if the pipe is usable, else the errno of pipe2 or F_SETPIPE_SZ.
  int error() const { return error_; }
  size_t slots() const { return slots_; }
  int read_end() const { return read_.get(); }
  int write_end() const { return write_.get(); }
  // Bytes waiting in the pipe (none once a reply consumed them).
  size_t pending() const;

 private:
  UniqueFd read_, write_;
  size_t slots_ = 0;
  int error_ = 0;
};

class SpliceStage {
 public:
  // READs of more runs than this are gathered.
  static constexpr size_t kMaxRuns = 32;
  // Nor are READs whose runs are shorter than this on average, or READs shorter than this.
  static constexpr uint64_t kMinRunBytes = 16 << 10;

  // `tree` must outlive the stage; staging pipes have `slots` slots.
  SpliceStage(const Tree& tree, size_t slots) : tree_(tree), slots_(slots) {}
  size_t slots() const { return slots_; }

  // Whether a READ of `runs`, `bytes` long in all, is staged: few, long runs that fit a pipe of
  // `slots` with room for the reply header, also in the pipe libfuse sizes for a reply of
  // `bytes`.
  static bool worth_it(std::span<const plan::Run> runs, uint64_t bytes, size_t slots);
  // The same for [off, off + len) of file `ino` (false if not a file).
  bool would_stage(uint64_t ino, uint64_t off, size_t len) const;

  // Stages [off, off + len) of file `ino` (which must be a file, off inside it) into `pipe`.
  // Before the first splice, the READ's sources are taken into `hold` (source_leases.h), which
  // the caller keeps until the reply is written: staged only if all of them are leased, or, with
  // `unleased_ok` (-o splice=always), if none is being written. done(bytes): that many bytes are
  // in the pipe. declined: the READ is better gathered, a source is not leased, or the pipe
  // filled up; the caller gathers it. failed(EIO): a source changed or shrank (logged). Unless
  // done, the pipe may hold bytes: the caller must replace it.
  ReadResult stage(uint64_t ino, uint64_t off, size_t len, const StagePipe& pipe,
                   SourceLeases::Hold& hold, bool unleased_ok) const;

 private:
  const Tree& tree_;
  size_t slots_;
};

}  // namespace ckptfs::fs
