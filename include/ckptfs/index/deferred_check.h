// A scan the cache index gave for a file on a FUSE filesystem by its path, size and mtime, whose
// structure bytes (structure.h) have not been compared yet. A FUSE daemon reports whatever
// attributes it likes (s3fs sets the ctime back with `touch -d`), so only those bytes tell a
// rewrite in place; but a `.ckpt`'s record headers span the file, and over an S3 filesystem
// reading them fetches the whole object. A remount would pay that for every source, whether or
// not the node reads it. Instead the comparison is made once, before the first byte of the file
// is served (fs::Tree's source checks). On a mismatch the entry is dropped from the index, so
// that the next mount scans the file again, and reads from it fail with EIO.
//
// Thread-safe: verify() may be called from many threads at once; the first reads the bytes and
// the others wait for its answer, which stands for the life of the object.
#pragma once

#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>

#include "ckptfs/index/structure.h"
#include "ckptfs/scan/file_scan.h"

namespace ckptfs::index {

class DeferredCheck {
 public:
  // `want`: the digest stored with the scan; `index_dir` and `key` (Fingerprint::key(); empty
  // for none): the entry to drop if the file does not have it.
  DeferredCheck(StructureDigest want, std::filesystem::path index_dir, std::string key)
      : want_(want), index_dir_(std::move(index_dir)), key_(std::move(key)) {}

  // Whether the check is still to be made; once false, false for good.
  bool pending() const { return state_.load(std::memory_order_acquire) == kPending; }
  // Whether the check was made and the structure bytes differ (final).
  bool differs() const { return state_.load(std::memory_order_acquire) == kDiffers; }
  enum class Result {
    kMatched,     // the structure bytes have the stored digest: serve the file
    kDiffers,     // they do not, for good: the index entry is dropped (a failure to is logged)
    kUnreadable,  // they could not be read (an I/O error): asked again on the next call
  };
  // Compares the structure bytes `scan` places in `fd` with the stored digest, with the reason
  // for anything but kMatched in `why`. Never throws.
  Result verify(int fd, const std::string& name, const scan::FileScan& scan,
                std::string& why) const;

 private:
  enum State : int { kPending, kMatched, kDiffers };
  const StructureDigest want_;
  const std::filesystem::path index_dir_;
  const std::string key_;
  mutable std::mutex mutex_;  // held while the bytes are read
  mutable std::atomic<int> state_{kPending};
  mutable std::string why_;  // set once under mutex_ before state_ becomes kDiffers
};

}  // namespace ckptfs::index
