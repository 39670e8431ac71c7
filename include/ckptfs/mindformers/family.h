// The MindFormers metadata family's entry in the registry (view/families.h): a Checkpoint 2.0
// tree (latest_checkpointed_iteration.txt, or one iteration_<N>/ of metadata.json and
// safetensors files), viewed through plan::make_located_plan with metadata.json's layouts.
// Thread-safety: an immutable constant; its functions keep no state.
#pragma once

#include "ckptfs/family/family.h"

namespace ckptfs::mindformers {

extern const family::Family kFamily;

}  // namespace ckptfs::mindformers
