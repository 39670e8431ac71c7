// Content of one resharded tensor: the target box of a global tensor, and the source blocks
// that tile it. map() turns a byte range of that content into source runs arithmetically, in C
// order, with no per-element work and without touching tensor bytes.
// Thread-safety: immutable once built (the planner shares them as shared_ptr<const>); map() and
// the other const members may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ckptfs/plan/virtual_file.h"
#include "ckptfs/scan/file_scan.h"

namespace ckptfs::plan {

// One source block: the file it is read from and that file's record of the parameter (whose
// content extents hold the block in C order, possibly cut into several records).
struct SourceBlock {
  uint32_t source = 0;
  const scan::Param* param = nullptr;
};

struct TensorContent {
  uint32_t element_size = 0;
  std::vector<int64_t> target_begin;  // target box, global coordinates (rank >= 1)
  std::vector<int64_t> target_shape;
  std::vector<int64_t> block_shape;  // extent of every source block
  std::vector<int64_t> first_block;  // block coordinates of the first intersecting block
  std::vector<int64_t> grid;         // intersecting blocks along each dimension
  std::vector<SourceBlock> blocks;   // product(grid) blocks, C order over the grid

  uint64_t nbytes() const;
  // Appends runs for content bytes [begin, end) (begin <= end <= nbytes()). Stops as soon as
  // `out` holds more than `max_runs` runs (those then cover only a prefix of the range): a caller
  // that only needs to know whether there are more than that need not map thousands.
  void map(uint64_t begin, uint64_t end, std::vector<Run>& out, size_t max_runs = kAllRuns) const;
  // Appends runs holding every source byte that map(begin, end) would, as whole rows (along the
  // first dimension) of the source blocks met: also bytes of other boxes' columns. For read-ahead,
  // which wants the stretches of the sources a window reads, not its ~100k runs: O(blocks met).
  void cover(uint64_t begin, uint64_t end, std::vector<Run>& out) const;
};

// A piece of a storage kept in several files (an hfai tensor's torch.chunk pieces): storage
// bytes [start, start + length) are at `offset` of `source`.
struct StoragePiece {
  uint64_t start = 0;
  uint32_t source = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A strided view of one storage (a torch.save tensor): element (i0, ..., in) is storage byte
// (storage_offset + sum ik * strides[k]) * element_size, which is at that offset from `base` in
// `source`, or, with `pieces`, in the piece holding it. map() walks the tensor in C order as runs
// as long as the trailing dimensions are contiguous in the storage: O(rank) arithmetic per run
// (plus a search among the pieces), nothing per element within a run.
struct StridedContent {
  uint32_t source = 0;
  uint64_t base = 0;
  // Ascending, consecutive from storage byte 0; shared by the boxes cut from one tensor.
  std::shared_ptr<const std::vector<StoragePiece>> pieces;
  uint32_t element_size = 0;
  uint64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  uint64_t nbytes() const;
  // Appends runs for content bytes [begin, end) (begin <= end <= nbytes()). Stops as soon as
  // `out` holds more than `max_runs` runs (those then cover only a prefix of the range): a caller
  // that only needs to know whether there are more than that need not map thousands.
  void map(uint64_t begin, uint64_t end, std::vector<Run>& out, size_t max_runs = kAllRuns) const;
  // The view of the box [begin, begin + extent) of this tensor (extent[k] <= shape[k] - begin[k]).
  StridedContent box(const std::vector<int64_t>& begin, const std::vector<int64_t>& extent) const;
  // Every source file the view may read.
  std::vector<uint32_t> sources() const;

 private:
  // Storage bytes [pos, pos + length), which the pieces (if any) cover.
  void emit_storage_bytes(uint64_t pos, uint64_t length, std::vector<Run>& out) const;
};

// A tensor whose chunks tile it as a grid (a DTensor's shards over a device mesh, even or
// uneven): the cut points along each dimension and, per grid cell, the strided view of the chunk
// holding it. One of these stands for the whole tensor, whatever its row count: describing a
// column-split tensor range by range would take one range per row and chunk. map() walks the
// tensor in C order; from the last dimension cut into several cells every cell holds whole
// trailing rows, so each run is one cell's part of one row there (O(rank log cells) arithmetic,
// then the cell's own map()).
struct GridContent {
  uint32_t element_size = 0;
  std::vector<int64_t> shape;
  // Per dimension, ascending from 0 to shape[d], each cell of non-zero extent.
  std::vector<std::vector<int64_t>> cuts;
  // Product over d of (cuts[d].size() - 1) cells, C order over the grid; each one's shape is its
  // cell's extent.
  std::vector<std::shared_ptr<const StridedContent>> cells;

  uint64_t nbytes() const;
  // Appends runs for content bytes [begin, end) (begin <= end <= nbytes()). Stops as soon as
  // `out` holds more than `max_runs` runs (those then cover only a prefix of the range): a caller
  // that only needs to know whether there are more than that need not map thousands.
  void map(uint64_t begin, uint64_t end, std::vector<Run>& out, size_t max_runs = kAllRuns) const;
  // The box [begin, begin + extent) of this tensor (extent[k] <= shape[k] - begin[k]) as a grid
  // of the boxes of the cells it meets: O(cells) whatever the box's row count. An empty box is
  // one empty cell.
  GridContent box(const std::vector<int64_t>& begin, const std::vector<int64_t>& extent) const;
  // Every source file the cells may read.
  std::vector<uint32_t> sources() const;
};

}  // namespace ckptfs::plan
