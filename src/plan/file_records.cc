#include "ckptfs/plan/file_records.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "ckptfs/ckpt/encoder.h"
#include "ckptfs/error.h"
#include "ckptfs/safetensors/format.h"
#include "ckptfs/safetensors/scanner.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::plan {

namespace {

// The bytes the file holds in memory from `offset` on, up to `length` of them: they end where a
// source's bytes begin.
std::string held_bytes(const VirtualFile& file, uint64_t offset, uint64_t length) {
  std::vector<Run> runs;
  file.map(offset, length, runs);
  std::string out;
  for (const Run& r : runs) {
    if (r.mem == nullptr) break;
    out.append(r.mem, r.length);
  }
  return out;
}

void safetensors_records(const TargetFile& target, const std::string& name, PlannedRecords& out) {
  const VirtualFile& file = target.file;
  // The header is the first bytes the view added: read_header never reaches past it.
  const ReadExact read = [&](uint64_t offset, std::span<uint8_t> bytes) {
    const std::string held = held_bytes(file, offset, bytes.size());
    if (held.size() != bytes.size())
      fail("{}: byte offset {}: the plan holds no header bytes there", name, offset + held.size());
    std::memcpy(bytes.data(), held.data(), held.size());
  };
  const safetensors::Header h = safetensors::read_header(read, file.size(), name);
  for (const safetensors::Tensor& t : h.tensors) {
    PlannedRecord& r = out.records.emplace_back();
    r.name = t.name;
    r.dtype = t.code;
    r.shape = t.shape;
    r.ranges.emplace_back(h.data_start() + t.begin, t.end - t.begin);
  }
}

// A .ckpt view is record after record: a header held in memory followed by its content, or a
// record copied whole from a source (a map tensor's). Consecutive records of one name are one
// parameter (a tensor cut in 512 MiB records), as a loader groups them.
void ckpt_records(const TargetFile& target, const std::string& name, PlannedRecords& out) {
  const VirtualFile& file = target.file;
  const std::vector<CopiedRecord>& copied = file.copied_records();
  size_t next_copied = 0;
  bool last_copied = false;
  for (uint64_t pos = 0; pos < file.size();) {
    if (next_copied < copied.size() && copied[next_copied].at == pos) {
      const CopiedRecord& c = copied[next_copied++];
      if (out.records.empty() || !last_copied || out.records.back().name != c.name) {
        PlannedRecord& r = out.records.emplace_back();
        r.name = c.name;
      }
      out.records.back().ranges.emplace_back(pos, c.length);
      last_copied = true;
      pos += c.length;
      continue;
    }
    // Headers are short; a long tag takes a second look.
    std::optional<ckpt::RecordHeader> h;
    std::string held;
    for (uint64_t want = 256;; want *= 4) {
      held = held_bytes(file, pos, want);
      h = ckpt::parse_record_header(
          std::span(reinterpret_cast<const uint8_t*>(held.data()), held.size()));
      if (h || held.size() < want) break;
    }
    if (!h) fail("{}: byte offset {}: the plan holds no record header there", name, pos);
    const uint64_t content_at = pos + h->size;
    if (out.records.empty() || last_copied || out.records.back().name != h->tag) {
      PlannedRecord& r = out.records.emplace_back();
      r.name = h->tag;
      r.dtype = h->tensor_type;
      // [0] is a 0-d tensor for every loader, except on strings where it is always written.
      if (!(h->dims.size() == 1 && h->dims[0] == 0 && h->tensor_type != "str"))
        r.shape = std::move(h->dims);
    }
    out.records.back().ranges.emplace_back(content_at, h->content_length);
    last_copied = false;
    pos = content_at + h->content_length;
  }
}

}  // namespace

PlannedRecords planned_records(const TargetFile& target) {
  PlannedRecords out;
  const std::string name = target.path();
  const std::string file_name = target.file_name();
  if (safetensors::is_safetensors_name(file_name)) {
    out.format = "safetensors";
    safetensors_records(target, name, out);
  } else if (file_name.ends_with(".ckpt")) {
    out.format = "ckpt";
    ckpt_records(target, name, out);
  } else {
    out.format = "other";
  }
  return out;
}

}  // namespace ckptfs::plan
