// The files a loader reads one full model from, as Hugging Face's save_pretrained writes them
// (safetensors, {"format":"pt"}): model.safetensors, or, for a model over the shard size,
// model-0000k-of-0000n.safetensors plus model.safetensors.index.json naming each tensor's file.
// The merged views of PyTorch DCP and hfai checkpoints serve them at the mount's root.
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/plan/planner.h"
#include "ckptfs/plan/rename_map.h"
#include "ckptfs/plan/virtual_file.h"

namespace ckptfs::plan {

// save_pretrained's default max_shard_size, "5GB" (decimal, as its size parser reads GB).
inline constexpr uint64_t kDefaultShardSize = 5'000'000'000;

// --shard-size and --rename as a merged view takes them.
struct ModelFileOptions {
  uint64_t shard_size = kDefaultShardSize;  // 0: one model.safetensors, whatever its size
  bool shard_size_given = false;            // --shard-size was given (not the default)
  std::shared_ptr<const RenameMap> rename;  // null: the checkpoint's keys as they are
};

// A --shard-size value: bytes, or a number with KB, MB, GB, TB (powers of 1000, as
// save_pretrained reads them) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive, a
// fraction allowed ("2.5GB"); 0 or "none": never shard. Throws Error naming --shard-size.
uint64_t parse_shard_size(const std::string& text);

// Which tensors each shard holds (indexes into `sizes`, the tensors' byte sizes in the model's
// order), by save_pretrained's rule (huggingface_hub's split_state_dict_into_shards_factory):
// tensors are taken in order into the current shard, which is closed and a new one started when
// adding one would take it over `max`; a tensor larger than `max` gets a shard of its own,
// placed when it is met, while the current shard stays open for the tensors after it. `max` 0:
// one shard. No tensors: one empty shard.
std::vector<std::vector<size_t>> split_shards(std::span<const uint64_t> sizes, uint64_t max);

// "model-00002-of-00005.safetensors": shard `k` (from 1) of `n`.
std::string shard_file_name(size_t k, size_t n);

// One tensor of the model: its header entry and how its bytes, in C order, are added to a file.
struct ModelEntry {
  std::string name;
  std::string code;  // a safetensors::Dtype code
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::function<void(VirtualFile::Builder&)> add_content;
};

// model.safetensors.index.json for `model` cut into `shards`, as save_pretrained writes it:
// {"metadata": {"total_size": <sum of every tensor's bytes>}, "weight_map": {name: file}},
// keys sorted, indented by 2, ASCII only, ending in a newline.
std::string shard_index_json(std::span<const ModelEntry> model,
                             const std::vector<std::vector<size_t>>& shards);

// Appends to `plan` the root files of `model` (names already final, each once): one
// model.safetensors when split_shards gives one shard, else the shards and the index. Each file
// holds its tensors in the safetensors writer's order. Calls every add_content once.
void add_model_files(Plan& plan, std::span<const ModelEntry> model, uint64_t shard_size);

}  // namespace ckptfs::plan
