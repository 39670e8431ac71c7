// Parallel strategy files (spec §2): protobuf, JSON, or a directory of per-stage/per-rank files
// merged as merge_pipeline_strategys does (§2.4).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::strategy {

// The most ranks a strategy may span (devices per stage x stages). Today's largest jobs are far
// below it; every target is planned at mount, and 2^20 of them would take gigabytes, so a count
// past this is refused as a damaged or mistaken file.
inline constexpr int64_t kMaxRanks = int64_t{1} << 16;

// Device axes of one tensor dimension, in MindSpore's map convention (value a names device axis
// len(dev_matrix)-1-a), most significant first. Empty = the dimension is not split.
using DimAxes = std::vector<int32_t>;

struct ParamLayout {
  std::vector<int64_t> dev_matrix;
  std::vector<DimAxes> tensor_map;  // one entry per tensor dimension (multi-axis aware)
  std::vector<int64_t> param_split_shape;
  std::vector<int64_t> indices_offset;
  int32_t field = 0;
  int32_t opt_shard_step = 0;
  int32_t opt_shard_size = 0;
  std::vector<int64_t> tensor_shape;  // JSON "tensor_shape"; empty when absent
  bool operator==(const ParamLayout&) const = default;
};

struct StrategyParam {
  std::string name;                        // without the "<stage>-" prefix
  std::map<uint32_t, ParamLayout> stages;  // every stage that lists the parameter
  bool operator==(const StrategyParam&) const = default;
};

// A parallel_strategy_item (§2.2): an operator's input split factors. Only its stage matters
// (it names the pipeline stage of a per-stage file); the rest is kept for display.
struct OperatorStrategy {
  uint32_t stage = 0;
  std::vector<std::vector<uint32_t>> inputs;  // one list of split factors per operator input
  bool operator==(const OperatorStrategy&) const = default;
};

struct StrategyParam;

// Strategy::find's hashed index of the parameter names. Names of 10^5 parameters share long
// prefixes ("model.layers.00042.attention..."), so each step of a search of the sorted map
// compares dozens of bytes, and the planner asks for every name of every target. A copy starts
// without an index (it would point into the other map's nodes); it is built on first use.
class NameIndex {
 public:
  using Params = std::map<std::string, StrategyParam, std::less<>>;
  NameIndex();
  NameIndex(const NameIndex&);
  NameIndex& operator=(const NameIndex&);
  ~NameIndex();
  // The entry of `params` named `name`, or nullptr. `params` is the map this index belongs to;
  // a change of its size since the index was built rebuilds it. Safe from several threads.
  const StrategyParam* find(const Params& params, std::string_view name) const;

 private:
  struct Table;
  mutable std::mutex mu_;
  mutable std::atomic<const Table*> table_{nullptr};
  mutable std::unique_ptr<Table> owned_;
  mutable std::vector<std::unique_ptr<Table>> retired_;  // replaced tables, kept for readers
};

struct Strategy {
  std::string origin;             // the path read, for messages
  int64_t devices_per_stage = 1;  // product of every layout's dev_matrix
  uint32_t num_stages = 1;        // stages are exactly 0 .. num_stages-1
  std::map<std::string, StrategyParam, std::less<>> params;
  // Node name -> strategy item; the first one wins when merged files repeat a node name.
  std::map<std::string, OperatorStrategy, std::less<>> operators;

  // The parameter named `name`, or nullptr. Hashed: `params` must not change once find was
  // called (other than in size, which rebuilds the index). Safe from several threads.
  const StrategyParam* find(std::string_view name) const { return index_.find(params, name); }

 private:
  NameIndex index_;
};

// Reads a protobuf file, a ".json" file, or a directory of such files (one per stage or rank,
// merged in name order; a file whose stage was already merged is skipped). A file's stage is the
// stage of its first strategy item (0 for a single file without any); a layout name
// "<digits>-<name>" carries its own stage (split at the first "-" only). Throws Error naming the
// file for unreadable or empty input, a file without layouts, a layout whose device count
// differs from the others (naming the parameter), stages that are not exactly 0..S-1, or more
// than kMaxRanks ranks.
Strategy read_strategy(const std::filesystem::path& path);

}  // namespace ckptfs::strategy
