// The registry: every source family, in detection order (view/families.h).
#include "ckptfs/view/families.h"

#include <algorithm>
#include <vector>

#include "ckptfs/dcp/family.h"
#include "ckptfs/family/unified.h"
#include "ckptfs/hfai/view.h"
#include "ckptfs/index/readers.h"
#include "ckptfs/megatron/family.h"
#include "ckptfs/mindformers/family.h"

namespace ckptfs::view {

namespace {

std::optional<std::filesystem::path> any_directory(const std::filesystem::path& dir,
                                                   const std::string&) {
  return dir;
}

// MindSpore's rank directories (rank_<N>/ of .ckpt or of .safetensors files, a MindFormers
// output/ directory's too): one entry for both formats, since one listing finds either and the
// planner refuses a mix. Last: it takes every directory the others decline, and its listing
// names what is wrong with one that holds no checkpoint.
const family::Family kRankDirs{
    "mindspore-rank-dirs", any_directory, index::mindspore_readers, nullptr, nullptr, nullptr};

const family::Family* const kFamilies[] = {
    &megatron::kFamily,    &dcp::kFamily,     &hfai::kFamily,
    &mindformers::kFamily, &family::kUnified, &kRankDirs,
};

}  // namespace

std::span<const family::Family* const> families() { return kFamilies; }

Detected detect(const std::filesystem::path& dir, const std::string& step) {
  for (const family::Family* f : kFamilies)
    if (std::optional<std::filesystem::path> found = f->detect(dir, step))
      return {f, std::move(*found)};
  return {&kRankDirs, dir};  // not reached: the last entry takes every directory
}

bool is_rank_dirs(const family::Family& f) { return f.plan == nullptr; }

const scan::FileReader& reader_for_file(int fd, const std::string& name) {
  std::vector<const scan::FileReader*> all;
  for (const family::Family* f : kFamilies)
    for (const scan::FileReader* r : f->readers())
      if (std::find(all.begin(), all.end(), r) == all.end()) all.push_back(r);
  return scan::pick_reader(all, fd, name);
}

}  // namespace ckptfs::view
