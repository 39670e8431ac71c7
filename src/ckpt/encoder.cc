#include "ckptfs/ckpt/encoder.h"

#include "ckptfs/ckpt/varint.h"

namespace ckptfs::ckpt {

namespace {

// Key bytes: field number << 3 | wire type.
constexpr char kTag = 0x0A;      // Value.tag, Checkpoint.value (field 1, LEN)
constexpr char kTensor = 0x12;   // Value.tensor, TensorProto.tensor_type (field 2, LEN)
constexpr char kDims = 0x08;     // TensorProto.dims (field 1, varint)
constexpr char kContent = 0x1A;  // TensorProto.tensor_content (field 3, LEN)

uint64_t length_delimited_size(uint64_t payload) { return 1 + varint_size(payload) + payload; }

// The TensorProto's and the Value's payload sizes (the content included).
struct Sizes {
  uint64_t tensor = 0, value = 0;
};
Sizes payload_sizes(std::string_view tag, std::span<const int64_t> dims,
                    std::string_view tensor_type, uint64_t content_length) {
  uint64_t tensor_size =
      length_delimited_size(tensor_type.size()) + length_delimited_size(content_length);
  for (int64_t dim : dims) tensor_size += 1 + varint_size(static_cast<uint64_t>(dim));
  return {tensor_size, length_delimited_size(tag.size()) + length_delimited_size(tensor_size)};
}

}  // namespace

uint64_t record_header_size(std::string_view tag, std::span<const int64_t> dims,
                            std::string_view tensor_type, uint64_t content_length) {
  // The whole record (key, length, Value) less the content that follows the header.
  const uint64_t value_size = payload_sizes(tag, dims, tensor_type, content_length).value;
  return 1 + varint_size(value_size) + value_size - content_length;
}

std::string record_header(std::string_view tag, std::span<const int64_t> dims,
                          std::string_view tensor_type, uint64_t content_length) {
  const auto [tensor_size, value_size] = payload_sizes(tag, dims, tensor_type, content_length);

  std::string out;
  out.reserve(32 + tag.size() + tensor_type.size() + 11 * dims.size());
  out.push_back(kTag);
  put_varint(out, value_size);
  out.push_back(kTag);
  put_varint(out, tag.size());
  out.append(tag);
  out.push_back(kTensor);
  put_varint(out, tensor_size);
  for (int64_t dim : dims) {
    out.push_back(kDims);
    put_varint(out, static_cast<uint64_t>(dim));
  }
  out.push_back(kTensor);
  put_varint(out, tensor_type.size());
  out.append(tensor_type);
  out.push_back(kContent);
  put_varint(out, content_length);
  return out;
}

std::optional<RecordHeader> parse_record_header(std::span<const uint8_t> bytes) {
  size_t at = 0;
  const auto varint = [&]() -> std::optional<uint64_t> {
    size_t used = 0;
    const std::optional<uint64_t> v = get_varint(bytes.subspan(at), used);
    if (v) at += used;
    return v;
  };
  const auto key = [&](char expected) {
    if (at >= bytes.size() || bytes[at] != static_cast<uint8_t>(expected)) return false;
    ++at;
    return true;
  };
  // A length-delimited field's payload as text, if all of it is there.
  const auto text = [&]() -> std::optional<std::string_view> {
    const std::optional<uint64_t> n = varint();
    if (!n || *n > bytes.size() - at) return std::nullopt;
    std::string_view out(reinterpret_cast<const char*>(bytes.data() + at), static_cast<size_t>(*n));
    at += static_cast<size_t>(*n);
    return out;
  };
  RecordHeader h;
  if (!key(kTag) || !varint() || !key(kTag)) return std::nullopt;
  const std::optional<std::string_view> tag = text();
  if (!tag || !key(kTensor) || !varint()) return std::nullopt;
  h.tag = *tag;
  while (key(kDims)) {
    const std::optional<uint64_t> dim = varint();
    if (!dim) return std::nullopt;
    h.dims.push_back(static_cast<int64_t>(*dim));
  }
  if (!key(kTensor)) return std::nullopt;
  const std::optional<std::string_view> type = text();
  if (!type || !key(kContent)) return std::nullopt;
  h.tensor_type = *type;
  const std::optional<uint64_t> content = varint();
  if (!content) return std::nullopt;
  h.content_length = *content;
  h.size = at;
  return h;
}

}  // namespace ckptfs::ckpt
