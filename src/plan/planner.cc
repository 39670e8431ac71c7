// The entry points of planner.h: each checks what it was given, runs the shared prologue
// (prologue.h), plans its targets with the target planner (target_planner.h) and builds their
// files with the views (views.h). Also the small functions of planner.h.
#include "ckptfs/plan/planner.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include "ckptfs/error.h"
#include "ckptfs/plan/read_map.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/strategy/rank_list.h"
#include "prologue.h"
#include "target_planner.h"
#include "views.h"

namespace ckptfs::plan {

using strategy::Layout;
using strategy::TargetMaps;

std::string TargetFile::dir_name() const {
  return rank == kRootRank ? std::string() : fmt::format("rank_{}", rank);
}
std::string TargetFile::path() const {
  return rank == kRootRank ? file_name() : dir_name() + "/" + file_name();
}
std::string TargetFile::file_name() const {
  return name.empty() ? fmt::format("checkpoint_{}.ckpt", rank) : name;
}

namespace {

Plan plan_views(Plan plan, const strategy::Strategy* src, const strategy::Strategy* dst,
                const ViewOptions& views, bool safetensors_rules, bool located = false);

// Stage `stage` of a pipeline strategy as the one-stage file MindSpore saved for it.
strategy::Strategy stage_strategy(const strategy::Strategy& src, uint32_t stage) {
  strategy::Strategy out;
  out.origin = fmt::format("{} (stage {})", src.origin, stage);
  out.devices_per_stage = src.devices_per_stage;
  out.num_stages = 1;
  for (const auto& [name, param] : src.params) {
    auto it = param.stages.find(stage);
    if (it == param.stages.end()) continue;
    out.params.emplace(name, strategy::StrategyParam{name, {{0, it->second}}});
  }
  return out;
}

// §4.7: each stage's sources (local ranks 0..N-1) against the destination restricted to the
// stage's names; destination rank l's result is rank_<l>/<prefix><l>_part<stage>.ckpt.
void plan_by_stage(Plan& plan, const strategy::Strategy* src, const strategy::Strategy* dst,
                   bool safetensors_rules, const ViewOptions& views, bool located) {
  if (!src || src->num_stages < 2 || !dst || dst->num_stages != 1)
    fail(
        "-o by_stage writes one _part<stage> file per stage of a pipeline source: it needs a "
        "source strategy of several stages and a destination strategy of one stage (the source "
        "has {} stage{}, the destination {})",
        src ? src->num_stages : 1, src && src->num_stages != 1 ? "s" : "",
        dst ? fmt::format("{} stage{}", dst->num_stages, dst->num_stages == 1 ? "" : "s") : "none");
  const int64_t n_src = src->devices_per_stage;
  std::vector<std::vector<Entry>> by_stage_and_rank;  // [stage * n_dst + l]
  // Entries point into their planner and its strategies: all live until the files are built.
  std::deque<strategy::Strategy> strategies;
  std::deque<TargetPlanner> planners;
  const size_t total = size_t{src->num_stages} * static_cast<size_t>(dst->devices_per_stage);
  if (views.on_planned) views.on_planned(0, total);
  for (uint32_t stage = 0; stage < src->num_stages; ++stage) {
    const strategy::Strategy& src_s = strategies.emplace_back(stage_strategy(*src, stage));
    strategy::Strategy& dst_s = strategies.emplace_back(*dst);
    std::erase_if(dst_s.params, [&](const auto& p) { return !src_s.params.count(p.first); });
    // Other stages' files play no rank here (a negative one nobody asks for).
    std::vector<int64_t> ranks;
    for (size_t i = 0; i < plan.source_ranks.size(); ++i) {
      const int64_t g = plan.source_ranks[i];
      ranks.push_back(g / n_src == stage ? g % n_src : -1 - static_cast<int64_t>(i));
    }
    TargetPlanner& planner =
        planners.emplace_back(plan, &src_s, &dst_s, safetensors_rules, ranks, located);
    planner.set_by_stage_load_order();
    for (int64_t l = 0; l < dst->devices_per_stage; ++l) {
      by_stage_and_rank.push_back(planner.plan_target(l));
      if (views.on_planned) views.on_planned(by_stage_and_rank.size(), total);
    }
  }
  for (int64_t l = 0; l < dst->devices_per_stage; ++l)
    for (uint32_t stage = 0; stage < src->num_stages; ++stage)
      plan.targets.push_back(
          TargetFile{l,
                     ckpt_view(by_stage_and_rank[stage * dst->devices_per_stage + l],
                               views.ckpt_trailing, views.sizes_only),
                     fmt::format("{}{}_part{}.ckpt", views.prefix, l, stage), false});
}

}  // namespace

SourcesRead sources_read(const Plan& plan, const VirtualFile& file) {
  SourcesRead out;
  for (uint32_t s : file.sources()) {
    if (s >= plan.sources.size()) continue;
    out.newest_mtime_ns = std::max(out.newest_mtime_ns, plan.sources[s].file.fingerprint.mtime_ns);
    out.ranks.push_back(plan.source_ranks[s]);
  }
  std::sort(out.ranks.begin(), out.ranks.end());
  out.ranks.erase(std::unique(out.ranks.begin(), out.ranks.end()), out.ranks.end());
  return out;
}

int64_t target_count(const strategy::Strategy* dst) {
  return dst ? dst->devices_per_stage * dst->num_stages : 1;
}

void check_target_ranks(const std::vector<int64_t>& ranks, const strategy::Strategy* dst) {
  const int64_t n = target_count(dst);
  for (int64_t r : ranks)
    if (r < 0 || r >= n)
      fail("the view has no rank {} (its ranks are 0 to {}, from {})", r, n - 1,
           dst ? dst->origin : "the unsharded destination");
}

Plan make_plan(std::map<int64_t, index::IndexedSource> sources, const strategy::Strategy* src,
               const strategy::Strategy* dst, const ViewOptions& views) {
  if (!src && !dst)
    fail("give --src-strategy, --dst-strategy or both: with neither there is nothing to reshard");
  if (sources.empty()) fail("no source checkpoint found (expected rank_<N>/*.ckpt directories)");
  check_views_chosen(views);
  // MindSpore's safetensors transform has no duplicate or __param_key__ rules.
  const bool st_rules = apply_source_rules(
      sources, true, views.layout_memo ? &as_saved_names(*views.layout_memo) : nullptr);
  std::vector<int64_t> ranks;
  for (const auto& [rank, source] : sources) ranks.push_back(rank);
  // The directory holding the rank directories, for messages. A subset of targets loads a
  // subset of the sources; the caller checked the directories then.
  if (views.ranks.empty())
    check_rank_count(ranks, src,
                     sources.begin()->second.file.path.parent_path().parent_path().string());
  if (src)
    check_strategy_covered(sources, *src,
                           views.layout_memo ? &covered_names(*views.layout_memo) : nullptr);
  return plan_views(plan_of(sources), src, dst, views, st_rules);
}

Plan make_located_plan(std::vector<index::IndexedSource> files, const std::vector<int64_t>& ranks,
                       const strategy::Strategy& src, const strategy::Strategy* dst,
                       const ViewOptions& views) {
  if (files.empty()) fail("no source file found");
  if (files.size() != ranks.size())
    fail("make_located_plan: {} files for {} ranks", files.size(), ranks.size());
  check_views_chosen(views);
  std::vector<std::pair<int64_t, index::IndexedSource>> ranked;
  for (size_t i = 0; i < files.size(); ++i) ranked.emplace_back(ranks[i], std::move(files[i]));
  const bool st_rules = apply_source_rules(ranked, true);
  return plan_views(plan_of(ranked), &src, dst, views, st_rules, true);
}

// The one-rank destination that names every tensor of `sources` unsharded: planned against it, a
// full checkpoint in several files is served as rank_0's one file, each tensor copied whole.
strategy::Strategy whole_strategy(const std::vector<index::IndexedSource>& sources) {
  strategy::Strategy out;
  out.origin = "the unsharded destination";
  for (const index::IndexedSource& source : sources)
    for (const scan::Param& p : source.scan.params) {
      if (p.kind != scan::EntryKind::Tensor) continue;
      strategy::ParamLayout layout;
      layout.dev_matrix = {1};
      layout.tensor_map.assign(p.shape.size(), strategy::DimAxes{});  // no dimension split
      out.params.emplace(p.name, strategy::StrategyParam{p.name, {{0, std::move(layout)}}});
    }
  return out;
}

Plan make_unified_plan(std::vector<index::IndexedSource> parts, const strategy::Strategy* dst,
                       const ViewOptions& views) {
  if (parts.empty()) fail("no part of the unified checkpoint found");
  check_views_chosen(views);
  std::vector<std::pair<int64_t, index::IndexedSource>> ranked;
  for (auto& part : parts) ranked.emplace_back(0, std::move(part));
  const bool st_rules = apply_source_rules(ranked, false);
  Plan plan = plan_of(ranked);
  if (dst) return plan_views(std::move(plan), nullptr, dst, views, st_rules);
  // Without a destination: one merged checkpoint, rank_0, as any full source is served.
  const strategy::Strategy whole = whole_strategy(plan.sources);
  return plan_views(std::move(plan), nullptr, &whole, views, st_rules);
}

void add_full_views(Plan& plan, const std::vector<FullTensor>& tensors,
                    const strategy::Strategy& dst, const ViewOptions& asked) {
  check_views_chosen(asked);
  ViewOptions views = asked;
  if (views.source_format) views.ckpt = false;  // a full model's own format (hfai): safetensors
  if (views.by_stage)
    fail(
        "--by-stage writes one file per stage of a pipeline source; this checkpoint is one full "
        "model: omit --by-stage");
  check_target_ranks(views.ranks, &dst);
  std::unordered_map<std::string_view, const FullTensor*> by_name;
  for (const FullTensor& t : tensors)
    if (!by_name.emplace(t.name, &t).second) fail("two tensors named {}", t.name);
  // A name the checkpoint lacks is a strategy for another model (or a typo): cutting the rest
  // would serve a model the strategy does not describe.
  for (const auto& [name, param] : dst.params) {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      fail(
          "{}: parameter {} is not in the checkpoint ({} tensors, such as {}); give a strategy "
          "for this model",
          dst.origin, name, tensors.size(), tensors.empty() ? "none" : tensors.front().name);
    check_stated_shape(dst, name, it->second->shape);
  }
  std::vector<int64_t> targets = views.ranks;
  if (targets.empty())
    for (int64_t t = 0; t < target_count(&dst); ++t) targets.push_back(t);
  if (views.on_planned) views.on_planned(0, targets.size());
  for (size_t k = 0; k < targets.size(); ++k) {
    const int64_t t = targets[k];
    const TargetMaps maps(nullptr, &dst, t);
    std::vector<Entry> entries, passthrough;
    for (const FullTensor& full : tensors) {
      Entry e{full.name,    full.dtype, scan::EntryKind::Tensor, full.shape, nullptr, nullptr, 0,
              full.content, full.grid};
      switch (maps.role(full.name)) {
        case TargetMaps::Role::Drop:
          break;
        case TargetMaps::Role::Passthrough:
          passthrough.push_back(std::move(e));
          break;
        case TargetMaps::Role::Reshard: {
          const Layout layout = maps.dst_layout(full.name, full.shape.size());
          try {
            layout.slice_shape(full.shape, full.name);  // divisibility, named
          } catch (const Error& err) {
            fail("{}: {}", dst.origin, err.what());
          }
          const strategy::Box box = layout.slice_of(maps.target_local(), full.shape);
          for (size_t d = 0; d < full.shape.size(); ++d) e.shape[d] = box.end[d] - box.begin[d];
          if (!full.grid) {
            e.view = std::make_shared<StridedContent>(full.content->box(box.begin, e.shape));
            entries.push_back(std::move(e));
            break;
          }
          GridContent cut = full.grid->box(box.begin, e.shape);
          e.grid = nullptr;
          if (cut.cells.size() == 1)
            e.view = cut.cells.front();
          else
            e.grid = std::make_shared<const GridContent>(std::move(cut));
          entries.push_back(std::move(e));
          break;
        }
      }
    }
    std::move(passthrough.begin(), passthrough.end(), std::back_inserter(entries));
    std::set<std::string> left_out;  // none: every tensor has a type both views hold
    if (views.ckpt)
      plan.targets.push_back(TargetFile{t, ckpt_view(entries, {}, views.sizes_only),
                                        fmt::format("{}{}.ckpt", views.prefix, t), false});
    if (views.safetensors)
      plan.targets.push_back(TargetFile{t, safetensors_view(entries, left_out, views.sizes_only),
                                        fmt::format("{}{}.safetensors", views.prefix, t), true});
    if (!left_out.empty()) fail("tensor {}: no safetensors type for it", *left_out.begin());
    if (views.on_planned) views.on_planned(k + 1, targets.size());
  }
}

namespace {

Plan plan_views(Plan plan, const strategy::Strategy* src, const strategy::Strategy* dst,
                const ViewOptions& asked, bool safetensors_rules, bool located) {
  ViewOptions views = asked;
  if (views.source_format) {
    views.ckpt = !safetensors_rules;
    views.safetensors = safetensors_rules;
  }
  check_target_ranks(views.ranks, dst);
  if (views.by_stage && !views.ranks.empty())
    fail("--ranks and -o by_stage cannot be combined: by_stage serves every destination rank");
  if (views.by_stage) {
    plan_by_stage(plan, src, dst, safetensors_rules, views, located);
    return plan;
  }
  TargetPlanner planner(plan, src, dst, safetensors_rules, plan.source_ranks, located,
                        views.layout_memo.get());
  if (!views.ranks.empty()) planner.set_partial();
  std::vector<int64_t> targets = views.ranks;
  if (targets.empty())
    for (int64_t t = 0; t < target_count(dst); ++t) targets.push_back(t);
  std::set<std::string> left_out;
  if (views.on_planned) views.on_planned(0, targets.size());
  for (size_t k = 0; k < targets.size(); ++k) {
    const int64_t t = targets[k];
    const std::vector<Entry> entries = planner.plan_target(t);
    if (views.on_planned) views.on_planned(k + 1, targets.size());
    if (views.ckpt)
      plan.targets.push_back(TargetFile{t,
                                        ckpt_view(entries, views.ckpt_trailing, views.sizes_only),
                                        fmt::format("{}{}.ckpt", views.prefix, t), false});
    if (views.safetensors)
      plan.targets.push_back(TargetFile{t, safetensors_view(entries, left_out, views.sizes_only),
                                        fmt::format("{}{}.safetensors", views.prefix, t), true});
  }
  if (!left_out.empty()) {
    std::vector<std::string> names(left_out.begin(), left_out.end());
    const size_t shown = std::min<size_t>(names.size(), 10);
    plan.warnings.push_back(fmt::format(
        "the .safetensors files leave out {} entries safetensors cannot hold (strings, map "
        "tensors, Int4 of .ckpt sources); the .ckpt files keep them: {}{}",
        names.size(), fmt::join(names.begin(), names.begin() + static_cast<ptrdiff_t>(shown), ", "),
        names.size() > shown ? fmt::format(" and {} more", names.size() - shown) : ""));
  }
  return plan;
}

}  // namespace

}  // namespace ckptfs::plan
