// Record-by-record walk of a checkpoint (spec §1). Only headers pass through memory: a small
// window refilled by pread at the current position; tensor_content is stepped over by offset.
#include "ckptfs/ckpt/scanner.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/ckpt/varint.h"
#include "ckptfs/error.h"
#include "ckptfs/scan/dtype.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/pread.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/remote_fs.h"
#include "ckptfs/util/shape_text.h"
#include "ckptfs/util/view_reach.h"

namespace ckptfs::ckpt {

using scan::EntryKind;
using scan::Extent;
using scan::FileScan;
using scan::Param;

namespace {

// A jump (after skipped content) reads a little: the next header is usually a few dozen bytes,
// and reading more would pull tensor bytes nobody asked for. Sequential reads use the window.
constexpr size_t kWindowBytes = 64 * 1024;
constexpr size_t kJumpReadBytes = 4 * 1024;
// On a remote filesystem each read is a request (s3fs: a ranged GET, and a miss pulls a large
// prefetch), so every read is one large window: tensors smaller than it are read through rather
// than jumped, and the file passes in order, a few requests per window. Bounded: a tensor
// larger than the window is still stepped over.
constexpr size_t kLargeReadBytes = 8 * 1024 * 1024;

struct ReadSizes {
  size_t window;
  size_t jump;
};

ReadSizes read_sizes(ReadPattern pattern) {
  return pattern == ReadPattern::large ? ReadSizes{kLargeReadBytes, kLargeReadBytes}
                                       : ReadSizes{kWindowBytes, kJumpReadBytes};
}
constexpr size_t kCrcBlockBytes = 1024 * 1024;

// Names and type strings are held in memory; these bounds keep a hostile length prefix from
// turning into a huge allocation. Real names are well below a kilobyte.
constexpr uint64_t kMaxStringBytes = 1 << 20;
constexpr size_t kMaxDims = 64;

constexpr std::string_view kCrcMagic = "crc_num";

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLen = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5
};

// A fixed window over [0, end) of the file, no bigger than the file: a mount scans every source,
// and a small one should not cost a zero-filled 64 KiB.
class Window {
 public:
  Window(const ReadExact& read, uint64_t end, ReadSizes sizes)
      : read_(read),
        end_(end),
        jump_(sizes.jump),
        buf_(static_cast<size_t>(std::min<uint64_t>(sizes.window, end))) {}

  // Up to n bytes at pos, fewer only where `limit` (<= end) cuts them.
  std::span<const uint8_t> peek(uint64_t pos, size_t n, uint64_t limit) {
    const uint64_t avail = limit > pos ? limit - pos : 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, avail));
    if (n == 0) return {};
    if (pos < buf_off_ || pos + n > buf_off_ + buf_len_) fill(pos, n);
    return std::span<const uint8_t>(buf_.data() + (pos - buf_off_), n);
  }

  // The byte at pos when the window holds it and pos < limit, else -1: a header walk's varints
  // are nearly all one byte, and this answers them without building a span.
  int byte_at(uint64_t pos, uint64_t limit) const {
    return pos < limit && pos >= buf_off_ && pos - buf_off_ < buf_len_ ? buf_[pos - buf_off_] : -1;
  }

  void copy(uint64_t pos, std::span<uint8_t> out) {
    if (out.size() > buf_.size()) {
      read_(pos, out);
      return;
    }
    auto bytes = peek(pos, out.size(), end_);
    std::copy(bytes.begin(), bytes.end(), out.begin());
  }

 private:
  void fill(uint64_t pos, size_t need) {
    // Reading on from inside the window (a header straddling its end) is sequential too.
    const bool sequential = pos >= buf_off_ && pos <= buf_off_ + buf_len_;
    size_t want = std::max(need, sequential ? buf_.size() : jump_);
    want = static_cast<size_t>(std::min<uint64_t>(want, end_ - pos));
    read_(pos, std::span<uint8_t>(buf_.data(), want));
    buf_off_ = pos;
    buf_len_ = want;
  }

  const ReadExact& read_;
  uint64_t end_;
  size_t jump_;
  std::vector<uint8_t> buf_;
  uint64_t buf_off_ = 0;
  size_t buf_len_ = 0;
};

struct Key {
  uint64_t offset;
  uint32_t field;
  uint32_t wire;
};

