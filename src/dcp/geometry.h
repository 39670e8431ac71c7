// Checks of a DCP tensor's chunk boxes against its global shape (spec torch-dcp-megatron.md
// §1.8): what DCP's save planner checks, done again at read time.
#pragma once

#include <string>

#include "ckptfs/dcp/dcp.h"

namespace ckptfs::dcp {

// Throws Error naming `name` (the .metadata file) and the tensor unless every chunk has the
// tensor's rank, lies inside it (a zero-size chunk may start at the dimension's end), no two
// chunks with elements overlap, and their elements add up to the tensor's.
void check_chunks(const std::string& name, const Tensor& tensor);

}  // namespace ckptfs::dcp
