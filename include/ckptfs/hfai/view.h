// The views of a merged hfai checkpoint, built through the planner's public API (plan::Plan,
// plan::VirtualFile, plan::add_full_views) and the hfai family's entry in the registry
// (view/families.h): PART_*.pt files, read by the torch.save reader, merged by hfai::merge.
// Thread-safety: free functions of their arguments; kFamily is an immutable constant.
#pragma once

#include <vector>

#include "ckptfs/family/family.h"
#include "ckptfs/hfai/merge.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/model_files.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::hfai {

// A merged hfai checkpoint (hfai::merge of `parts`) as root files: model.safetensors,
// optimizer.safetensors and others.safetensors (where they have tensors) in the reference
// writer's layout with {"format":"pt"}, and extra.json for every other value. Throws Error for a
// dtype safetensors cannot hold, naming the file and tensor.
// With `dst`, the model is not a root file but cut for every target rank (add_full_views, in
// hfai's merged order); the optimizer state stays merged at the root, since hfai keys it by
// parameter index, which names no parameter. Without `dst`, views.ranks and views.by_stage are
// refused (there is nothing to choose among). The model's tensors are served under the names
// model_files.rename gives them; without `dst`, model.safetensors is cut into save_pretrained's
// shards of model_files.shard_size when it is larger (plan::add_model_files).
plan::Plan make_hfai_plan(std::vector<index::IndexedSource> parts, const Merged& merged,
                          const strategy::Strategy* dst = nullptr,
                          const plan::ViewOptions& views = {},
                          const plan::ModelFileOptions& model_files = {});

// The hfai family: a directory holding PART_*.pt files; its view is make_hfai_plan's.
extern const family::Family kFamily;

}  // namespace ckptfs::hfai
