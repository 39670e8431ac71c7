// Strategy files written for checkpoints that come without one (`ckptfs strategy new`: PyTorch,
// hfai): one pipeline stage on a one-axis device mesh of N devices, every tensor either split
// N ways along one dimension or replicated, chosen by ordered rules. The bytes are what
// MindSpore itself writes (spec §2.6 for protobuf, §2.3 for JSON), so read_strategy, MindSpore's
// transform_checkpoints and build_searched_strategy all read them, as --dst-strategy and, for
// checkpoints saved in that layout, as --src-strategy.
// Pure functions on values (write_strategy_file aside, which writes one file): thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/strategy/strategy.h"

namespace ckptfs::strategy {

// A tensor to lay out: its name and GLOBAL (whole-model) shape.
struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
};

struct LayoutRule {
  std::string text;            // as the user wrote it, for messages: "--split 'wq.*=0'"
  std::string pattern;         // POSIX extended regular expression (grep -E's) that must match
                               // the WHOLE name
  std::optional<int64_t> dim;  // split along this dimension (negative: from the end); none:
                               // replicated
};

struct NewStrategy {
  int64_t devices = 1;              // 1 .. kMaxRanks
  std::vector<LayoutRule> rules;    // the first rule whose pattern matches a name decides
  bool unmatched_replicate = true;  // a tensor no rule matches: replicated, or refused
};

// Throws Error in one line for N out of range or a pattern that is not a regular expression
// (naming the rule); decide_layouts checks the same, this is for refusing before any source is
// read.
void check_new_strategy(const NewStrategy& options);

// One tensor's decision.
struct NewLayout {
  std::string name;
  std::vector<int64_t> shape;  // global
  ParamLayout layout;          // dev_matrix [devices]; tensor_shape = shape
  int rule = -1;               // index into NewStrategy::rules; -1: no rule matched
};

// The layout of every tensor, in the order given: dev_matrix [N], a split dimension mapped to
// device axis 0 (MindSpore's tensor_map value 0), every other dimension -1; no optimizer
// sharding. Throws Error in one line: check_new_strategy's refusals, no tensor at all, two tensors
// of one name, a name "<digits>-<rest>" (every reader takes it for <rest> of a pipeline stage,
// spec §2.4), and, naming the tensor with its shape and the rule, a split dimension out of range
// or one whose size does not divide by N (MindSpore's transform refuses those too, spec §5), or a
// tensor no rule matches when unmatched ones are refused.
std::vector<NewLayout> decide_layouts(const std::vector<TensorShape>& tensors,
                                      const NewStrategy& options);

// The file's bytes. Protobuf: a ParallelStrategyMap as MindSpore writes one (§2.6): current_stage
// 1, a strategy item per tensor (node "StrategyNew_<name>", stage 0, its split counts), a layout
// item per tensor with one DevMatrix, one TensorMap, one empty ParamSplitShape and IndicesOffset,
// field 0 and both optimizer fields 0, repeated scalars unpacked. JSON: the same as §2.3's
// object, each layout with its global "tensor_shape", one entry per line.
std::string encode_protobuf(const std::vector<NewLayout>& layouts);
std::string encode_json(const std::vector<NewLayout>& layouts);

// Writes encode_json's bytes if `path` ends in ".json" (read_strategy's rule), else
// encode_protobuf's, through a temporary file in the same directory renamed over `path`, so that
// a reader never sees half a file. Throws Error naming the path if it cannot be written.
void write_strategy_file(const std::filesystem::path& path, const std::vector<NewLayout>& layouts);

}  // namespace ckptfs::strategy
