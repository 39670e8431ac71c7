#include "scratch.h"

namespace ckptfs::fs::detail {

Scratch& scratch() {
  thread_local Scratch mine;
  return mine;
}

}  // namespace ckptfs::fs::detail
