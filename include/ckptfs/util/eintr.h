// The one loop around a system call that a signal may interrupt.
#pragma once

#include <cerrno>

namespace ckptfs {

// Calls `call` (a system call returning -1 and setting errno on failure) again while it fails
// with EINTR; returns its first other result, errno intact.
template <typename Call>
auto retry_eintr(Call&& call) {
  for (;;) {
    const auto result = call();
    if (result >= 0 || errno != EINTR) return result;
  }
}

}  // namespace ckptfs
