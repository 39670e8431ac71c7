// Whether a file looks like a parallel strategy file, without reading it as one: for a command
// that was given the wrong kind of file (`inspect` of a strategy) to say so in its one line.
// Thread-safety: a free function of its argument; safe from any thread.
#pragma once

#include <filesystem>

namespace ckptfs::strategy {

// True if `path` is a regular file that parses as a strategy with layouts: a ".json" file with
// a "parallel_layout_item" object, else a complete ParallelStrategyMap protobuf with at least
// one layout. Never throws for a file that is not one (unreadable: false).
bool looks_like_strategy(const std::filesystem::path& path) noexcept;

}  // namespace ckptfs::strategy
