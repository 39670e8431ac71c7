// The mounted tree without FUSE: fixed inodes for "/", "rank_N/" and "rank_N/checkpoint_N.ckpt",
// lookups, attributes, listings, and reads mapped to runs with a check that the sources read are
// unchanged. The FUSE adapter only translates kernel requests into calls on this.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "ckptfs/plan/planner.h"

namespace ckptfs::fs {

class Tree {
 public:
  static constexpr uint64_t kRootIno = 1;

  explicit Tree(plan::Plan plan);

  // 0 if not found.
  uint64_t lookup(uint64_t parent, std::string_view name) const;
  // False if no such inode.
  bool stat(uint64_t ino, struct stat& st) const;
  struct DirEntry {
    uint64_t ino;
    std::string_view name;
    bool is_dir;
  };
  // Entries of a directory inode ("." and ".." included); empty if not a directory.
  std::vector<DirEntry> list(uint64_t ino) const;
  const plan::VirtualFile* file(uint64_t ino) const;
  const plan::Plan& plan() const { return plan_; }
  // 0, or EIO (after logging which source changed) if a source `runs` read differs from its
  // fingerprint at mount.
  int check_sources(const std::vector<plan::Run>& runs) const;

 private:
  plan::Plan plan_;
  // inode layout: 1 = root, 2 + 2i = rank dir of target i, 3 + 2i = its file
};

}  // namespace ckptfs::fs
