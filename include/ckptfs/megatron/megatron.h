// Megatron-Core's torch_dist checkpoints (spec torch-dcp-megatron.md §3, docs/FORMATS-dcp.md):
// a save root holding latest_checkpointed_iteration.txt and iter_<7 digits>/ (or release/)
// directories, each a PyTorch DCP directory (.metadata, __<rank>_<k>.distcp) plus metadata.json
// ({"sharded_backend": "torch_dist", ...}), common.pt (up to v0.18; from v0.19 the common state is
// the ShardedObject common_state inside the DCP files) and, optionally, integrity.json.
// Nothing here unpickles common.pt or a ShardedObject. Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/dcp/dcp.h"
#include "ckptfs/index/store.h"

namespace ckptfs::megatron {

inline constexpr std::string_view kTrackerName = "latest_checkpointed_iteration.txt";
inline constexpr std::string_view kConfigName = "metadata.json";
inline constexpr std::string_view kCommonName = "common.pt";
inline constexpr std::string_view kIntegrityName = "integrity.json";
inline constexpr std::string_view kOptimizerPrefix = "optimizer.";

// The iteration directory of the Megatron checkpoint at `dir` for --step `step`, or nullopt if
// `dir` is not one. `dir` is an iteration directory (it holds metadata.json with a
// sharded_backend: then `step` must be "latest") or a save root (it holds iter_<digits>/ or
// release/ directories): `step` "latest" takes the iteration the tracker file names ("release"
// for release/), a decimal number iter_<number, 7 digits>. Throws Error, one line naming the file
// or option, for: a backend other than torch_dist, a tracker file that names no iteration, a
// missing or unreadable tracker with --step latest, a --step that is not latest or a number, and
// a chosen directory without metadata.json or .metadata (not saved, or not completely).
std::optional<std::filesystem::path> find_iteration(const std::filesystem::path& dir,
                                                    const std::string& step);

// Whether `fqn` names distributed-optimizer state (its key starts with "optimizer.").
bool is_optimizer(std::string_view fqn);

// Megatron's stacked layers: a key with a "layers." segment followed by a name (not a layer
// number) holds every layer of that parameter along dimension 0 (chunk offset = global layer).
// The per-layer name of layer `i` of such a key ("decoder.layers.mlp.linear_fc1.weight", 2 ->
// "decoder.layers.2.mlp.linear_fc1.weight"), or nullopt if `fqn` is not a stacked key.
std::optional<std::string> layer_name(std::string_view fqn, int64_t i);

// Rewrites `metadata` and the scans of its data files (`files`, metadata.files' order) so that
// each stacked tensor [L, ...] becomes L tensors named by layer_name, each served from its
// layers' chunks as views of the same stored bytes (nothing is copied or read). A stacked tensor
// of rank 0 is left as it is.
void unstack_layers(dcp::Metadata& metadata, std::vector<index::IndexedSource>& files);

// integrity.json's check of the iteration directory `dir`: {"algorithm": "sha256", "files":
// {name: hex digest}}. Returns one line per file that differs or is missing (empty: all match);
// nullopt when there is no integrity.json. Throws Error naming the file for a malformed one or
// another algorithm.
std::optional<std::vector<std::string>> check_integrity(const std::filesystem::path& dir);

}  // namespace ckptfs::megatron