struct TensorFields {
  std::vector<int64_t> dims;
  std::optional<std::string> type;
  std::optional<Extent> content;
};

struct Record {
  std::string tag;
  bool is_map = false;
  TensorFields tensor;  // unused for map tensors
  Extent record;
};

// Text naming a field in an error message: a string, or a callable that formats it. The
// callable runs only when an error is raised, so the path that succeeds formats nothing: a
// scan reads millions of fields, and formatting each one's name cost 7% of a cold mount.
template <class What>
std::string describe(const What& what) {
  if constexpr (std::is_invocable_v<const What&>)
    return what();
  else
    return std::string(what);
}

// Protobuf wire reading with every length checked against the enclosing message. `scope`
// names that message in errors ("file", "Checkpoint.Value", ...).
class Parser {
 public:
  Parser(const ReadExact& read, const std::string& name, uint64_t end, std::string_view top_scope,
         ReadSizes sizes)
      : name_(name), end_(end), top_scope_(top_scope), in_(read, end, sizes) {}

  bool at(uint64_t limit) const { return pos_ >= limit; }

  [[noreturn]] void error_at(uint64_t offset, std::string_view what) const {
    fail("{}: byte offset {}: {}", name_, offset, what);
  }

  template <class What>
  uint64_t varint(uint64_t limit, const What& what) {
    if (const int b = in_.byte_at(pos_, limit); b >= 0 && b < 0x80) {
      ++pos_;
      return static_cast<uint64_t>(b);
    }
    const uint64_t start = pos_;
    const auto bytes = in_.peek(pos_, 10, limit);
    size_t used = 0;
    const auto value = get_varint(bytes, used);
    if (!value) {
      const bool cut = bytes.size() < 10 &&
                       std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b & 0x80; });
      if (cut)
        error_at(start, fmt::format("truncated varint ({}): the enclosing message ends at byte {}",
                                    describe(what), limit));
      error_at(start, fmt::format("malformed varint ({}): more than 64 bits", describe(what)));
    }
    pos_ += used;
    return *value;
  }

  Key key(uint64_t limit, std::string_view scope) {
    const uint64_t start = pos_;
    const uint64_t v = varint(limit, [&] { return fmt::format("field key in {}", scope); });
    if (v > 0xFFFFFFFFull || (v >> 3) == 0)
      error_at(start, fmt::format("invalid field key in {} (field number 0 or above 2^29)", scope));
    return Key{start, static_cast<uint32_t>(v >> 3), static_cast<uint32_t>(v & 7)};
  }

  // A length prefix, checked to leave the payload inside [pos, limit).
  template <class What>
  uint64_t length(uint64_t limit, const What& what, std::string_view scope) {
    const uint64_t start = pos_;
    const uint64_t len = varint(limit, [&] { return fmt::format("length of {}", describe(what)); });
    if (len > end_)
      error_at(start, fmt::format("length of {} is larger than the whole {} ({} bytes)",
                                  describe(what), top_scope_, end_));
    if (len > limit - pos_)
      error_at(start, fmt::format("length {} of {} runs past byte {}, the end of the enclosing {}",
                                  len, describe(what), limit, scope));
    return len;
  }

  void skip(uint64_t n) { pos_ += n; }

  void expect_wire(const Key& k, uint32_t wire, std::string_view what) const {
    if (k.wire != wire)
      error_at(k.offset, fmt::format("{} (field {}) has the wrong wire type (expected {})", what,
                                     k.field, wire));
  }

  void skip_field(const Key& k, uint64_t limit, std::string_view scope) {
    switch (k.wire) {
      case kVarint:
        varint(limit, [&] { return fmt::format("an unknown field in {}", scope); });
        return;
      case kFixed64:
      case kFixed32: {
        const uint64_t n = k.wire == kFixed64 ? 8 : 4;
        if (n > limit - pos_)
          error_at(k.offset, fmt::format("an unknown {}-byte field runs past byte {}, the end of "
                                         "the enclosing {}",
                                         n, limit, scope));
        pos_ += n;
        return;
      }
      case kLen:
        pos_ += length(
            limit, [] { return std::string("an unknown field"); }, scope);
        return;
      case kStartGroup:
      case kEndGroup:
        error_at(k.offset, fmt::format("an unknown field in {} is a protobuf group, which a "
                                       "checkpoint never contains",
                                       scope));
      default:
        error_at(k.offset, fmt::format("an unknown field in {} has an invalid wire type", scope));
    }
  }

  std::string string(uint64_t limit, std::string_view what, std::string_view scope) {
    const uint64_t start = pos_;
    const uint64_t len = length(limit, what, scope);
    if (len > kMaxStringBytes)
      error_at(start, fmt::format("{} is {} bytes long, more than the {} this reader accepts", what,
                                  len, kMaxStringBytes));
    std::string out(static_cast<size_t>(len), '\0');
    in_.copy(pos_, std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size()));
    pos_ += len;
    return out;
  }

  void add_dim(TensorFields& t, uint64_t raw, uint64_t offset) {
    const auto dim = static_cast<int64_t>(raw);
    if (dim < 0) error_at(offset, "negative dimension");
    if (t.dims.size() >= kMaxDims)
      error_at(offset, fmt::format("more than {} dimensions", kMaxDims));
    t.dims.push_back(dim);
  }

  // TensorProto.dims: one dimension (varint), or several (packed), appended to t.dims.
  void dims(const Key& k, uint64_t limit, TensorFields& t) {
    if (k.wire == kVarint) {
      const uint64_t at_dim = pos_;
      add_dim(t, varint(limit, "dims"), at_dim);
    } else if (k.wire == kLen) {
      const uint64_t len = length(limit, "packed dims", "TensorProto");
      const uint64_t packed_end = pos_ + len;
      while (!at(packed_end)) {
        const uint64_t at_dim = pos_;
        add_dim(t, varint(packed_end, "packed dims"), at_dim);
      }
    } else {
      expect_wire(k, kVarint, "TensorProto.dims");
    }
  }

  // TensorProto fields merge into `t` as protobuf merges a repeated occurrence of a message:
  // dims append, type and content are replaced.
  void tensor(uint64_t limit, TensorFields& t) {
    static constexpr std::string_view kScope = "TensorProto";
    while (!at(limit)) {
      const Key k = key(limit, kScope);
      switch (k.field) {
        case 1:
          dims(k, limit, t);
          break;
        case 2:
          expect_wire(k, kLen, "TensorProto.tensor_type");
          t.type = string(limit, "tensor_type", kScope);
          break;
        case 3: {
          expect_wire(k, kLen, "TensorProto.tensor_content");
          const uint64_t len = length(limit, "tensor_content", kScope);
          t.content = Extent{pos_, len};
          pos_ += len;
          break;
        }
        default:
          skip_field(k, limit, kScope);
      }
    }
  }

  void require_tensor_fields(const TensorFields& t, uint64_t offset, std::string_view where) const {
    if (!t.type) error_at(offset, fmt::format("{} has no tensor_type (a required field)", where));
    if (!t.content)
      error_at(offset, fmt::format("{} has no tensor_content (a required field)", where));
  }

  // Map tensor components are checked for structure only: ckptfs copies their records whole.
  void map_tensor(uint64_t limit) {
    static constexpr std::string_view kScope = "MapTensorProto";
    while (!at(limit)) {
      const Key k = key(limit, kScope);
      if (k.field != 1) {
        skip_field(k, limit, kScope);
        continue;
      }
      expect_wire(k, kLen, "MapTensorProto.tensor");
      const uint64_t len = length(limit, "MapTensorProto.tensor", kScope);
      TensorFields component;
      tensor(pos_ + len, component);
      require_tensor_fields(component, k.offset, "map tensor component");
    }
  }

  // One Checkpoint.value occurrence; pos is just past its key.
  Record record(uint64_t key_offset) {
    static constexpr std::string_view kScope = "Checkpoint.Value";
    const uint64_t len = length(end_, "Checkpoint.value", top_scope_);
    const uint64_t limit = pos_ + len;
    Record r;
    r.record = Extent{key_offset, limit - key_offset};
    bool has_tag = false;
    enum { kNoValue, kTensorValue, kMapValue } which = kNoValue;
    while (!at(limit)) {
      const Key k = key(limit, kScope);
      switch (k.field) {
        case 1:
          expect_wire(k, kLen, "Checkpoint.Value.tag");
          r.tag = string(limit, "tag", kScope);
          has_tag = true;
          break;
        case 2: {
          expect_wire(k, kLen, "Checkpoint.Value.tensor");
          const uint64_t tlen = length(limit, "Checkpoint.Value.tensor", kScope);
          // tensor and maptensor form a oneof: setting one clears the other.
          if (which != kTensorValue) r.tensor = TensorFields{};
          which = kTensorValue;
          tensor(pos_ + tlen, r.tensor);
          break;
        }
        case 3: {
          expect_wire(k, kLen, "Checkpoint.Value.maptensor");
          const uint64_t mlen = length(limit, "Checkpoint.Value.maptensor", kScope);
          which = kMapValue;
          map_tensor(pos_ + mlen);
          break;
        }
        default:
          skip_field(k, limit, kScope);
      }
    }
    if (!has_tag) error_at(key_offset, "record has no tag (a required field)");
    if (which == kNoValue)
      error_at(key_offset,
               fmt::format("record {} has neither tensor nor maptensor", file_text(r.tag)));
    r.is_map = which == kMapValue;
    // The message is formatted only for a record that lacks a field: formatting it for every
    // record cost the scan as much as parsing the record.
    if (!r.is_map && (!r.tensor.type || !r.tensor.content))
      require_tensor_fields(r.tensor, key_offset, fmt::format("record {}", file_text(r.tag)));
    return r;
  }

  // Calls on_record for each Checkpoint.value in file order.
  template <typename F>
  void walk(F&& on_record) {
    while (!at(end_)) {
      const Key k = key(end_, top_scope_);
      if (k.field != 1) {
        skip_field(k, end_, top_scope_);
        continue;
      }
      expect_wire(k, kLen, "Checkpoint.value");
      on_record(record(k.offset));
    }
  }

 private:
  const std::string& name_;
  uint64_t end_;
  std::string_view top_scope_;  // "file", or the body before a CRC trailer
  Window in_;
  uint64_t pos_ = 0;
};

