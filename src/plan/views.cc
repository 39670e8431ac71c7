#include "views.h"

#include <algorithm>
#include <optional>

#include "ckptfs/ckpt/encoder.h"
#include "ckptfs/safetensors/format.h"

namespace ckptfs::plan {

namespace {

// Bytes [begin, end) of an entry's content.
void add_content(VirtualFile::Builder& builder, const Entry& e, uint64_t begin, uint64_t end) {
  if (e.tensor) {
    builder.add_tensor(e.tensor, begin, end);
    return;
  }
  if (e.view) {
    builder.add_strided(e.view, begin, end);
    return;
  }
  if (e.grid) {
    builder.add_grid(e.grid, begin, end);
    return;
  }
  uint64_t pos = 0;
  for (const scan::Extent& x : e.copy->content) {
    const uint64_t lo = std::max(begin, pos), hi = std::min(end, pos + x.length);
    if (lo < hi) builder.add_source_range(e.source, x.offset + (lo - pos), hi - lo);
    pos += x.length;
  }
}

}  // namespace

VirtualFile ckpt_view(const std::vector<Entry>& entries,
                      const std::vector<TrailingScalar>& trailing, bool sizes_only) {
  VirtualFile::Builder builder(sizes_only);
  if (!sizes_only)
    builder.reserve(2 * (entries.size() + trailing.size()));  // a header and its content each
  for (const Entry& e : entries) {
    if (e.copy && e.kind == scan::EntryKind::MapTensor) {
      for (const scan::Extent& r : e.copy->records)
        builder.add_source_record(e.source, r.offset, r.length, std::string(e.name));
      continue;
    }
    const uint64_t nbytes = e.nbytes();
    // MindSpore writes no record for an empty tensor.
    if (e.kind == scan::EntryKind::Tensor && nbytes == 0) continue;
    // Strings keep dims [0] (their only form); scalars lose it (≥2.3).
    const std::vector<int64_t> dims =
        e.kind == scan::EntryKind::String ? std::vector<int64_t>{0} : e.shape;
    uint64_t begin = 0;
    do {
      const uint64_t end = std::min(nbytes, begin + ckpt::kRecordChunkBytes);
      if (sizes_only)
        builder.add_bytes(ckpt::record_header_size(e.name, dims, e.dtype, end - begin));
      else
        builder.add_bytes(ckpt::record_header(e.name, dims, e.dtype, end - begin));
      add_content(builder, e, begin, end);
      begin = end;
    } while (begin < nbytes);
  }
  for (const TrailingScalar& scalar : trailing) {
    if (std::any_of(entries.begin(), entries.end(),
                    [&](const Entry& e) { return e.name == scalar.name; }))
      continue;
    builder.add_bytes(ckpt::record_header(scalar.name, {}, scalar.dtype, scalar.bytes.size()));
    builder.add_bytes(scalar.bytes);
  }
  return builder.finish();
}

VirtualFile safetensors_view(const std::vector<Entry>& entries, std::set<std::string>& left_out,
                             bool sizes_only) {
  std::vector<safetensors::HeaderEntry> header;
  std::vector<const Entry*> from;
  for (const Entry& e : entries) {
    const bool dense = e.kind == scan::EntryKind::Tensor || e.kind == scan::EntryKind::Opaque;
    const std::optional<safetensors::Dtype> d =
        dense ? safetensors::dtype_by_mindspore(e.dtype) : std::nullopt;
    // The header's own key: a .ckpt parameter of that name has no place in it.
    if (!d || e.name == safetensors::kMetadataKey) {
      left_out.emplace(e.name);
      continue;
    }
    header.push_back({e.name, d->code, e.shape, e.nbytes()});
    from.push_back(&e);
  }
  const std::vector<size_t> order = safetensors::sort_like_writer(header);
  static const std::vector<std::pair<std::string, std::string>> kMetadata{{"format", "ms"}};

  VirtualFile::Builder builder(sizes_only);
  builder.add_bytes(safetensors::encode_header(header, kMetadata));
  // Freed before the pieces grow: a large view holds millions of entries.
  header = decltype(header)();
  if (!sizes_only) builder.reserve(1 + order.size());
  for (size_t i : order)
    if (const uint64_t n = from[i]->nbytes(); n > 0) add_content(builder, *from[i], 0, n);
  return builder.finish();
}

}  // namespace ckptfs::plan
