#include "ckptfs/index/structure.h"

#include <algorithm>
#include <span>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::index {

namespace {

// Structure bytes closer together than this are read in one pread, content included: a file of
// many small tensors costs a few large reads, not one per record.
constexpr uint64_t kReadThrough = uint64_t{64} << 10;
constexpr size_t kBufferBytes = size_t{1} << 20;

}  // namespace

std::vector<scan::Extent> structure_extents(const scan::FileScan& scan) {
  std::vector<scan::Extent> content;
  for (const scan::Param& p : scan.params)
    for (const scan::Extent& e : p.content)
      if (e.length > 0) content.push_back(e);
  std::sort(content.begin(), content.end(),
            [](const scan::Extent& a, const scan::Extent& b) { return a.offset < b.offset; });
  std::vector<scan::Extent> out;
  uint64_t at = 0;  // everything before `at` is content or already emitted
  for (const scan::Extent& e : content) {
    const uint64_t begin = std::min(e.offset, scan.file_size);
    const uint64_t end =
        std::min(begin + std::min(e.length, scan.file_size - begin), scan.file_size);
    if (begin > at) out.push_back({at, begin - at});
    at = std::max(at, end);
  }
  if (at < scan.file_size) out.push_back({at, scan.file_size - at});
  return out;
}

StructureDigest structure_digest(int fd, const std::string& name, const scan::FileScan& scan) {
  const std::vector<scan::Extent> parts = structure_extents(scan);
  StructureDigest digest;
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < parts.size();) {
    // One read: parts[i..j) and the content between them, at most kBufferBytes (a single part
    // longer than that is read in pieces).
    const uint64_t begin = parts[i].offset;
    size_t j = i + 1;
    while (j < parts.size() &&
           parts[j].offset - (parts[j - 1].offset + parts[j - 1].length) <= kReadThrough &&
           parts[j].offset + parts[j].length - begin <= kBufferBytes)
      ++j;
    const uint64_t end = parts[j - 1].offset + parts[j - 1].length;
    if (end - begin > kBufferBytes) {  // one long part
      for (uint64_t at = begin; at < end;) {
        const uint64_t n = std::min<uint64_t>(kBufferBytes, end - at);
        buffer.resize(n);
        pread_exact(fd, name, at, buffer);
        digest.crc = ckpt::crc32_update(digest.crc, buffer);
        at += n;
      }
    } else {
      buffer.resize(end - begin);
      pread_exact(fd, name, begin, buffer);
      for (size_t k = i; k < j; ++k)
        digest.crc = ckpt::crc32_update(
            digest.crc, std::span(buffer).subspan(parts[k].offset - begin, parts[k].length));
    }
    for (size_t k = i; k < j; ++k) digest.bytes += parts[k].length;
    i = j;
  }
  return digest;
}

}  // namespace ckptfs::index