// Builds Params from records, merging runs of equal tags (spec §1.5).
class Grouper {
 public:
  // `size`: the body's, which bounds the numbers an error may quote (ckptfs/util/quote.h).
  Grouper(const std::string& name, uint64_t size) : name_(name), size_(size) {}

  void add(Record r) {
    if (open_ && current_.name == r.tag) {
      append(r);
      return;
    }
    close();
    start(r);
  }

  std::vector<Param> finish() {
    close();
    return std::move(params_);
  }

 private:
  void start(Record& r) {
    current_ = Param{};
    current_.name = std::move(r.tag);
    raw_dims_ = r.tensor.dims;
    if (r.is_map) {
      current_.kind = EntryKind::MapTensor;
    } else {
      current_.dtype = *r.tensor.type;
      current_.content.push_back(*r.tensor.content);
    }
    current_.records.push_back(r.record);
    open_ = true;
  }

  void append(const Record& r) {
    const bool was_map = current_.kind == EntryKind::MapTensor;
    const uint64_t at = r.record.offset;
    if (was_map != r.is_map)
      fail("{}: byte offset {}: parameter {} continues a {} record with a {} record", name_, at,
           file_text(current_.name), was_map ? "map tensor" : "tensor",
           r.is_map ? "map tensor" : "tensor");
    if (!r.is_map) {
      if (*r.tensor.type != current_.dtype)
        fail("{}: byte offset {}: chunk of parameter {} has type {}, earlier chunks {}", name_, at,
             file_text(current_.name), file_text(*r.tensor.type), file_text(current_.dtype.name()));
      if (r.tensor.dims != raw_dims_)
        fail("{}: byte offset {}: chunk of parameter {} has dims {}, earlier chunks {}", name_, at,
             file_text(current_.name), file_shape(r.tensor.dims, size_),
             file_shape(raw_dims_, size_));
      current_.content.push_back(*r.tensor.content);
    }
    current_.records.push_back(r.record);
  }

