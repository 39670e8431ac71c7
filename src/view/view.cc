#include "ckptfs/view/view.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "ckptfs/ckpt/crc32.h"
#include "ckptfs/crypt/session_key.h"
#include "ckptfs/error.h"
#include "ckptfs/fs/lazy_ranks.h"
#include "ckptfs/fs/steps.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/plan/step_scalars.h"
#include "ckptfs/source/pinned_files.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/strategy/compact.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/out_of_memory.h"
#include "ckptfs/util/rank_set.h"
#include "ckptfs/view/families.h"
#include "ckptfs/view/progress.h"
#include "rank_dirs.h"

namespace ckptfs::view {

void ViewNotes::say() const {
  // The choice is news at the default level, but not a warning.
  if (!quiet && spdlog::should_log(spdlog::level::warn)) fmt::print(stderr, "ckptfs: {}\n", chosen);
  spdlog::info("{}", chosen);
  if (!ignored.empty()) spdlog::warn("{}", ignored);
  for (const std::string& line : plan_warnings) spdlog::warn("{}", line);
  for (const std::string& line : detail) spdlog::debug("{}", line);
}

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
  out.source_format = args.source_format;
  if (!args.ranks.empty()) out.ranks = util::parse_rank_set(args.ranks);
  return out;
}

plan::ModelFileOptions model_file_options(const ViewArgs& args) {
  plan::ModelFileOptions out;
  if (!args.shard_size.empty()) {
    out.shard_size = plan::parse_shard_size(args.shard_size);
    out.shard_size_given = true;
  }
  if (!args.rename.empty()) out.rename = plan::RenameMap::read(args.rename);
  return out;
}

namespace {

using namespace detail;

}  // namespace

namespace detail {

void refuse_model_file_options(const ViewArgs& args, std::string_view family) {
  if (!args.shard_size.empty() || !args.rename.empty())
    fail(
        "{}: {} applies to a merged model.safetensors (PyTorch DCP, hfai), which a {} checkpoint "
        "is not served as; omit it",
        args.src_dir, args.shard_size.empty() ? "--rename" : "--shard-size", family);
}

// --unstack-layers applies to checkpoints with stacked layers only: never silently ignored.
void refuse_unused_unstack(const ViewArgs& args, bool asked, std::string_view family) {
  if (args.unstack_layers && !asked)
    fail("--unstack-layers: {} is a {} checkpoint, which has no stacked layers; omit it",
         args.src_dir, family);
}

// The strategy and the view options are parsed once, when the family first asks for them, so
// that it refuses in its own order.
FamilyInputs::FamilyInputs(const family::Family& fam, const std::filesystem::path& found,
                           const ViewArgs& args) {
  in.src_dir = args.src_dir;
  in.found = found;
  in.step = args.step;
  in.src_strategy = args.src_strategy;
  in.dst = [this, &args]() -> const strategy::Strategy* {
    if (!dst_read_ && !args.dst_strategy.empty()) dst_ = strategy::read_strategy(args.dst_strategy);
    dst_read_ = true;
    return dst_ ? &*dst_ : nullptr;
  };
  in.views = [this, &args] {
    plan::ViewOptions views = view_options(args);
    if (!progress_) progress_.emplace("plan", "target ranks", Progress::mode_for(args.quiet));
    report_planning(views, *progress_);
    return views;
  };
  in.model_files = [this, &args] {
    if (!model_files_) {
      model_files_ = model_file_options(args);
      if (model_files_->shard_size_given && in.dst())
        fail(
            "{}: --shard-size cuts the merged model.safetensors; with --dst-strategy every rank "
            "holds one file; omit one of them",
            args.src_dir);
    }
    return *model_files_;
  };
  in.unstack_layers = [this, &args] {
    unstack_asked = true;
    return args.unstack_layers;
  };
  in.scan = [&fam, &args](const std::vector<std::filesystem::path>& paths) {
    return index_files(index_dir(args), args.shipped_index, paths, args.quiet, fam.readers());
  };
}

}  // namespace detail

