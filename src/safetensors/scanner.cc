// Validation follows the reference reader's order of checks, so a damaged file is described the
// way other tools would describe it, and adds what the reference leaves out (duplicate names).
#include "ckptfs/safetensors/scanner.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "ckptfs/error.h"
#include "ckptfs/safetensors/format.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/pread.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs::safetensors {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kInt4Marker = "Int4";

// A non-negative integer that fits int64_t (shapes) or uint64_t (offsets).
bool is_count(const Json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

// One top-level member of the header: a tensor's entry or __metadata__, with the keys of its
// value in file order when that value is an object (the tree's own keys are sorted).
struct Member {
  std::string key;
  Json value;
  std::vector<std::string> keys;
};

// Reads the header as a stream of events and hands on each top-level member as soon as it is
// complete, so no tree of the whole header is built and no ordered map (whose every insertion
// searches linearly: hours for a header near the size cap) is needed to keep the file's order.
// A key repeated within any object is refused: a JSON tree would silently keep one copy, and
// the reference reader refuses a repeated tensor field.
class HeaderEvents {
 public:
  HeaderEvents(const std::string& name, std::function<void(const Member&)> on_member)
      : name_(name), on_member_(std::move(on_member)) {}

  // The JSON type of the whole header when it is not an object ("" when it is).
  const std::string& not_object() const { return not_object_; }

  bool null() { return value(nullptr); }
  bool boolean(bool b) { return value(b); }
  bool number_integer(int64_t n) { return value(n); }
  bool number_unsigned(uint64_t n) { return value(n); }
  bool number_float(double d, const std::string& /*text*/) { return value(d); }
  bool string(std::string& s) { return value(std::move(s)); }
  bool binary(Json::binary_t& b) { return value(std::move(b)); }  // not made by the JSON parser
  bool start_object(size_t /*elements*/) { return open(Json::object()); }
  bool start_array(size_t /*elements*/) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    if (!not_object_.empty()) return true;
    if (open_.empty()) {
      if (!names_.insert(k).second)
        fail("{}: safetensors header names tensor {} twice", name_, file_text(k));
      member_.key = std::move(k);
      return true;
    }
    if (open_.size() == 1) member_.keys.push_back(k);
    auto [at, inserted] = open_.back()->get_ref<Json::object_t&>().try_emplace(k);
    if (!inserted) fail("{}: safetensors header: {} names {} twice", name_, file_text(member_.key),
           file_text(k));
    slot_ = &at->second;
    return true;
  }

  bool parse_error(size_t position, const std::string& /*token*/,
                   const nlohmann::detail::exception& e) {
    if (dynamic_cast<const nlohmann::json::parse_error*>(&e) != nullptr)
      // `position` counts from 1 within the header, which starts at file offset 8.
      fail(
          "{}: byte offset {}: safetensors header is not valid UTF-8 JSON ({}); the file is "
          "damaged or not a safetensors file",
          name_, kLengthBytes + (position > 0 ? position - 1 : 0), json_error_text(e.what()));
    // Valid JSON that cannot be held, such as a number beyond a double's range.
    fail(
        "{}: safetensors header cannot be read ({}); the file is damaged or not a safetensors "
        "file",
        name_, json_error_text(e.what()));
  }

 private:
  // A complete value where the parser is: the whole header, a member, or inside one.
  bool value(Json v) {
    if (!not_object_.empty()) return true;
    if (!in_root_) {
      not_object_ = v.type_name();
      return true;
    }
    place(std::move(v));
    if (open_.empty()) finish_member();
    return true;
  }
  bool open(Json container) {
    if (!not_object_.empty()) return true;
    if (!in_root_) {
      if (!container.is_object()) not_object_ = container.type_name();
      in_root_ = true;
      return true;
    }
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    if (!not_object_.empty()) return true;
    if (open_.empty()) return true;  // the header's own closing brace
    open_.pop_back();
    if (open_.empty()) finish_member();
    return true;
  }
  // Where a new value goes: the member itself, the end of an open array, or the slot of the
  // key just read. Containers being filled never move: only the innermost one grows.
  Json* place(Json v) {
    if (open_.empty()) {
      member_.value = std::move(v);
      return &member_.value;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  void finish_member() {
    on_member_(member_);
    member_.value = nullptr;
    member_.keys.clear();
  }

  const std::string& name_;
  std::function<void(const Member&)> on_member_;
  bool in_root_ = false;
  std::string not_object_;
  std::unordered_set<std::string> names_;  // top-level keys so far
  Member member_;
  std::vector<Json*> open_;  // containers of the current member being filled, outermost first
  Json* slot_ = nullptr;     // the value of the key just read
};

std::vector<std::pair<std::string, std::string>> read_metadata(const Member& member,
                                                               const std::string& name) {
  const Json& value = member.value;
  if (!value.is_object())
    fail("{}: safetensors __metadata__ is a JSON {}, not a string-to-string map", name,
         value.type_name());
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(member.keys.size());
  for (const std::string& key : member.keys) {
    const Json& v = value.at(key);
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
  if (!dtype_by_code(t.code))  // escaped: a NUL would end the message, a newline split it
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
  HeaderEvents events(name, [&](const Member& m) {
    if (m.key == kMetadataKey)
      h.metadata = read_metadata(m, name);
    else
      h.tensors.push_back(read_tensor(m.key, m.value, name, h.file_size));
  });
  Json::sax_parse(text, &events);
  if (!events.not_object().empty())
    fail("{}: byte offset 8: safetensors header is a JSON {}, not an object", name,
         events.not_object());

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

  // Looked up by name: a file may mark every one of its 100,000 tensors.
  std::unordered_map<std::string_view, Tensor*> by_name;
  for (const auto& [key, value] : h.metadata) {
    if (value != kInt4Marker) continue;
    if (by_name.empty())
      for (Tensor& t : h.tensors) by_name.emplace(t.name, &t);
    const auto it = by_name.find(key);
    if (it == by_name.end())
      fail("{}: __metadata__ marks {} as Int4, but the file has no tensor of that name", name,
           file_text(key));
    it->second->int4 = true;
  }
  return h;
}

scan::FileScan scan_safetensors_fd(int fd, const std::string& display_name) {
  Header h = read_header(fd, display_name);
  scan::FileScan scan;
  scan.format = scan::SourceFormat::Safetensors;
  scan.file_size = scan.body_size = h.file_size;
  scan.params.reserve(h.tensors.size());
  for (Tensor& t : h.tensors) {
    scan::Param& p = scan.params.emplace_back();
    const Dtype d = *dtype_by_code(t.code);
    p.name = std::move(t.name);
    p.shape = std::move(t.shape);
    p.dtype = d.mindspore;
    if (t.int4) {
      // Packed 4-bit values have no element grid to cut: copied whole, as the type they are
      // stored as (MindSpore's transform, loading with safetensors' load_file, drops the
      // marker too).
      p.kind = scan::EntryKind::Opaque;
    } else {
      p.element_size = d.size;
    }
    p.content.push_back({h.data_start() + t.begin, t.end - t.begin});
  }
  return scan;
}

scan::FileScan scan_safetensors(const std::string& path) {
  const UniqueFd fd = util::open_regular(path, "checkpoint file");
  return scan_safetensors_fd(fd.get(), path);
}

}  // namespace ckptfs::safetensors
