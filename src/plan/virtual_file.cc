#include "ckptfs/plan/virtual_file.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "append_run.h"
#include "ckptfs/plan/read_map.h"

namespace ckptfs::plan {

namespace {

enum class PieceKind : uint8_t { Bytes, Source, Tensor, Strided, Grid };

// A contiguous part of the virtual file. `pos` is the start in the header arena (Bytes), in the
// source file (Source) or in the tensor's content (Tensor, Strided, Grid). 32 bytes: a target file
// has two pieces per record, and a mount plans millions of records.
struct Piece {
  uint64_t start = 0;
  uint64_t length = 0;
  uint64_t pos = 0;
  uint32_t ref =
      0;  // Source: the source index; otherwise index into Impl's tensors, strided, grids
  PieceKind kind = PieceKind::Bytes;
};
static_assert(sizeof(Piece) == 32);

}  // namespace

void append_run(std::vector<Run>& out, const Run& run) {
  if (run.length == 0) return;
  if (!out.empty()) {
    Run& last = out.back();
    const bool both_mem = last.mem && run.mem && last.mem + last.length == run.mem;
    const bool both_source = !last.mem && !run.mem && last.source == run.source &&
                             last.offset + last.length == run.offset;
    if (both_mem || both_source) {
      last.length += run.length;
      return;
    }
  }
  out.push_back(run);
}

struct VirtualFile::Impl {
  std::string arena;  // every record header of the file, back to back
  std::vector<Piece> pieces;
  std::vector<std::shared_ptr<const TensorContent>> tensors;   // Piece::ref of a Tensor piece
  std::vector<std::shared_ptr<const StridedContent>> strided;  // Piece::ref of a Strided piece
  std::vector<std::shared_ptr<const GridContent>> grids;       // Piece::ref of a Grid piece
  std::vector<uint32_t> sources;
  std::vector<CopiedRecord> copied;
  uint64_t size = 0;
  bool sizes_only = false;  // Builder(true): no pieces, header bytes or contents kept
  // Which sources are in `sources` already: a resharded tensor names each of its blocks' files,
  // so a file of many merged tensors would otherwise list its few sources millions of times.
  std::vector<bool> listed;

  // Sorted by finish().
  void add_source(uint32_t source) {
    if (source >= listed.size()) listed.resize(size_t{source} + 1);
    if (listed[source]) return;
    listed[source] = true;
    sources.push_back(source);
  }

