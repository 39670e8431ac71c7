#include "view.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/fs/steps.h"
#include "ckptfs/hfai/merge.h"
#include "ckptfs/index/store.h"
#include "ckptfs/mindformers/metadata.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/plan/step_scalars.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/source/unified.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/rank_set.h"
#include "progress.h"

namespace ckptfs::cli {

CLI::App* add_view_command(CLI::App& app, std::string name, std::string description,
                           ViewArgs& args) {
  CLI::App* command = app.add_subcommand(std::move(name), std::move(description));
  command
      ->add_option("SRC_DIR", args.src_dir,
                   "Directory holding rank_<N>/*.ckpt or *.safetensors, a MindFormers "
                   "output/ directory, a MindFormers metadata checkpoint (the directory of "
                   "latest_checkpointed_iteration.txt, or one iteration_<N>/), or an hfai "
                   "checkpoint (a directory of PART_000.pt ...)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--src-strategy", args.src_strategy,
                      "Strategy the sources were saved with: protobuf file, .json file, or a "
                      "directory of per-stage files (omit: a MindFormers output/strategy/ if "
                      "SRC_DIR is such an output/, else rank_0 holds one full checkpoint)");
  command->add_option("--dst-strategy", args.dst_strategy,
                      "Strategy to present (omit: one merged checkpoint, rank_0)");
  command
      ->add_option("--step", args.step,
                   "Which checkpoint of each rank: latest (the newest step saved on every rank), "
                   "EPOCH_STEP such as 10_100, breakpoint, or a file-name glob; for a MindFormers "
                   "metadata checkpoint, latest or an iteration number")
      ->capture_default_str();
  command->add_flag("--allow-mixed-steps", args.allow_mixed_steps,
                    "With --step FILE-GLOB: serve the named files even if they are of different "
                    "steps");
  command
      ->add_option("--view", args.views,
                   "Which files each rank directory shows, comma-separated: ckpt, safetensors "
                   "(default both)")
      ->delimiter(',');
  command->add_option("--prefix", args.prefix,
                      "File name prefix of the shown files, as transform_checkpoints' "
                      "ckpt_prefix (default checkpoint_)");
  command->add_flag("--by-stage", args.by_stage,
                    "One _part<stage> file per source pipeline stage, as MindSpore's by-stage "
                    "transform writes");
  command->add_option("--ranks", args.ranks,
                      "Only these target ranks, e.g. 0-7,16 (one node's share): only the source "
                      "files they load are opened, scanned and planned");
  command->add_option("--index", args.shipped_index,
                      "A shipped index (`ckptfs index build SRC --output DIR`) to take every scan "
                      "from, read-only and lock-free; refused if a source changed since it was "
                      "built");
  command->add_option("--index-dir", args.index_dir,
                      "Where the LMDB index lives (default $XDG_CACHE_HOME/ckptfs/index or "
                      "~/.cache/ckptfs/index)");
  command->add_flag("-q,--quiet", args.quiet,
                    "No progress lines (shown on stderr for scanning, planning and writing that "
                    "take more than a second)");
  return command;
}

void ViewNotes::say() const {
  // The choice is news at the default level, but not a warning.
  if (spdlog::should_log(spdlog::level::warn)) fmt::print(stderr, "ckptfs: {}\n", chosen);
  spdlog::info("{}", chosen);
  if (!ignored.empty()) spdlog::warn("{}", ignored);
  for (const std::string& line : plan_warnings) spdlog::warn("{}", line);
  for (const std::string& line : detail) spdlog::debug("{}", line);
}

namespace {

plan::ViewOptions view_options(const ViewArgs& args) {
  plan::ViewOptions out;
  out.ckpt = out.safetensors = false;
  for (const std::string& view : args.views) {
    if (view == "ckpt")
      out.ckpt = true;
    else if (view == "safetensors")
      out.safetensors = true;
    else
      fail("--view {}: expected ckpt, safetensors or ckpt,safetensors", view);
  }
  // It becomes part of a file name in every rank directory.
  if (args.prefix.find('/') != std::string::npos || args.prefix.find('\0') != std::string::npos)
    fail("--prefix {}: a file name prefix cannot hold '/'", args.prefix);
  out.prefix = args.prefix;
  out.by_stage = args.by_stage;
  if (!args.ranks.empty()) out.ranks = util::parse_rank_set(args.ranks);
  return out;
}

// The index only saves the next scan: a location that cannot hold it (read-only, full, no
// HOME) costs one warning, never the command.
std::unique_ptr<index::Store> open_index(const std::optional<std::filesystem::path>& dir) {
  static std::atomic<bool> warned{false};
  try {
    return std::make_unique<index::Store>(dir ? *dir : index::default_dir());
  } catch (const Error& e) {
    if (!warned.exchange(true))
      spdlog::warn("{}; going on without a persistent index (every source is scanned)", e.what());
    return nullptr;
  }
}

std::vector<index::IndexedSource> index_files(const std::optional<std::filesystem::path>& dir,
                                              const std::string& shipped,
                                              const std::vector<std::filesystem::path>& paths,
                                              bool quiet) {
  Progress progress("scan", "files", Progress::mode_for(quiet));
  progress.also_count("tensors");
  progress.only_if_slow();
  progress.start_items(paths.size());
  const index::OnFile on_file = [&progress](const ckpt::FileScan& scan) {
    progress.add_also(scan.params.size());
    progress.item_done();
  };
  // The LMDB environment is closed before a mount's daemon forks.
  // A shipped index is the only source of scans: a stale one is refused, never repaired.
  if (!shipped.empty())
    return index::index_sources_shipped(index::Store::open_shipped(shipped), paths, on_file);
  std::unique_ptr<index::Store> store = open_index(dir);
  return index::index_sources(store.get(), paths, on_file);
}

// A plan of many target ranks reports its progress (if it takes a while) while `progress` lives.
void report_planning(plan::ViewOptions& views, Progress& progress) {
  progress.only_if_slow();
  views.on_planned = [&progress, started = false](size_t done, size_t total) mutable {
    if (!started) {
      progress.start_items(total);
      started = true;
    }
    if (done > 0) progress.item_done();
  };
}

std::optional<std::filesystem::path> index_dir(const ViewArgs& args) {
  if (args.index_dir.empty()) return std::nullopt;
  return std::filesystem::path(args.index_dir);
}

// What planning any step needs: the strategies and where the index lives.
struct Planning {
  std::shared_ptr<const strategy::Strategy> src, dst;
  std::optional<std::filesystem::path> index_dir;
  std::string shipped;  // --index
  std::string root;     // the directory holding rank_<N>/, for messages
  plan::ViewOptions views;
  bool quiet = false;

