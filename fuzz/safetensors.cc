// The safetensors header reader on arbitrary bytes: a scan either throws ckptfs::Error or gives
// a scan that scan::check_scan accepts for a file of the input's size, in offset order, whose
// every tensor is the one nlohmann's own tree parser finds under that name (same dtype, shape
// and extent, as many tensors as the tree has). The tree keeps one copy of a repeated key, so a
// repeated key the scanner let through would show as a count or a field that disagrees.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/error.h"
#include "ckptfs/safetensors/format.h"
#include "ckptfs/safetensors/scanner.h"
#include "fuzz_input.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& name) {
  std::fprintf(stderr, "accepted scan: %s (tensor \"%s\")\n", what, name.c_str());
  std::abort();
}

// The accepted scan against the header as a tree.
void compare_with_tree(const uint8_t* data, const ckptfs::scan::FileScan& scan) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{data[i]} << (8 * i);
  const nlohmann::json tree = nlohmann::json::parse(data + 8, data + 8 + n);
  const size_t tensors = tree.size() - (tree.contains("__metadata__") ? 1 : 0);
  if (tensors != scan.params.size()) finding("tensor count differs from the tree's", "");
  uint64_t last = 0;
  for (const ckptfs::scan::Param& p : scan.params) {
    const auto it = tree.find(p.name);
    if (it == tree.end() || p.name == "__metadata__") finding("a name the tree lacks", p.name);
    const auto dtype = ckptfs::safetensors::dtype_by_code(it->at("dtype").get<std::string>());
    if (!dtype || p.dtype != dtype->mindspore) finding("dtype differs", p.name);
    if (p.shape != it->at("shape").get<std::vector<int64_t>>()) finding("shape differs", p.name);
    const uint64_t begin = (*it)["data_offsets"][0].get<uint64_t>();
    const uint64_t end = (*it)["data_offsets"][1].get<uint64_t>();
    if (p.content.size() != 1 || p.content[0].offset != 8 + n + begin ||
        p.content[0].length != end - begin)
      finding("extent differs", p.name);
    if (begin < last) finding("not in offset order", p.name);
    last = begin;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  fuzz::MemFile file(data, size);
  scan::FileScan scan;
  try {
    scan = safetensors::scan_safetensors_fd(file.fd(), "input");
  } catch (const Error&) {
    return 0;
  }
  if (const std::string why = scan::check_scan(scan, size); !why.empty()) {
    std::fprintf(stderr, "accepted scan fails check_scan: %s\n", why.c_str());
    std::abort();
  }
  compare_with_tree(data, scan);
  return 0;
}