namespace {

// A checkpoint of a family that plans its own view (view/families.h).
std::unique_ptr<fs::Tree> build_family_tree(const family::Family& fam,
                                            const std::filesystem::path& found,
                                            const ViewArgs& args, ViewNotes& notes) {
  const FamilyInputs inputs(fam, found, args);
  family::ViewText text;
  plan::Plan plan = fam.plan(inputs.in, text);
  if (!inputs.model_files_asked()) refuse_model_file_options(args, fam.name);
  refuse_unused_unstack(args, inputs.unstack_asked, fam.name);
  notes.chosen = std::move(text.chosen);
  notes.detail = std::move(text.detail);
  return std::make_unique<fs::Tree>(std::move(plan));
}

// `latest` is the newest step saved on every rank, which a node's copy holding only some source
// ranks (--ranks needs only its share) cannot see: a step saved on the ranks present but not on
// the others would be served there, while a node with other ranks serves an older one, and the
// job would load a mix of steps. So such a copy must be told the step, the same on every node.
// A needed rank missing is named first, by the plan's own check: copying it in may be the fix.
void require_step_if_partial(const RankDirs& dirs, const ViewArgs& args) {
  const Planning& planning = *dirs.planning;
  if (planning.views.ranks.empty() ||
      source::StepRequest::parse(args.step, args.allow_mixed_steps).kind !=
          source::StepRequest::Kind::Latest)
    return;
  const strategy::Strategy* src = planning.src.get();
  const int64_t expected = src ? src->devices_per_stage * int64_t{src->num_stages} : 1;
  std::vector<int64_t> present;
  for (const auto& [rank, file] : dirs.choice.files) present.push_back(rank);
  const int64_t in_strategy =
      std::ranges::count_if(present, [expected](int64_t r) { return r < expected; });
  if (in_strategy >= expected) return;
  strategy::TransformMemo memo;
  const std::optional<std::set<int64_t>> needed =
      planning.needed_sources(planning.views.ranks, memo);
  if (!needed) return;  // every source is read: the plan refuses the absent ones
  plan::check_rank_count(present, src, planning.root, planning.unusable, &*needed);
  fail(
      "{}: only {} of the {} source ranks are present, so the newest step saved on every rank "
      "cannot be known; give --step EPOCH_STEP{}, the same on every node",
      dirs.listing.root.string(), in_strategy, expected,
      dirs.choice.step ? fmt::format(" (the newest here is {})", dirs.choice.step->str()) : "");
}

std::unique_ptr<fs::Tree> build_step_tree(const ViewArgs& args, ViewNotes& notes, bool steps) {
  const Detected detected = detect(args.src_dir, args.step);
  if (!is_rank_dirs(*detected.family))
    return build_family_tree(*detected.family, detected.found, args, notes);
  refuse_model_file_options(args, detected.family->name);
  // A node of a large job: with a shipped index of this view and the strategies given, the
  // source directory is not even listed (no /steps then: the index pins one step).
  bool tried_lazy = false;  // once refused (logged), the listed files would be refused too
  if (steps && !args.shipped_index.empty() && !args.src_strategy.empty()) {
    if (const std::optional<source::Choice> pinned = pinned_files(args.shipped_index)) {
      tried_lazy = true;
      ViewNotes pinned_notes;
      const RankDirs dirs =
          prepare_rank_dirs(*detected.family, args, pinned_notes, &*pinned, /*parse=*/false);
      if (std::unique_ptr<fs::Tree> tree = lazy_tree(dirs, args)) {
        notes = std::move(pinned_notes);
        return tree;
      }
    }
  }
  refuse_unused_unstack(args, false, detected.family->name);
  const RankDirs dirs = prepare_rank_dirs(*detected.family, args, notes);
  require_step_if_partial(dirs, args);
  const std::shared_ptr<Planning>& planning = dirs.planning;

  // Only a mount plans lazily: materialize and verify read every file at once anyway.
  std::unique_ptr<fs::Tree> tree = steps && !tried_lazy ? lazy_tree(dirs, args) : nullptr;
  if (!tree)
    tree = std::make_unique<fs::Tree>(
        planning->plan(dirs.choice.files, dirs.choice.mixed_allowed, /*report=*/true));
  // Every step is offered, planned only when looked up: nothing more is read now.
  if (steps && !source::complete_steps(dirs.listing).empty()) {
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

void load_key(const ViewArgs& args) {
  if (!args.dec_key_file.empty() && !args.dec_key_env.empty())
    fail("--dec-key-file and --dec-key-env both given: give the key once");
  if (!args.dec_key_file.empty())
    crypt::set_session_key(crypt::read_key_file(args.dec_key_file));
  else if (!args.dec_key_env.empty())
    crypt::set_session_key(crypt::read_key_env(args.dec_key_env));
}

std::unique_ptr<fs::Tree> build_tree(const ViewArgs& args, ViewNotes& notes, bool steps) {
  util::require_directory(args.src_dir, "source directory");
  load_key(args);
  // A source that runs out of memory while scanned is named by the scan; past that, the view.
  std::unique_ptr<fs::Tree> tree =
      naming_out_of_memory(args.src_dir, "planning the view of its files",
                           [&] { return build_step_tree(args, notes, steps); });
  notes.plan_warnings = tree->plan().warnings;
  notes.quiet = args.quiet;
  return tree;
}

}  // namespace ckptfs::view
