// The torch.save reader (zip directory + allow-listed pickle machine) on arbitrary bytes: a
// scan either throws ckptfs::Error or returns views that lie inside their storage records (their
// sizes not wrapped), records inside the file under distinct names, and a tree whose tensor
// references all resolve.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "ckptfs/error.h"
#include "ckptfs/torchzip/torch_file.h"
#include "fuzz_input.h"

namespace {

size_t count_refs(const nlohmann::json& node, size_t params) {
  size_t n = 0;
  if (node.is_object()) {
    if (auto it = node.find("$tensor"); it != node.end()) {
      if (!it->is_number_unsigned() || it->get<size_t>() >= params) std::abort();
      return 1;
    }
    for (const auto& [key, value] : node.items()) n += count_refs(value, params);
  } else if (node.is_array()) {
    for (const auto& value : node) n += count_refs(value, params);
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  fuzz::MemFile file(data, size);
  scan::FileScan scan;
  try {
    scan = torchzip::scan_torch_fd(file.fd(), "input");
  } catch (const Error&) {
    return 0;
  }
  if (scan.file_size != size) std::abort();
  for (const scan::Param& p : scan.params) {
    if (!p.view || p.content.size() != 1 || p.shape.size() != p.strides.size()) std::abort();
    const scan::Extent& record = p.content[0];
    if (record.offset > size || record.length > size - record.offset) std::abort();
    // Computed so nothing wraps: with at most 2^62 elements, the sum of (size-1) x stride is
    // below 2^125, and the end is compared in elements (a byte count x16 could wrap 128 bits).
    unsigned __int128 numel = 1, last = p.storage_offset;
    for (size_t k = 0; k < p.shape.size(); ++k) {
      if (p.shape[k] < 0 || p.strides[k] < 0) std::abort();
      numel *= static_cast<uint64_t>(p.shape[k]);
      if (numel > (uint64_t{1} << 62)) std::abort();
    }
    // The size shown (inspect's BYTES) is the whole tensor's, not a wrapped remainder.
    if (numel * p.element_size != p.nbytes()) std::abort();
    if (numel == 0) continue;
    for (size_t k = 0; k < p.shape.size(); ++k)
      last += static_cast<unsigned __int128>(p.shape[k] - 1) * static_cast<uint64_t>(p.strides[k]);
    if (p.element_size == 0 || last >= record.length / p.element_size) std::abort();
  }
  if (count_refs(nlohmann::json::parse(scan.tree), scan.params.size()) != scan.params.size())
    std::abort();
  return 0;
}
