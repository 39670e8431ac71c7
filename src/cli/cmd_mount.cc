// ckptfs mount / umount: source scan -> index -> strategies -> plan -> FUSE.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/fs/mount.h"
#include "ckptfs/fs/steps.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/plan/step_scalars.h"
#include "ckptfs/source/discover.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/source/unified.h"
#include "ckptfs/strategy/strategy.h"
#include "commands.h"

namespace ckptfs::cli {

namespace {

struct MountArgs {
  std::string src_dir;
  std::string mountpoint;
  std::string src_strategy;
  std::string dst_strategy;
  std::string index_dir;
  std::string log_file;
  std::string step = "latest";
  bool allow_mixed_steps = false;
  bool foreground = false;
  std::vector<std::string> options;
  std::vector<std::string> views{"ckpt", "safetensors"};
  std::string prefix = "checkpoint_";
};

constexpr std::string_view kByStage = "by_stage";

std::vector<std::string> split_options(const std::string& list) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t comma; (comma = list.find(',', begin)) != std::string::npos; begin = comma + 1)
    out.push_back(list.substr(begin, comma - begin));
  out.push_back(list.substr(begin));
  return out;
}

bool has_option(const std::vector<std::string>& lists, std::string_view word) {
  for (const std::string& list : lists)
    for (const std::string& w : split_options(list))
      if (w == word) return true;
  return false;
}

plan::ViewOptions view_options(const MountArgs& args) {
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
  out.by_stage = has_option(args.options, kByStage);
  return out;
}

// The -o words go to fs::mount as they are (but by_stage, which chooses the files): it takes
// out its own (cache, noreadahead, ...) and hands the rest to libfuse.
fs::MountOptions mount_options(const MountArgs& args) {
  fs::MountOptions out;
  out.foreground = args.foreground;
  out.log_file = args.log_file;
  for (const std::string& list : args.options) {
    std::string kept;
    for (const std::string& word : split_options(list))
      if (word != kByStage) kept += (kept.empty() ? "" : ",") + word;
    if (!kept.empty()) out.fuse_options.push_back(kept);
  }
  return out;
}

// What the mount says once it is sure to serve: logged only then, so a refusal stays one line.
struct Notes {
  std::string chosen;               // which checkpoints, in one line
  std::string ignored;              // entries that are not checkpoints, in one line or ""
  std::vector<std::string> detail;  // one debug line per ignored entry
  std::vector<std::string> plan_warnings;
};

// What planning any step needs: the strategies and where the index lives.
struct Planning {
  std::shared_ptr<const strategy::Strategy> src, dst;
  std::filesystem::path index_dir;
  std::string root;  // the directory holding rank_<N>/, for messages
  plan::ViewOptions views;

  plan::Plan plan(const std::map<int64_t, std::filesystem::path>& files, bool mixed_allowed) const {
    std::vector<std::filesystem::path> paths;
    std::vector<int64_t> ranks;
    for (const auto& [rank, path] : files) {
      ranks.push_back(rank);
      paths.push_back(path);
    }
    // Before indexing: a wrong strategy is refused without scanning every file first.
    plan::check_rank_count(ranks, src.get(), root);
    std::vector<index::IndexedSource> indexed;
    {
      // The LMDB environment is closed before the daemon forks.
      index::Store store(index_dir);
      indexed = index::index_sources(store, paths);
    }
    std::map<int64_t, index::IndexedSource> sources;
    for (size_t i = 0; i < indexed.size(); ++i) sources.emplace(ranks[i], std::move(indexed[i]));
    if (!mixed_allowed) plan::check_step_scalars(sources);
    return plan::make_plan(std::move(sources), src.get(), dst.get(), views);
  }
};

// A unified_safetensors directory: one full checkpoint in several files.
std::unique_ptr<fs::Tree> build_unified_tree(const MountArgs& args,
                                             const source::UnifiedDir& unified, Notes& notes) {
  if (!args.src_strategy.empty())
    fail(
        "{}: a unified_safetensors directory ({} beside part*.safetensors) is one full "
        "checkpoint; omit --src-strategy",
        args.src_dir, source::kParamNameMap);
  notes.chosen =
      fmt::format("{}: a unified checkpoint of {} files", args.src_dir, unified.files.size());
  std::optional<strategy::Strategy> dst;
  if (!args.dst_strategy.empty()) dst = strategy::read_strategy(args.dst_strategy);
  std::vector<index::IndexedSource> parts;
  {
    // The LMDB environment is closed before the daemon forks.
    index::Store store(args.index_dir.empty() ? index::default_dir()
                                              : std::filesystem::path(args.index_dir));
    parts = index::index_sources(store, unified.files);
  }
  // The map must agree with the files, or a parameter would silently come from nowhere.
  std::map<std::string, std::set<std::string_view>> held;
  for (const index::IndexedSource& part : parts)
    for (const ckpt::Param& p : part.scan.params)
      held[part.file.path.filename().string()].insert(p.name);
  for (const auto& [name, file] : unified.weight_map)
    if (!held[file].count(name))
      fail("{}: {} names parameter {} in {}, which does not hold it", args.src_dir,
           source::kParamNameMap, name, file);
  return std::make_unique<fs::Tree>(
      plan::make_unified_plan(std::move(parts), dst ? &*dst : nullptr, view_options(args)));
}

