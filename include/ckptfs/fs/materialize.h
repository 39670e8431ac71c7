// Writing a view as real files, without FUSE: the same Tree read path a mount serves, so the
// files are byte for byte what the mount shows. Each file is written to ".NAME.partial" in its
// rank directory and renamed to NAME once complete (after fdatasync, with its mtime set to the
// view's), so a file under its final name is always whole. A rerun skips every file whose
// final name already has the view's size and mtime (what a completed write leaves) and
// rewrites the rest from the start.
//
// Memory: `jobs` buffers of kBufferBytes (4 MiB each) besides the tree, whatever the size of
// the tensors or files; work is handed out in segments of kSegmentBytes, so one large file is
// written by several workers at once.
//
// Thread-safety: materialize() may run while other threads read the same Tree (its read path is
// thread-safe), but two calls must not write the same output directory. Its on_bytes and on_file
// callbacks are called from several workers at once and must be thread-safe; on_start is called
// once, on the calling thread, before any worker starts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "ckptfs/fs/tree.h"

namespace ckptfs::fs {

struct MaterializeOptions {
  std::vector<int64_t> ranks;  // target ranks to write; empty: all
  unsigned jobs = 1;           // worker threads, >= 1
  // Called once before writing: bytes and files to write (skipped files not counted).
  std::function<void(uint64_t bytes, size_t files)> on_start;
  // Called from the workers as bytes are written and files completed.
  std::function<void(uint64_t bytes)> on_bytes;
  std::function<void()> on_file;
};

struct MaterializeResult {
  size_t written = 0, skipped = 0;
  uint64_t bytes_written = 0, bytes_skipped = 0;
};

inline constexpr size_t kMaterializeBufferBytes = size_t{4} << 20;
inline constexpr uint64_t kMaterializeSegmentBytes = uint64_t{64} << 20;

// Writes OUT/rank_N/checkpoint_N.ckpt for the chosen targets, creating directories as needed.
// Throws Error naming the rank not in the view, the file that could not be written (and why),
// or the target file whose read failed (a source changed or shrank); files completed before
// stay complete.
MaterializeResult materialize(const Tree& tree, const std::filesystem::path& out,
                              const MaterializeOptions& options);

}  // namespace ckptfs::fs
