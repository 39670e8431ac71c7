// The DCP family's entry in the source-family registry (family/family.h, view/families.h): a
// directory holding DCP's global .metadata and its .distcp data files, served as one merged
// model.safetensors, or cut for the ranks of a --dst-strategy, built through the planner's public
// API (plan::Plan, plan::VirtualFile). Thread-safety: free functions of their arguments; kFamily is
// an immutable constant.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ckptfs/dcp/dcp.h"
#include "ckptfs/family/family.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/model_files.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::dcp {

// The views of the checkpoint `metadata` describes, whose data files are `files` (the scans of
// metadata.files, in that order, each taken against this very .metadata). Each tensor is served
// under its checkpoint key, or the name model_files.rename gives it. Without `dst`: the root
// files plan::add_model_files makes ({"format":"pt"}, the safetensors writer's layout): one
// model.safetensors, or save_pretrained's shards of model_files.shard_size and their index. Each
// tensor's bytes are read in C order from its chunks, which may tile it in any way (DTensor's
// Shard(d) splits, uneven and empty last shards, replicas saved once), each chunk a strided view.
// With `dst`: the tensors, in .metadata's order, cut for every target rank of `dst`
// (plan::add_full_views); a tensor of several chunks that do not tile it as a grid must then
// have each stored in C order.
// Non-tensor items are not served: the plan's warnings name them in one line. `dir` names the
// checkpoint in messages. Throws Error naming the tensor for a scan that does not match the
// metadata, a dtype safetensors cannot hold, what the rename map and add_full_views refuse.
plan::Plan make_dcp_plan(std::vector<index::IndexedSource> files, const Metadata& metadata,
                         const std::string& dir, const strategy::Strategy* dst = nullptr,
                         const plan::ViewOptions& views = {},
                         const plan::ModelFileOptions& model_files = {});

// The tensors of `metadata` and their global shapes under the names the view serves them (the
// rename map of in.model_files applied), as `strategy new` lays them out; `what` describes the
// checkpoint.
family::ModelTensors served_tensors(const Metadata& metadata, const family::ViewInputs& in,
                                    std::string what);

// What a family whose checkpoints are DCP directories with more around them (Megatron-Core's
// torch_dist) changes before planning: the parsed .metadata and the scans of its data files.
using Adjust = std::function<void(Metadata& metadata, std::vector<index::IndexedSource>& files)>;

// The DCP view of the checkpoint at in.found whose .metadata is `metadata` (`dir` names it in
// messages): refuses --src-strategy, --view without safetensors and --ranks or --by-stage without
// --dst-strategy; scans metadata.files through in.scan, each scan taken again if it was made
// against another .metadata; calls `adjust` (if any); then make_dcp_plan.
plan::Plan plan_dcp_view(const family::ViewInputs& in, Metadata metadata, const std::string& dir,
                         const Adjust& adjust = nullptr);
// Throws Error unless in.src_strategy is empty: the layout is .metadata's.
void refuse_src_strategy(const family::ViewInputs& in);

// The DCP family: detect, the .distcp reader, the merged view, the data files to index.
extern const family::Family kFamily;

}  // namespace ckptfs::dcp
