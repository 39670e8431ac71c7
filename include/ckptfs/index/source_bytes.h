// Bytes of a source at the offsets of its scan, for the few checks above the read path that
// look at a value (the step counters): a plain source's file, an encrypted source's plaintext
// (FileScan::encrypted: its extents are plaintext offsets) through a decrypted stream.
//
// Thread-safety: the returned function may be called from one thread at a time per call of
// source_reader; distinct calls share nothing.
#pragma once

#include "ckptfs/index/store.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::index {

// Throws Error naming the file (an encrypted source without a key, or whose block no longer
// decrypts).
ReadExact source_reader(const IndexedSource& source);

}  // namespace ckptfs::index
