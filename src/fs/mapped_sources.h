// The source files mapped read-only, and copies of runs out of them. Mapped pages count in the
// daemon's resident set although they belong to the page cache, so once kBudget bytes of source
// have been touched (by all threads together) their page-table entries are dropped again: the
// resident set stays flat however much is read, and the next touch maps the cached page again.
// A request over more than kFewSources sources reads each source's stretch with preadv instead,
// where its runs form one.
//
// An encrypted source (FileScan::encrypted) is not mapped: its runs are plaintext offsets, read
// through one DecryptedStream per source (its own lock and small wiped cache) straight into the
// reply buffer. Plain sources do not pay for it beyond one flag test per request.
//
// A source standing for an S3 object (remote/objects.h) is not mapped either: its runs are read
// with ranged GETs (remote_runs.h), merged per request.
//
// Thread-safety: copy() may run on any number of threads at once; `mutex_` guards only the
// touched-tables accounting, is a leaf (nothing else is locked or called while it is held) and
// is never held during a copy or an madvise. Per-thread buffers live in scratch.h.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "ckptfs/crypt/decrypted_stream.h"
#include "ckptfs/fs/read_result.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/virtual_file.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/util/mapped_file.h"

namespace ckptfs::fs {

class MappedSources {
 public:
  static constexpr uint64_t kBudget = 8 << 20;
  // A copy reading more sources than this drops each one's pages as soon as it is done.
  static constexpr size_t kFewSources = 2;

  // Maps every source at its fingerprint size (an encrypted one: opens its decrypted stream
  // with the session key); throws Error naming a file that cannot be mapped or decrypted.
  explicit MappedSources(std::span<const index::IndexedSource> sources);

  size_t count() const { return maps_.size(); }
  // Bytes readable of source `index`: its size at mount (an encrypted one: its plaintext's).
  uint64_t mapped_size(uint32_t index) const {
    if (objects_[index]) return objects_[index]->info.size;
    return streams_[index] ? streams_[index]->size() : maps_[index].size();
  }
  bool encrypted(uint32_t index) const { return streams_[index] != nullptr; }
  bool any_encrypted() const { return any_encrypted_; }

  // Copies the bytes of `runs` to `out` (header runs from memory): done(their length), or
  // failed(EIO) if a file shrank since it was mapped (the copy faulted or a read came up short).
  // Every source run must lie within its mapping.
  ReadResult copy(std::span<const plan::Run> runs, char* out);

  struct Range {
    uint64_t begin = 0, end = 0;
  };

 private:
  // Adds the page tables of `source_runs` (indexes into `runs`) to the touched set, and lets
  // the whole set go once it spans kBudget.
  void note(std::span<const plan::Run> runs, std::span<const uint32_t> source_runs);
  // For a request over many sources, `order` grouped by source: reads each source whose runs
  // are one stretch of its file with preadv into `dest`, and leaves the others in `order`.
  bool read_stretches(std::span<const plan::Run> runs, std::span<char* const> dest,
                      std::vector<uint32_t>& order) const;
  // MADV_DONTNEED on each (source, tables) range; empties `ranges`.
  void let_go(std::vector<std::pair<uint32_t, Range>>& ranges) const;

  // Reads the encrypted sources' runs of `runs` into `dest` and drops them from `order`; false
  // (the reason logged, naming the file) when a block no longer decrypts.
  bool decrypt_runs(std::span<const plan::Run> runs, std::span<char* const> dest,
                    std::vector<uint32_t>& order);

  std::vector<MappedFile> maps_;
  std::vector<std::unique_ptr<crypt::DecryptedStream>> streams_;  // null: a plain source
  bool any_encrypted_ = false;
  std::vector<const remote::ObjectRef*> objects_;  // null: not an S3 object
  bool any_remote_ = false;
  std::vector<int> fds_;        // the sources' descriptors (owned by the plan)
  std::mutex mutex_;            // guards touched_ and spanned_
  std::vector<Range> touched_;  // per source: the span touched since the last let-go
  uint64_t spanned_ = 0;
};

}  // namespace ckptfs::fs
