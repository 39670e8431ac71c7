// The safetensors header reader on arbitrary bytes: a scan either throws ckptfs::Error or gives
// a scan that ckpt::check_scan accepts for a file of the input's size.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/error.h"
#include "ckptfs/safetensors/scanner.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  fuzz::MemFile file(data, size);
  ckpt::FileScan scan;
  try {
    scan = safetensors::scan_safetensors_fd(file.fd(), "input");
  } catch (const Error&) {
    return 0;
  }
  if (const std::string why = ckpt::check_scan(scan, size); !why.empty()) {
    std::fprintf(stderr, "accepted scan fails check_scan: %s\n", why.c_str());
    std::abort();
  }
  return 0;
}
