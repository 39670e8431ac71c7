// Exact bytes of output records (spec §1.3, §1.10): fields in ascending order, dims unpacked,
// ≥2.3 conventions. A record's tensor_content is its last field, so an output record is
// header bytes followed directly by content bytes, and file sizes follow from metadata alone.
// Thread-safe: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::ckpt {

// Content above this many bytes is cut into consecutive records of exactly this size (≥2.3).
inline constexpr uint64_t kRecordChunkBytes = 536870912;

// Bytes of one record before its content: 0A len | 0A taglen tag | 12 len | (08 dim)* |
// 12 typelen type | 1A content_len.
std::string record_header(std::string_view tag, std::span<const int64_t> dims,
                          std::string_view tensor_type, uint64_t content_length);
// record_header(...).size(), without writing it (a file's size from metadata alone).
uint64_t record_header_size(std::string_view tag, std::span<const int64_t> dims,
                            std::string_view tensor_type, uint64_t content_length);

// A header record_header wrote, read back from the start of `bytes`: its fields and how many
// bytes it takes. nullopt unless `bytes` start with a whole header of exactly that form (bytes
// that end early give nullopt too: ask again with more).
struct RecordHeader {
  std::string_view tag;
  std::vector<int64_t> dims;
  std::string_view tensor_type;
  uint64_t content_length = 0;
  size_t size = 0;  // header bytes
};
std::optional<RecordHeader> parse_record_header(std::span<const uint8_t> bytes);

}  // namespace ckptfs::ckpt