  // With `report`, scanning and planning report progress (the first plan, not a step's plan
  // made later by the daemon, which has no terminal).
  plan::Plan plan(const std::map<int64_t, std::filesystem::path>& files, bool mixed_allowed,
                  bool report = false) const {
    std::vector<std::filesystem::path> paths;
    std::vector<int64_t> ranks;
    for (const auto& [rank, path] : files) {
      ranks.push_back(rank);
      paths.push_back(path);
    }
    // Before indexing: a wrong strategy is refused without scanning every file first.
    plan::check_rank_count(ranks, src.get(), root);
    if (!views.ranks.empty()) keep_needed(ranks, paths);
    std::vector<index::IndexedSource> indexed =
        index_files(index_dir, shipped, paths, !report || quiet);
    std::map<int64_t, index::IndexedSource> sources;
    for (size_t i = 0; i < indexed.size(); ++i) sources.emplace(ranks[i], std::move(indexed[i]));
    if (!mixed_allowed) plan::check_step_scalars(sources);
    Progress progress("plan", "target ranks", Progress::mode_for(!report || quiet));
    plan::ViewOptions reported = views;
    report_planning(reported, progress);
    return plan::make_plan(std::move(sources), src.get(), dst.get(), reported);
  }

  // Narrows the files to those the exposed target ranks load, so a node opens, scans and maps
  // only its own share of a large checkpoint: the ranks whose blocks the planner reads (the
  // minimal list) and, in each stage the target walks, the passthrough source t_local mod N_src,
  // as the planner's load order has them. Record order follows each stage's names, so it does
  // not depend on which files of a stage are loaded.
  void keep_needed(std::vector<int64_t>& ranks, std::vector<std::filesystem::path>& paths) const {
    plan::check_target_ranks(views.ranks, dst.get());
    std::set<int64_t> needed;
    for (int64_t t : views.ranks) {
      const strategy::TargetMaps maps(src.get(), dst.get(), t);
      const int64_t n = maps.src_devices();
      const int64_t passthrough = maps.target_local() % n;
      std::vector<int64_t> minimal;
      try {
        minimal = strategy::rank_list_for_transform(src.get(), dst.get(), t, true);
      } catch (const Error&) {
        return;  // layouts MindSpore cannot pair: the planner's own fallback sees every file
      }
      for (int64_t r : minimal) {
        needed.insert(r);
        needed.insert(r / n * n + passthrough);
      }
      if (!src) {
        needed.insert(0);
        continue;
      }
      for (const auto& [name, param] : src->params)
        if (maps.in_effective_src(name) && maps.in_effective_dst(name))
          for (const auto& [stage, layout] : param.stages)
            needed.insert(static_cast<int64_t>(stage) * n + passthrough);
    }
    // No parameter the targets read is in both strategies (a strategy of another model): every
    // file goes to the planner, which says what does not fit, as a mount of all ranks would.
    if (needed.empty()) return;
    size_t kept = 0;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!needed.count(ranks[i])) continue;
      ranks[kept] = ranks[i];
      paths[kept++] = std::move(paths[i]);
    }
    ranks.resize(kept);
    paths.resize(kept);
  }
};

