#include "entry_codec.h"

#include <fmt/format.h>

#include <limits>
#include <optional>
#include <set>
#include <span>
#include <utility>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/ckpt/varint.h"
#include "index.pb.h"

namespace ckptfs::index {

namespace {

// An entry is the serialized ScannedFile followed by the CRC-32 of those bytes (big-endian), so
// a damaged page or a stray write reads as a damaged entry rather than as other offsets.
constexpr size_t kChecksumBytes = 4;

uint32_t checksum(std::string_view bytes) {
  return ckpt::crc32_update(
      0, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

}  // namespace

std::optional<std::string_view> checked_message(std::string_view entry) {
  if (entry.size() < kChecksumBytes) return std::nullopt;
  const std::string_view message = entry.substr(0, entry.size() - kChecksumBytes);
  uint32_t stored = 0;
  for (char c : entry.substr(message.size())) stored = stored << 8 | static_cast<uint8_t>(c);
  if (stored != checksum(message)) return std::nullopt;
  return message;
}

namespace {

// Protobuf wire bytes written by hand: index build encodes millions of parameters, and going
// through generated messages costs several allocations for each. The layout is
// indexpb::ScannedFile's (proto/index.proto); decode_entry reads it back by hand too.
class Wire {
 public:
  explicit Wire(std::string& out) : out_(out) {}
  void varint(uint64_t v) { ckpt::put_varint(out_, v); }
  void tag(uint32_t field, uint32_t wire_type) { varint(uint64_t{field} << 3 | wire_type); }
  void uint(uint32_t field, uint64_t v) {
    if (v == 0) return;  // proto3: a zero is not written
    tag(field, 0);
    varint(v);
  }
  void bytes(uint32_t field, std::string_view v) {
    if (v.empty()) return;
    tag(field, 2);
    varint(v.size());
    out_.append(v);
  }
  template <typename Int>
  void packed(uint32_t field, const std::vector<Int>& values) {
    if (values.empty()) return;
    size_t n = 0;
    for (Int v : values) n += ckpt::varint_size(static_cast<uint64_t>(v));
    tag(field, 2);
    varint(n);
    for (Int v : values) varint(static_cast<uint64_t>(v));
  }
  void extents(uint32_t field, const scan::Extents& values) {
    if (values.empty()) return;
    size_t n = 0;
    for (const scan::Extent& e : values)
      n += ckpt::varint_size(e.offset) + ckpt::varint_size(e.length);
    tag(field, 2);
    varint(n);
    for (const scan::Extent& e : values) {
      varint(e.offset);
      varint(e.length);
    }
  }

 private:
  std::string& out_;
};

}  // namespace

std::string encode_entry(const std::string& path, const scan::FileScan& scan,
                         const StructureDigest& structure) {
  std::string out;
  out.reserve(64 + path.size() + scan.tree.size() + scan.params.size() * 96);
  Wire file(out);
  file.uint(1, kFormatVersion);
  file.bytes(2, path);
  file.uint(3, scan.file_size);
  file.uint(4, scan.body_size);
  file.uint(5, scan.has_crc_trailer ? 1 : 0);
  std::string param;
  for (const scan::Param& p : scan.params) {
    param.clear();
    Wire w(param);
    w.bytes(1, p.name);
    w.bytes(2, p.dtype);
    w.packed(3, p.shape);
    w.uint(4, p.dims_zero ? 1 : 0);
    w.uint(5, static_cast<uint32_t>(p.kind));
    w.uint(6, p.element_size);
    w.extents(7, p.content);
    w.extents(8, p.records);
    if (p.view) {
      w.uint(9, 1);
      w.uint(10, p.storage_offset);
      w.packed(11, p.strides);
    }
    file.tag(6, 2);
    file.varint(param.size());
    out.append(param);
  }
  file.uint(7, static_cast<uint32_t>(scan.format));
  file.bytes(8, scan.tree);
  file.uint(9, structure.bytes);
  file.uint(10, structure.crc);
  file.uint(11, structure.region);
  file.packed(12, structure.regions);
  const uint32_t crc = checksum(out);
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(crc >> shift));
  return out;
}

namespace {

// Reads protobuf wire bytes by hand, as Wire writes them: a warm mount and every target summary
// of `index build` decode millions of parameters, and the generated parser (plus the copy out of
// its messages) cost as much per parameter as scanning the checkpoint. Accepts what protobuf
// accepts for these messages: fields in any order, unknown fields skipped, repeated scalars
// packed or not, the last value of a scalar winning.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes)
      : at_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(at_ + bytes.size()) {}
  bool done() const { return at_ == end_; }

