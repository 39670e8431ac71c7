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

}  // namespace

std::string record_header(std::string_view tag, std::span<const int64_t> dims,
                          std::string_view tensor_type, uint64_t content_length) {
  uint64_t tensor_size =
      length_delimited_size(tensor_type.size()) + length_delimited_size(content_length);
  for (int64_t dim : dims) tensor_size += 1 + varint_size(static_cast<uint64_t>(dim));
  const uint64_t value_size =
      length_delimited_size(tag.size()) + length_delimited_size(tensor_size);

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

}  // namespace ckptfs::ckpt
