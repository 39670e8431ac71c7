// param_name_map.json of a unified_safetensors directory (src/source/unified.cc), a JSON file in
// the source tree. The directory also holds part0, part1, part10 and hyper_param .safetensors.
// Checked on an accepted map: every file it names is listed once and exists, part<i> files come
// in numeric order, hyper_param.safetensors last.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "ckptfs/error.h"
#include "ckptfs/source/unified.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const fs::path map = ckptfs::fuzz::write_named(ckptfs::source::kParamNameMap, data, size);
  const fs::path dir = map.parent_path();
  static const bool made = [&] {
    for (const char* f : {"part0.safetensors", "part1.safetensors", "part10.safetensors",
                          ckptfs::source::kHyperParamFile})
      std::ofstream(dir / f).put('x');
    return true;
  }();
  static_cast<void>(made);
  std::optional<ckptfs::source::UnifiedDir> u;
  try {
    u = ckptfs::source::read_unified(dir);
  } catch (const ckptfs::Error&) {
    return 0;
  }
  if (!u || u->files.empty() || u->weight_map.empty()) std::abort();
  std::set<fs::path> listed;
  int last_part = -1;
  for (size_t i = 0; i < u->files.size(); ++i) {
    const fs::path& f = u->files[i];
    if (f.parent_path() != dir || !fs::is_regular_file(f) || !listed.insert(f).second) std::abort();
    const std::string name = f.filename();
    if (name == ckptfs::source::kHyperParamFile && i + 1 != u->files.size()) std::abort();
    if (name.starts_with("part")) {
      const int n = std::stoi(name.substr(4));
      if (n <= last_part) std::abort();
      last_part = n;
    }
  }
  for (const auto& [param, file] : u->weight_map)
    if (!listed.count(dir / file)) std::abort();
  return 0;
}
