#include "geometry.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs::dcp {

namespace {

bool overlap(const Chunk& a, const Chunk& b) {
  for (size_t k = 0; k < a.offsets.size(); ++k)
    if (a.offsets[k] >= b.offsets[k] + b.sizes[k] || b.offsets[k] >= a.offsets[k] + a.sizes[k])
      return false;
  return true;
}

using Pair = std::optional<std::pair<size_t, size_t>>;

// When the chunks are the cells of one grid (on each axis the cuts are the chunks' offsets and
// the dimension's end, and each chunk spans one cell), as every DTensor placement gives: two
// of them overlap only if they are the same cell, found by sorting, in n log n. Sets `grid`
// false when the chunks are not such cells.
Pair grid_overlap(const Tensor& t, const std::vector<size_t>& filled, bool& grid) {
  const size_t rank = t.shape.size();
  std::vector<std::vector<int64_t>> cuts(rank);
  for (size_t k = 0; k < rank; ++k) {
    for (size_t i : filled) cuts[k].push_back(t.chunks[i].offsets[k]);
    cuts[k].push_back(t.shape[k]);
    std::sort(cuts[k].begin(), cuts[k].end());
    cuts[k].erase(std::unique(cuts[k].begin(), cuts[k].end()), cuts[k].end());
  }
  std::vector<uint32_t> cells(filled.size() * rank);  // each chunk's cell, axis by axis
  for (size_t n = 0; n < filled.size(); ++n) {
    const Chunk& c = t.chunks[filled[n]];
    for (size_t k = 0; k < rank; ++k) {
      const auto at = std::lower_bound(cuts[k].begin(), cuts[k].end(), c.offsets[k]);
      // Filled chunks have sizes >= 1, so their offsets lie before the dimension's end.
      if (c.sizes[k] != *(at + 1) - c.offsets[k]) {
        grid = false;
        return std::nullopt;
      }
      cells[n * rank + k] = static_cast<uint32_t>(at - cuts[k].begin());
    }
  }
  grid = true;
  std::vector<size_t> order(filled.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto cell = [&](size_t n) { return std::span(cells).subspan(n * rank, rank); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::ranges::lexicographical_compare(cell(a), cell(b));
  });
  for (size_t i = 1; i < order.size(); ++i)
    if (std::ranges::equal(cell(order[i - 1]), cell(order[i])))
      return std::make_pair(filled[order[i - 1]], filled[order[i]]);
  return std::nullopt;
}

// Chunks that are not one grid: a sweep along the axis with the most distinct offsets, which
// compares only chunks whose ranges on it meet. That can still be quadratic for a hostile
// arrangement, so past kMaxComparisons the tensor is refused (DCP's own planners write grids).
constexpr uint64_t kMaxComparisons = uint64_t{1} << 26;

Pair swept_overlap(const std::string& name, const Tensor& t, std::vector<size_t> filled) {
  size_t axis = 0, most = 0;
  for (size_t k = 0; k < t.shape.size(); ++k) {
    std::vector<int64_t> offsets;
    for (size_t i : filled) offsets.push_back(t.chunks[i].offsets[k]);
    std::sort(offsets.begin(), offsets.end());
    const auto distinct =
        static_cast<size_t>(std::unique(offsets.begin(), offsets.end()) - offsets.begin());
    if (distinct > most) axis = k, most = distinct;
  }
  std::sort(filled.begin(), filled.end(), [&](size_t a, size_t b) {
    return t.chunks[a].offsets[axis] < t.chunks[b].offsets[axis];
  });
  uint64_t comparisons = 0;
  for (size_t i = 0; i < filled.size(); ++i) {
    const Chunk& a = t.chunks[filled[i]];
    for (size_t j = i + 1; j < filled.size(); ++j) {
      const Chunk& b = t.chunks[filled[j]];
      if (b.offsets[axis] >= a.offsets[axis] + a.sizes[axis]) break;
      if (overlap(a, b)) return std::make_pair(filled[i], filled[j]);
      if (++comparisons > kMaxComparisons)
        fail(
            "{}: tensor {} has {} chunks that are not cells of one grid, too many to check for "
            "overlaps (over {} comparisons); DCP's planners write grids: the metadata is damaged "
            "or hostile",
            name, file_text(t.fqn), filled.size(), kMaxComparisons);
    }
  }
  return std::nullopt;
}

Pair overlapping_pair(const std::string& name, const Tensor& t, const std::vector<size_t>& filled) {
  bool grid = false;
  const Pair pair = grid_overlap(t, filled, grid);
  return grid ? pair : swept_overlap(name, t, filled);
}

}  // namespace

void check_chunks(const std::string& name, const Tensor& t) {
  const std::string tensor = file_text(t.fqn);
  unsigned __int128 total = 1;
  for (int64_t d : t.shape) {
    if (d < 0) fail("{}: tensor {} has shape {}", name, tensor, shape_text(t.shape));
    total *= static_cast<uint64_t>(d);
    if (total > UINT64_MAX) fail("{}: tensor {} has a shape past 64 bits", name, tensor);
  }
  unsigned __int128 covered = 0;
  std::vector<size_t> filled;  // chunks with elements
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const Chunk& c = t.chunks[i];
    if (c.offsets.size() != t.shape.size() || c.sizes.size() != t.shape.size())
      fail("{}: tensor {} of shape {} has a chunk at {} of sizes {}: not of its rank", name, tensor,
           shape_text(t.shape), shape_text(c.offsets), shape_text(c.sizes));
    unsigned __int128 n = 1;
    for (size_t k = 0; k < t.shape.size(); ++k) {
      // Also refuses negatives; a zero-size chunk at offset == dim passes (pytorch PR #150862).
      if (c.offsets[k] < 0 || c.sizes[k] < 0 || c.offsets[k] > t.shape[k] ||
          c.sizes[k] > t.shape[k] - c.offsets[k])
        fail(
            "{}: tensor {} of shape {} has a chunk at {} of sizes {} outside it (dimension "
            "{}): the checkpoint is damaged",
            name, tensor, shape_text(t.shape), shape_text(c.offsets), shape_text(c.sizes), k);
      n *= static_cast<uint64_t>(c.sizes[k]);
    }
    covered += n;
    if (n > 0) filled.push_back(i);
  }
  if (t.shape.empty()) {
    if (filled.size() > 1)
      fail("{}: scalar tensor {} is stored {} times: the checkpoint is damaged", name, tensor,
           filled.size());
  } else if (const auto pair = overlapping_pair(name, t, filled)) {
    const Chunk& a = t.chunks[pair->first];
    const Chunk& b = t.chunks[pair->second];
    fail(
        "{}: tensor {} has chunks at {} (sizes {}) and at {} (sizes {}) that overlap: "
        "the checkpoint is damaged",
        name, tensor, shape_text(a.offsets), shape_text(a.sizes), shape_text(b.offsets),
        shape_text(b.sizes));
  }
  if (covered != total)
    fail(
        "{}: the chunks of tensor {} (shape {}) hold {} of its {} elements: the checkpoint "
        "is incomplete or damaged",
        name, tensor, shape_text(t.shape), static_cast<uint64_t>(covered),
        static_cast<uint64_t>(total));
}

}  // namespace ckptfs::dcp
