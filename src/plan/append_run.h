// Shared by the virtual file and the read map: appends a run, merging it into the previous one
// when both are contiguous pieces of the same memory or the same source file.
#pragma once

#include <vector>

#include "ckptfs/plan/virtual_file.h"

namespace ckptfs::plan {

void append_run(std::vector<Run>& out, const Run& run);

}  // namespace ckptfs::plan
