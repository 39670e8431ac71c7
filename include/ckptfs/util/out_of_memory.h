// Running out of memory as one line naming the input and what to do, instead of a bare
// std::bad_alloc. Each reader of a whole input (a scan of a source file, the plan of a view)
// runs under naming_out_of_memory, so the command or the mount fails with an Error like any other
// refusal. Header-only; safe from any thread.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <new>
#include <string>
#include <string_view>

#include "ckptfs/error.h"

namespace ckptfs {

// The peak memory of a mount per tensor record of its sources (the scans, the index entries and
// the plan of both views; `inspect` needs about a quarter): the README's figure (0.64 KiB
// measured), rounded up, a guide for sizing.
inline constexpr uint64_t kBytesPerRecordGuide = 700;

// The sentence after "<input>: out of memory <doing what>": the address-space limit if there is
// one (the usual cause), and what to do.
inline std::string out_of_memory_advice() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    return fmt::format(
        "this process may use {} MiB of address space (ulimit -v) and a mount needs up to about "
        "{} bytes per tensor record; raise the limit or run on a machine with more memory",
        limit.rlim_cur >> 20, kBytesPerRecordGuide);
  return fmt::format(
      "the machine's memory is exhausted; a mount needs up to about {} bytes per tensor record",
      kBytesPerRecordGuide);
}

// work()'s result; a std::bad_alloc out of it becomes Error("<input>: out of memory <doing>: ...").
// The memory work() held is released by the time the message is built.
template <typename Work>
decltype(auto) naming_out_of_memory(std::string_view input, std::string_view doing, Work&& work) {
  try {
    return work();
  } catch (const std::bad_alloc&) {
    fail("{}: out of memory {}: {}", input, doing, out_of_memory_advice());
  }
}

}  // namespace ckptfs
