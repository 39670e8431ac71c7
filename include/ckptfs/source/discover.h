// Source discovery (spec §4.6): SRC_DIR/rank_<digits>/ directories, the last regular *.ckpt of
// each in plain string order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace ckptfs::source {

struct Discovery {
  std::map<int64_t, std::filesystem::path> files;  // global source rank -> chosen file
  std::vector<std::string> warnings;               // entries ignored, and why
};

// Throws Error naming SRC_DIR if it is not a readable directory, and for duplicate ranks
// ("rank_3" and "rank_03").
Discovery discover(const std::filesystem::path& src_dir);

}  // namespace ckptfs::source
