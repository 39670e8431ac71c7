// The tensors of a checkpoint and their global (whole-model) shapes, for `strategy new`: what a
// strategy lays out. Reads only headers, metadata and the scans of the few files it needs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ckptfs/strategy/writer.h"

namespace ckptfs::cli {

struct TensorList {
  std::string what;  // the source, in one phrase: "an hfai checkpoint of 4 PART files"
  std::vector<strategy::TensorShape> tensors;
  size_t left_out = 0;  // entries that are no tensor of one dimension or more (scalars, strings)
};

// `src` is a directory ckptfs mounts, or a ".json" file {"name": [dim, ...], ...}:
// - an hfai checkpoint: its merged model tensors, in hfai's merged order;
// - a MindFormers metadata checkpoint: metadata.json's parameters and global shapes;
// - a unified_safetensors directory: the parts' tensors (not hyper_param.safetensors');
// - rank_<N>/ directories at `step`: without `src_strategy` (and not a MindFormers output/ with
//   its own strategy) rank_0 is one full checkpoint and its tensors are taken as they are; with
//   one, the tensors it lays out, each global shape from the first rank of a stage holding it
//   (its slice shape times the layout's splits), in file order, stage by stage.
// With `rename` (a --rename file), the names a merged view serves (a family whose view takes
// no rename map refuses it); with `unstack_layers`, Megatron-Core's stacked layers one by one as
// --unstack-layers serves them (other families refuse it). Throws Error in one line naming the
// file or directory at fault.
TensorList tensor_shapes(const std::string& src, const std::string& src_strategy,
                         const std::string& step, const std::string& rename = "",
                         bool unstack_layers = false);

}  // namespace ckptfs::cli
