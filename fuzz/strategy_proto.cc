// The protobuf strategy reader (ParallelStrategyMap) and the layout math on what it accepts.
#include "fuzz_input.h"
#include "strategy_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::fuzz::check_strategy(ckptfs::fuzz::write_named("strategy.ckpt", data, size));
  return 0;
}
