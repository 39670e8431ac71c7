// The zip container of a torch.save file (spec §2.2): the record table from the central
// directory, each record's data offset from its own local header. Only stored records are
// accepted; no record byte is read here, and CRCs are reported, never checked (torch does not).
// Stateless functions; safe to call from several threads on different (or the same) fds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::torchzip {

struct ZipRecord {
  std::string name;  // without the archive's top folder: "data.pkl", "data/0", "version"
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;  // absolute file offset of the first data byte
  uint64_t size = 0;
  uint32_t crc32 = 0;  // as recorded in the central directory (0: not recorded)
};

struct ZipArchive {
  uint64_t file_size = 0;
  std::string folder;              // the top folder every record lives under
  std::vector<ZipRecord> records;  // central-directory order

  const ZipRecord* find(std::string_view name) const;  // null if absent
};

// Limits of spec §2.7.
inline constexpr uint64_t kMaxRecords = 1'000'000;
inline constexpr uint64_t kMaxNameLength = 4096;

// Reads the central directory of the open file `fd`. Throws Error naming `display_name` (and
// the byte offset where it applies) for: another container (legacy pickle stream, tar,
// "PYTORCH1", anything not a zip, each with its own message), a truncated or inconsistent
// directory, a compressed record, a record outside the file or overlapping another, names
// outside one top folder, two records of one name, and limits exceeded. Reads O(records) bytes.
ZipArchive read_zip(int fd, const std::string& display_name);
// The same for an archive embedded in a larger file (a DCP .distcp item): its `size` bytes start
// at file offset `base`, and its own offsets count from there. ZipArchive::file_size is `size`;
// record offsets are absolute file offsets, and so are the offsets messages give.
ZipArchive read_zip_at(int fd, const std::string& display_name, uint64_t base, uint64_t size);

}  // namespace ckptfs::torchzip
