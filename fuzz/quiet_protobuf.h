// For the targets that decode protobuf messages from random bytes: protobuf logs an ERROR line to
// stderr for every string field that is not UTF-8. Such a parse fails and the reader refuses the
// input, as it should, so the line is no finding; at tens of thousands of inputs a second the
// lines cost more than the decode and fill the run's log (hundreds of MB in a long run). Silenced
// once at start-up; a FATAL message still aborts, so a protobuf check that fails is still found.
#pragma once

#include <google/protobuf/stubs/logging.h>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}
