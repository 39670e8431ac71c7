// Target ranks listed before they are planned (a shipped index's target summaries): the mount
// shows each rank's files with their exact sizes at once, and plans a rank, as a Tree of its own
// holding just that rank's files and sources, when one of its files is first opened. Memory and
// work then follow the ranks a node opens, not the checkpoint.
//
// Thread-safe: a rank is planned once, by the first caller (others asking for the same rank wait
// for it); a planned rank's Tree lives as long as this object, so pointers into it stay valid.
// Each rank's lock is held while it is planned (which takes the index's locks, never a read
// path lock); no two ranks' locks are held together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/plan/planner.h"

namespace ckptfs::fs {

class Tree;

class LazyRanks {
 public:
  struct File {
    int64_t rank = 0;
    std::string name;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    bool page_cache = false;
    // The source files its owner, group and read bits derive from (fs::Tree), as an eagerly
    // planned file's do: those whose bytes it reads, or, if it reads none, all its view's.
    std::vector<std::string> sources;
  };
  // Plans the files of one target rank; throws Error naming what is wrong.
  using PlanRank = std::function<plan::Plan(int64_t rank)>;

  // `files` grouped by rank (each rank's files together, in the planner's order).
  LazyRanks(std::vector<File> files, PlanRank plan_rank);
  ~LazyRanks();
  LazyRanks(const LazyRanks&) = delete;
  LazyRanks& operator=(const LazyRanks&) = delete;

  const std::vector<File>& files() const { return files_; }
  // The Tree serving files()[i] and that file's inode in it, planning its rank now if it was
  // not yet. {nullptr, 0} if the rank cannot be planned or its plan disagrees with the listing
  // (logged once per rank, and refused from then on).
  std::pair<const Tree*, uint64_t> resolve(size_t i);
  // The same, but never plans: {nullptr, 0} until the rank is planned.
  std::pair<const Tree*, uint64_t> planned(size_t i) const;
  // How many ranks are planned so far.
  size_t planned_ranks() const;

 private:
  struct Rank;
  std::vector<File> files_;
  std::vector<size_t> rank_of_;  // files_[i] belongs to ranks_[rank_of_[i]]
  std::vector<std::unique_ptr<Rank>> ranks_;
  PlanRank plan_rank_;
};

}  // namespace ckptfs::fs
