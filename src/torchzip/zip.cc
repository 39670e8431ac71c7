#include "ckptfs/torchzip/zip.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "ckptfs/error.h"
#include "ckptfs/util/quote.h"
#include "io.h"

namespace ckptfs::torchzip {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint64_t kEndSize = 22;
constexpr uint64_t kLocatorSize = 20;
constexpr uint64_t kZip64EndSize = 56;
constexpr uint64_t kMaxComment = 65535;
// A directory of a million records with short names is far below this; a claim above it is
// not a torch file, and reading it would cost its size in memory.
constexpr uint64_t kMaxDirectoryBytes = uint64_t{256} << 20;

// The 14 bytes a legacy (pre-1.6) torch.save stream starts with: PROTO 2 and the pickled
// magic number.
constexpr unsigned char kLegacyMagic[] = {0x80, 0x02, 0x8A, 0x0A, 0x6C, 0xFC, 0x9C,
                                          0x46, 0xF9, 0x20, 0x6A, 0xA8, 0x50, 0x19};

[[noreturn]] void refuse_other_container(int fd, const std::string& name, uint64_t base,
                                         uint64_t size) {
  std::string head(std::min<uint64_t>(size, 512), '\0');
  read_exact(fd, name, base, head.data(), head.size());
  if (head.size() >= sizeof kLegacyMagic &&
      std::memcmp(head.data(), kLegacyMagic, sizeof kLegacyMagic) == 0)
    fail(
        "{}: legacy torch.save format (PyTorch < 1.6 or _use_new_zipfile_serialization=False): "
        "re-save with a current PyTorch",
        name);
  if (head.size() >= 262 && head.compare(257, 5, "ustar") == 0)
    fail("{}: a tar archive (torch.save of 2017-era PyTorch): re-save with a current PyTorch",
         name);
  if (head.rfind("PYTORCH1", 0) == 0)
    fail("{}: a PYTORCH1 archive (preview-era PyTorch): re-save with a current PyTorch", name);
  fail("{}: byte offset {}: not a torch.save zip file (no zip local header)", name, base);
}

struct EndOfDirectory {
  uint64_t entries = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
  uint64_t end_offset = 0;  // where the classic end record starts
};

// Positions are relative to the archive's first byte, which is at `base` in the file (0 but
// for an archive embedded in a larger file); messages give file offsets.
EndOfDirectory find_end(int fd, const std::string& name, uint64_t base, uint64_t size) {
  if (size < kEndSize) fail("{}: {} bytes, too short for a zip file", name, size);
  // The end record is the last 22 bytes unless the archive has a comment (torch writes none).
  const uint64_t window = std::min(size, kEndSize + kMaxComment);
  std::string tail(window, '\0');
  read_exact(fd, name, base + size - window, tail.data(), tail.size());
  uint64_t at = window - kEndSize;
  for (;; --at) {
    if (le32(tail.data() + at) == kEndSig && at + kEndSize + le16(tail.data() + at + 20) == window)
      break;
    if (at == 0)
      fail("{}: no zip end-of-central-directory record in the last {} bytes", name, window);
  }
  const char* e = tail.data() + at;
  EndOfDirectory end;
  end.end_offset = size - window + at;
  end.entries = le16(e + 10);
  end.size = le32(e + 12);
  end.offset = le32(e + 16);
  if (end.end_offset >= kLocatorSize) {
    char loc[kLocatorSize];
    read_exact(fd, name, base + end.end_offset - kLocatorSize, loc, sizeof loc);
    if (le32(loc) == kZip64LocatorSig) {
      const uint64_t z = le64(loc + 8);
      if (z > end.end_offset - kLocatorSize || end.end_offset - kLocatorSize - z < kZip64EndSize)
        fail("{}: byte offset {}: the zip64 locator points at {}, outside the file", name,
             base + end.end_offset - kLocatorSize, file_number(z, size));
      char rec[kZip64EndSize];
      read_exact(fd, name, base + z, rec, sizeof rec);
      if (le32(rec) != kZip64EndSig)
        fail("{}: byte offset {}: no zip64 end-of-central-directory record there", name, base + z);
      end.entries = le64(rec + 32);
      end.size = le64(rec + 40);
      end.offset = le64(rec + 48);
      end.end_offset = z;
    }
  }
  if (end.entries > kMaxRecords)
    fail("{}: the zip directory claims more records than the limit of {}", name, kMaxRecords);
  if (end.offset > end.end_offset || end.size > end.end_offset - end.offset)
    fail("{}: the zip central directory ({} bytes at {}) runs past its end record at {}", name,
         file_number(end.size, size), file_number(end.offset, size), end.end_offset);
  if (end.size > kMaxDirectoryBytes)
    fail("{}: the zip central directory is {} bytes, more than the limit of {}", name,
         file_number(end.size, size), kMaxDirectoryBytes);
  return end;
}

// The zip64 extra field (id 1) supplies, in this order, each of the three values that was
// written as 0xFFFFFFFF.
void apply_zip64(const std::string& name, uint64_t at, const char* extra, uint32_t length,
                 uint64_t& usize, uint64_t& csize, uint64_t& offset) {
  for (uint32_t p = 0; p + 4 <= length;) {
    const uint16_t id = le16(extra + p);
    const uint16_t len = le16(extra + p + 2);
    if (p + 4 + len > length)
      fail("{}: byte offset {}: a zip extra field runs past its entry", name, at);
    if (id == 1) {
      const char* f = extra + p + 4;
      uint32_t q = 0;
      for (uint64_t* v : {&usize, &csize, &offset}) {
        if (*v != 0xFFFFFFFF) continue;
        if (q + 8 > len) fail("{}: byte offset {}: zip64 extra field too short", name, at);
        *v = le64(f + q);
        q += 8;
      }
      return;
    }
    p += 4 + len;
  }
}

}  // namespace

