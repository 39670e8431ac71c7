// The unified_safetensors family's entry in the registry (view/families.h): MindSpore's one full
// checkpoint in part<i>.safetensors files beside param_name_map.json (source/unified.h reads
// the map), viewed through plan::make_unified_plan.
// Thread-safety: an immutable constant; its functions keep no state.
#pragma once

#include "ckptfs/family/family.h"

namespace ckptfs::family {

extern const Family kUnified;

}  // namespace ckptfs::family
