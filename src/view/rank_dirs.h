// The view module's own parts, shared by its files (not a public header): how rank directories
// are listed, indexed and planned (rank_dirs.cc) and how a shipped index's target summaries are
// made and used (summaries.cc). Thread-safety: Planning is shared by the FUSE workers that plan
// ranks and steps on first use; its mutable state is guarded by its own mutex, and a shipped index
// is opened under shipped_mutex().
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/family/family.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/plan/source_fit.h"
#include "ckptfs/plan/step_scalars.h"
#include "ckptfs/scan/reader.h"
#include "ckptfs/source/discover.h"
#include "ckptfs/source/open_files.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/view/progress.h"
#include "ckptfs/view/view.h"

namespace ckptfs::view::detail {

// A process may open an index directory only once at a time (LMDB's rule), and ranks or steps
// planned on first use may be planned by two FUSE workers at once.
std::mutex& shipped_mutex();

// Scans `paths` with `readers` through the cache index in `dir` or the shipped index `shipped`,
// opening them through `opens` when given. `defer`: index::index_sources' (for plans served
// only through fs::Tree); `defer_shipped`: index::index_sources_shipped's (the same, for plans
// made in the daemon: a plan made at mount is refused there, in one line).
std::vector<index::IndexedSource> index_files(const std::optional<std::filesystem::path>& dir,
                                              const std::string& shipped,
                                              const std::vector<std::filesystem::path>& paths,
                                              bool quiet, scan::Readers readers,
                                              source::OpenFiles* opens = nullptr,
                                              bool defer = false, bool defer_shipped = false);

// A plan of many target ranks reports its progress (if it takes a while) while `progress` lives.
void report_planning(plan::ViewOptions& views, Progress& progress);

std::optional<std::filesystem::path> index_dir(const ViewArgs& args);

// Throws Error in one line if --shard-size or --rename was given for a `family` whose view has
// no merged model.safetensors (it never asked for them).
void refuse_model_file_options(const ViewArgs& args, std::string_view family);

// Throws Error in one line if --unstack-layers was given and the family did not ask for it
// (`asked`): a checkpoint without stacked layers.
void refuse_unused_unstack(const ViewArgs& args, bool asked, std::string_view family);

// What a family with its own view is given (family::ViewInputs) for `args`, with the state its
// callbacks keep: the destination strategy and the planning progress, each made once. Lives as
// long as the family's call; neither copied nor moved (the callbacks point into it).
struct FamilyInputs {
  FamilyInputs(const family::Family& fam, const std::filesystem::path& found, const ViewArgs& args);
  FamilyInputs(const FamilyInputs&) = delete;
  FamilyInputs& operator=(const FamilyInputs&) = delete;

  family::ViewInputs in;
  // Whether the family asked for --shard-size and --rename (in.model_files).
  bool model_files_asked() const { return model_files_.has_value(); }
  bool unstack_asked = false;  // the family asked in.unstack_layers

 private:
  std::optional<plan::ModelFileOptions> model_files_;
  std::optional<strategy::Strategy> dst_;
  bool dst_read_ = false;
  std::optional<Progress> progress_;
};

// A strategy's compact copy as a shipped index stores it, decoded; nullopt if damaged.
std::optional<strategy::Strategy> load_compact(std::string_view stored, std::string origin);

// What planning any step needs: the strategies and where the index lives.
struct Planning {
  // Set at mount, or on the first plan from `compact` (see decode_strategies).
  mutable std::shared_ptr<const strategy::Strategy> src, dst;
  std::optional<std::filesystem::path> index_dir;
  std::string shipped;                      // --index
  std::string root;                         // the directory holding rank_<N>/, for messages
  std::map<int64_t, std::string> unusable;  // source::Listing's, for messages
  plan::ViewOptions views;
  bool quiet = false;
  // Every plan of the view opens its sources through this: a rank planned on first open does
  // not open again what an earlier rank opened (source/open_files.h says what that costs).
  std::shared_ptr<source::OpenFiles> opens = std::make_shared<source::OpenFiles>();
  // index build: the scans come from this store (being built), not from index_dir or shipped.
  const index::Store* store = nullptr;
  scan::Readers readers;  // the family's (view/families.h)