  void close() {
    if (!open_) return;
    open_ = false;
    Param& p = current_;
    if (p.kind != EntryKind::MapTensor) {
      const bool is_string = p.dtype == "str";
      const uint32_t size = p.dtype.element_size();
      p.kind = size > 0 ? EntryKind::Tensor : is_string ? EntryKind::String : EntryKind::Opaque;
      p.element_size = size;
      p.dims_zero = raw_dims_.size() == 1 && raw_dims_[0] == 0;
      // [0] is a 0-d tensor for every loader, except on strings where it is what is always written.
      if (!(p.dims_zero && !is_string)) p.shape = raw_dims_;
      if (p.kind == EntryKind::Tensor) validate(p);
    }
    params_.push_back(std::move(p));
  }

  void validate(const Param& p) const {
    const uint64_t at = p.records.front().offset;
    unsigned __int128 need = p.element_size;
    for (int64_t d : p.shape) {
      need *= static_cast<uint64_t>(d);
      if (need > UINT64_MAX)
        fail("{}: byte offset {}: parameter {} has a shape whose size overflows 64 bits", name_, at,
             file_text(p.name));
    }
    if (p.nbytes() != static_cast<uint64_t>(need))
      fail("{}: byte offset {}: parameter {} has {} content bytes, but shape {} of {} needs {}",
           name_, at, file_text(p.name), p.nbytes(), file_shape(p.shape, size_),
           file_text(p.dtype.name()), file_number(static_cast<uint64_t>(need), size_));
  }

