#include "ckptfs/safetensors/format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <iterator>
#include <numeric>
#include <utility>

#include "ckptfs/scan/dtype.h"

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
  return {code, mindspore, scan::element_size(mindspore), static_cast<int>(rank)};
}

int rank_of(std::string_view code) {
  for (size_t i = 0; i < kCodes.size(); ++i)
    if (kCodes[i].first == code) return static_cast<int>(i);
  return -1;
}

// writer_before, on ranks already looked up.
bool before(int rank_a, std::string_view name_a, int rank_b, std::string_view name_b) {
  if (rank_a != rank_b) return rank_a > rank_b;
  return name_a < name_b;  // compares bytes as unsigned char (char_traits<char>)
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
  return before(rank_of(a.code), a.name, rank_of(b.code), b.name);
}

std::vector<size_t> sort_like_writer(std::vector<HeaderEntry>& entries) {
  // Each entry's dtype looked up once: a target file of 100,000 tensors is sorted on every plan.
  std::vector<int> ranks(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) ranks[i] = rank_of(entries[i].code);
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return before(ranks[a], entries[a].name, ranks[b], entries[b].name);
  });
  // Entry j becomes entry order[j], following each cycle of the permutation: a sorted copy would
  // hold every entry twice.
  std::vector<bool> placed(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (placed[i]) continue;
    HeaderEntry first = std::move(entries[i]);
    for (size_t j = i;;) {
      placed[j] = true;
      const size_t from = order[j];
      if (from == i) {
        entries[j] = std::move(first);
        break;
      }
      entries[j] = std::move(entries[from]);
      j = from;
    }
  }
  return order;
}

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  // Names rarely need escaping: the run before the first character that does goes in at once.
  const auto plain = std::find_if(text.begin(), text.end(), [](char c) {
    return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
  });
  out.append(text.begin(), plain);
  text.remove_prefix(static_cast<size_t>(plain - text.begin()));
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

namespace {

template <typename Int>
void append_decimal(std::string& out, Int value) {
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), value);
  out.append(digits, end);
}

size_t decimal_digits(uint64_t n) {
  size_t digits = 1;
  for (; n >= 10; n /= 10) ++digits;
  return digits;
}

// What encode_header writes when no name needs escaping (then a little more).
size_t encoded_size_estimate(std::span<const HeaderEntry> entries,
                             std::span<const std::pair<std::string, std::string>> metadata) {
  size_t size = kLengthBytes + 8 + kMetadataKey.size() + 8;
  for (const auto& [key, value] : metadata) size += key.size() + value.size() + 6;
  uint64_t total = 0;
  for (const HeaderEntry& e : entries) total += e.nbytes;
  const size_t offset_digits = decimal_digits(total);
  // ,"<name>":{"dtype":"<code>","shape":[<dims>],"data_offsets":[<begin>,<end>]}
  for (const HeaderEntry& e : entries) {
    size += e.name.size() + e.code.size() + 47 + 2 * offset_digits;
    for (int64_t d : e.shape) size += decimal_digits(static_cast<uint64_t>(d)) + 1;
  }
  return size;
}

}  // namespace

std::string encode_header(std::span<const HeaderEntry> entries,
                          std::span<const std::pair<std::string, std::string>> metadata) {
  // One buffer, the length prefix first and filled in last: a header of millions of entries is
  // hundreds of megabytes, and neither a second copy nor a doubling's slack should add to that.
  std::string out(kLengthBytes, '\0');
  out.reserve(encoded_size_estimate(entries, metadata));
  out += '{';
  if (!metadata.empty()) {
    append_json_string(out, kMetadataKey);
    out += ":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i > 0) out += ',';
      append_json_string(out, metadata[i].first);
      out += ':';
      append_json_string(out, metadata[i].second);
    }
    out += '}';
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const HeaderEntry& e = entries[i];
    if (i > 0 || !metadata.empty()) out += ',';
    append_json_string(out, e.name);
    // Appended piece by piece: a formatting call per entry costs as much as the rest of a plan.
    out += ":{\"dtype\":\"";
    out += e.code;
    out += "\",\"shape\":[";
    for (size_t d = 0; d < e.shape.size(); ++d) {
      if (d > 0) out += ',';
      append_decimal(out, e.shape[d]);
    }
    out += "],\"data_offsets\":[";
    append_decimal(out, offset);
    out += ',';
    append_decimal(out, offset + e.nbytes);
    out += "]}";
    offset += e.nbytes;
  }
  out += '}';
  out.append((8 - out.size() % 8) % 8, ' ');

  const uint64_t n = out.size() - kLengthBytes;
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

}  // namespace ckptfs::safetensors
