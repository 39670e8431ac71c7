#include "ckptfs/index/structure.h"

#include <algorithm>
#include <bit>
#include <memory>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::index {

namespace {

// Structure bytes closer together than this are read in one pread, content included: a file of
// many small tensors costs a few large reads, not one per record.
constexpr uint64_t kReadThrough = uint64_t{64} << 10;
constexpr size_t kBufferBytes = size_t{1} << 20;
constexpr uint64_t kMinRegion = uint64_t{1} << 20;

// Calls on(offset, bytes) for the bytes of `parts` in [begin, end), in file order, reading them
// from `fd` in as few preads as kReadThrough and kBufferBytes allow.
template <typename On>
void read_parts(int fd, const std::string& name, std::span<const scan::Extent> all, uint64_t begin,
                uint64_t end, On&& on) {
  // Clipped to [begin, end): the first part ending past `begin`, up to the first starting at
  // or past `end`.
  const auto first = std::partition_point(
      all.begin(), all.end(), [&](const scan::Extent& e) { return e.offset + e.length <= begin; });
  std::vector<scan::Extent> parts;
  for (auto it = first; it != all.end() && it->offset < end; ++it) {
    const uint64_t from = std::max(it->offset, begin);
    const uint64_t to = std::min(it->offset + it->length, end);
    if (to > from) parts.push_back({from, to - from});
  }
  // Not zeroed: every byte handed to `on` was just read.
  std::unique_ptr<uint8_t[]> storage;
  size_t capacity = 0;
  const auto buffer_of = [&](size_t n) {
    if (n > capacity) {
      storage = std::make_unique_for_overwrite<uint8_t[]>(n);
      capacity = n;
    }
    return std::span<uint8_t>(storage.get(), n);
  };
  for (size_t i = 0; i < parts.size();) {
    // One read: parts[i..j) and the content between them, at most kBufferBytes (a single part
    // longer than that is read in pieces).
    const uint64_t from = parts[i].offset;
    size_t j = i + 1;
    while (j < parts.size() &&
           parts[j].offset - (parts[j - 1].offset + parts[j - 1].length) <= kReadThrough &&
           parts[j].offset + parts[j].length - from <= kBufferBytes)
      ++j;
    const uint64_t to = parts[j - 1].offset + parts[j - 1].length;
    if (to - from > kBufferBytes) {  // one long part
      for (uint64_t at = from; at < to;) {
        const std::span<uint8_t> buffer = buffer_of(std::min<uint64_t>(kBufferBytes, to - at));
        pread_exact(fd, name, at, buffer);
        on(at, std::span<const uint8_t>(buffer));
        at += buffer.size();
      }
    } else {
      const std::span<uint8_t> buffer = buffer_of(to - from);
      pread_exact(fd, name, from, buffer);
      for (size_t k = i; k < j; ++k)
        on(parts[k].offset,
           std::span<const uint8_t>(buffer).subspan(parts[k].offset - from, parts[k].length));
    }
    i = j;
  }
}

}  // namespace

uint64_t region_size(uint64_t file_size) {
  const uint64_t at_least = (file_size + kMaxRegions - 1) / uint64_t{kMaxRegions};
  return std::max(kMinRegion, std::bit_ceil(at_least));
}

bool parsed_from_start(const scan::FileScan& scan) {
  return !scan.encrypted && scan.format == scan::SourceFormat::Safetensors;
}

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
  digest.region = region_size(scan.file_size);
  digest.regions.assign((scan.file_size + digest.region - 1) / digest.region, 0);
  read_parts(fd, name, parts, 0, scan.file_size,
             [&](uint64_t offset, std::span<const uint8_t> bytes) {
               digest.crc = ckpt::crc32_update(digest.crc, bytes);
               digest.bytes += bytes.size();
               // A part may run on into the next regions.
               while (!bytes.empty()) {
                 const uint64_t r = offset / digest.region;
                 const size_t n = static_cast<size_t>(
                     std::min<uint64_t>(bytes.size(), (r + 1) * digest.region - offset));
                 digest.regions[r] = ckpt::crc32_update(digest.regions[r], bytes.first(n));
                 bytes = bytes.subspan(n);
                 offset += n;
               }
             });
  return digest;
}

uint32_t structure_crc(int fd, const std::string& name, std::span<const scan::Extent> parts,
                       uint64_t begin, uint64_t end) {
  uint32_t crc = 0;
  read_parts(fd, name, parts, begin, end, [&](uint64_t, std::span<const uint8_t> bytes) {
    crc = ckpt::crc32_update(crc, bytes);
  });
  return crc;
}

}  // namespace ckptfs::index