  const std::string& name_;
  uint64_t size_;
  std::vector<Param> params_;
  Param current_;
  std::vector<int64_t> raw_dims_;
  bool open_ = false;
};

const char* encryption_mode(uint32_t magic) {
  switch (magic) {
    case 0x7F3A5ED8:
      return "AES-GCM";
    case 0x7F3A5ED9:
      return "AES-CBC";
    case 0x7F3A5EDA:
      return "SM4-CBC";
    default:
      return nullptr;
  }
}

// Refuses an encrypted file (spec §1.8): its first four bytes are a known magic. It is read
// through its decrypted stream instead (kEncryptedReader), with a key.
void refuse_encrypted(const ReadExact& read, uint64_t size, const std::string& name) {
  if (size < 4) return;
  std::array<uint8_t, 4> head;
  read(0, head);
  const uint32_t magic = static_cast<uint32_t>(head[0]) | static_cast<uint32_t>(head[1]) << 8 |
                         static_cast<uint32_t>(head[2]) << 16 |
                         static_cast<uint32_t>(head[3]) << 24;
  if (const char* mode = encryption_mode(magic))
    fail(
        "{}: byte offset 0: encrypted checkpoint ({}, magic 0x{:08X}); give its key with "
        "--dec-key-file FILE (raw key bytes, mode 600) or --dec-key-env NAME (hex)",
        name, mode, magic);
}

// The CRC trailer MindSpore appends: "crc_num" and a 10-byte big-endian integer, of which a
// CRC-32 only ever fills the last four bytes.
struct CrcTrailer {
  uint32_t low = 0;              // the value's low 32 bits
  bool high_bytes_zero = false;  // the six bytes above them are zero
};

std::optional<CrcTrailer> read_crc_trailer(const ReadExact& read, uint64_t size) {
  if (size < kCrcTrailerBytes) return std::nullopt;
  std::array<uint8_t, kCrcTrailerBytes> trailer;
  read(size - kCrcTrailerBytes, trailer);
  if (!std::equal(kCrcMagic.begin(), kCrcMagic.end(), trailer.begin())) return std::nullopt;
  CrcTrailer out;
  out.high_bytes_zero =
      std::all_of(trailer.begin() + 7, trailer.begin() + 13, [](uint8_t b) { return b == 0; });
  out.low = static_cast<uint32_t>(trailer[13]) << 24 | static_cast<uint32_t>(trailer[14]) << 16 |
            static_cast<uint32_t>(trailer[15]) << 8 | trailer[16];
  return out;
}

void verify_crc(const ReadExact& read, const std::string& name, uint64_t body_size,
                const CrcTrailer& trailer) {
  // No larger than the body: a small file's check does not zero a whole block first.
  std::vector<uint8_t> block(static_cast<size_t>(std::min<uint64_t>(kCrcBlockBytes, body_size)));
  uint32_t crc = 0;
  for (uint64_t off = 0; off < body_size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), body_size - off));
    read(off, std::span<uint8_t>(block.data(), n));
    crc = crc32_update(crc, std::span<const uint8_t>(block.data(), n));
    off += n;
  }
  // Neither value is shown: both are functions of the file's bytes, and a mismatch is all the
  // reader can act on.
  if (!trailer.high_bytes_zero || crc != trailer.low)
    fail(
        "{}: crc check failed: the trailer at byte offset {} does not hold the CRC-32 of the {} "
        "body bytes before it",
        name, body_size, body_size);
}

