// The readers of MindSpore's own sources, in the order they are asked: a torch.save zip by its
// first bytes (whatever its name), a safetensors file by its name (as MindSpore tells it), else a
// .ckpt protobuf. The families of MindSpore rank directories, unified_safetensors, MindFormers
// metadata and hfai all read their files with it; it is also what the index scans with when its
// caller names no readers. A family with files of its own passes its own list instead.
// Thread-safety: an immutable constant; safe from any thread.
#pragma once

#include "ckptfs/scan/reader.h"

namespace ckptfs::index {

scan::Readers mindspore_readers();

}  // namespace ckptfs::index
