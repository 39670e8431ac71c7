#include "ckptfs/plan/read_map.h"

#include <algorithm>
#include <span>

#include "append_run.h"

namespace ckptfs::plan {

namespace {

// Emits block bytes [pos, pos + length) of `param`, whose content may span several records.
void emit_block_bytes(const SourceBlock& block, uint64_t pos, uint64_t length,
                      std::vector<Run>& out) {
  for (const scan::Extent& extent : block.param->content) {
    if (length == 0) return;
    if (pos >= extent.length) {
      pos -= extent.length;
      continue;
    }
    const uint64_t n = std::min(length, extent.length - pos);
    append_run(out, Run{nullptr, block.source, extent.offset + pos, n});
    length -= n;
    pos = 0;
  }
}

}  // namespace

uint64_t TensorContent::nbytes() const {
  uint64_t n = element_size;
  for (int64_t d : target_shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The target box is walked in C order as runs that are contiguous in the target AND in one
// source block. Dimensions after `c` are covered whole and aligned (the target's extent equals
// one block's), so a run is a segment along dimension c, cut where source blocks change, times
// everything inside it. Only the first run's position is found by division; each next run's
// follows from the last one's (the next block along c, or the next row: the dimensions before c
// count up as an odometer), so a run costs a few additions, whatever its length. Divisions were
// half of the mapping's time, and a resharded view maps ~1.6M runs per 0.25 GiB read.
void TensorContent::map(uint64_t begin, uint64_t end, std::vector<Run>& out,
                        size_t max_runs) const {
  const size_t k = target_shape.size();
  const uint64_t e = element_size;
  if (begin >= end || e == 0 || k == 0) return;

  size_t c = k - 1;
  while (c > 0 && target_shape[c] == block_shape[c] && target_begin[c] % block_shape[c] == 0) --c;
  uint64_t inner = 1;
  for (size_t j = c + 1; j < k; ++j) inner *= static_cast<uint64_t>(target_shape[j]);
  const uint64_t row = static_cast<uint64_t>(target_shape[c]) * inner;

  // Offsets that depend only on dimensions after c are the same for every run.
  uint64_t block_stride = inner;  // elements per step of dimension c inside a block
  uint64_t tail_grid = 0;         // grid index contribution of dimensions after c
  uint64_t grid_stride = 1;
  for (size_t j = k; j-- > c + 1;) {
    tail_grid +=
        static_cast<uint64_t>(target_begin[j] / block_shape[j] - first_block[j]) * grid_stride;
    grid_stride *= static_cast<uint64_t>(grid[j]);
  }
  const uint64_t grid_stride_c = grid_stride;

  // Per dimension j < c: the position's coordinate in the target box, its block and its offset
  // in the block, and what a block and an offset add to the grid index and source element.
  struct Digit {
    int64_t x = 0, block = 0, at = 0;
    uint64_t grid_stride = 0, block_stride = 0;
    uint64_t grid_part() const { return static_cast<uint64_t>(block) * grid_stride; }
    uint64_t src_part() const { return static_cast<uint64_t>(at) * block_stride; }
  };
  thread_local std::vector<Digit> digits;  // map() calls nothing that maps
  digits.resize(c);
  uint64_t q = begin / e;  // element holding byte `begin`
  uint64_t outer = q / row;
  uint64_t xc = q % row / inner;
  uint64_t within = q % row % inner;
  // The dimensions before c's share of the grid index and the source element: grid parts are
  // counted from block 0 (first_block's share is taken off once, in `grid_base`).
  uint64_t outer_grid = 0, outer_src = 0, grid_base = tail_grid;
  {
    uint64_t gstride = grid_stride_c * static_cast<uint64_t>(grid[c]);
    uint64_t bstride = block_stride * static_cast<uint64_t>(block_shape[c]);
    for (size_t j = c; j-- > 0;) {
      Digit& d = digits[j];
      d.x = static_cast<int64_t>(outer % static_cast<uint64_t>(target_shape[j]));
      outer /= static_cast<uint64_t>(target_shape[j]);
      const int64_t g = target_begin[j] + d.x;
      d.block = g / block_shape[j];
      d.at = g - d.block * block_shape[j];
      d.grid_stride = gstride;
      d.block_stride = bstride;
      outer_grid += d.grid_part();
      outer_src += d.src_part();
      grid_base -= static_cast<uint64_t>(first_block[j]) * gstride;
      gstride *= static_cast<uint64_t>(grid[j]);
      bstride *= static_cast<uint64_t>(block_shape[j]);
    }
  }
  // Along c: the block and the offset in it.
  int64_t bc = (target_begin[c] + static_cast<int64_t>(xc)) / block_shape[c];
  int64_t at_c = target_begin[c] + static_cast<int64_t>(xc) - bc * block_shape[c];

  while (q * e < end && out.size() <= max_runs) {
    const uint64_t seg_end = std::min<uint64_t>(
        target_shape[c], static_cast<uint64_t>((bc + 1) * block_shape[c] - target_begin[c]));
    const uint64_t run_elems = (seg_end - xc) * inner - within;
    const uint64_t grid_index =
        grid_base + static_cast<uint64_t>(bc - first_block[c]) * grid_stride_c + outer_grid;
    const uint64_t src_elem = static_cast<uint64_t>(at_c) * block_stride + within + outer_src;
    const uint64_t run_begin = std::max(q * e, begin);
    const uint64_t run_end = std::min((q + run_elems) * e, end);
    emit_block_bytes(blocks[grid_index], src_elem * e + (run_begin - q * e), run_end - run_begin,
                     out);
    q += run_elems;
    within = 0;
    if (seg_end < static_cast<uint64_t>(target_shape[c])) {  // the next block along c
      xc = seg_end;
      ++bc;
      at_c = 0;
      continue;
    }
    // The next row: back to the start along c, and one step of the dimensions before it.
    xc = 0;
    bc = target_begin[c] / block_shape[c];
    at_c = target_begin[c] - bc * block_shape[c];
    for (size_t j = c; j-- > 0;) {
      Digit& d = digits[j];
      outer_grid -= d.grid_part();
      outer_src -= d.src_part();
      const bool carry = ++d.x == target_shape[j];
      if (carry) {
        d.x = 0;
        d.block = target_begin[j] / block_shape[j];
        d.at = target_begin[j] - d.block * block_shape[j];
      } else if (++d.at == block_shape[j]) {
        d.at = 0;
        ++d.block;
      }
      outer_grid += d.grid_part();
      outer_src += d.src_part();
      if (!carry) break;
    }
  }
}

void TensorContent::cover(uint64_t begin, uint64_t end, std::vector<Run>& out) const {
  const size_t k = target_shape.size();
  const uint64_t e = element_size;
  if (begin >= end || e == 0 || k == 0) return;
  // The target rows (first dimension) the range meets, then the source block rows they are.
  const uint64_t row_bytes = nbytes() / static_cast<uint64_t>(target_shape[0]);
  if (row_bytes == 0) return;
  const int64_t first_row = target_begin[0] + static_cast<int64_t>(begin / row_bytes);
  const int64_t end_row = target_begin[0] + static_cast<int64_t>((end - 1) / row_bytes) + 1;
  uint64_t block_row_bytes = e;  // one row of a source block
  for (size_t j = 1; j < k; ++j) block_row_bytes *= static_cast<uint64_t>(block_shape[j]);
  size_t per_slab = 1;  // blocks of the grid at one block index along the first dimension
  for (size_t j = 1; j < k; ++j) per_slab *= static_cast<size_t>(grid[j]);
  for (int64_t b = first_row / block_shape[0]; b * block_shape[0] < end_row; ++b) {
    const int64_t lo = std::max(first_row, b * block_shape[0]) - b * block_shape[0];
    const int64_t hi = std::min(end_row, (b + 1) * block_shape[0]) - b * block_shape[0];
    const size_t slab = static_cast<size_t>(b - first_block[0]) * per_slab;
    for (size_t i = 0; i < per_slab; ++i)
      emit_block_bytes(blocks[slab + i], static_cast<uint64_t>(lo) * block_row_bytes,
                       static_cast<uint64_t>(hi - lo) * block_row_bytes, out);
  }
}

namespace {
// The bytes of a C-order tensor of `shape`: what a strided or grid content reads out.
uint64_t dense_bytes(uint64_t element_size, std::span<const int64_t> shape) {
  uint64_t n = element_size;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}
}  // namespace

uint64_t StridedContent::nbytes() const { return dense_bytes(element_size, shape); }

void StridedContent::map(uint64_t begin, uint64_t end, std::vector<Run>& out,
                         size_t max_runs) const {
  const uint64_t e = element_size;
  if (begin >= end || e == 0) return;
  // Trailing dimensions laid out densely in the source form one run.
  size_t k = shape.size();
  uint64_t run = 1;
  while (k > 0 && (shape[k - 1] == 1 || static_cast<uint64_t>(strides[k - 1]) == run)) {
    run *= static_cast<uint64_t>(shape[k - 1]);
    --k;
  }
  for (uint64_t q = begin / e; q * e < end && out.size() <= max_runs;) {
    const uint64_t within = q % run;
    uint64_t outer = q / run;
    uint64_t src = storage_offset + within;
    for (size_t j = k; j-- > 0;) {
      const auto extent = static_cast<uint64_t>(shape[j]);
      src += (outer % extent) * static_cast<uint64_t>(strides[j]);
      outer /= extent;
    }
    const uint64_t run_begin = std::max(q * e, begin);
    const uint64_t run_end = std::min((q - within + run) * e, end);
    emit_storage_bytes(src * e + (run_begin - q * e), run_end - run_begin, out);
    q += run - within;
  }
}

void StridedContent::emit_storage_bytes(uint64_t pos, uint64_t length,
                                        std::vector<Run>& out) const {
  if (!pieces) {
    append_run(out, Run{nullptr, source, base + pos, length});
    return;
  }
  auto it = std::upper_bound(pieces->begin(), pieces->end(), pos,
                             [](uint64_t p, const StoragePiece& piece) { return p < piece.start; });
  for (--it; length > 0; ++it) {
    const uint64_t within = pos - it->start;
    const uint64_t n = std::min(length, it->length - within);
    append_run(out, Run{nullptr, it->source, it->offset + within, n});
    pos += n;
    length -= n;
  }
}

StridedContent StridedContent::box(const std::vector<int64_t>& begin,
                                   const std::vector<int64_t>& extent) const {
  StridedContent out = *this;
  out.shape = extent;
  for (size_t k = 0; k < begin.size(); ++k)
    out.storage_offset += static_cast<uint64_t>(begin[k]) * static_cast<uint64_t>(strides[k]);
  return out;
}

std::vector<uint32_t> StridedContent::sources() const {
  if (!pieces) return {source};
  std::vector<uint32_t> out;
  for (const StoragePiece& piece : *pieces) out.push_back(piece.source);
  return out;
}

uint64_t GridContent::nbytes() const { return dense_bytes(element_size, shape); }

void GridContent::map(uint64_t begin, uint64_t end, std::vector<Run>& out, size_t max_runs) const {
  const uint64_t e = element_size;
  const size_t k = shape.size();
  if (begin >= end || e == 0) return;
  if (k == 0) return cells[0]->map(begin, end, out, max_runs);
  // `split`: the last dimension cut into several cells (every cell is whole after it).
  size_t split = 0;
  for (size_t d = 0; d < k; ++d)
    if (cuts[d].size() > 2) split = d;
  uint64_t inner = 1;
  for (size_t d = split + 1; d < k; ++d) inner *= static_cast<uint64_t>(shape[d]);
  std::vector<int64_t> x(k);
  for (uint64_t q = begin / e; q * e < end && out.size() <= max_runs;) {
    uint64_t rest = q;
    for (size_t d = k; d-- > 0;) {
      x[d] = static_cast<int64_t>(rest % static_cast<uint64_t>(shape[d]));
      rest /= static_cast<uint64_t>(shape[d]);
    }
    // The cell holding x, and x's element index in that cell's C order.
    uint64_t cell = 0, local = 0;
    int64_t split_end = 0;
    for (size_t d = 0; d < k; ++d) {
      const std::vector<int64_t>& c = cuts[d];
      const size_t i =
          static_cast<size_t>(std::upper_bound(c.begin(), c.end(), x[d]) - c.begin()) - 1;
      cell = cell * (c.size() - 1) + i;
      local = local * static_cast<uint64_t>(c[i + 1] - c[i]) + static_cast<uint64_t>(x[d] - c[i]);
      if (d == split) split_end = c[i + 1];
    }
    const uint64_t within = q % inner;
    const uint64_t run = static_cast<uint64_t>(split_end - x[split]) * inner - within;
    const uint64_t run_begin = std::max(q * e, begin);
    const uint64_t run_end = std::min((q + run) * e, end);
    cells[cell]->map(local * e + (run_begin - q * e), local * e + (run_end - q * e), out, max_runs);
    q += run;
  }
}

GridContent GridContent::box(const std::vector<int64_t>& begin,
                             const std::vector<int64_t>& extent) const {
  const size_t k = shape.size();
  GridContent out;
  out.element_size = element_size;
  out.shape = extent;
  out.cuts.resize(k);
  std::vector<size_t> first(k), grid(k), count(k);
  for (size_t d = 0; d < k; ++d) {
    const std::vector<int64_t>& c = cuts[d];
    const int64_t lo = begin[d], hi = lo + extent[d];
    size_t i = static_cast<size_t>(std::upper_bound(c.begin(), c.end(), lo) - c.begin()) - 1;
    if (i + 1 == c.size()) --i;  // an empty box at the end of the dimension
    first[d] = i;
    grid[d] = c.size() - 1;
    out.cuts[d] = {0};
    do {
      out.cuts[d].push_back(std::min(c[i + 1], hi) - lo);
      ++i;
    } while (i + 1 < c.size() && c[i] < hi);
    count[d] = out.cuts[d].size() - 1;
  }
  // The new grid's cells in C order, each the box of the old cell it lies in.
  std::vector<size_t> j(k, 0);
  std::vector<int64_t> at(k), size(k);
  for (bool more = true; more;) {
    size_t cell = 0;
    for (size_t d = 0; d < k; ++d) {
      const size_t i = first[d] + j[d];
      cell = cell * grid[d] + i;
      at[d] = std::max(begin[d], cuts[d][i]) - cuts[d][i];
      size[d] = out.cuts[d][j[d] + 1] - out.cuts[d][j[d]];
    }
    out.cells.push_back(std::make_shared<const StridedContent>(cells[cell]->box(at, size)));
    more = false;
    for (size_t d = k; d-- > 0;) {
      if (++j[d] < count[d]) {
        more = true;
        break;
      }
      j[d] = 0;
    }
  }
  return out;
}

std::vector<uint32_t> GridContent::sources() const {
  std::vector<uint32_t> out;
  for (const auto& cell : cells)
    for (uint32_t s : cell->sources()) out.push_back(s);
  return out;
}

}  // namespace ckptfs::plan
