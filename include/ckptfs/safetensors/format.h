// The safetensors file format (spec torch-hfai-safetensors.md §4): the dtype codes, and the exact
// header bytes the reference writer (Hugging Face safetensors >= 0.4) produces, so that a view
// can be byte-identical to what a framework would save. Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckptfs::safetensors {

// A file is the 8-byte little-endian header length, the JSON header, then the data section.
inline constexpr uint64_t kLengthBytes = 8;
// The header key of the metadata map; no tensor may have this name.
inline constexpr std::string_view kMetadataKey = "__metadata__";
// The reference reader refuses longer headers ("header too large"), and so do we.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct Dtype {
  std::string_view code;       // "F32", as in the header
  std::string_view mindspore;  // the MindSpore tensor_type of the same bytes ("Float32")
  uint32_t size = 0;           // bytes per element
  int rank = 0;                // position in the writer's Dtype enum: larger is written first
};

// The 13 codes MindSpore reads and writes (BOOL U8 I8 I16 U16 I32 U32 I64 U64 F16 BF16 F32
// F64); nullopt for any other code or type name.
std::optional<Dtype> dtype_by_code(std::string_view code);
std::optional<Dtype> dtype_by_mindspore(std::string_view tensor_type);

// One tensor as a header lists it. Offsets follow from the order of the list. The name is viewed:
// it must outlive the entry (headers of millions of tensors are built at mount).
struct HeaderEntry {
  std::string_view name;
  std::string_view code;  // a Dtype::code
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

// The reference writer's order: dtype descending (enum order), then name byte-wise. Data is
// laid out in this order, so it is also offset order.
bool writer_before(const HeaderEntry& a, const HeaderEntry& b);
// Sorts `entries` into that order in place and returns where each came from: entry i of the
// result was entry order[i] before.
std::vector<size_t> sort_like_writer(std::vector<HeaderEntry>& entries);

// The first bytes of the file: the length, then the compact JSON header as serde_json writes it
// ({"__metadata__":{...}} first when `metadata` is not empty, keys in the order given, then the
// entries in the order given with consecutive data_offsets from 0, fields dtype, shape,
// data_offsets), padded with spaces to a multiple of 8. The data section follows directly.
// Metadata with one key ({"format":"ms"} for MindSpore, {"format":"pt"} for PyTorch) is what
// makes the output deterministic; callers with several keys should sort them.
std::string encode_header(std::span<const HeaderEntry> entries,
                          std::span<const std::pair<std::string, std::string>> metadata);

// `text` as a JSON string literal the way serde_json writes it: quotes, backslash and control
// characters escaped (\b \t \n \f \r, else \u00xx in lowercase hex), everything else raw.
void append_json_string(std::string& out, std::string_view text);

}  // namespace ckptfs::safetensors
