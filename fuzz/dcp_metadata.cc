// A DCP .metadata pickle (the pickle machine's DcpMetadata allow-list and the DCP decoder) on
// arbitrary bytes: parsing either throws ckptfs::Error or returns tensors whose chunks lie inside
// them, have its rank and add up to it, each with a storage entry naming a listed file.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ckptfs/dcp/dcp.h"
#include "ckptfs/error.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  dcp::Metadata md;
  try {
    md = dcp::parse_metadata(std::string_view(reinterpret_cast<const char*>(data), size), "input");
  } catch (const Error&) {
    return 0;
  }
  if (md.bytes != size) std::abort();
  for (const dcp::Tensor& t : md.tensors) {
    if (t.element_size == 0) std::abort();
    unsigned __int128 total = 1, covered = 0;
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
      total *= static_cast<uint64_t>(d);
    }
    for (const dcp::Chunk& c : t.chunks) {
      if (c.offsets.size() != t.shape.size() || c.sizes.size() != t.shape.size()) std::abort();
      unsigned __int128 n = 1;
      for (size_t k = 0; k < t.shape.size(); ++k) {
        if (c.offsets[k] < 0 || c.sizes[k] < 0 || c.offsets[k] + c.sizes[k] > t.shape[k])
          std::abort();
        n *= static_cast<uint64_t>(c.sizes[k]);
      }
      covered += n;
      if (c.storage.file >= md.files.size()) std::abort();
    }
    if (covered != total) std::abort();
  }
  for (const dcp::Object& o : md.objects)
    if (o.storage.file >= md.files.size()) std::abort();
  for (const std::string& f : md.files)
    if (f.empty() || f.find('/') != std::string::npos) std::abort();
  return 0;
}