// The body's records, grouped into parameters in file order.
std::vector<Param> scan_params(const ReadExact& read, const std::string& name, uint64_t body_size,
                               bool has_crc_trailer, ReadPattern pattern) {
  Parser parser(read, name, body_size,
                has_crc_trailer ? "checkpoint body (before the CRC trailer)" : "file",
                read_sizes(pattern));
  Grouper grouper(name, body_size);
  parser.walk([&](Record r) { grouper.add(std::move(r)); });
  return grouper.finish();
}

}  // namespace

FileScan scan_checkpoint(const std::string& path, const ScanOptions& options) {
  const UniqueFd fd = util::open_regular(path, "checkpoint file");
  return scan_checkpoint_fd(fd.get(), path, options);
}

FileScan scan_checkpoint_fd(int fd, const std::string& display_name, const ScanOptions& options) {
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("{}: cannot stat: {}", display_name, errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", display_name);
  ScanOptions opts = options;
  if (opts.reads == ReadPattern::automatic)
    opts.reads = on_remote_filesystem(fd) ? ReadPattern::large : ReadPattern::small;
  return scan_checkpoint_bytes(read_exact_from(fd, display_name), static_cast<uint64_t>(st.st_size),
                               display_name, opts);
}

FileScan scan_checkpoint_bytes(const ReadExact& read, uint64_t size,
                               const std::string& display_name, const ScanOptions& options) {
  refuse_encrypted(read, size, display_name);
  FileScan scan;
  scan.file_size = size;
  scan.body_size = size;
  if (const std::optional<CrcTrailer> trailer = read_crc_trailer(read, size)) {
    scan.has_crc_trailer = true;
    scan.body_size = size - kCrcTrailerBytes;
    if (options.verify_crc) verify_crc(read, display_name, scan.body_size, *trailer);
  }
  scan.params =
      scan_params(read, display_name, scan.body_size, scan.has_crc_trailer, options.reads);
  return scan;
}

// MindSpore's suffix of a parameter cache key entry, "<name>.__param_key__<n>".
constexpr std::string_view kParamKeySuffix = ".__param_key__";

bool loads_as_saved(std::span<const Param> params) {
  std::unordered_set<std::string_view> names;
  names.reserve(params.size());
  for (const Param& p : params)
    if (!names.insert(p.name).second || p.name.find(kParamKeySuffix) != std::string::npos)
      return false;
  return true;
}

bool same_names(std::span<const Param> a, std::span<const Param> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const Param& x, const Param& y) { return x.name == y.name; });
}

bool same_names(std::span<const std::string> names, std::span<const Param> params) {
  return std::equal(names.begin(), names.end(), params.begin(), params.end(),
                    [](const std::string& n, const Param& p) { return n == p.name; });
}

std::vector<Param> loaded_params(FileScan scan) {
  // Nearly every file has unique names and no cache keys: then the order is the file's.
  if (loads_as_saved(scan.params)) return std::move(scan.params);
  // Python dict semantics: assigning an existing key keeps its position, a new key goes last.
  std::vector<std::optional<Param>> slots;
  std::unordered_map<std::string, size_t> index;
  auto assign = [&](Param p) {
    auto it = index.find(p.name);
    if (it != index.end()) {
      slots[it->second] = std::move(p);
    } else {
      index.emplace(p.name, slots.size());
      slots.push_back(std::move(p));
    }
  };
  for (Param& p : scan.params) assign(std::move(p));

  // MindSpore then pops every "<name>.__param_key__<n>" entry, in order, and stores it as <name>.
  std::vector<size_t> keyed;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i]->name.find(kParamKeySuffix) != std::string::npos) keyed.push_back(i);
  for (size_t i : keyed) {
    Param p = std::move(*slots[i]);
    slots[i].reset();
    index.erase(p.name);
    p.name.resize(p.name.find(kParamKeySuffix));
    assign(std::move(p));
  }

  std::vector<Param> out;
  out.reserve(slots.size());
  for (auto& slot : slots)
    if (slot) out.push_back(std::move(*slot));
  return out;
}

}  // namespace ckptfs::ckpt
