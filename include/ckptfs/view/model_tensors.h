// The tensors of a checkpoint and their global (whole-model) shapes: what `ckptfs strategy new`
// lays out. A family that knows its model's shapes says them (family::Family::tensors); for
// MindSpore rank directories they are taken from one rank's file (no source strategy: rank_0 is
// the whole model) or from the first rank of each stage times the source strategy's splits.
// Reads only headers, metadata and the scans of the few files it needs.
// Thread-safety: a free function of its arguments; any thread.
#pragma once

#include "ckptfs/family/family.h"
#include "ckptfs/view/view.h"

namespace ckptfs::view {

// SRC_DIR (args.src_dir) at args.step, with args.src_strategy if given, through the index as a
// view reads it. Scalars and strings are listed with tensor = false or an empty shape. Throws
// Error in one line naming the file or directory at fault.
family::ModelTensors model_tensors(const ViewArgs& args);

}  // namespace ckptfs::view
