#include "ckptfs/plan/source_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string_view>
#include <unordered_set>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/error.h"

namespace ckptfs::plan {

namespace {

constexpr size_t kMaxNamed = 4;

std::string rank_dirs(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < kMaxNamed; ++i)
    out += fmt::format("{}rank_{}/", i ? ", " : "", ranks[i]);
  if (ranks.size() > kMaxNamed) out += fmt::format(" and {} more", ranks.size() - kMaxNamed);
  return out;
}

// Names a strategy lists that a save may lack: MindFormers' filter list (accu_grads, *_cache*,
// *expert_load*) and optimizer states, which saves of the network's weights alone leave out.
bool may_be_unsaved(std::string_view name) {
  for (std::string_view prefix : {"accu_grads", "adam_m.", "adam_v.", "moment1.", "moment2."})
    if (name.starts_with(prefix)) return true;
  return name.find("_cache") != std::string_view::npos ||
         name.find("expert_load") != std::string_view::npos;
}

}  // namespace

void check_rank_count(const std::vector<int64_t>& ranks, const strategy::Strategy* src,
                      const std::string& src_dir, const std::map<int64_t, std::string>& unusable,
                      const std::set<int64_t>* needed) {
  const int64_t devices = src ? src->devices_per_stage : 1;
  const int64_t stages = src ? src->num_stages : 1;
  const int64_t expected = devices * stages;
  std::vector<int64_t> extra, missing;
  std::set<int64_t> present(ranks.begin(), ranks.end());
  for (int64_t r : present)
    if (r >= expected) extra.push_back(r);
  for (int64_t r = 0; r < expected; ++r)
    if (!present.count(r) && (!needed || needed->count(r))) missing.push_back(r);
  if (extra.empty() && missing.empty()) return;

  if (!src) {
    if (!extra.empty())
      fail(
          "{}: without --src-strategy the source is one full checkpoint in rank_0/, but there "
          "are also {}; give --src-strategy with the strategy the checkpoints were saved with",
          src_dir, rank_dirs(extra));
    const auto why = unusable.find(0);
    fail("{}: no rank_0/ checkpoint{}, needed without --src-strategy (one full checkpoint)",
         src_dir, why == unusable.end() ? "" : " (" + why->second + ")");
  }
  const std::string shape =
      fmt::format("the source strategy {} describes {} rank{} ({} device{} x {} stage{})",
                  src->origin, expected, expected == 1 ? "" : "s", devices, devices == 1 ? "" : "s",
                  stages, stages == 1 ? "" : "s");
  if (!extra.empty())
    fail(
        "{}: {} rank directories, but {}: {} {} no place in it; give the strategy the "
        "checkpoints were saved with (for a pipeline job, the directory of every stage's file)",
        src_dir, present.size(), shape, rank_dirs(extra), extra.size() == 1 ? "has" : "have");
  // A rank whose directory is there but unusable (empty, a FIFO, a symlink loop) is named as
  // such: "missing" would send the user looking for a directory they can see.
  std::string which;
  bool all_absent = true;
  for (size_t i = 0; i < missing.size() && i < kMaxNamed; ++i) {
    const auto why = unusable.find(missing[i]);
    all_absent = all_absent && why == unusable.end();
    which += why == unusable.end()
                 ? fmt::format("{}rank_{}/ (source rank {})", i ? ", " : "", missing[i], missing[i])
                 : fmt::format("{}source rank {}: {}", i ? "; " : "", missing[i], why->second);
  }
  if (missing.size() > kMaxNamed) which += fmt::format(" and {} more", missing.size() - kMaxNamed);
  if (needed)
    fail(
        "{}: the exposed target ranks read {} of the {} source ranks of the strategy {}, and {} "
        "{}: {}; copy in {} checkpoint{}, or give the strategy the checkpoints were saved with",
        src_dir, needed->size(), expected, src->origin, missing.size() == 1 ? "this" : "these",
        all_absent ? (missing.size() == 1 ? "is missing" : "are missing")
                   : (missing.size() == 1 ? "has no checkpoint" : "have no checkpoint"),
        which, missing.size() == 1 ? "its" : "their", missing.size() == 1 ? "" : "s");
  fail(
      "{}: {} rank directories, but {}: {} {}; copy in every rank's checkpoint, or give the "
      "strategy the checkpoints were saved with",
      src_dir, present.size(), shape, all_absent ? "missing" : "no checkpoint for", which);
}

void check_strategy_covered(const std::map<int64_t, index::IndexedSource>& sources,
                            const strategy::Strategy& src, CoveredNames* covered) {
  if (covered && covered->src != &src) *covered = CoveredNames{&src, {}};
  std::vector<std::unordered_set<std::string_view>> held(src.num_stages);
  // A mount of some target ranks loads only their sources: stages without one are not read.
  std::vector<bool> present(src.num_stages);
  std::vector<bool> known(src.num_stages);       // a file lists names found to cover the stage
  std::vector<size_t> distinct(src.num_stages);  // name lists hashed for the stage
  std::vector<const std::vector<scan::Param>*> last(src.num_stages);  // the stage's last file
  for (const auto& [rank, source] : sources) {
    const int64_t stage = rank / src.devices_per_stage;
    if (stage < 0 || stage >= static_cast<int64_t>(held.size())) continue;
    present[stage] = true;
    if (known[stage]) continue;
    if (covered) {
      auto it = covered->by_stage.find(stage);
      if (it != covered->by_stage.end() && ckpt::same_names(it->second, source.scan.params)) {
        known[stage] = true;
        continue;
      }
    }
    const std::vector<scan::Param>*& prev = last[static_cast<size_t>(stage)];
    if (prev && ckpt::same_names(*prev, source.scan.params)) continue;  // nothing new
    prev = &source.scan.params;
    ++distinct[stage];
    for (const scan::Param& p : source.scan.params) held[stage].insert(p.name);
  }
  for (uint32_t stage = 0; stage < src.num_stages; ++stage) {
    if (!present[stage] || known[stage]) continue;
    std::vector<std::string_view> missing;
    for (const auto& [name, param] : src.params)
      if (param.stages.count(stage) && !may_be_unsaved(name) && !held[stage].count(name))
        missing.push_back(name);
    if (missing.empty()) continue;
    std::string names;
    for (size_t i = 0; i < missing.size() && i < kMaxNamed; ++i)
      names += fmt::format("{}{}", i ? ", " : "", missing[i]);
    if (missing.size() > kMaxNamed)
      names += fmt::format(" and {} more", missing.size() - kMaxNamed);
    const int64_t first = stage * src.devices_per_stage;
    fail(
        "the source strategy {} names {} parameter{} of stage {} that no source file of that "
        "stage (rank_{}/ .. rank_{}/) holds: {}; give the strategy these checkpoints were saved "
        "with",
        src.origin, missing.size(), missing.size() == 1 ? "" : "s", stage, first,
        first + src.devices_per_stage - 1, names);
  }
  // Where every file of a stage listed the same names, that list covers the stage: kept for the
  // next plan's files.
  if (covered)
    for (uint32_t stage = 0; stage < src.num_stages; ++stage)
      if (present[stage] && !known[stage] && distinct[stage] == 1) {
        std::vector<std::string>& names = covered->by_stage[stage];
        names.clear();
        for (const scan::Param& p : *last[stage]) names.push_back(p.name);
      }
}

}  // namespace ckptfs::plan
