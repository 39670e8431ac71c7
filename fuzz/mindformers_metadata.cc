// The metadata.json reader on arbitrary bytes: read_iteration either throws ckptfs::Error or
// returns parameters whose every slice is stored by a file of the directory at a rank of the
// saved job. The input is written as metadata.json of a scratch directory (the reader takes a
// directory); no safetensors file is there, so any file name it returns is a bug.
#include <cstdint>
#include <cstdlib>

#include "ckptfs/error.h"
#include "ckptfs/mindformers/metadata.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  // The process's scratch folder on tmpfs, removed at exit (a folder made under /tmp was left
  // behind by every fuzzer process, and /tmp may be a disk).
  const std::filesystem::path& dir = fuzz::scratch_dir();
  fuzz::write_named(mindformers::kMetadataFile, data, size);
  mindformers::Iteration it;
  try {
    it = mindformers::read_iteration(dir);
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