// A unified_safetensors directory: one full checkpoint in several files.
std::unique_ptr<fs::Tree> build_unified_tree(const ViewArgs& args,
                                             const source::UnifiedDir& unified, ViewNotes& notes) {
  if (!args.src_strategy.empty())
    fail(
        "{}: a unified_safetensors directory ({} beside part*.safetensors) is one full "
        "checkpoint; omit --src-strategy",
        args.src_dir, source::kParamNameMap);
  notes.chosen =
      fmt::format("{}: a unified checkpoint of {} files", args.src_dir, unified.files.size());
  std::optional<strategy::Strategy> dst;
  if (!args.dst_strategy.empty()) dst = strategy::read_strategy(args.dst_strategy);
  std::vector<index::IndexedSource> parts =
      index_files(index_dir(args), args.shipped_index, unified.files, args.quiet);
  // The map must agree with the files, or a parameter would silently come from nowhere.
  std::map<std::string, std::set<std::string_view>> held;
  for (const index::IndexedSource& part : parts)
    for (const ckpt::Param& p : part.scan.params)
      held[part.file.path.filename().string()].insert(p.name);
  for (const auto& [name, file] : unified.weight_map)
    if (!held[file].count(name))
      fail("{}: {} names parameter {} in {}, which does not hold it", args.src_dir,
           source::kParamNameMap, name, file);
  plan::ViewOptions views = view_options(args);
  Progress progress("plan", "target ranks", Progress::mode_for(args.quiet));
  report_planning(views, progress);
  return std::make_unique<fs::Tree>(
      plan::make_unified_plan(std::move(parts), dst ? &*dst : nullptr, views));
}

// An hfai directory (PART_000.pt ...): the merged model, optimizer and values at the root, or
// with --dst-strategy the model cut per target rank.
std::unique_ptr<fs::Tree> build_hfai_tree(const ViewArgs& args, ViewNotes& notes) {
  if (!args.src_strategy.empty())
    fail(
        "{}: an hfai checkpoint records no parallel layout (its PART files merge into one full "
        "model); omit --src-strategy",
        args.src_dir);
  const std::vector<std::filesystem::path> files = hfai::part_files(args.src_dir);
  notes.chosen = fmt::format("{}: an hfai checkpoint of {} PART files", args.src_dir, files.size());
  std::optional<strategy::Strategy> dst;
  if (!args.dst_strategy.empty()) dst = strategy::read_strategy(args.dst_strategy);
  plan::ViewOptions views = view_options(args);
  std::vector<index::IndexedSource> parts =
      index_files(index_dir(args), args.shipped_index, files, args.quiet);
  const hfai::Merged merged = hfai::merge(parts);
  Progress progress("plan", "target ranks", Progress::mode_for(args.quiet));
  report_planning(views, progress);
  return std::make_unique<fs::Tree>(
      plan::make_hfai_plan(std::move(parts), merged, dst ? &*dst : nullptr, views));
}

