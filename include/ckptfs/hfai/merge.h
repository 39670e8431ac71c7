// An hfai sharded checkpoint (spec torch-hfai-safetensors.md §1): the PART files' scans merged
// the way hfai.checkpoint.load merges them (§1.7), as lists of logical tensors that point into
// the files, without reading any tensor byte. Validation follows §1.8: every failure is one
// line naming the file and the key. Works on scans only (no wire format); not thread-bound.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/index/store.h"

namespace ckptfs::hfai {

// Where a part of a merged tensor lies: params[param] of sources[source].
struct Part {
  uint32_t source = 0;
  uint32_t param = 0;
};

// One merged tensor. One part: the tensor is that view (any strides). Several: 1-D contiguous
// chunks whose concatenation, in order, is the tensor in C order.
struct Tensor {
  std::string name;
  std::string code;  // safetensors dtype code
  uint32_t element_size = 0;
  std::vector<int64_t> shape;
  std::vector<Part> parts;
};

struct Merged {
  std::vector<Tensor> model;      // merged order; names "<key>" (one model) or "<j>.<key>"
  std::vector<Tensor> optimizer;  // "state.<param_id>.<key>" (one optimizer) or "<j>.state..."
  std::vector<Tensor> others;     // tensors among the user's values: "<key>[.<inner>...]"
  // Everything else, in the fixtures' type-preserving JSON encoding, key order kept: the merged
  // object without "model", each tensor as {"$tensor": "<file>:<name>"}.
  nlohmann::ordered_json extra;
};

// The PART files of `dir` (PART_000.pt .. PART_<n-1>.pt, 3 or more digits), in rank order.
// Throws Error naming the directory and the missing, extra or misnumbered file.
std::vector<std::filesystem::path> part_files(const std::filesystem::path& dir);
// True if `dir` holds any PART_*.pt entry.
bool is_hfai_dir(const std::filesystem::path& dir);

// `parts` are the scans of part_files(dir), in rank order.
Merged merge(const std::vector<index::IndexedSource>& parts);

}  // namespace ckptfs::hfai
