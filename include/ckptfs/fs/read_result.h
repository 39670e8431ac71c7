// What every step of the read path answers (Tree::read_into and gather, the prefetcher, the
// splice stage, the mapped sources, the FUSE-free read service): the bytes served, an errno, or
// "declined" (nothing done and nothing wrong: the caller serves the request another way, as a
// READ better gathered than spliced). One shape for all of them, so a caller cannot drop an
// errno or read a byte count that was never set; failures are values, never exceptions.
#pragma once

#include <cstddef>

namespace ckptfs::fs {

class [[nodiscard]] ReadResult {
 public:
  // `bytes` served (short of the request only at end of file).
  static constexpr ReadResult done(size_t bytes) noexcept { return {Kind::kDone, 0, bytes}; }
  // Failed with `err` (an errno, not 0): ENOENT or EISDIR for a bad inode, EINVAL for a bad
  // offset, EIO for a source that changed, shrank or could not be read (logged where found).
  static constexpr ReadResult failed(int err) noexcept { return {Kind::kFailed, err, 0}; }
  static constexpr ReadResult declined() noexcept { return {Kind::kDeclined, 0, 0}; }

  constexpr bool ok() const noexcept { return kind_ == Kind::kDone; }
  constexpr bool is_declined() const noexcept { return kind_ == Kind::kDeclined; }
  // The errno of a failure; 0 otherwise.
  constexpr int error() const noexcept { return err_; }
  // Bytes served; 0 unless ok().
  constexpr size_t bytes() const noexcept { return bytes_; }

 private:
  enum class Kind { kDone, kFailed, kDeclined };
  constexpr ReadResult(Kind kind, int err, size_t bytes) noexcept
      : kind_(kind), err_(err), bytes_(bytes) {}
  Kind kind_;
  int err_;
  size_t bytes_;
};

}  // namespace ckptfs::fs
