// One file format's reader as the rest of the program sees it: whether it takes a file (told by
// its name and first bytes) and its scan into the common types. Readers are values
// (ckpt::kReader, safetensors::kReader, torchzip::kReader, and a new family's own); a source
// family lists the readers its files need, in the order they are asked, and the index scans
// with the list it is given. So "which format is this file" is decided by one function,
// pick_reader, over one list.
// Thread-safety: readers are immutable constants and their functions keep no state; safe from
// any thread.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "ckptfs/scan/file_scan.h"

namespace ckptfs::scan {

struct ReadOptions {
  bool verify_crc = false;  // readers of formats with a checksum read the whole file to check it
};

struct FileReader {
  SourceFormat format;
  // Whether this reader takes the file `name` whose first bytes are `head` (kHeadBytes, fewer
  // for a shorter file). The last reader of a list may take every file (the fallback).
  bool (*claims)(std::string_view name, std::string_view head);
  // The scan of the open file `fd` (named `name` in messages). Throws Error naming the file and
  // the offset of the problem; reads headers only unless `options` ask for more.
  FileScan (*scan)(int fd, const std::string& name, const ReadOptions& options);
};

// The readers one family's files may need, first claim wins.
using Readers = std::span<const FileReader* const>;

inline constexpr size_t kHeadBytes = 4;

// The first of `readers` that claims the open file `fd` named `name` (its first kHeadBytes are
// read with pread). Throws Error naming the file when none does.
const FileReader& pick_reader(Readers readers, int fd, const std::string& name);

}  // namespace ckptfs::scan
