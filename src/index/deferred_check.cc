#include "ckptfs/index/deferred_check.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>
#include <span>

#include "ckptfs/index/store.h"

namespace ckptfs::index {

namespace {

// How long a drop waits for the index to be closed elsewhere in this process (another source's
// drop, a step's plan taking scans from it): a mount's checks of several sources run at once,
// and an entry left there is trusted, and refused, again by the next mount.
constexpr std::chrono::seconds kDropPatience{10};

// Dropped so that the next mount scans the file rather than trusting the same size and mtime
// again. The index is a cache: failing to drop the entry costs only that.
void drop_entry(const std::filesystem::path& dir, const std::string& key, const std::string& name) {
  if (key.empty()) return;
  try {
    Store store = Store::open_waiting(dir, kDropPatience);
    store.remove(std::span(&key, 1));
  } catch (const std::exception& e) {
    spdlog::warn(
        "{}: its index entry could not be dropped ({}); `ckptfs index clear --index-dir {}` "
        "drops it with the others",
        name, e.what(), dir.string());
  }
}

}  // namespace

DeferredCheck::Result DeferredCheck::verify(int fd, const std::string& name,
                                            const scan::FileScan& scan, std::string& why) const {
  if (state_.load(std::memory_order_acquire) == kMatched) return Result::kMatched;
  bool found_now = false;
  {
    std::lock_guard lock(mutex_);
    if (state_.load(std::memory_order_relaxed) == kPending) {
      StructureDigest found;
      try {
        found = structure_digest(fd, name, scan);
      } catch (const std::exception& e) {
        why = fmt::format("its headers could not be read to compare them with the index: {}",
                          e.what());
        return Result::kUnreadable;
      }
      if (found == want_) {
        state_.store(kMatched, std::memory_order_release);
        return Result::kMatched;
      }
      why_ =
          "its headers are not those the index was made from (rewritten in place, its size and "
          "mtime put back?); its index entry is dropped: mount again to scan it";
      state_.store(kDiffers, std::memory_order_release);
      found_now = true;
    }
    if (state_.load(std::memory_order_relaxed) == kMatched) return Result::kMatched;
    why = why_;
  }
  // Outside the lock: the other readers of the file are answered while the drop may wait.
  if (found_now) drop_entry(index_dir_, key_, name);
  return Result::kDiffers;
}

}  // namespace ckptfs::index