const ZipRecord* ZipArchive::find(std::string_view name) const {
  for (const ZipRecord& r : records)
    if (r.name == name) return &r;
  return nullptr;
}

ZipArchive read_zip(int fd, const std::string& name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("{}: cannot stat: {}", name, std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 4) fail("{}: {} bytes, too short for a torch.save file", name, size);
  return read_zip_at(fd, name, 0, size);
}

ZipArchive read_zip_at(int fd, const std::string& name, uint64_t base, uint64_t size) {
  ZipArchive zip;
  zip.file_size = size;
  char sig[4] = {};
  if (zip.file_size < 4)
    fail("{}: byte offset {}: {} bytes, too short for a torch.save archive", name, base,
         zip.file_size);
  read_exact(fd, name, base, sig, 4);
  if (le32(sig) != kLocalSig) refuse_other_container(fd, name, base, zip.file_size);

  const EndOfDirectory end = find_end(fd, name, base, zip.file_size);
  std::string dir(end.size, '\0');
  read_exact(fd, name, base + end.offset, dir.data(), dir.size());
  zip.records.reserve(end.entries);
  uint64_t p = 0;
  for (uint64_t i = 0; i < end.entries; ++i) {
    const uint64_t at = base + end.offset + p;
    if (dir.size() - p < 46 || le32(dir.data() + p) != kCentralSig)
      fail("{}: byte offset {}: zip central directory entry {} of {} is missing or damaged", name,
           at, i, end.entries);
    const char* e = dir.data() + p;
    const uint16_t method = le16(e + 10);
    const uint32_t crc = le32(e + 16);
    uint64_t csize = le32(e + 20), usize = le32(e + 24);
    const uint16_t name_len = le16(e + 28), extra_len = le16(e + 30), comment_len = le16(e + 32);
    uint64_t offset = le32(e + 42);
    if (dir.size() - p - 46 < uint64_t{name_len} + extra_len + comment_len)
      fail("{}: byte offset {}: zip central directory entry {} runs past the directory", name, at,
           i);
    if (name_len > kMaxNameLength)
      fail("{}: byte offset {}: a record name of {} bytes (limit {})", name, at, name_len,
           kMaxNameLength);
    std::string full(e + 46, name_len);
    apply_zip64(name, at, e + 46 + name_len, extra_len, usize, csize, offset);
    p += 46 + uint64_t{name_len} + extra_len + comment_len;

    if (i == 0) zip.folder = full.substr(0, full.find('/'));
    if (full.size() <= zip.folder.size() + 1 ||
        full.compare(0, zip.folder.size(), zip.folder) != 0 || full[zip.folder.size()] != '/')
      fail("{}: record {} is not under the archive's folder {}", name, file_text(full),
           file_text(zip.folder + "/"));
    if (method != 0)
      fail("{}: record {} is compressed; torch.save stores records uncompressed", name,
           file_text(full));
    if (csize != usize)
      fail("{}: record {}: stored sizes disagree ({} and {})", name, file_text(full),
           file_number(csize, zip.file_size), file_number(usize, zip.file_size));

    char local[30];
    if (offset > zip.file_size || zip.file_size - offset < sizeof local)
      fail("{}: record {}: its local header is outside the file ({} bytes)", name, file_text(full),
           zip.file_size);
    read_exact(fd, name, base + offset, local, sizeof local);
    if (le32(local) != kLocalSig)
      fail("{}: byte offset {}: no local header for record {}", name, base + offset,
           file_text(full));
    const uint64_t data = offset + 30 + le16(local + 26) + le16(local + 28);
    if (data > end.offset || usize > end.offset - data)
      fail("{}: record {}: {} bytes at byte offset {} run past the central directory at {}", name,
           file_text(full), file_number(usize, zip.file_size),
           file_number(base + data, base + zip.file_size), base + end.offset);
    zip.records.push_back(
        {full.substr(zip.folder.size() + 1), base + offset, base + data, usize, crc});
  }

  // Readers disagree on which of two records of one name they take (the first, the last):
  // either answer may be the wrong tensor, so the archive is refused.
  std::unordered_map<std::string_view, const ZipRecord*> by_name;
  by_name.reserve(zip.records.size());
  for (const ZipRecord& r : zip.records)
    if (const auto [it, inserted] = by_name.emplace(r.name, &r); !inserted)
      fail(
          "{}: record {} appears twice in the zip directory (local headers at byte offsets {} "
          "and {}); which one is meant is ambiguous: the file is damaged or was not written by "
          "torch.save",
          name, r.name, it->second->header_offset, r.header_offset);

  std::vector<const ZipRecord*> by_offset;
  by_offset.reserve(zip.records.size());
  for (const ZipRecord& r : zip.records) by_offset.push_back(&r);
  std::sort(by_offset.begin(), by_offset.end(), [](const ZipRecord* a, const ZipRecord* b) {
    return a->header_offset < b->header_offset;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipRecord& a = *by_offset[i - 1];
    const ZipRecord& b = *by_offset[i];
    if (a.data_offset + a.size > b.header_offset)
      fail("{}: records {} and {} overlap (byte offsets {} and {})", name, file_text(a.name),
           file_text(b.name), a.data_offset, b.header_offset);
  }
  return zip;
}

}  // namespace ckptfs::torchzip