// The chosen step's tree, with /steps when the source has steps.
std::unique_ptr<fs::Tree> build_tree(const MountArgs& args, Notes& notes) {
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
  planning->index_dir =
      args.index_dir.empty() ? index::default_dir() : std::filesystem::path(args.index_dir);
  planning->root = listing.root.string();
  planning->views = view_options(args);

  auto tree = std::make_unique<fs::Tree>(planning->plan(choice.files, choice.mixed_allowed));
  // Every step is offered, planned only when looked up: nothing more is read now.
  if (!source::complete_steps(listing).empty()) {
    tree->set_steps(std::make_shared<fs::Steps>(
        args.src_dir, [planning](const std::map<int64_t, std::filesystem::path>& files) {
          return planning->plan(files, false);
        }));
  }
  return tree;
}

void say(const Notes& notes) {
  // The choice is news at the default level, but not a warning.
  if (spdlog::should_log(spdlog::level::warn)) fmt::print(stderr, "ckptfs: {}\n", notes.chosen);
  spdlog::info("{}", notes.chosen);
  if (!notes.ignored.empty()) spdlog::warn("{}", notes.ignored);
  for (const std::string& line : notes.plan_warnings) spdlog::warn("{}", line);
  for (const std::string& line : notes.detail) spdlog::debug("{}", line);
}

void run_mount(const MountArgs& args) {
  std::error_code ec;
  if (!std::filesystem::is_directory(args.mountpoint, ec))
    fail("mountpoint {} is not a directory", args.mountpoint);
  Notes notes;
  std::unique_ptr<fs::Tree> tree = build_tree(args, notes);
  notes.plan_warnings = tree->plan().warnings;
  fs::MountOptions options = mount_options(args);
  options.on_mounted = [&notes] { say(notes); };
  const int rc = fs::mount(args.mountpoint, *tree, options);
  // Not freed: this process only exits now, and the detached daemon shares the tables with it
  // copy-on-write, so freeing them would copy every page they sit on first (seconds and
  // gigabytes at millions of source tensors).
  static_cast<void>(tree.release());
  if (rc != 0) fail("mount at {} ended with status {}", args.mountpoint, rc);
}

}  // namespace

void add_mount_commands(CLI::App& app) {
  auto args = std::make_shared<MountArgs>();
  CLI::App* mount = app.add_subcommand(
      "mount",
      "Mount SRC_DIR's checkpoints (.ckpt or .safetensors) at MOUNTPOINT as "
      "rank_N/checkpoint_N.ckpt and rank_N/checkpoint_N.safetensors files resharded from the "
      "source strategy to the destination strategy, synthesized on read");
  mount
      ->add_option("SRC_DIR", args->src_dir,
                   "Directory holding rank_<N>/*.ckpt or *.safetensors, or a MindFormers "
                   "output/ directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  mount->add_option("MOUNTPOINT", args->mountpoint, "Empty directory to mount on")->required();
  mount->add_option("--src-strategy", args->src_strategy,
                    "Strategy the sources were saved with: protobuf file, .json file, or a "
                    "directory of per-stage files (omit: a MindFormers output/strategy/ if SRC_DIR "
                    "is such an output/, else rank_0 holds one full checkpoint)");
  mount->add_option("--dst-strategy", args->dst_strategy,
                    "Strategy to present (omit: one merged checkpoint, rank_0)");
  mount
      ->add_option("--step", args->step,
                   "Which checkpoint of each rank: latest (the newest step saved on every rank), "
                   "EPOCH_STEP such as 10_100, breakpoint, or a file-name glob")
      ->capture_default_str();
  mount->add_flag("--allow-mixed-steps", args->allow_mixed_steps,
                  "With --step FILE-GLOB: serve the named files even if they are of different "
                  "steps");
  mount
      ->add_option("--view", args->views,
                   "Which files each rank directory shows, comma-separated: ckpt, safetensors "
                   "(default both)")
      ->delimiter(',');
  mount->add_option("--prefix", args->prefix,
                    "File name prefix of the shown files, as transform_checkpoints' ckpt_prefix "
                    "(default checkpoint_)");
  mount->add_flag("-f,--foreground", args->foreground, "Stay in the foreground until unmounted");
  mount
      ->add_option("-o", args->options,
                   "Mount options, comma-separated: cache (page-cache mode for mmap users; "
                   "default is direct I/O), noreadahead (no read-ahead thread for sequential "
                   "readers), by_stage (one _part<stage> file per source pipeline stage, as "
                   "MindSpore's by-stage transform writes), splice (splice long runs while "
                   "several files are read; needs "
                   "fs.pipe-max-size >= 2 MiB), splice=always, max_read=N, max_threads=N, or any "
                   "libfuse option such as allow_other")
      ->allow_extra_args(false);
  mount->add_option("--index-dir", args->index_dir,
                    "Where the LMDB index lives (default $XDG_CACHE_HOME/ckptfs/index or "
                    "~/.cache/ckptfs/index)");
  mount->add_option("--log-file", args->log_file,
                    "Log file of the mounted daemon (default: none once detached)");
  mount->callback([args] { run_mount(*args); });

  auto mountpoint = std::make_shared<std::string>();
  CLI::App* umount = app.add_subcommand("umount", "Unmount a ckptfs mount");
  umount->add_option("MOUNTPOINT", *mountpoint, "Where ckptfs is mounted")->required();
  umount->callback([mountpoint] { fs::unmount(*mountpoint); });
}

}  // namespace ckptfs::cli
