// Source discovery: the rank directories of SRC_DIR (spec §4.6 step 1) and every checkpoint in
// each, with the step its name gives. Which of them a mount serves is step_choice.h's job.
// Stateless: each call lists the directory anew; safe from any thread.
#pragma once

#include <compare>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::source {

// Where a checkpoint stands in a training run: "<prefix>-<epoch>_<step>.ckpt" (MindSpore's
// ModelCheckpoint) and "<prefix>_rank_N-<epoch>_<step>.ckpt" (MindFormers) alike.
struct StepKey {
  int64_t epoch = 0;
  int64_t step = 0;
  auto operator<=>(const StepKey&) const = default;
  std::string str() const;   // "10_100", the form --step takes and steps/ shows
  std::string text() const;  // "epoch 10 step 100"
};

struct Candidate {
  std::string name;
  // From the name: its stem (without ".ckpt"/".safetensors" and a trailing "_breakpoint") ends in
  // "<digits>_<digits>". Other names (checkpoint_3.ckpt, model.ckpt) carry no step.
  std::optional<StepKey> step;
  bool breakpoint = false;  // the stem ends in "_breakpoint" (a save made on an exception)
};

// What a checkpoint file name says (its step, whether a breakpoint save); `name` is a file name
// ending in ".ckpt" or ".safetensors".
Candidate make_candidate(std::string name);

// Candidate order within a rank directory: numerically by the last two integers of the name
// (missing ones count as -1), then by name. MindSpore's safetensors rule; its .ckpt transform
// (2.4-2.10) takes plain string order instead, where net-9_2.ckpt beats net-12_2.ckpt, which is
// an older step: ckptfs does not reproduce that.
bool candidate_before(const Candidate& a, const Candidate& b);

struct RankDir {
  std::filesystem::path dir;          // SRC_DIR joined with the entry name, not resolved
  std::vector<Candidate> candidates;  // oldest first (candidate_before); may be empty
};

struct Ignored {
  std::filesystem::path path;
  std::string why;
  // A file training leaves beside its checkpoints (*.tmp partial saves, *.meta graphs,
  // meta.json): expected, so not worth a warning.
  bool side_file = false;
};

struct Listing {
  std::filesystem::path root;  // the directory holding rank_<N>/
  // A MindFormers output/ directory: root is its checkpoint/, and this its strategy/ if present.
  std::optional<std::filesystem::path> mindformers_strategy;
  std::map<int64_t, RankDir> ranks;  // global rank -> directory
  std::vector<Ignored> ignored;      // every other entry looked at, in name order
  // Ranks whose rank_<N> entry gave no candidate, and why, as one phrase naming the entry:
  // "rank_5/ is empty", "rank_7 is not a directory: a FIFO (named pipe)". For the messages that
  // would otherwise call such a rank missing.
  std::map<int64_t, std::string> unusable;
};

// Lists SRC_DIR. Rank directories are the entries named "rank_" followed by decimal digits
// (leading zeros accepted) that are directories, symlinks followed. If SRC_DIR has none but has
// a checkpoint/ directory (MindFormers' output/), that directory is listed instead. In a rank
// directory the candidates are the non-hidden names ending in ".ckpt" or ".safetensors" that
// are regular files, symlinks followed. Paths are joined, not resolved. Listing order never depends
// on the order the filesystem lists entries in.
//
// Throws Error naming the directory if SRC_DIR or a rank directory is not a readable directory,
// naming both entries when two rank directories give the same rank and both hold a candidate
// ("rank_3" and "rank_03"), and naming a file of each when a rank directory holds both .ckpt
// and .safetensors candidates.
Listing list_sources(const std::filesystem::path& src_dir);

// One line about the entries that are neither rank directories nor candidates and are not side
// files ("" if none): how many, the first few names, and that --log-level debug lists them.
std::string ignored_summary(const Listing& listing);

}  // namespace ckptfs::source
