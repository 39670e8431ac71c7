#include "ckptfs/fs/lazy_ranks.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>

#include "ckptfs/error.h"
#include "ckptfs/fs/tree.h"

namespace ckptfs::fs {

struct LazyRanks::Rank {
  int64_t rank = 0;
  size_t first = 0;  // its files are files_[first, first + count)
  size_t count = 0;
  std::mutex mu;
  std::atomic<const Tree*> tree{nullptr};
  std::atomic<bool> failed{false};
  std::unique_ptr<Tree> owned;
  std::vector<uint64_t> local;  // the inode of each of its files in `owned`
};

LazyRanks::LazyRanks(std::vector<File> files, PlanRank plan_rank)
    : files_(std::move(files)), plan_rank_(std::move(plan_rank)) {
  rank_of_.reserve(files_.size());
  for (size_t i = 0; i < files_.size(); ++i) {
    if (ranks_.empty() || ranks_.back()->rank != files_[i].rank) {
      auto r = std::make_unique<Rank>();
      r->rank = files_[i].rank;
      r->first = i;
      ranks_.push_back(std::move(r));
    }
    ++ranks_.back()->count;
    rank_of_.push_back(ranks_.size() - 1);
  }
}

LazyRanks::~LazyRanks() = default;

std::pair<const Tree*, uint64_t> LazyRanks::planned(size_t i) const {
  if (i >= files_.size()) return {nullptr, 0};
  const Rank& r = *ranks_[rank_of_[i]];
  const Tree* tree = r.tree.load(std::memory_order_acquire);
  return tree ? std::pair{tree, r.local[i - r.first]} : std::pair<const Tree*, uint64_t>{};
}

size_t LazyRanks::planned_ranks() const {
  size_t n = 0;
  for (const auto& r : ranks_) n += r->tree.load(std::memory_order_acquire) != nullptr ? 1 : 0;
  return n;
}

std::pair<const Tree*, uint64_t> LazyRanks::resolve(size_t i) {
  if (auto found = planned(i); found.first || i >= files_.size()) return found;
  Rank& r = *ranks_[rank_of_[i]];
  if (r.failed.load()) return {nullptr, 0};
  std::lock_guard lock(r.mu);
  if (auto found = planned(i); found.first || r.failed.load()) return found;
  const auto start = std::chrono::steady_clock::now();
  try {
    auto tree = std::make_unique<Tree>(plan_rank_(r.rank));
    std::vector<uint64_t> local;
    const uint64_t dir = tree->lookup(Tree::kRootIno, fmt::format("rank_{}", r.rank));
    for (size_t f = r.first; f < r.first + r.count; ++f) {
      const File& listed = files_[f];
      const uint64_t ino = dir == 0 ? 0 : tree->lookup(dir, listed.name);
      const plan::VirtualFile* file = ino == 0 ? nullptr : tree->file(ino);
      if (file == nullptr) fail("its plan has no file {}, which the index lists", listed.name);
      if (file->size() != listed.size)
        fail("{} is planned at {} bytes, the index lists {}; rebuild the index", listed.name,
             file->size(), listed.size);
      local.push_back(ino);
    }
    spdlog::info("rank {}: planned on first open: {} files from {} sources in {:.3f} s", r.rank,
                 r.count, tree->plan().sources.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    r.local = std::move(local);
    r.owned = std::move(tree);
    r.tree.store(r.owned.get(), std::memory_order_release);
  } catch (const std::exception& e) {
    spdlog::error("rank {}: cannot be planned: {}; its files fail with EIO", r.rank, e.what());
    r.failed = true;
    return {nullptr, 0};
  }
  return planned(i);
}

}  // namespace ckptfs::fs
