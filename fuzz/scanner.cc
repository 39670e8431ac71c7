// The checkpoint scanner on arbitrary bytes: a scan either throws ckptfs::Error or returns
// params whose extents lie inside the file and whose sizes agree with their dims.
#include "ckptfs/ckpt/scanner.h"

#include <cstdint>
#include <cstdlib>

#include "ckptfs/error.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  fuzz::MemFile file(data, size);
  for (bool crc : {false, true}) {
    scan::FileScan scan;
    try {
      scan = ckpt::scan_checkpoint_fd(file.fd(), "input", ckpt::ScanOptions{.verify_crc = crc});
    } catch (const Error&) {
      continue;
    }
    if (scan.body_size > scan.file_size || scan.file_size != size) std::abort();
    for (const scan::Param& p : scan.params) {
      for (const auto* list : {&p.content, &p.records})
        for (const scan::Extent& e : *list)
          if (e.offset > scan.body_size || e.length > scan.body_size - e.offset) std::abort();
      if (p.kind == scan::EntryKind::Tensor) {
        for (int64_t d : p.shape)
          if (d < 0) std::abort();
        if (p.elements() * p.element_size != p.nbytes()) std::abort();
      }
    }
    ckpt::loaded_params(std::move(scan));
  }
  return 0;
}
