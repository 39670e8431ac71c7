// The step counters a training run saves in every rank's checkpoint (global_step, epoch_num,
// step_num) must agree across the files a mount combines: files of different steps would give
// tensors that never coexisted. Stateless; safe from any thread (pread only).
#pragma once

#include <cstdint>
#include <map>

#include "ckptfs/index/store.h"

namespace ckptfs::plan {

// Reads the (few-byte) content of each counter every source holds, with pread. Throws Error
// naming the counter and, per value, the ranks and a file holding it, when the values differ;
// or naming the file if a counter cannot be read. Counters a file lacks are not compared.
void check_step_scalars(const std::map<int64_t, index::IndexedSource>& sources);

}  // namespace ckptfs::plan
