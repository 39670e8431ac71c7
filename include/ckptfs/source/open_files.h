// Source files opened once per path for all the plans of one mount. A mount with a shipped index
// plans each target rank when it is first opened, and every rank's plan opens its sources; on a
// FUSE filesystem every open(2) asks the server, and unless the server keeps the cache (s3fs
// does not, without -o kernel_cache) the kernel drops every cached page of the file. The ranks
// read the same source bytes one after another (a tensor-parallel target's runs are spread over
// every source), so each rank's open made the S3 filesystem serve the whole checkpoint again:
// 3.6 times the sources' bytes for a view of 4 ranks, all through FUSE requests. Here a path
// opened before is handed out as a duplicate of the descriptor opened then (no open reaches the
// filesystem), as long as the path still names that file; a file replaced since is opened anew.
// A file is held only while a SourceFile from here uses it (or, with kForLife, until this object
// goes): a step dropped from a mount, or deleted, is closed with its plan, so its disk space
// comes back.
// It also remembers which files' structure was checked against the shipped index (index/
// structure.h: a rank's plan read every record header of its sources, a fifth of the checkpoint
// here, again for every rank), so that a later plan checks only a file that changed since, and
// keeps the one deferred check of a file whose check is made as it is served.
//
// Thread-safety: open() may be called from any thread; one leaf mutex guards the map of paths.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "ckptfs/source/source_file.h"
#include "ckptfs/util/fd.h"

namespace ckptfs::source {

class OpenFiles {
 public:
  enum class Keep {
    kWhileUsed,  // a mount: closed when its last SourceFile from here is
    kForLife,    // index build: its plans are made and dropped one target at a time
  };
  explicit OpenFiles(Keep keep = Keep::kWhileUsed) : keep_(keep) {}

  // SourceFile::open(path), or SourceFile::adopt of a duplicate of the descriptor an earlier
  // call opened for `path` when that file is still held and the path still names it (device
  // and inode). Throws as SourceFile::open.
  SourceFile open(const std::filesystem::path& path);

  // Whether `file` (from open()) is the file held for its path, with the fingerprint it had
  // when mark_checked was called for it: its ctime moves on any rewrite, so its bytes are those
  // checked then.
  bool checked(const SourceFile& file);
  void mark_checked(const SourceFile& file);
  // The check object an earlier call kept for `file` (from open()) with its fingerprint, else
  // make()'s, kept from now on (while the file is held): one index::DeferredCheck per file for
  // all the plans of a mount, so that each rank planned on first open does not read the same
  // headers again. make() is called under the map's lock: it must not call back here.
  std::shared_ptr<const void> shared_check(
      const SourceFile& file, const std::function<std::shared_ptr<const void>()>& make);

 private:
  struct Held {
    std::weak_ptr<const UniqueFd> fd;
    std::shared_ptr<const UniqueFd> pinned;  // kForLife
    std::optional<Fingerprint> checked;
    std::shared_ptr<const void> check;  // shared_check's, for check_for
    std::optional<Fingerprint> check_for;
  };
  // The entry of `file`'s path if `file` is an open of the file it holds; under mutex_.
  Held* held_for(const SourceFile& file);
  // Forgets the paths whose file was closed, once the map has doubled; under mutex_.
  void sweep();

  const Keep keep_;
  std::mutex mutex_;
  std::unordered_map<std::string, Held> held_;
  size_t sweep_at_ = 64;
};

}  // namespace ckptfs::source
