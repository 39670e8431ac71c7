// Exact bytes of output records (spec §1.3, §1.10): fields in ascending order, dims unpacked,
// ≥2.3 conventions. A record's tensor_content is its last field, so an output record is
// header bytes followed directly by content bytes, and file sizes follow from metadata alone.
// Thread-safe: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ckptfs::ckpt {

// Content above this many bytes is cut into consecutive records of exactly this size (≥2.3).
inline constexpr uint64_t kRecordChunkBytes = 536870912;

// Bytes of one record before its content: 0A len | 0A taglen tag | 12 len | (08 dim)* |
// 12 typelen type | 1A content_len.
std::string record_header(std::string_view tag, std::span<const int64_t> dims,
                          std::string_view tensor_type, uint64_t content_length);

}  // namespace ckptfs::ckpt
