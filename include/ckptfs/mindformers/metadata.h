// MindFormers' metadata checkpoints ("Checkpoint 2.0", spec mindspore-safetensors.md §2.6 as
// corrected by its MindFormers 2.1.0 notes): ROOT/latest_checkpointed_iteration.txt and
// ROOT/iteration_<8 digits>/{metadata.json, common.json, [prefix-]{model|opt}-<7>-<7>.safetensors}.
// metadata.json carries every parameter's layout and the files storing each of its blocks, so
// such a tree is a source without a strategy file. Reads the two JSON files only; the tensors'
// files are checked against them once indexed (validate). Free functions, no shared state:
// thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/index/store.h"
#include "ckptfs/strategy/strategy.h"

namespace ckptfs::mindformers {

inline constexpr char kLatestFile[] = "latest_checkpointed_iteration.txt";
inline constexpr char kMetadataFile[] = "metadata.json";
inline constexpr char kCommonFile[] = "common.json";

// The iteration directory to mount: `dir` itself when it holds metadata.json (then `step` must
// be "latest"), else, when `dir` holds latest_checkpointed_iteration.txt, its
// iteration_<8 digits> for `step` ("latest": the number in that file; else a decimal
// iteration). nullopt when `dir` is neither. Throws Error naming the file or directory at
// fault (unreadable or malformed number, iteration directory missing).
std::optional<std::filesystem::path> find_iteration(const std::filesystem::path& dir,
                                                    std::string_view step);

// One parameter of metadata.json.
struct ParamMeta {
  std::string name;
  std::string dtype;  // MindSpore's name, as the files' headers map it ("Float32", "BFloat16")
  std::vector<int64_t> global_shape;
  uint32_t stage = 0;
  // By slice index (row-major over the block grid): the file names storing that block.
  std::vector<std::vector<std::string>> blocks;
};

// A file that stores some block, with the rank metadata.json says stored it.
struct StoredFile {
  std::filesystem::path path;
  int64_t rank = 0;
};

// A common.json counter as the .ckpt view shows it: a scalar record of `dtype` holding `bytes`
// (little-endian).
struct Scalar {
  std::string name;
  std::string dtype;
  std::string bytes;
};

struct Iteration {
  std::filesystem::path dir;
  strategy::Strategy strategy;  // the saved layouts, as a strategy file would give them
  std::vector<ParamMeta> params;
  std::vector<StoredFile> files;  // ascending rank; a rank's model file before its opt file
  // *.safetensors of the directory that metadata.json names for no block (not served).
  std::vector<std::string> unnamed;
  std::vector<Scalar> scalars;  // epoch_num, step_num, global_step, loss_scale, global_batch_size
  // common.json's ckpt_status is 1 (ABNORMAL): MindFormers' resume looks for another iteration.
  bool unhealthy = false;
};

// Reads metadata.json and common.json (optional) of an iteration directory. Throws Error
// naming the file and, where one is at fault, the parameter or storage key: malformed JSON, a
// layout that does not fit its shape, pipeline stages that are not contiguous rank ranges,
// a block no file stores, a storage rank that does not hold the block, a named file that is
// not in the directory.
Iteration read_iteration(const std::filesystem::path& dir);

// Every stored block against the scanned files (`scans[i]` is `it.files[i]`): the file holds
// the parameter, with the block's shape and metadata.json's dtype. Throws one Error with one
// line per failure (the first 20), each naming the file and the parameter.
void validate(const Iteration& it, const std::vector<index::IndexedSource>& scans);

}  // namespace ckptfs::mindformers
