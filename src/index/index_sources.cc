#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include "ckptfs/error.h"
#include "ckptfs/index/store.h"

namespace ckptfs::index {

namespace fs = std::filesystem;

namespace {

// Scanning is mostly waiting for header pages of cold files, so two in flight hide much of the
// latency without crowding the (small) machine or the disk.
constexpr size_t kScanThreads = 2;

// Scans sources[i] for every i in `misses`, kScanThreads at a time, and returns how many of
// `misses` (a prefix) were scanned. On failure the workers stop taking new files and the error
// of the first file (in `misses` order) that failed is returned in `error`.
size_t scan_files(std::vector<IndexedSource>& sources, const std::vector<size_t>& misses,
                  std::exception_ptr& error) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t error_at = misses.size();

  const auto work = [&] {
    for (size_t k; !failed.load() && (k = next.fetch_add(1)) < misses.size();) {
      IndexedSource& source = sources[misses[k]];
      const std::string name = source.file.path.string();
      try {
        source.scan = ckpt::scan_checkpoint_fd(source.file.fd.get(), name);
        // A file still being written would leave a scan of a prefix in the index for good.
        if (source::fingerprint_of(source.file.fd.get(), name) != source.file.fingerprint) {
          fail("{}: changed while being indexed; index it again once it is complete", name);
        }
        spdlog::debug("{}: scanned, {} parameters", name, source.scan.params.size());
      } catch (...) {
        std::lock_guard lock(mu);
        if (k < error_at) {
          error_at = k;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };

  {
    std::vector<std::jthread> helpers;
    for (size_t i = 1; i < std::min(kScanThreads, misses.size()); ++i) helpers.emplace_back(work);
    work();
  }
  // Files are taken in order and a taken file is always finished, so everything before the
  // first failure was scanned.
  return error_at;
}

std::string absolute_name(const fs::path& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return (ec ? path : absolute.lexically_normal()).string();
}

}  // namespace

std::vector<IndexedSource> index_sources(Store& store, const std::vector<fs::path>& paths) {
  std::vector<IndexedSource> sources;
  sources.reserve(paths.size());
  std::vector<size_t> misses;
  for (const fs::path& path : paths) {
    IndexedSource& source = sources.emplace_back();
    source.file = source::SourceFile::open(path);
    if (std::optional<ckpt::FileScan> scan = store.lookup(source.file.fingerprint)) {
      source.scan = std::move(*scan);
      source.from_index = true;
    } else {
      misses.push_back(sources.size() - 1);
    }
  }
  if (!misses.empty()) {
    spdlog::info("scanning {} of {} source files", misses.size(), sources.size());
  }
  std::exception_ptr error;
  const size_t scanned = scan_files(sources, misses, error);

  // Recorded even when a later file failed, so that the retry after fixing it is quick.
  std::vector<Store::NewEntry> items;
  items.reserve(scanned);
  for (size_t k = 0; k < scanned; ++k) {
    const IndexedSource& source = sources[misses[k]];
    items.push_back({absolute_name(source.file.path), source.file.fingerprint, &source.scan});
  }
  try {
    store.insert(items);
  } catch (const Error& e) {
    // The scans are good; only the next mount loses the head start.
    spdlog::warn("{}; the new scans are not recorded", e.what());
  }
  if (error) std::rethrow_exception(error);
  spdlog::info("{} source files: {} from the index, {} scanned", sources.size(),
               sources.size() - misses.size(), misses.size());
  return sources;
}

}  // namespace ckptfs::index
