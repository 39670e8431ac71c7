#include "bus_guard.h"

#include <csignal>
#include <mutex>

namespace ckptfs::fs::detail {

thread_local sigjmp_buf* bus_landing = nullptr;

namespace {

void on_bus(int, siginfo_t*, void*) {
  if (sigjmp_buf* landing = bus_landing) siglongjmp(*landing, 1);
  // Not a guarded copy: a real fault. Returning re-executes the access under the default
  // action, which kills the process as it would have without us.
  std::signal(SIGBUS, SIG_DFL);
}

}  // namespace

void install_bus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  });
}

}  // namespace ckptfs::fs::detail