  // A mount listed from a shipped index takes the strategies' compact copies from the index
  // (found by the digest of the files' bytes at mount) instead of parsing the files, and
  // decodes them on the first plan: in the daemon, when a rank is first opened.
  struct Compact {
    std::string origin;  // the path, for messages; empty: no strategy on this side
    std::string bytes;
  };
  mutable std::optional<std::pair<Compact, Compact>> compact;
  mutable std::mutex compact_mu;

  void decode_strategies() const {
    std::lock_guard lock(compact_mu);
    if (!compact) return;
    const auto decode = [](const Compact& c) -> std::shared_ptr<const strategy::Strategy> {
      if (c.origin.empty()) return nullptr;
      std::optional<strategy::Strategy> s = load_compact(c.bytes, c.origin);
      if (!s)
        fail("{}: the shipped index's copy of this strategy is damaged; rebuild the index",
             c.origin);
      return std::make_shared<const strategy::Strategy>(std::move(*s));
    };
    const auto start = std::chrono::steady_clock::now();
    src = decode(compact->first);
    dst = decode(compact->second);
    compact.reset();
    spdlog::info("strategies decoded from the shipped index in {:.3f} s",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  // With `report`, scanning and planning report progress (the first plan, not a step's plan
  // made later by the daemon, which has no terminal).
  plan::Plan plan(const std::map<int64_t, std::filesystem::path>& files, bool mixed_allowed,
                  bool report = false) const {
    return plan_ranks(files, mixed_allowed, views.ranks, report);
  }

  // What a planning thread keeps across its plans of this view (index build's summaries).
  struct Memos {
    std::shared_ptr<plan::LayoutMemo> layouts = plan::new_layout_memo();
    strategy::TransformMemo transform;
  };

  // The same, exposing `ranks_shown` (empty: all). `loads`: the source ranks a shipped index's
  // summaries say those ranks load (their plan's source_ranks when the index was built from the
  // same files), which spares a first open the walk over every parameter that finds them.
  plan::Plan plan_ranks(const std::map<int64_t, std::filesystem::path>& files, bool mixed_allowed,
                        const std::vector<int64_t>& ranks_shown, bool report = false,
                        Memos* memos = nullptr, const std::set<int64_t>* loads = nullptr) const {
    decode_strategies();
    plan::ViewOptions shown = views;
    shown.ranks = ranks_shown;
    if (memos) shown.layout_memo = memos->layouts;
    std::vector<std::filesystem::path> paths;
    std::vector<int64_t> ranks;
    for (const auto& [rank, path] : files) {
      ranks.push_back(rank);
      paths.push_back(path);
    }
    // Only the sources the exposed ranks read must be there; the others are neither required
    // nor opened (a node's copy may hold just its share).
    std::optional<std::set<int64_t>> needed;
    if (loads && !shown.ranks.empty()) {
      plan::check_target_ranks(shown.ranks, dst.get());
      needed = *loads;
    } else if (!shown.ranks.empty()) {
      strategy::TransformMemo own;
      needed = needed_sources(shown.ranks, memos ? memos->transform : own);
    }
    // Before indexing: a wrong strategy is refused without scanning every file first.
    plan::check_rank_count(ranks, src.get(), root, unusable, needed ? &*needed : nullptr);
    if (needed) keep_only(*needed, ranks, paths);
    std::vector<index::IndexedSource> indexed =
        // The index being built: its structure digests were taken from these files' bytes
        // moments ago, so each target's sources are not read again for them.
        store != nullptr
            ? index::index_sources_shipped(*store, paths, {}, false, opens.get())
            : index_files(index_dir, shipped, paths, !report || quiet, readers, opens.get(),
                          /*defer=*/true, /*defer_shipped=*/!report);
    std::map<int64_t, index::IndexedSource> sources = by_rank(ranks, std::move(indexed));
    if (!mixed_allowed) {
      try {
        plan::check_step_scalars(sources);
      } catch (const Error&) {
        // The counters were read where scans the index gave unchecked (over FUSE) place them:
        // a file rewritten in place since holds other bytes there. Before the steps are said
        // to differ, every file's headers are compared (those that differ are scanned again).
        if (std::none_of(sources.begin(), sources.end(),
                         [](const auto& s) { return s.second.deferred != nullptr; }))
          throw;
        sources = by_rank(
            ranks, index_files(index_dir, shipped, paths, !report || quiet, readers, opens.get()));
        plan::check_step_scalars(sources);
      }
    }
    Progress progress("plan", "target ranks", Progress::mode_for(!report || quiet));
    report_planning(shown, progress);
    return plan::make_plan(std::move(sources), src.get(), dst.get(), shown);
  }

  // The source ranks the exposed target ranks load, so a node opens, scans and maps only its own
  // share of a large checkpoint: the ranks whose blocks the planner reads (the minimal list) and,
  // in each stage the target walks, the passthrough source t_local mod N_src, as the planner's
  // load order has them. Record order follows each stage's names, so it does not depend on
  // which files of a stage are loaded. nullopt: every source (see the returns below).
  std::optional<std::set<int64_t>> needed_sources(const std::vector<int64_t>& shown,
                                                  strategy::TransformMemo& memo) const {
    plan::check_target_ranks(shown, dst.get());
    std::set<int64_t> needed;
    for (int64_t t : shown) {
      const strategy::TargetMaps maps(src.get(), dst.get(), t);
      const int64_t n = maps.src_devices();
      const int64_t passthrough = maps.target_local() % n;
      std::vector<int64_t> minimal;
      try {
        minimal = strategy::rank_list_for_transform(src.get(), dst.get(), t, true, &memo);
      } catch (const Error&) {
        return std::nullopt;  // layouts MindSpore cannot pair: the planner's own fallback
      }
      for (int64_t r : minimal) {
        needed.insert(r);
        needed.insert(r / n * n + passthrough);
      }
      if (!src) {
        needed.insert(0);
        continue;
      }
      // Every stage of a parameter the target reads (the memo has them from the rank list).
      for (const strategy::TransformMemo::Pair& pair : memo.stage(maps).pairs)
        for (uint32_t stage : pair.stages)
          needed.insert(static_cast<int64_t>(stage) * n + passthrough);
    }
    // No parameter the targets read is in both strategies (a strategy of another model): each
    // target's passthrough file of every stage goes to the planner, which says what does not
    // fit as a mount of all ranks would (every file of a stage holds that stage's names).
    if (needed.empty()) {
      for (int64_t t : shown) {
        const strategy::TargetMaps maps(src.get(), dst.get(), t);
        const int64_t n = maps.src_devices();
        for (int64_t stage = 0; stage < (src ? int64_t{src->num_stages} : 1); ++stage)
          needed.insert(stage * n + maps.target_local() % n);
      }
    }
    return needed;
  }

  static std::map<int64_t, index::IndexedSource> by_rank(
      const std::vector<int64_t>& ranks, std::vector<index::IndexedSource> indexed) {
    std::map<int64_t, index::IndexedSource> sources;
    for (size_t i = 0; i < indexed.size(); ++i) sources.emplace(ranks[i], std::move(indexed[i]));
    return sources;
  }

  static void keep_only(const std::set<int64_t>& needed, std::vector<int64_t>& ranks,
                        std::vector<std::filesystem::path>& paths) {
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

// A directory of rank_<N>/ checkpoints: which files, and how to plan them.
struct RankDirs {
  source::Listing listing;
  source::Choice choice;
  std::string src_strategy;  // the path given, or a MindFormers output's own
  std::shared_ptr<Planning> planning;
};

// `pinned`: the files a shipped index was built from, taken instead of listing the source
// directory (whose thousands of rank directories every node would otherwise read).
// `parse`: false leaves the strategies unparsed (a lazily listed mount takes them from the index).
RankDirs prepare_rank_dirs(const family::Family& fam, const ViewArgs& args, ViewNotes& notes,
                           const source::Choice* pinned = nullptr, bool parse = true);

// The files a shipped index with target summaries was built from; nullopt if it has none.
std::optional<source::Choice> pinned_files(const std::string& shipped);

// The ranks a mount exposes listed from a shipped index's summaries and planned on first open;
// null (and the mount plans them now) where the index has no summaries for this view.
std::unique_ptr<fs::Tree> lazy_tree(const RankDirs& dirs, const ViewArgs& args);

}  // namespace ckptfs::view::detail
