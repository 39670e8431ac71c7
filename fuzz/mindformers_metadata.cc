// The metadata.json reader on arbitrary bytes: read_iteration either throws ckptfs::Error or
// returns parameters whose every slice is stored by a file of the directory at a rank of the
// saved job. The input is written as metadata.json of a scratch directory (the reader takes a
// directory); no safetensors file is there, so any file name it returns is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "ckptfs/error.h"
#include "ckptfs/mindformers/metadata.h"

namespace {

const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ckptfs-fuzz-mf-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  {
    std::ofstream out(scratch() / mindformers::kMetadataFile, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) std::abort();
  }
  mindformers::Iteration it;
  try {
    it = mindformers::read_iteration(scratch());
  } catch (const Error&) {
    return 0;
  }
  // Every stored block names a file, and every file must exist: none does here.
  if (!it.files.empty()) std::abort();
  const int64_t ranks = it.strategy.devices_per_stage * it.strategy.num_stages;
  if (ranks < 1 || ranks > strategy::kMaxRanks) std::abort();
  for (const mindformers::ParamMeta& p : it.params) {
    if (p.blocks.empty() || p.stage >= it.strategy.num_stages) std::abort();
    for (const auto& files : p.blocks)
      if (files.empty()) std::abort();
  }
  return 0;
}