// A MindFormers metadata checkpoint: metadata.json gives the layouts and the storing files.
std::unique_ptr<fs::Tree> build_metadata_tree(const ViewArgs& args,
                                              const std::filesystem::path& dir, ViewNotes& notes) {
  if (!args.src_strategy.empty())
    fail("{}: a MindFormers metadata checkpoint carries its layouts in {}; omit --src-strategy",
         dir.string(), mindformers::kMetadataFile);
  const mindformers::Iteration it = mindformers::read_iteration(dir);
  notes.chosen =
      fmt::format("{}: a MindFormers metadata checkpoint of {} files, {} ranks", dir.string(),
                  it.files.size(), it.strategy.devices_per_stage * it.strategy.num_stages);
  // A deduplicated save leaves optimizer files holding only global_step: normal, so not a warning.
  for (const std::string& name : it.unnamed)
    notes.detail.push_back(fmt::format("{}: ignored, {} names no block in it",
                                       (dir / name).string(), mindformers::kMetadataFile));
  std::optional<strategy::Strategy> dst;
  if (!args.dst_strategy.empty()) dst = strategy::read_strategy(args.dst_strategy);
  std::vector<std::filesystem::path> paths;
  std::vector<int64_t> ranks;
  for (const mindformers::StoredFile& f : it.files) {
    paths.push_back(f.path);
    ranks.push_back(f.rank);
  }
  std::vector<index::IndexedSource> files =
      index_files(index_dir(args), args.shipped_index, paths, args.quiet);
  mindformers::validate(it, files);
  plan::ViewOptions views = view_options(args);
  for (const mindformers::Scalar& s : it.scalars)
    views.ckpt_trailing.push_back({s.name, s.dtype, s.bytes});
  Progress progress("plan", "target ranks", Progress::mode_for(args.quiet));
  report_planning(views, progress);
  plan::Plan plan =
      plan::make_located_plan(std::move(files), ranks, it.strategy, dst ? &*dst : nullptr, views);
  if (it.unhealthy)
    plan.warnings.push_back(fmt::format(
        "{}: {} marks this checkpoint unhealthy (ckpt_status 1); MindFormers' resume would skip "
        "it for an older healthy iteration (--step ITERATION)",
        dir.string(), mindformers::kCommonFile));
  return std::make_unique<fs::Tree>(std::move(plan));
}

std::unique_ptr<fs::Tree> build_step_tree(const ViewArgs& args, ViewNotes& notes, bool steps) {
  if (hfai::is_hfai_dir(args.src_dir)) return build_hfai_tree(args, notes);
  if (const auto iteration = mindformers::find_iteration(args.src_dir, args.step))
    return build_metadata_tree(args, *iteration, notes);
  if (const std::optional<source::UnifiedDir> unified = source::read_unified(args.src_dir))
    return build_unified_tree(args, *unified, notes);
  const source::Listing listing = source::list_sources(args.src_dir);
  const source::Choice choice =
      source::choose(listing, source::StepRequest::parse(args.step, args.allow_mixed_steps));
  notes.chosen = fmt::format("{}: {}", listing.root.string(), choice.summary);
  notes.ignored = source::ignored_summary(listing);
  for (const source::Ignored& entry : listing.ignored)
    notes.detail.push_back(fmt::format("{}: ignored, {}", entry.path.string(), entry.why));

  std::string src_strategy = args.src_strategy;
  if (src_strategy.empty() && listing.mindformers_strategy) {
    src_strategy = listing.mindformers_strategy->string();
    notes.chosen += fmt::format(
        "; source strategy {} (a MindFormers output directory; --src-strategy overrides it)",
        src_strategy);
  }
  auto planning = std::make_shared<Planning>();
  if (!src_strategy.empty())
    planning->src = std::make_shared<strategy::Strategy>(strategy::read_strategy(src_strategy));
  if (!args.dst_strategy.empty())
    planning->dst =
        std::make_shared<strategy::Strategy>(strategy::read_strategy(args.dst_strategy));
  planning->index_dir = index_dir(args);
  planning->root = listing.root.string();
  planning->views = view_options(args);
  planning->shipped = args.shipped_index;
  planning->quiet = args.quiet;

  auto tree = std::make_unique<fs::Tree>(
      planning->plan(choice.files, choice.mixed_allowed, /*report=*/true));
  // Every step is offered, planned only when looked up: nothing more is read now.
  if (steps && !source::complete_steps(listing).empty()) {
    // Absolute: the daemon serves from "/".
    tree->set_steps(std::make_shared<fs::Steps>(
        std::filesystem::absolute(args.src_dir),
        [planning](const std::map<int64_t, std::filesystem::path>& files) {
          return planning->plan(files, false);
        }));
  }
  return tree;
}

}  // namespace

std::unique_ptr<fs::Tree> build_tree(const ViewArgs& args, ViewNotes& notes, bool steps) {
  std::unique_ptr<fs::Tree> tree = build_step_tree(args, notes, steps);
  notes.plan_warnings = tree->plan().warnings;
  return tree;
}

}  // namespace ckptfs::cli
