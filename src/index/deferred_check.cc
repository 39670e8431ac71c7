#include "ckptfs/index/deferred_check.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
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

DeferredCheck::DeferredCheck(StructureDigest want, const scan::FileScan& scan,
                             std::filesystem::path index_dir, std::string key, bool shipped)
    : want_(std::move(want)),
      file_size_(scan.file_size),
      by_prefix_(parsed_from_start(scan) && want_.region > 0 &&
                 want_.regions.size() ==
                     file_size_ / want_.region + (file_size_ % want_.region != 0)),
      index_dir_(std::move(index_dir)),
      key_(std::move(key)),
      shipped_(shipped) {}

namespace {

uint64_t round_up(uint64_t n, uint64_t to) { return n / to * to + (n % to != 0 ? to : 0); }

}  // namespace

uint64_t DeferredCheck::target(uint64_t upto) const {
  return whole() ? file_size_ : std::min(file_size_, round_up(upto, want_.region));
}

bool DeferredCheck::needs(uint64_t upto) const {
  if (differs()) return false;
  const uint64_t goal = target(upto);
  return checked_.load(std::memory_order_acquire) < goal;
}

void DeferredCheck::wake() const {
  std::lock_guard lock(mutex_);
  progress_.notify_all();
}

void DeferredCheck::found_different() const {
  why_ = shipped_ ? fmt::format(
                        "its headers are not those the index {} was built from (rewritten in "
                        "place, its size and mtime kept?); rebuild it with `ckptfs index build "
                        "SRC --output {}`",
                        index_dir_.string(), index_dir_.string())
                  : std::string(
                        "its headers are not those the index was made from (rewritten in place, "
                        "its size and mtime put back?); its index entry is dropped: mount again "
                        "to scan it");
  differs_.store(true, std::memory_order_release);
}

DeferredCheck::Result DeferredCheck::verify(int fd, const std::string& name,
                                            const scan::FileScan& scan, uint64_t upto,
                                            std::string& why, const std::atomic<bool>* stop) const {
  if (!needs(upto) && !differs()) return Result::kMatched;
  const uint64_t goal = target(upto);
  const auto stopped = [&] { return stop && stop->load(std::memory_order_relaxed); };
  std::unique_lock lock(mutex_);
  // One thread reads at a time; the others wait for the regions they need, or for their turn
  // to read further. A check run ahead and given up waits no longer (wake()): the thread
  // reading may be another tree's, checking the whole file.
  progress_.wait(lock, [&] {
    return differs_.load(std::memory_order_relaxed) ||
           checked_.load(std::memory_order_relaxed) >= goal || !checking_ || stopped();
  });
  if (checking_ && stopped() && !differs_.load(std::memory_order_relaxed)) return Result::kMatched;
  bool found_now = false;
  if (!differs_.load(std::memory_order_relaxed) &&
      checked_.load(std::memory_order_relaxed) < goal) {
    checking_ = true;
    if (!whole() && parts_.empty()) parts_ = structure_extents(scan);
    try {
      // The lock is let go while bytes are read (over an S3 filesystem, a fetch), so that a
      // reader whose regions are checked meanwhile goes on.
      while (checked_.load(std::memory_order_relaxed) < goal && !stopped()) {
        const uint64_t begin = checked_.load(std::memory_order_relaxed);
        bool same = false;
        uint64_t end = file_size_;
        lock.unlock();
        if (whole()) {
          same = same_structure(structure_digest(fd, name, scan), want_);
        } else {
          end = std::min(file_size_, begin + want_.region);
          same = structure_crc(fd, name, parts_, begin, end) == want_.regions[begin / want_.region];
        }
        lock.lock();
        if (!same) {
          found_different();
          found_now = true;
          break;
        }
        checked_.store(end, std::memory_order_release);
        progress_.notify_all();
      }
    } catch (const std::exception& e) {
      if (!lock.owns_lock()) lock.lock();
      checking_ = false;
      progress_.notify_all();
      why =
          fmt::format("its headers could not be read to compare them with the index: {}", e.what());
      return Result::kUnreadable;
    }
    checking_ = false;
    if (checked_.load(std::memory_order_relaxed) == file_size_ || found_now)
      std::vector<scan::Extent>().swap(parts_);
    progress_.notify_all();
  }
  if (!differs_.load(std::memory_order_relaxed)) return Result::kMatched;
  why = why_;
  lock.unlock();
  // Outside the lock: the other readers of the file are answered while the drop may wait.
  if (found_now && !shipped_) drop_entry(index_dir_, key_, name);
  return Result::kDiffers;
}

}  // namespace ckptfs::index
