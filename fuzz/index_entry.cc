// An index entry read back from LMDB (index::decode_entry): the first 8 input bytes are the file
// size, the rest the entry's message, sealed here with a valid CRC-32 so that the fuzzer reaches
// the checks behind the checksum. Whatever decodes must pass scan::check_scan, count no more
// structure bytes than the file has, and give structure extents that are ascending, disjoint,
// inside the file and outside every content.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/index/store.h"
#include "ckptfs/index/structure.h"
#include "quiet_protobuf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  if (size < 8) return 0;
  uint64_t file_size = 0;
  for (int i = 0; i < 8; ++i) file_size = file_size << 8 | data[i];
  std::string entry(reinterpret_cast<const char*>(data + 8), size - 8);
  const uint32_t crc = ckpt::crc32_update(0, std::span(data + 8, size - 8));
  for (int shift = 24; shift >= 0; shift -= 8) entry.push_back(static_cast<char>(crc >> shift));
  for (const std::string& e : {entry, std::string(entry).append("x")}) {
    std::string why;
    index::StructureDigest digest;
    const std::optional<scan::FileScan> scan = index::decode_entry(e, file_size, &why, &digest);
    if (scan && !scan::check_scan(*scan, file_size).empty()) std::abort();
    if (!scan && why.empty()) std::abort();
    if (!scan) continue;
    if (digest.bytes > file_size) std::abort();
    uint64_t at = 0;
    for (const scan::Extent& x : index::structure_extents(*scan)) {
      if (x.length == 0 || x.offset < at || x.offset + x.length > file_size) std::abort();
      at = x.offset + x.length;
      for (const scan::Param& p : scan->params)
        for (const scan::Extent& c : p.content)
          if (c.length > 0 && c.offset < at && x.offset < c.offset + c.length) std::abort();
    }
  }
  return 0;
}
