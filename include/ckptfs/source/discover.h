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

// Rank directories are the entries named "rank_" followed by decimal digits (leading zeros
// accepted: rank_03 is rank 3) that are directories, symlinks followed. In each, the candidates
// are the non-hidden names ending in ".ckpt" that are regular files, symlinks followed; the
// last full path in byte order is chosen (net-9_1.ckpt beats net-10_1.ckpt). Every other entry
// of SRC_DIR, every rank directory without a candidate and every other file in a rank directory
// is reported in `warnings`. The returned paths are SRC_DIR joined with the entry names, not
// resolved. No rank at all is not an error here.
//
// Throws Error naming the directory if SRC_DIR or a rank directory is not a readable directory,
// and naming both entries when two rank directories give the same rank and both hold a
// candidate ("rank_3" and "rank_03": MindSpore's choice would depend on listing order).
Discovery discover(const std::filesystem::path& src_dir);

}  // namespace ckptfs::source
