// The persistent index: LMDB, source file fingerprint -> header-only scan of that file. A second
// mount of an unchanged source reads it instead of scanning; a changed file has a new
// fingerprint and is scanned again. Nothing here is on the read path.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/source/source_file.h"

namespace ckptfs::index {

// $XDG_CACHE_HOME/ckptfs/index, else $HOME/.cache/ckptfs/index.
std::filesystem::path default_dir();

struct Entry {
  std::string path;
  source::Fingerprint fingerprint;
  uint64_t params = 0;
};

class Store {
 public:
  // Opens (creating) the LMDB environment in `dir`; throws Error naming it.
  explicit Store(const std::filesystem::path& dir);
  ~Store();
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;

  std::optional<ckpt::FileScan> lookup(const source::Fingerprint& fingerprint) const;
  struct NewEntry {
    std::string path;
    source::Fingerprint fingerprint;
    const ckpt::FileScan* scan = nullptr;
  };
  // All in one write transaction.
  void insert(std::span<const NewEntry> items);
  std::vector<Entry> entries() const;
  size_t clear();  // removes every entry, returns how many

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct IndexedSource {
  source::SourceFile file;
  ckpt::FileScan scan;
  bool from_index = false;
};

// Opens every path, takes scans from the store where the fingerprint matches and scans the
// rest (header only), then records the new scans in one transaction. A file that changes while
// it is scanned is an Error.
std::vector<IndexedSource> index_sources(Store& store,
                                         const std::vector<std::filesystem::path>& paths);

}  // namespace ckptfs::index
