// An open source checkpoint and the identity it had when opened. The fingerprint keys the index
// and tells whether the file changed underneath a mount.
// Thread-safety: a SourceFile is built once and then only read: unchanged() and pread on `fd`
// may be called from many threads at once; open() and fingerprint_of() keep no state.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckptfs/source/write_watch.h"
#include "ckptfs/util/fd.h"

namespace ckptfs::source {

// Identity of a file's contents as far as stat can tell: a rewrite in place moves the mtime (or
// the size) and the ctime, a replacement by rename changes the inode. The ctime catches a rewrite
// whose mtime was put back (rsync -a --inplace, touch -r), since no call can set it; it also
// moves on chmod, chown and link changes, which then count as changes too.
struct Fingerprint {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // st_mtim in nanoseconds since the epoch
  int64_t ctime_ns = 0;  // st_ctim likewise
  bool operator==(const Fingerprint&) const = default;

  static constexpr size_t kKeySize = 40;
  // dev, ino, size, mtime_ns, ctime_ns as 8-byte big-endian words (times two's complement): the
  // LMDB key.
  std::string key() const;
  // The fingerprint of a file with this stat.
  static Fingerprint from_stat(const struct stat& st);
  // The inverse of key(); nullopt unless `key` is kKeySize bytes.
  static std::optional<Fingerprint> from_key(std::string_view key);
};

// Throws Error naming `display_name` if fstat fails.
Fingerprint fingerprint_of(int fd, const std::string& display_name);

struct SourceFile {
  std::filesystem::path path;
  UniqueFd fd;
  Fingerprint fingerprint;
  WriteWatch writes;  // taken before the fingerprint
  // With OpenFiles (open_files.h), the open file this one duplicates, kept open while it lives.
  std::shared_ptr<const UniqueFd> shared;

  // Opens read-only (O_CLOEXEC) and fingerprints; throws Error naming the path if it cannot be
  // opened or is not a regular file.
  static SourceFile open(const std::filesystem::path& path);
  // The same for `fd`, already open read-only on the regular file `path` names.
  static SourceFile adopt(const std::filesystem::path& path, UniqueFd fd);
  // True while fstat of the open descriptor still gives the fingerprint taken at open; false if
  // fstat fails. A file replaced by rename or deleted still counts as unchanged: the descriptor
  // keeps reading the bytes that were fingerprinted. Losing its last name moves the ctime, so
  // once the file has no name left (st_nlink 0) its ctime is compared only if `writes` saw a
  // write (or cannot tell): a held descriptor can still rewrite it and put the mtime back.
  // On a FUSE filesystem it sees only what the daemon reports: an object rewritten through s3fs
  // with size, mtime and ctime put back reads as unchanged (docs/RELIABILITY.md). Thread-safe.
  bool unchanged() const;
};

}  // namespace ckptfs::source
