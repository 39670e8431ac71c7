// Copies out of file mappings without dying when a file shrinks underneath. Touching a mapped
// page past the new end of file raises SIGBUS; inside copy_guarded that becomes a false return
// (the caller answers EIO), anywhere else the process still gets the default action.
// Thread-safety: the landing point is per thread, so any number of threads may copy guarded at
// once; the handler is installed once for the process.
#pragma once

#include <csetjmp>

namespace ckptfs::fs {

namespace detail {
extern thread_local sigjmp_buf* bus_landing;
void install_bus_handler();
}  // namespace detail

// Runs `copy` (which must only read mappings and write memory it owns, and take no locks);
// false if it was cut short by SIGBUS.
template <typename Copy>
bool copy_guarded(Copy&& copy) {
  detail::install_bus_handler();
  sigjmp_buf landing;
  // savemask 0: the handler runs with SA_NODEFER, so SIGBUS is not left blocked by the jump,
  // and no sigprocmask call is paid per copy.
  if (sigsetjmp(landing, 0) != 0) {
    detail::bus_landing = nullptr;
    return false;
  }
  detail::bus_landing = &landing;
  copy();
  detail::bus_landing = nullptr;
  return true;
}

}  // namespace ckptfs::fs
