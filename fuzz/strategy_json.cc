// The JSON strategy reader and the layout math on what it accepts.
#include "fuzz_input.h"
#include "strategy_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::fuzz::crash_if_injected();  // the one target the test command's self-test runs
  ckptfs::fuzz::check_strategy(ckptfs::fuzz::write_named("strategy.json", data, size));
  return 0;
}
