// What a source file's scan was read from: every byte outside its tensor contents (record
// headers, a safetensors header, a torch zip's directory and pickle, a CRC trailer, padding).
// An index entry stores a digest of those bytes, so that a scan taken from a shipped index,
// which can only compare size and mtime, is checked against the file's structure itself: a
// rewrite in place that keeps the size and puts the mtime back (two same-shaped tensors' names
// swapped) shows, however the file's timestamps look.
//
// The digest is also kept region by region, so that a file whose content bytes are all placed by
// structure bytes before them (parsed_from_start) can be checked a prefix at a time: over an S3
// filesystem comparing a whole file's structure before its first byte is served fetches much
// of it first (deferred_check.h).
//
// Thread-safe: plain functions of their arguments (the descriptor is read with pread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/scan/file_scan.h"

namespace ckptfs::index {

struct StructureDigest {
  uint64_t bytes = 0;  // how many bytes lie outside the tensor contents
  uint32_t crc = 0;    // CRC-32 of those bytes, in file order
  // regions[i]: CRC-32 of those of them in file bytes [i * region, (i + 1) * region).
  // Empty in an entry written before they were kept (the file is then checked whole).
  uint64_t region = 0;
  std::vector<uint32_t> regions;
  bool operator==(const StructureDigest&) const = default;
};

// Whether `found` (structure_digest of a file) is the structure `want` was taken from. Only the
// whole-file CRC counts: an entry written before regions were kept has none.
inline bool same_structure(const StructureDigest& found, const StructureDigest& want) {
  return found.bytes == want.bytes && found.crc == want.crc;
}

// The region size for a file of `file_size` bytes: a power of two of at least 1 MiB, small
// enough that a read waits for little more than its own bytes, and at most kMaxRegions regions a
// file so that an entry, and the check a mount holds for each source, stays small (an entry with
// more reads as damaged).
inline constexpr size_t kMaxRegions = 256;
uint64_t region_size(uint64_t file_size);

// Whether every content byte of the file is placed by structure bytes before it, so that
// structure bytes matching the index up to an offset place every content byte before it where
// the scan says: a safetensors file, whose header comes first and says where every tensor lies.
// Not a `.ckpt`: a record's tag may follow its tensor (protobuf fields come in any order), and
// a later record of an earlier record's name is the one MindSpore loads, so a rewrite past an
// offset can move the bytes of a name before it. Nor a torch zip (read from its directory at
// the end) or a DCP file (through its .metadata). Those are checked whole. An encrypted file's
// structure is plaintext: never digested.
bool parsed_from_start(const scan::FileScan& scan);

// The byte ranges of a file of scan.file_size bytes outside every parameter's content extents
// (overlapping or shared extents, as views of one storage have, merged), ascending.
std::vector<scan::Extent> structure_extents(const scan::FileScan& scan);

// The digest of the bytes structure_extents(scan) names, read from `fd`, with its regions.
// Throws Error naming `name` if they cannot be read (the file is shorter than the scan says).
StructureDigest structure_digest(int fd, const std::string& name, const scan::FileScan& scan);

// CRC-32 of the bytes of `parts` (structure_extents) that lie in [begin, end), read from `fd`:
// one region's entry of StructureDigest::regions. Throws as structure_digest.
uint32_t structure_crc(int fd, const std::string& name, std::span<const scan::Extent> parts,
                       uint64_t begin, uint64_t end);

}  // namespace ckptfs::index
