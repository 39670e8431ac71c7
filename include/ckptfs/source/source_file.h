// An open source checkpoint and the identity it had when opened. The fingerprint keys the index
// and tells whether the file changed underneath a mount.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "ckptfs/util/fd.h"

namespace ckptfs::source {

struct Fingerprint {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const Fingerprint&) const = default;
  std::string key() const;  // fixed-width big-endian bytes, the LMDB key
};

// Throws Error naming `display_name` if fstat fails.
Fingerprint fingerprint_of(int fd, const std::string& display_name);

struct SourceFile {
  std::filesystem::path path;
  UniqueFd fd;
  Fingerprint fingerprint;

  // Opens read-only and fingerprints; throws Error naming the path.
  static SourceFile open(const std::filesystem::path& path);
  // True while fstat still gives the fingerprint taken at open.
  bool unchanged() const;
};

}  // namespace ckptfs::source
