#include "geometry.h"

#include <algorithm>
#include <numeric>

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
  // Sweep along dimension 0: only chunks whose first-axis ranges meet are compared.
  if (!t.shape.empty()) {
    std::sort(filled.begin(), filled.end(),
              [&](size_t a, size_t b) { return t.chunks[a].offsets[0] < t.chunks[b].offsets[0]; });
    for (size_t i = 0; i < filled.size(); ++i) {
      const Chunk& a = t.chunks[filled[i]];
      for (size_t j = i + 1; j < filled.size(); ++j) {
        const Chunk& b = t.chunks[filled[j]];
        if (b.offsets[0] >= a.offsets[0] + a.sizes[0]) break;
        if (overlap(a, b))
          fail(
              "{}: tensor {} has chunks at {} (sizes {}) and at {} (sizes {}) that overlap: "
              "the checkpoint is damaged",
              name, tensor, shape_text(a.offsets), shape_text(a.sizes), shape_text(b.offsets),
              shape_text(b.sizes));
      }
    }
  } else if (filled.size() > 1) {
    fail("{}: scalar tensor {} is stored {} times: the checkpoint is damaged", name, tensor,
         filled.size());
  }
  if (covered != total)
    fail(
        "{}: the chunks of tensor {} (shape {}) hold {} of its {} elements: the checkpoint "
        "is incomplete or damaged",
        name, tensor, shape_text(t.shape), static_cast<uint64_t>(covered),
        static_cast<uint64_t>(total));
}

}  // namespace ckptfs::dcp
