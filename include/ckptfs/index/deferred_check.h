// A scan an index gave for a file on a FUSE filesystem by its path, size and mtime, whose
// structure bytes (structure.h) have not been compared yet. A FUSE daemon reports whatever
// attributes it likes (s3fs sets the ctime back with `touch -d`), so only those bytes tell a
// rewrite in place; but a `.ckpt`'s record headers span the file, and over an S3 filesystem
// reading them fetches the whole object. A mount would pay that for every source, before its
// first byte is served, whether or not the node reads the rest. Instead the comparison is made
// as the file is served (fs::Tree's source checks): for a format parsed from its start, region
// by region up to the last byte a read takes from it (a prefix whose structure matches places
// every content byte in it as indexed), else the whole file before its first byte. On a
// mismatch reads from the file fail with EIO and, for the cache index, the entry is dropped so
// that the next mount scans the file again; a shipped index is to be rebuilt.
//
// Thread-safe: verify() may be called from many threads at once; one reads the bytes, region by
// region, while the others wait for the regions they need; what was checked stays checked for
// the life of the object.
#pragma once

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "ckptfs/index/structure.h"
#include "ckptfs/scan/file_scan.h"

namespace ckptfs::index {

class DeferredCheck {
 public:
  // `want`: the digest stored with `scan` (only its size and format are kept here). A cache
  // index: `index_dir` and `key` (Fingerprint::key()) name the entry to drop on a mismatch. A
  // shipped index (`shipped`): nothing is dropped, the message says to rebuild it.
  DeferredCheck(StructureDigest want, const scan::FileScan& scan, std::filesystem::path index_dir,
                std::string key, bool shipped = false);

  // Whether some of the file is still to be checked (none once it differs); once false, false
  // for good.
  bool pending() const {
    return !differs() && checked_.load(std::memory_order_acquire) < file_size_;
  }
  // Whether the file is checked whole before its first byte (not parsed from its start, or an
  // entry without regions): several of those are best read at once (fs::Tree).
  bool whole() const { return want_.regions.empty() || !by_prefix_; }
  // Whether a check found the structure bytes differ (final).
  bool differs() const { return differs_.load(std::memory_order_acquire); }
  // Whether verify(..., upto) would have bytes to read.
  bool needs(uint64_t upto) const;

  enum class Result {
    kMatched,     // the structure bytes checked so far have the stored digest: serve
    kDiffers,     // they do not, for good: the index entry is dropped (a failure to is logged)
    kUnreadable,  // they could not be read (an I/O error): asked again on the next call
  };
  // Makes sure content bytes of `fd` before `upto` may be served: compares the structure bytes
  // `scan` places in the regions up to the one holding byte upto - 1 (every region, whatever
  // `upto`, when whole()) with the stored digest, with the reason for anything but kMatched in
  // `why`. upto 0 checks nothing by prefix. Once `stop` is set, returns kMatched after the
  // region being read without reading more (a check run ahead of reads, given up), or, if
  // waiting for another thread's reads, once woken (wake()). Never throws
  // (a thread that cannot be woken is the one exception: std::system_error ends the process).
  Result verify(int fd, const std::string& name, const scan::FileScan& scan, uint64_t upto,
                std::string& why, const std::atomic<bool>* stop = nullptr) const;
  // Has the verify() calls waiting for another thread's reads look at their `stop` again: a
  // call given up returns kMatched at once, without waiting for the reads to finish.
  void wake() const;

 private:
  // How far from the start the file must be checked for verify(..., upto): a region boundary or
  // its end (its end when whole()).
  uint64_t target(uint64_t upto) const;
  void found_different() const;  // under mutex_

  const StructureDigest want_;
  const uint64_t file_size_;
  const bool by_prefix_;
  const std::filesystem::path index_dir_;
  const std::string key_;
  const bool shipped_;
  mutable std::mutex mutex_;
  mutable std::condition_variable progress_;  // checked_, differs_ or checking_ moved
  mutable bool checking_ = false;             // a thread is reading; mutex_
  // Bytes of the file from its start whose structure matched: a multiple of want_.region, or
  // file_size_ once all of it did.
  mutable std::atomic<uint64_t> checked_{0};
  mutable std::atomic<bool> differs_{false};
  // structure_extents while regions remain: set under mutex_, read by the checking thread.
  mutable std::vector<scan::Extent> parts_;
  mutable std::string why_;  // set under mutex_ before differs_
};

}  // namespace ckptfs::index
