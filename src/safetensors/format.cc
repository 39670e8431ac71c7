#include "ckptfs/safetensors/format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <utility>

#include "ckptfs/ckpt/dtype.h"

namespace ckptfs::safetensors {

namespace {

// The writer's Dtype enum order, which is each code's rank; only the relative order matters, and
// it is the same for these 13 codes in every writer version since 0.3 (spec §4.3). Sizes are
// MindSpore's for the same type.
constexpr std::array<std::pair<std::string_view, std::string_view>, 13> kCodes{
    {{"BOOL", "Bool"},
     {"U8", "UInt8"},
     {"I8", "Int8"},
     {"I16", "Int16"},
     {"U16", "UInt16"},
     {"F16", "Float16"},
     {"BF16", "BFloat16"},
     {"I32", "Int32"},
     {"U32", "UInt32"},
     {"F32", "Float32"},
     {"F64", "Float64"},
     {"I64", "Int64"},
     {"U64", "UInt64"}}};

Dtype dtype_at(size_t rank) {
  const auto& [code, mindspore] = kCodes[rank];
  return {code, mindspore, ckpt::element_size(mindspore), static_cast<int>(rank)};
}

int rank_of(std::string_view code) {
  const std::optional<Dtype> d = dtype_by_code(code);
  return d ? d->rank : -1;
}

}  // namespace

std::optional<Dtype> dtype_by_code(std::string_view code) {
  for (size_t i = 0; i < kCodes.size(); ++i)
    if (kCodes[i].first == code) return dtype_at(i);
  return std::nullopt;
}

std::optional<Dtype> dtype_by_mindspore(std::string_view tensor_type) {
  for (size_t i = 0; i < kCodes.size(); ++i)
    if (kCodes[i].second == tensor_type) return dtype_at(i);
  return std::nullopt;
}

bool writer_before(const HeaderEntry& a, const HeaderEntry& b) {
  const int ra = rank_of(a.code), rb = rank_of(b.code);
  if (ra != rb) return ra > rb;
  return a.name < b.name;  // std::string compares bytes as unsigned char
}

void sort_like_writer(std::vector<HeaderEntry>& entries) {
  std::sort(entries.begin(), entries.end(), writer_before);
}

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        else
          out += c;
    }
  }
  out += '"';
}

std::string encode_header(std::span<const HeaderEntry> entries,
                          std::span<const std::pair<std::string, std::string>> metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    append_json_string(json, kMetadataKey);
    json += ":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i > 0) json += ',';
      append_json_string(json, metadata[i].first);
      json += ':';
      append_json_string(json, metadata[i].second);
    }
    json += '}';
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const HeaderEntry& e = entries[i];
    if (i > 0 || !metadata.empty()) json += ',';
    append_json_string(json, e.name);
    json += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", e.code,
                        fmt::join(e.shape, ","), offset, offset + e.nbytes);
    offset += e.nbytes;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');

  std::string out(kLengthBytes, '\0');
  const uint64_t n = json.size();
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + json;
}

}  // namespace ckptfs::safetensors
