// What a source file's scan was read from: every byte outside its tensor contents (record
// headers, a safetensors header, a torch zip's directory and pickle, a CRC trailer, padding).
// An index entry stores a digest of those bytes, so that a scan taken from a shipped index,
// which can only compare size and mtime, is checked against the file's structure itself: a
// rewrite in place that keeps the size and puts the mtime back (two same-shaped tensors' names
// swapped) shows, however the file's timestamps look.
//
// Thread-safe: plain functions of their arguments (the descriptor is read with pread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckptfs/scan/file_scan.h"

namespace ckptfs::index {

struct StructureDigest {
  uint64_t bytes = 0;  // how many bytes lie outside the tensor contents
  uint32_t crc = 0;    // CRC-32 of those bytes, in file order
  bool operator==(const StructureDigest&) const = default;
};

// The byte ranges of a file of scan.file_size bytes outside every parameter's content extents
// (overlapping or shared extents, as views of one storage have, merged), ascending.
std::vector<scan::Extent> structure_extents(const scan::FileScan& scan);

// The digest of the bytes structure_extents(scan) names, read from `fd`. Throws Error naming
// `name` if they cannot be read (the file is shorter than the scan says).
StructureDigest structure_digest(int fd, const std::string& name, const scan::FileScan& scan);

}  // namespace ckptfs::index
