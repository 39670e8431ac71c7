// Validation follows the reference reader's order of checks, so a damaged file is described the
// way other tools would describe it, and adds what the reference leaves out (duplicate names).
#include "ckptfs/safetensors/scanner.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "ckptfs/error.h"
#include "ckptfs/safetensors/format.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/pread.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs::safetensors {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kInt4Marker = "Int4";

// A non-negative integer that fits int64_t (shapes) or uint64_t (offsets).
bool is_count(const Json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

// Parses the header text, refusing a repeated top-level name (the reference's README forbids
// them; a JSON parser would silently keep one of the copies).
Json parse_header(const std::string& text, const std::string& name) {
  std::set<std::string> keys;
  std::string duplicate;
  const Json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                               Json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !keys.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, on_event);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts from 1 within the header, which starts at file offset 8.
    fail(
        "{}: byte offset {}: safetensors header is not valid UTF-8 JSON ({}); the file is "
        "damaged or not a safetensors file",
        name, kLengthBytes + (e.byte > 0 ? e.byte - 1 : 0), json_error_text(e.what()));
  } catch (const nlohmann::json::exception& e) {
    // Valid JSON that the parser cannot hold, such as a number beyond a double's range.
    fail(
        "{}: safetensors header cannot be read ({}); the file is damaged or not a safetensors file",
        name, json_error_text(e.what()));
  }
  if (!header.is_object())
    fail("{}: byte offset 8: safetensors header is a JSON {}, not an object", name,
         header.type_name());
  if (!duplicate.empty())
    fail("{}: safetensors header names tensor {} twice", name, file_text(duplicate));
  return header;
}

std::vector<std::pair<std::string, std::string>> read_metadata(const Json& value,
                                                               const std::string& name) {
  if (!value.is_object())
    fail("{}: safetensors __metadata__ is a JSON {}, not a string-to-string map", name,
         value.type_name());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string())
      fail("{}: safetensors __metadata__ {} is a JSON {}, not a string", name, file_text(key),
           v.type_name());
    out.emplace_back(key, v.get<std::string>());
  }
  return out;
}

// `file_size` bounds the numbers an error may quote (ckptfs/util/quote.h).
Tensor read_tensor(const std::string& key, const Json& v, const std::string& name,
                   uint64_t file_size) {
  Tensor t;
  t.name = key;
  if (!v.is_object())
    fail("{}: tensor {}: entry is a JSON {}, not an object", name, file_text(key), v.type_name());
  const auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string())
    fail("{}: tensor {}: no \"dtype\" string", name, file_text(key));
  t.code = dtype->get<std::string>();
  if (!dtype_by_code(t.code))
    fail(
        "{}: tensor {}: dtype {} is not one of BOOL U8 I8 I16 U16 I32 U32 I64 U64 F16 "
        "BF16 F32 F64, the types MindSpore reads",
        name, file_text(key), file_text(t.code));
  const auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array())
    fail("{}: tensor {}: no \"shape\" array", name, file_text(key));
  for (const Json& d : *shape) {
    if (!is_count(d) ||
        (d.is_number_unsigned() &&
         d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      fail("{}: tensor {}: shape is not a list of non-negative integers", name, file_text(key));
    t.shape.push_back(d.get<int64_t>());
  }
  const auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !is_count((*offsets)[0]) || !is_count((*offsets)[1]))
    fail("{}: tensor {}: \"data_offsets\" is not two non-negative integers", name, file_text(key));
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  if (t.end < t.begin)
    fail("{}: tensor {}: data_offsets end before they begin", name, file_text(key));
  // Element count x size, refusing overflow rather than wrapping to a plausible number.
  uint64_t bytes = dtype_by_code(t.code)->size;
  for (int64_t d : t.shape) {
    const uint64_t u = static_cast<uint64_t>(d);
    if (u != 0 && bytes > std::numeric_limits<uint64_t>::max() / u)
      fail("{}: tensor {}: its shape overflows 64 bits of bytes", name, file_text(key));
    bytes *= u;
  }
  if (bytes != t.end - t.begin)
    fail("{}: tensor {}: {} shape {} is {} bytes, but data_offsets [{},{}] hold {}", name,
         file_text(key), t.code, file_shape(t.shape, file_size), file_number(bytes, file_size),
         file_number(t.begin, file_size), file_number(t.end, file_size),
         file_number(t.end - t.begin, file_size));
  return t;
}

}  // namespace

bool is_safetensors_name(std::string_view name) { return name.ends_with(".safetensors"); }

