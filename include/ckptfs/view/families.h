// The registry of source families (family/family.h): the one table that says which family a
// source directory is and which reader a file needs. Entries are asked in order and the first
// whose detect answers owns the directory; the rank-directory family is last and takes every
// directory the others decline (its listing then names what is wrong with it).
// Thread-safety: the table is an immutable constant built before main; the functions keep no
// state and are safe from any thread.
#pragma once

#include <filesystem>
#include <span>
#include <string>

#include "ckptfs/family/family.h"

namespace ckptfs::view {

// Every family, in detection order.
std::span<const family::Family* const> families();

// The family whose checkpoint `dir` is (with --step's text), and the directory its view reads.
// Throws Error (from that family's detect) for a directory recognisably its but unusable.
struct Detected {
  const family::Family* family = nullptr;
  std::filesystem::path found;
};
Detected detect(const std::filesystem::path& dir, const std::string& step);

// True for the families whose views are rank_<N>/ directories (steps, lazy ranks, summaries).
bool is_rank_dirs(const family::Family& f);

// The reader of a single file given alone (`ckptfs inspect`): the first reader of any family,
// in registry order, that claims it.
const scan::FileReader& reader_for_file(int fd, const std::string& name);

}  // namespace ckptfs::view
