// Source discovery and --step (src/source/discover.cc, step_choice.cc): the names of the files in
// a source directory are written by training jobs and users, the --step text by the user.
// Input: line 1 is the --step text (a leading '+' asks --allow-mixed-steps); every further line
// is a file: its first byte picks rank_<b % 4> (rank_0<b % 4> when b & 8, a second spelling of
// the same rank), the rest is the file name ('/' becomes '_'). Checked on every accepted choice:
// one file per rank, each a candidate of its rank directory and of the kind asked for; the step
// reported is each chosen file's; complete_steps lists only steps every rank has.
#include "ckptfs/source/step_choice.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/source/discover.h"
#include "fuzz_input.h"

namespace {

namespace fs = std::filesystem;
using ckptfs::source::Candidate;

// The source directory the lines describe, written afresh under the scratch folder.
fs::path write_tree(const std::vector<std::string_view>& lines) {
  const fs::path root = ckptfs::fuzz::scratch_dir() / "src";
  fs::remove_all(root);
  fs::create_directories(root);
  for (size_t i = 1; i < lines.size() && i <= 32; ++i) {
    if (lines[i].empty()) continue;
    const auto b = static_cast<unsigned char>(lines[i][0]);
    std::string name(lines[i].substr(1, 200));
    std::replace(name.begin(), name.end(), '/', '_');
    std::replace(name.begin(), name.end(), '\0', '_');
    if (name.empty() || name == "." || name == "..") continue;
    const fs::path dir = root / ((b & 8) ? "rank_0" : "rank_") += std::to_string(b % 4);
    fs::create_directories(dir);
    std::ofstream(dir / name).put('x');
  }
  return root;
}

const Candidate* candidate_of(const ckptfs::source::Listing& listing, int64_t rank,
                              const fs::path& file) {
  const auto it = listing.ranks.find(rank);
  if (it == listing.ranks.end() || file.parent_path() != it->second.dir) return nullptr;
  for (const Candidate& c : it->second.candidates)
    if (c.name == file.filename()) return &c;
  return nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> lines = ckptfs::fuzz::lines_of(data, size);
  std::string_view step = lines[0];
  const bool mixed = step.starts_with('+');
  if (mixed) step.remove_prefix(1);
  const fs::path root = write_tree(lines);
  using ckptfs::source::StepRequest;
  ckptfs::source::Listing listing;
  StepRequest request;
  ckptfs::source::Choice choice;
  try {
    listing = ckptfs::source::list_sources(root);
    request = StepRequest::parse(step, mixed);
    choice = ckptfs::source::choose(listing, request);
  } catch (const ckptfs::Error&) {
    return 0;
  }
  if (choice.files.size() != listing.ranks.size()) std::abort();
  for (const auto& [rank, file] : choice.files) {
    const Candidate* c = candidate_of(listing, rank, file);
    if (!c) std::abort();
    if (request.kind == StepRequest::Kind::Exact && c->step != request.exact) std::abort();
    if (request.kind == StepRequest::Kind::Breakpoint && !c->breakpoint) std::abort();
    if (request.kind == StepRequest::Kind::Glob &&
        ::fnmatch(request.glob.c_str(), c->name.c_str(), 0) != 0)
      std::abort();
    if (choice.step && c->step != choice.step) std::abort();
  }
  for (const auto& [key, files] : ckptfs::source::complete_steps(listing)) {
    if (files.size() != listing.ranks.size()) std::abort();
    for (const auto& [rank, file] : files) {
      const Candidate* c = candidate_of(listing, rank, file);
      if (!c || c->breakpoint || c->step != key) std::abort();
    }
  }
  return 0;
}
