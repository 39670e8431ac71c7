// The Megatron-Core torch_dist family's entry in the source-family registry (family/family.h,
// view/families.h): a save root or one iteration directory (megatron/megatron.h), served as the
// DCP family serves its files (dcp::plan_dcp_view: merged model.safetensors, or cut for the ranks
// of a --dst-strategy), model weights only. Distributed-optimizer items (keys optimizer.*: in the
// default dp_reshardable form their boxes are buffers of the optimizer's own layout, not of the
// model's tensors), ShardedObjects and common.pt are not served: one summary line each names
// them. With family::ViewInputs::unstack_layers, stacked layers are served per layer.
// Thread-safety: an immutable constant; its functions keep no state.
#pragma once

#include "ckptfs/family/family.h"

namespace ckptfs::megatron {

extern const family::Family kFamily;

}  // namespace ckptfs::megatron
