// Content of one resharded tensor: the target box of a global tensor, and the source blocks
// that tile it. map() turns a byte range of that content into source runs arithmetically, in C
// order, with no per-element work and without touching tensor bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/plan/virtual_file.h"

namespace ckptfs::plan {

// One source block: the file it is read from and that file's record of the parameter (whose
// content extents hold the block in C order, possibly cut into several records).
struct SourceBlock {
  uint32_t source = 0;
  const ckpt::Param* param = nullptr;
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
  // Appends runs for content bytes [begin, end) (begin <= end <= nbytes()).
  void map(uint64_t begin, uint64_t end, std::vector<Run>& out) const;
};

// A strided view of one source storage (a torch.save tensor): element (i0, ..., in) is at
// byte base + (storage_offset + sum ik * strides[k]) * element_size of `source`. map() walks the
// tensor in C order as runs as long as the trailing dimensions are contiguous in the source:
// O(rank) arithmetic per run, nothing per element within a run.
struct StridedContent {
  uint32_t source = 0;
  uint64_t base = 0;
  uint32_t element_size = 0;
  uint64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  uint64_t nbytes() const;
  // Appends runs for content bytes [begin, end) (begin <= end <= nbytes()).
  void map(uint64_t begin, uint64_t end, std::vector<Run>& out) const;
};

}  // namespace ckptfs::plan