  void add(Piece piece) {
    if (piece.length == 0) return;
    piece.start = size;
    size += piece.length;
    if (!sizes_only) pieces.push_back(piece);
  }
};

VirtualFile::VirtualFile() : impl_(std::make_unique<Impl>()) {}
VirtualFile::~VirtualFile() = default;
VirtualFile::VirtualFile(VirtualFile&&) noexcept = default;
VirtualFile& VirtualFile::operator=(VirtualFile&&) noexcept = default;

uint64_t VirtualFile::size() const { return impl_->size; }

const std::vector<uint32_t>& VirtualFile::sources() const { return impl_->sources; }

const std::vector<CopiedRecord>& VirtualFile::copied_records() const { return impl_->copied; }

uint64_t VirtualFile::map(uint64_t offset, uint64_t length, std::vector<Run>& out,
                          size_t max_runs) const {
  return walk(offset, length, out, max_runs, false);
}

void VirtualFile::cover(uint64_t offset, uint64_t length, std::vector<Run>& out) const {
  walk(offset, length, out, kAllRuns, true);
}

uint64_t VirtualFile::walk(uint64_t offset, uint64_t length, std::vector<Run>& out, size_t max_runs,
                           bool cover) const {
  const Impl& f = *impl_;
  if (offset >= f.size || f.sizes_only) return 0;
  const uint64_t end = offset + std::min(length, f.size - offset);
  auto it = std::upper_bound(f.pieces.begin(), f.pieces.end(), offset,
                             [](uint64_t off, const Piece& p) { return off < p.start; });
  for (--it; it != f.pieces.end() && it->start < end; ++it) {
    if (out.size() > max_runs) return 0;
    const uint64_t from = std::max(offset, it->start) - it->start;
    const uint64_t to = std::min(end, it->start + it->length) - it->start;
    switch (it->kind) {
      case PieceKind::Bytes:
        if (!cover) append_run(out, Run{f.arena.data() + it->pos + from, 0, 0, to - from});
        break;
      case PieceKind::Source:
        append_run(out, Run{nullptr, it->ref, it->pos + from, to - from});
        break;
      case PieceKind::Tensor:
        if (cover)
          f.tensors[it->ref]->cover(it->pos + from, it->pos + to, out);
        else
          f.tensors[it->ref]->map(it->pos + from, it->pos + to, out, max_runs);
        break;
      case PieceKind::Strided:
        f.strided[it->ref]->map(it->pos + from, it->pos + to, out, max_runs);
        break;
      case PieceKind::Grid:
        f.grids[it->ref]->map(it->pos + from, it->pos + to, out, max_runs);
        break;
    }
  }
  return out.size() > max_runs ? 0 : end - offset;
}

VirtualFile::Builder::Builder() : impl_(std::make_unique<Impl>()) {}
VirtualFile::Builder::Builder(bool sizes_only) : Builder() { impl_->sizes_only = sizes_only; }
VirtualFile::Builder::~Builder() = default;

bool VirtualFile::Builder::sizes_only() const { return impl_->sizes_only; }

void VirtualFile::Builder::add_bytes(uint64_t length) {
  if (!impl_->sizes_only) throw std::logic_error("VirtualFile::Builder: bytes not given");
  Piece piece;
  piece.length = length;
  impl_->add(piece);
}

void VirtualFile::Builder::add_bytes(std::string bytes) {
  if (impl_->sizes_only) return add_bytes(uint64_t{bytes.size()});
  Piece piece;
  piece.kind = PieceKind::Bytes;
  piece.pos = impl_->arena.size();
  piece.length = bytes.size();
  // A safetensors header is the whole arena: taken over, not copied.
  if (impl_->arena.empty())
    impl_->arena = std::move(bytes);
  else
    impl_->arena += bytes;
  impl_->add(piece);
}

void VirtualFile::Builder::add_source_range(uint32_t source, uint64_t offset, uint64_t length) {
  Piece piece;
  piece.kind = PieceKind::Source;
  piece.ref = source;
  piece.pos = offset;
  piece.length = length;
  impl_->add(piece);
  impl_->add_source(source);
}

void VirtualFile::Builder::add_source_record(uint32_t source, uint64_t offset, uint64_t length,
                                             std::string name) {
  if (length > 0 && !impl_->sizes_only)
    impl_->copied.push_back({impl_->size, length, std::move(name)});
  add_source_range(source, offset, length);
}

void VirtualFile::Builder::add_tensor(std::shared_ptr<const TensorContent> content, uint64_t begin,
                                      uint64_t end) {
  Piece piece;
  piece.kind = PieceKind::Tensor;
  piece.pos = begin;
  piece.length = end - begin;
  for (const SourceBlock& block : content->blocks) impl_->add_source(block.source);
  if (impl_->sizes_only) return impl_->add(piece);
  if (impl_->tensors.empty() || impl_->tensors.back() != content)
    impl_->tensors.push_back(std::move(content));
  piece.ref = static_cast<uint32_t>(impl_->tensors.size() - 1);
  impl_->add(piece);
}

void VirtualFile::Builder::add_strided(std::shared_ptr<const StridedContent> content,
                                       uint64_t begin, uint64_t end) {
  Piece piece;
  piece.kind = PieceKind::Strided;
  piece.pos = begin;
  piece.length = end - begin;
  for (uint32_t source : content->sources()) impl_->add_source(source);
  if (impl_->sizes_only) return impl_->add(piece);
  impl_->strided.push_back(std::move(content));
  piece.ref = static_cast<uint32_t>(impl_->strided.size() - 1);
  impl_->add(piece);
}

void VirtualFile::Builder::add_grid(std::shared_ptr<const GridContent> content, uint64_t begin,
                                    uint64_t end) {
  Piece piece;
  piece.kind = PieceKind::Grid;
  piece.pos = begin;
  piece.length = end - begin;
  for (uint32_t source : content->sources()) impl_->add_source(source);
  if (impl_->sizes_only) return impl_->add(piece);
  impl_->grids.push_back(std::move(content));
  piece.ref = static_cast<uint32_t>(impl_->grids.size() - 1);
  impl_->add(piece);
}

void VirtualFile::Builder::reserve(size_t pieces) { impl_->pieces.reserve(pieces); }

namespace {

// Dropping a container's slack copies it, and for a moment holds both: worth it only for more
// than an eighth (a doubling's slack), not for a reserve's small overestimate.
template <typename Container>
void shrink_if_loose(Container& c) {
  if (c.capacity() - c.size() > c.size() / 8) c.shrink_to_fit();
}

}  // namespace

VirtualFile VirtualFile::Builder::finish() {
  auto& sources = impl_->sources;
  std::sort(sources.begin(), sources.end());
  shrink_if_loose(sources);
  impl_->listed = {};
  shrink_if_loose(impl_->arena);
  shrink_if_loose(impl_->pieces);
  shrink_if_loose(impl_->tensors);
  shrink_if_loose(impl_->strided);
  shrink_if_loose(impl_->grids);
  shrink_if_loose(impl_->copied);
  VirtualFile file;
  auto fresh = std::make_unique<Impl>();
  fresh->sizes_only = impl_->sizes_only;
  file.impl_ = std::exchange(impl_, std::move(fresh));
  return file;
}

}  // namespace ckptfs::plan