Header read_header(int fd, const std::string& name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("{}: cannot stat: {}", name, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", name);
  return read_header(read_exact_from(fd, name), static_cast<uint64_t>(st.st_size), name);
}

Header read_header(const ReadExact& read, uint64_t size, const std::string& name) {
  Header h;
  h.file_size = size;
  if (h.file_size < kLengthBytes)
    fail("{}: {} bytes, too short for a safetensors file (8-byte header length first)", name,
         h.file_size);
  std::array<uint8_t, kLengthBytes> len;
  read(0, len);
  for (size_t i = 0; i < kLengthBytes; ++i) h.header_bytes |= uint64_t{len[i]} << (8 * i);
  if (h.header_bytes > kMaxHeaderBytes)
    fail(
        "{}: byte offset 0: the safetensors header length field is over the 100 MB limit of the "
        "reference reader; the file ({} bytes) is damaged or not a safetensors file",
        name, h.file_size);
  if (h.header_bytes > h.file_size - kLengthBytes)
    fail(
        "{}: byte offset 0: the safetensors header length field is larger than the file ({} "
        "bytes): truncated, or not a safetensors file",
        name, h.file_size);

  std::string text(h.header_bytes, '\0');
  read(kLengthBytes, std::span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()), text.size()));
  const Json header = parse_header(text, name);

  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey)
      h.metadata = read_metadata(value, name);
    else
      h.tensors.push_back(read_tensor(key, value, name, h.file_size));
  }

  // The data section must be tiled exactly: no holes, no overlaps, nothing after the last
  // tensor. Empty tensors may share an offset with their neighbour.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const Tensor& a, const Tensor& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  uint64_t at = 0;
  const Tensor* prev = nullptr;
  for (const Tensor& t : h.tensors) {
    if (t.begin != at) {
      if (t.begin < at)
        fail("{}: tensor {}: data_offsets [{},{}] overlap tensor {} [{},{}]", name,
             file_text(t.name), file_number(t.begin, h.file_size), file_number(t.end, h.file_size),
             file_text(prev->name), file_number(prev->begin, h.file_size),
             file_number(prev->end, h.file_size));
      fail(
          "{}: tensor {}: data_offsets [{},{}] leave bytes [{},{}) of the data section "
          "unused",
          name, file_text(t.name), file_number(t.begin, h.file_size),
          file_number(t.end, h.file_size), file_number(at, h.file_size),
          file_number(t.begin, h.file_size));
    }
    at = t.end;
    prev = &t;
  }
  const uint64_t data_bytes = h.file_size - h.data_start();
  if (at != data_bytes)
    fail(
        "{}: the tensors cover {} bytes of a {}-byte data section (byte offset {}); the file is "
        "{}",
        name, file_number(at, h.file_size), data_bytes, h.data_start(),
        at > data_bytes ? "truncated"
                        : "longer than its "
                          "header says");

  for (const auto& [key, value] : h.metadata) {
    if (value != kInt4Marker) continue;
    // Not captured by reference: clang 14 (the fuzz build) cannot capture a structured binding.
    auto it = std::find_if(h.tensors.begin(), h.tensors.end(),
                           [&marked = key](const Tensor& t) { return t.name == marked; });
    if (it == h.tensors.end())
      fail("{}: __metadata__ marks {} as Int4, but the file has no tensor of that name", name,
           file_text(key));
    it->int4 = true;
  }
  return h;
}

ckpt::FileScan scan_safetensors_fd(int fd, const std::string& display_name) {
  Header h = read_header(fd, display_name);
  ckpt::FileScan scan;
  scan.format = ckpt::SourceFormat::Safetensors;
  scan.file_size = scan.body_size = h.file_size;
  scan.params.reserve(h.tensors.size());
  for (Tensor& t : h.tensors) {
    ckpt::Param& p = scan.params.emplace_back();
    const Dtype d = *dtype_by_code(t.code);
    p.name = std::move(t.name);
    p.shape = std::move(t.shape);
    p.dtype = d.mindspore;
    if (t.int4) {
      // Packed 4-bit values have no element grid to cut: copied whole, as the type they are
      // stored as (MindSpore's transform, loading with safetensors' load_file, drops the
      // marker too).
      p.kind = ckpt::EntryKind::Opaque;
    } else {
      p.element_size = d.size;
    }
    p.content.push_back({h.data_start() + t.begin, t.end - t.begin});
  }
  return scan;
}

ckpt::FileScan scan_safetensors(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) fail("{}: cannot open: {}", path, std::strerror(errno));
  return scan_safetensors_fd(fd.get(), path);
}

}  // namespace ckptfs::safetensors
