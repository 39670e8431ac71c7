// Which checkpoint of each rank a mount serves (--step), and which steps every rank has.
// Pure functions of a Listing: nothing here touches the filesystem; safe from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ckptfs/source/discover.h"

namespace ckptfs::source {

struct StepRequest {
  enum class Kind { Latest, Exact, Breakpoint, Glob };
  Kind kind = Kind::Latest;
  StepKey exact;             // Kind::Exact
  std::string glob;          // Kind::Glob: an fnmatch pattern for file names in a rank directory
  bool allow_mixed = false;  // only with Kind::Glob: files of different steps are accepted

  // "latest", "<epoch>_<step>", "breakpoint", or a file-name glob (anything else). Throws Error
  // for an empty text, and for allow_mixed with anything but a glob.
  static StepRequest parse(std::string_view text, bool allow_mixed);
};

struct Choice {
  std::map<int64_t, std::filesystem::path> files;  // global rank -> chosen file
  std::optional<StepKey> step;                     // when every chosen name gives the same step
  // What was chosen and what was left, in one line, e.g. "epoch 10 step 100 on all 8 ranks; 9
  // older checkpoints ignored".
  std::string summary;
  // The chosen files may hold different global_step/epoch_num/step_num values (the user asked
  // for named files of mixed steps).
  bool mixed_allowed = false;
};

// Latest: the newest step (candidate_before) saved, not as a breakpoint, on every rank. If the
// ranks share no step: each rank's only non-breakpoint file when every rank has exactly one
// (names of different steps are still refused), or each rank's last file when no name carries a
// step at all. Exact: that step's file on every rank. Breakpoint: each rank's newest breakpoint
// file. Glob: each rank's newest file matching the pattern.
//
// Throws Error naming the ranks and files when: a rank lacks the requested file; the chosen
// files' names give different steps (unless a glob with allow_mixed); two files of one rank give
// the chosen step; the listing has no rank.
Choice choose(const Listing& listing, const StepRequest& request);

// Every step that some non-breakpoint file gives on each rank of the listing, with those files
// (a rank holding two files of one step contributes its last). Ascending.
std::map<StepKey, std::map<int64_t, std::filesystem::path>> complete_steps(const Listing& listing);

}  // namespace ckptfs::source