  // The next field's number and wire type; false at a malformed tag.
  bool tag(uint32_t& field, uint32_t& type) {
    uint64_t v = 0;
    if (!varint(v) || (v >> 3) == 0 || (v >> 3) > std::numeric_limits<uint32_t>::max())
      return false;
    field = static_cast<uint32_t>(v >> 3);
    type = static_cast<uint32_t>(v & 7);
    return true;
  }
  bool varint(uint64_t& out) {
    // Read here rather than through get_varint's optional, whose two halves stored apart and
    // read back whole stall the store buffer on every tag, length and offset (that was 5% of
    // index build's cycles). Up to nine bytes get_varint would take as they are; a tenth, whose
    // top bits it checks, and a malformed one go through it.
    const uint8_t* p = at_;
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 63 && p != end_; shift += 7) {
      const uint8_t b = *p++;
      v |= uint64_t{b & 0x7Fu} << shift;
      if (b < 0x80) {
        at_ = p;
        out = v;
        return true;
      }
    }
    size_t used = 0;
    const std::optional<uint64_t> value =
        ckpt::get_varint(std::span(at_, static_cast<size_t>(end_ - at_)), used);
    if (!value) return false;
    at_ += used;
    out = *value;
    return true;
  }
  bool bytes(std::string_view& out) {
    uint64_t n = 0;
    if (!varint(n) || n > static_cast<uint64_t>(end_ - at_)) return false;
    out = {reinterpret_cast<const char*>(at_), static_cast<size_t>(n)};
    at_ += n;
    return true;
  }
  // A scalar field's value (wire type 0) and a string or message field's bytes (wire type 2);
  // false for another wire type.
  bool number(uint32_t type, uint64_t& out) { return type == 0 && varint(out); }
  bool text(uint32_t type, std::string_view& out) { return type == 2 && bytes(out); }
  // Skips a field of wire type `type` (groups are not used by these messages: refused).
  bool skip(uint32_t type) {
    uint64_t v = 0;
    std::string_view b;
    switch (type) {
      case 0:
        return varint(v);
      case 1:
      case 5: {
        const size_t n = type == 1 ? 8 : 4;
        if (static_cast<size_t>(end_ - at_) < n) return false;
        at_ += n;
        return true;
      }
      case 2:
        return bytes(b);
      default:
        return false;
    }
  }
  // How many fields numbered `field` follow (a pass that skips every field); nullopt at a
  // malformed one. Lets a caller size its vector once instead of moving what it decoded.
  std::optional<size_t> count(uint32_t field) const {
    WireReader in(*this);
    size_t n = 0;
    for (uint32_t f = 0, type = 0; !in.done(); n += f == field) {
      if (!in.tag(f, type) || !in.skip(type)) return std::nullopt;
    }
    return n;
  }
  // A repeated integer field: packed (type 2) or one value (type 0), each appended.
  template <typename Int>
  bool repeated(uint32_t type, std::vector<Int>& out) {
    uint64_t v = 0;
    if (type == 0) {
      if (!varint(v)) return false;
      out.push_back(static_cast<Int>(v));
      return true;
    }
    std::string_view packed;
    if (!text(type, packed)) return false;
    WireReader in(packed);
    out.reserve(out.size() + in.ends_of_varints());
    while (!in.done()) {
      if (!in.varint(v)) return false;
      out.push_back(static_cast<Int>(v));
    }
    return true;
  }

 private:
  size_t ends_of_varints() const {
    return static_cast<size_t>(std::count_if(at_, end_, [](uint8_t b) { return b < 0x80; }));
  }

  const uint8_t* at_;
  const uint8_t* end_;
};

// Extents stored as flat (offset, length) pairs, packed.
bool extents(WireReader& in, uint32_t type, scan::Extents& out) {
  std::string_view packed;
  if (!in.text(type, packed)) return false;
  WireReader pairs(packed);
  while (!pairs.done()) {
    scan::Extent e;
    if (!pairs.varint(e.offset) || !pairs.varint(e.length)) return false;
    out.push_back(e);
  }
  return true;
}

bool decode_param(std::string_view bytes, scan::Param& p) {
  WireReader in(bytes);
  for (uint32_t field = 0, type = 0; !in.done();) {
    if (!in.tag(field, type)) return false;
    uint64_t v = 0;
    std::string_view b;
    bool ok = true;
    switch (field) {
      case 1:
        ok = in.text(type, b);
        p.name = b;
        break;
      case 2:
        ok = in.text(type, b);
        p.dtype = b;
        break;
      case 3:
        ok = in.repeated(type, p.shape);
        break;
      case 4:
        ok = in.number(type, v);
        p.dims_zero = v != 0;
        break;
      case 5:
        ok = in.number(type, v) && v <= static_cast<uint64_t>(scan::EntryKind::Opaque);
        p.kind = static_cast<scan::EntryKind>(v);
        break;
      case 6:
        ok = in.number(type, v) && v <= std::numeric_limits<uint32_t>::max();
        p.element_size = static_cast<uint32_t>(v);
        break;
      case 7:
        ok = extents(in, type, p.content);
        break;
      case 8:
        ok = extents(in, type, p.records);
        break;
      case 9:
        ok = in.number(type, v);
        p.view = v != 0;
        break;
      case 10:
        ok = in.number(type, v);
        p.storage_offset = v;
        break;
      case 11:
        ok = in.repeated(type, p.strides);
        break;
      default:
        ok = in.skip(type);
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::optional<scan::FileScan> decode_entry(std::string_view entry, uint64_t file_size,
                                           std::string* why, StructureDigest* structure,
                                           std::string_view path) {
  const auto bad = [&](std::string what) -> std::optional<scan::FileScan> {
    if (why) *why = std::move(what);
    return std::nullopt;
  };
  const std::optional<std::string_view> bytes = checked_message(entry);
  if (!bytes) return bad("its checksum does not match");
  scan::FileScan scan;
  uint64_t version = 0, format = 0;
  StructureDigest digest;
  std::vector<uint64_t> region_crcs;
  std::string_view scanned_path;
  WireReader in(*bytes);
  const std::optional<size_t> params = in.count(6);
  if (!params) return bad("it does not decode");
  scan.params.reserve(*params);
  for (uint32_t field = 0, type = 0; !in.done();) {
    if (!in.tag(field, type)) return bad("it does not decode");
    uint64_t v = 0;
    std::string_view b;
    bool ok = true;
    switch (field) {
      case 1:
        ok = in.number(type, version);
        break;
      case 2:
        ok = in.text(type, scanned_path);
        break;
      case 3:
        ok = in.number(type, scan.file_size);
        break;
      case 4:
        ok = in.number(type, scan.body_size);
        break;
      case 5:
        ok = in.number(type, v);
        scan.has_crc_trailer = v != 0;
        break;
      case 6:
        ok = in.text(type, b) && decode_param(b, scan.params.emplace_back());
        break;
      case 7:
        ok = in.number(type, format);
        break;
      case 8:
        ok = in.text(type, b);
        scan.tree = b;
        break;
      case 9:
        ok = in.number(type, digest.bytes);
        break;
      case 10:
        ok = in.number(type, v) && v <= std::numeric_limits<uint32_t>::max();
        digest.crc = static_cast<uint32_t>(v);
        break;
      case 11:
        ok = in.number(type, digest.region);
        break;
      case 12:
        ok = in.repeated(type, region_crcs);
        break;
      default:
        ok = in.skip(type);
    }
    if (!ok) return bad("it does not decode");
  }
  if (version != kFormatVersion) return bad("it is of another format version");
  if (!path.empty() && scanned_path != path)
    return bad(fmt::format("it is the scan of another file, {}", scanned_path));
  if (scan.file_size != file_size) return bad("it is of a file of another size");
  if (format > static_cast<uint32_t>(scan::kLastFormat))
    return bad("it names an unknown source format");
  scan.format = static_cast<scan::SourceFormat>(format);
  if (std::string what = scan::check_scan(scan, file_size); !what.empty()) return bad(what);
  if (digest.bytes > file_size) return bad("it counts more structure bytes than the file has");
  if (!region_crcs.empty() || digest.region != 0) {
    // A region count that does not tile the file would leave bytes no region vouches for.
    if (digest.region == 0 ||
        region_crcs.size() != file_size / digest.region + (file_size % digest.region != 0))
      return bad("its structure regions do not cover the file");
    if (region_crcs.size() > kMaxRegions)
      return bad(fmt::format("it keeps {} structure regions, more than the {} index build keeps",
                             region_crcs.size(), kMaxRegions));
    digest.regions.reserve(region_crcs.size());
    for (uint64_t crc : region_crcs) {
      if (crc > std::numeric_limits<uint32_t>::max())
        return bad("its structure regions do not decode");
      digest.regions.push_back(static_cast<uint32_t>(crc));
    }
  }
  if (structure) *structure = std::move(digest);
  return scan;
}

namespace {

std::string with_checksum(std::string bytes) {
  const uint32_t crc = checksum(bytes);
  for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(crc >> shift));
  return bytes;
}

}  // namespace

std::string encode_target(const TargetSummary& t) {
  indexpb::TargetSummary out;
  out.set_format_version(kFormatVersion);
  out.set_rank(t.rank);
  for (const TargetSummary::File& f : t.files) {
    indexpb::ListedFile* file = out.add_files();
    file->set_name(f.name);
    file->set_size(f.size);
    file->set_mtime_ns(f.mtime_ns);
    file->set_page_cache(f.page_cache);
    for (int64_t r : f.source_ranks) file->add_source_ranks(r);
  }
  for (int64_t r : t.source_ranks) out.add_source_ranks(r);
  return with_checksum(out.SerializeAsString());
}

namespace {

bool strictly_ascending(const google::protobuf::RepeatedField<int64_t>& ranks) {
  int64_t previous = -1;
  for (int64_t r : ranks) {
    if (r <= previous) return false;
    previous = r;
  }
  return true;
}

}  // namespace

std::optional<TargetSummary> decode_target(std::string_view entry, int64_t rank, std::string* why) {
  const auto bad = [&](std::string what) -> std::optional<TargetSummary> {
    if (why) *why = std::move(what);
    return std::nullopt;
  };
  const std::optional<std::string_view> message = checked_message(entry);
  if (!message) return bad("its checksum does not match");
  indexpb::TargetSummary in;
  if (!in.ParseFromArray(message->data(), static_cast<int>(message->size())))
    return bad("it does not decode");
  if (in.format_version() != kFormatVersion) return bad("it is of another format version");
  if (in.rank() != rank) return bad(fmt::format("it is the summary of rank {}", in.rank()));
  TargetSummary out;
  out.rank = rank;
  out.files.reserve(static_cast<size_t>(in.files_size()));
  std::set<std::string_view> names;
  for (const indexpb::ListedFile& f : in.files()) {
    const std::string& name = f.name();
    // Each name becomes a directory entry of the mount: one plain component.
    if (name.empty() || name == "." || name == ".." || name.size() > 255 ||
        name.find_first_of(std::string_view("/\0", 2)) != std::string::npos)
      return bad("it lists a file name that is not a plain directory entry");
    if (!names.insert(name).second) return bad("it lists a file name twice");
    if (f.size() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return bad("it lists a file size beyond an off_t");
    if (!strictly_ascending(f.source_ranks()))
      return bad("a file's source ranks are not non-negative and ascending");
    out.files.push_back({name, f.size(), f.mtime_ns(), f.page_cache(),
                         std::vector<int64_t>(f.source_ranks().begin(), f.source_ranks().end())});
  }
  if (!strictly_ascending(in.source_ranks()))
    return bad("its source ranks are not non-negative and ascending");
  out.source_ranks.assign(in.source_ranks().begin(), in.source_ranks().end());
  return out;
}

}  // namespace ckptfs::index
