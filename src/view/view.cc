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

namespace {

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

// A process may open an index directory only once at a time (LMDB's rule), and ranks or steps
// planned on first use may be planned by two FUSE workers at once.
std::mutex& shipped_mutex() {
  static std::mutex mu;
  return mu;
}

std::vector<index::IndexedSource> index_files(const std::optional<std::filesystem::path>& dir,
                                              const std::string& shipped,
                                              const std::vector<std::filesystem::path>& paths,
                                              bool quiet, scan::Readers readers) {
  Progress progress("scan", "files", Progress::mode_for(quiet));
  progress.also_count("tensors");
  progress.only_if_slow();
  progress.start_items(paths.size());
  const index::OnFile on_file = [&progress](const scan::FileScan& scan) {
    progress.add_also(scan.params.size());
    progress.item_done();
  };
  // The LMDB environment is closed before a mount's daemon forks.
  // A shipped index is the only source of scans: a stale one is refused, never repaired.
  if (!shipped.empty()) {
    std::lock_guard lock(shipped_mutex());
    return index::index_sources_shipped(index::Store::open_shipped(shipped), paths, on_file);
  }
  std::unique_ptr<index::Store> store = open_index(dir);
  return index::index_sources(store.get(), paths, on_file, readers);
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

uint32_t crc_of(std::string_view bytes) {
  return ckpt::crc32_update(
      0, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// A strategy's compact copy as the index stores it: the encoding, then its CRC-32 (8 hex
// digits), so that a damaged copy is refused rather than planned from.
std::string stored_compact(const strategy::Strategy& s) {
  std::string bytes = strategy::encode_compact(s);
  return bytes + fmt::format("{:08x}", crc_of(bytes));
}

bool compact_intact(std::string_view stored) {
  return stored.size() >= 8 && fmt::format("{:08x}", crc_of(stored.substr(0, stored.size() - 8))) ==
                                   stored.substr(stored.size() - 8);
}

std::optional<strategy::Strategy> load_compact(std::string_view stored, std::string origin) {
  if (!compact_intact(stored)) return std::nullopt;
  return strategy::decode_compact(stored.substr(0, stored.size() - 8), std::move(origin));
}

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

  // The same, exposing `ranks_shown` (empty: all).
  plan::Plan plan_ranks(const std::map<int64_t, std::filesystem::path>& files, bool mixed_allowed,
                        const std::vector<int64_t>& ranks_shown, bool report = false,
                        Memos* memos = nullptr) const {
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
    if (!shown.ranks.empty()) {
      strategy::TransformMemo own;
      needed = needed_sources(shown.ranks, memos ? memos->transform : own);
    }
    // Before indexing: a wrong strategy is refused without scanning every file first.
    plan::check_rank_count(ranks, src.get(), root, unusable, needed ? &*needed : nullptr);
    if (needed) keep_only(*needed, ranks, paths);
    std::vector<index::IndexedSource> indexed =
        store != nullptr ? index::index_sources_shipped(*store, paths)
                         : index_files(index_dir, shipped, paths, !report || quiet, readers);
    std::map<int64_t, index::IndexedSource> sources;
    for (size_t i = 0; i < indexed.size(); ++i) sources.emplace(ranks[i], std::move(indexed[i]));
    if (!mixed_allowed) plan::check_step_scalars(sources);
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

// A checkpoint of a family that plans its own view (view/families.h): the strategy and the view
// options parsed once, when the family first asks for them, so that it refuses in its own order.
std::unique_ptr<fs::Tree> build_family_tree(const family::Family& fam,
                                            const std::filesystem::path& found,
                                            const ViewArgs& args, ViewNotes& notes) {
  std::optional<strategy::Strategy> dst;
  bool dst_read = false;
  std::optional<Progress> progress;
  family::ViewInputs in;
  in.src_dir = args.src_dir;
  in.found = found;
  in.step = args.step;
  in.src_strategy = args.src_strategy;
  in.dst = [&]() -> const strategy::Strategy* {
    if (!dst_read && !args.dst_strategy.empty()) dst = strategy::read_strategy(args.dst_strategy);
    dst_read = true;
    return dst ? &*dst : nullptr;
  };
  in.views = [&] {
    plan::ViewOptions views = view_options(args);
    if (!progress) progress.emplace("plan", "target ranks", Progress::mode_for(args.quiet));
    report_planning(views, *progress);
    return views;
  };
  in.scan = [&](const std::vector<std::filesystem::path>& paths) {
    return index_files(index_dir(args), args.shipped_index, paths, args.quiet, fam.readers());
  };
  family::ViewText text;
  plan::Plan plan = fam.plan(in, text);
  notes.chosen = std::move(text.chosen);
  notes.detail = std::move(text.detail);
  return std::make_unique<fs::Tree>(std::move(plan));
}

// Both strategies, parsed at once (a large job's JSON strategy takes most of a second each);
// null for an empty path. The source's error is reported first, as when parsed in turn.
std::pair<std::shared_ptr<const strategy::Strategy>, std::shared_ptr<const strategy::Strategy>>
read_strategies(const std::string& src, const std::string& dst) {
  const auto read = [](const std::string& path) -> std::shared_ptr<const strategy::Strategy> {
    if (path.empty()) return nullptr;
    return std::make_shared<const strategy::Strategy>(strategy::read_strategy(path));
  };
  std::future<std::shared_ptr<const strategy::Strategy>> first =
      std::async(std::launch::async, read, src);
  std::shared_ptr<const strategy::Strategy> second;
  std::exception_ptr second_error;
  try {
    second = read(dst);
  } catch (...) {
    second_error = std::current_exception();
  }
  std::shared_ptr<const strategy::Strategy> parsed = first.get();
  if (second_error) std::rethrow_exception(second_error);
  return {std::move(parsed), std::move(second)};
}

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
                           const source::Choice* pinned = nullptr, bool parse = true) {
  RankDirs out;
  if (pinned) {
    out.choice = *pinned;
    out.listing.root = std::filesystem::absolute(args.src_dir).lexically_normal();
    notes.chosen =
        fmt::format("{}: {} rank files, as --index {} was built from them",
                    out.listing.root.string(), out.choice.files.size(), args.shipped_index);
  } else {
    out.listing = source::list_sources(args.src_dir);
    out.choice =
        source::choose(out.listing, source::StepRequest::parse(args.step, args.allow_mixed_steps));
    notes.chosen = fmt::format("{}: {}", out.listing.root.string(), out.choice.summary);
    notes.ignored = source::ignored_summary(out.listing);
    for (const source::Ignored& entry : out.listing.ignored)
      notes.detail.push_back(fmt::format("{}: ignored, {}", entry.path.string(), entry.why));
  }

  out.src_strategy = args.src_strategy;
  if (out.src_strategy.empty() && out.listing.mindformers_strategy) {
    out.src_strategy = out.listing.mindformers_strategy->string();
    notes.chosen += fmt::format(
        "; source strategy {} (a MindFormers output directory; --src-strategy overrides it)",
        out.src_strategy);
  }
  auto planning = std::make_shared<Planning>();
  if (parse)
    std::tie(planning->src, planning->dst) = read_strategies(out.src_strategy, args.dst_strategy);
  planning->index_dir = index_dir(args);
  planning->root = out.listing.root.string();
  planning->unusable = out.listing.unusable;
  planning->views = view_options(args);
  planning->readers = fam.readers();
  planning->shipped = args.shipped_index;
  planning->quiet = args.quiet;
  out.planning = std::move(planning);
  return out;
}

// Size and CRC-32 of a strategy file's bytes (a directory's files in name order): what a
// shipped index's summaries are compared by, without parsing.
std::string strategy_digest(const std::string& path) {
  if (path.empty()) return "none";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // anything else open_regular names
    for (const auto& entry : std::filesystem::directory_iterator(path, ec))
      if (entry.is_regular_file(ec)) files.push_back(entry.path());
    if (ec) fail("{}: cannot list the strategy directory: {}", path, ec.message());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  uint64_t size = 0;
  uint32_t crc = 0;
  std::vector<uint8_t> buf(1 << 20);
  for (const std::filesystem::path& file : files) {
    const UniqueFd fd = util::open_regular(file, "strategy file");
    for (;;) {
      const ssize_t n = retry_eintr([&] { return ::read(fd.get(), buf.data(), buf.size()); });
      if (n < 0) fail("{}: cannot read: {}", file.string(), std::strerror(errno));
      if (n == 0) break;
      crc = ckpt::crc32_update(crc, std::span(buf.data(), static_cast<size_t>(n)));
      size += static_cast<uint64_t>(n);
    }
  }
  return fmt::format("{} bytes crc {:08x} in {} files", size, crc, files.size());
}

std::string absolute_name(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return (ec ? path : absolute.lexically_normal()).string();
}

// The chosen files as a shipped index keeps them (source/pinned_files.h), by absolute name.
std::string absolute_files_text(const source::Choice& choice) {
  source::Choice absolute = choice;
  for (auto& [rank, path] : absolute.files) path = absolute_name(path);
  return source::files_text(absolute);
}

struct StrategyDigests {
  std::string src, dst;
};

StrategyDigests strategy_digests(const RankDirs& dirs, const ViewArgs& args) {
  return {strategy_digest(dirs.src_strategy), strategy_digest(args.dst_strategy)};
}

// Where a shipped index keeps the compact copy of a strategy whose files have `digest`.
std::string compact_key(std::string_view side, const std::string& digest) {
  return fmt::format("{} strategy {}", side, digest);
}

// Everything a target summary depends on, in one comparable string; the index stores it
// followed by "targets: <count>\n" (the destination's rank count, so that a mount need not
// parse the strategy to know it).
std::string view_key(const RankDirs& dirs, const ViewArgs& args, const StrategyDigests& digests) {
  const plan::ViewOptions& views = dirs.planning->views;
  const std::string files = absolute_files_text(dirs.choice);
  const uint32_t files_crc = ckpt::crc32_update(
      0, std::span(reinterpret_cast<const uint8_t*>(files.data()), files.size()));
  return fmt::format(
      "ckptfs target summaries 3\nsrc strategy: {}\ndst strategy: {}\nviews: {}{}\nprefix: "
      "{}\nstep: {}{}\nsource files: {} crc {:08x}\n",
      digests.src, digests.dst, views.ckpt ? "ckpt " : "", views.safetensors ? "safetensors" : "",
      views.prefix, args.step, args.allow_mixed_steps ? " (mixed allowed)" : "",
      dirs.choice.files.size(), files_crc);
}

// The target count a stored view ends with, if it is `key`'s; nullopt for another view.
std::optional<int64_t> view_targets(std::string_view stored, std::string_view key) {
  constexpr std::string_view kCount = "targets: ";
  if (!stored.starts_with(key)) return std::nullopt;
  std::string_view rest = stored.substr(key.size());
  if (!rest.starts_with(kCount) || !rest.ends_with('\n')) return std::nullopt;
  rest = rest.substr(kCount.size(), rest.size() - kCount.size() - 1);
  int64_t count = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), count);
  if (ec != std::errc() || end != rest.data() + rest.size() || count < 1) return std::nullopt;
  return count;
}

// The files a shipped index with target summaries was built from; nullopt if it has none.
std::optional<source::Choice> pinned_files(const std::string& shipped) {
  std::lock_guard lock(shipped_mutex());
  const index::Store store = index::Store::open_shipped(shipped);
  const std::optional<std::string> text = store.targets_files();
  return text ? source::parse_files_text(*text) : std::nullopt;
}

index::TargetSummary summarize(const plan::Plan& plan, int64_t rank) {
  index::TargetSummary out;
  out.rank = rank;
  for (const plan::TargetFile& target : plan.targets) {
    plan::SourcesRead read = plan::sources_read(plan, target.file);
    out.files.push_back({target.file_name(), target.file.size(), read.newest_mtime_ns,
                         target.page_cache, std::move(read.ranks)});
  }
  out.source_ranks = plan.source_ranks;
  return out;
}

// The ranks a mount exposes listed from a shipped index's summaries and planned on first open;
// null (and the mount plans them now) where the index has no summaries for this view.
std::unique_ptr<fs::Tree> lazy_tree(const RankDirs& dirs, const ViewArgs& args) {
  const Planning& planning = *dirs.planning;
  if (args.shipped_index.empty() || planning.views.by_stage) return nullptr;
  std::vector<int64_t> shown = planning.views.ranks;
  std::vector<fs::LazyRanks::File> files;
  {
    std::lock_guard lock(shipped_mutex());
    const index::Store store = index::Store::open_shipped(args.shipped_index);
    const std::optional<std::string> view = store.targets_view();
    if (!view) {
      spdlog::info(
          "--index {}: no target summaries (built without --dst-strategy): planning the exposed "
          "ranks now",
          args.shipped_index);
      return nullptr;
    }
    const StrategyDigests digests = strategy_digests(dirs, args);
    const std::optional<int64_t> count = view_targets(*view, view_key(dirs, args, digests));
    if (!count) {
      spdlog::warn(
          "--index {}: its target summaries were built for another view (the strategies, "
          "--view, --prefix, --step or the source files differ): planning the exposed ranks now "
          "instead of on first open",
          args.shipped_index);
      return nullptr;
    }
    // A rank the destination lacks: the plan at mount refuses it in its own words.
    if (std::any_of(shown.begin(), shown.end(), [&](int64_t t) { return t < 0 || t >= *count; }))
      return nullptr;
    if (shown.empty())
      for (int64_t t = 0; t < *count; ++t) shown.push_back(t);
    // The strategies as the build parsed these very bytes, decoded on the first plan (an index
    // that lacks a copy is damaged: the mount plans at mount instead).
    if (!planning.src && !planning.dst) {
      Planning::Compact src{dirs.src_strategy, {}}, dst{args.dst_strategy, {}};
      for (auto [c, side, digest] :
           {std::tuple{&src, "src", &digests.src}, std::tuple{&dst, "dst", &digests.dst}}) {
        if (c->origin.empty()) continue;
        std::optional<std::string> bytes = store.targets_extra(compact_key(side, *digest));
        if (!bytes || !compact_intact(*bytes)) {
          spdlog::warn(
              "--index {}: its copy of {} is missing or damaged: planning the exposed "
              "ranks now",
              args.shipped_index, c->origin);
          return nullptr;
        }
        c->bytes = std::move(*bytes);
      }
      planning.compact.emplace(std::move(src), std::move(dst));
    }
    std::set<int64_t> sources;
    std::vector<std::vector<int64_t>> reads;  // files[i] reads the sources of ranks reads[i]
    for (int64_t t : shown) {
      const std::optional<index::TargetSummary> summary = store.target(t);
      if (!summary) {
        spdlog::warn("--index {}: no usable summary of rank {}: planning the exposed ranks now",
                     args.shipped_index, t);
        return nullptr;
      }
      for (const index::TargetSummary::File& f : summary->files) {
        files.push_back({t, f.name, f.size, f.mtime_ns, f.page_cache, {}});
        reads.push_back(f.source_ranks);
      }
      sources.insert(summary->source_ranks.begin(), summary->source_ranks.end());
    }
    // Each file's access derives from the sources it reads, as an eager mount's does; one that
    // reads none takes that of all the sources the exposed ranks load (an eager mount's plan).
    for (size_t i = 0; i < files.size(); ++i) {
      for (int64_t r :
           reads[i].empty() ? std::vector<int64_t>(sources.begin(), sources.end()) : reads[i]) {
        auto it = dirs.choice.files.find(r);
        if (it == dirs.choice.files.end()) return nullptr;  // the eager path names what is missing
        files[i].sources.push_back(absolute_name(it->second));
      }
    }
    // Only the sources the exposed ranks read, by size and mtime as at build time.
    for (int64_t r : sources) {
      auto it = dirs.choice.files.find(r);
      if (it == dirs.choice.files.end()) return nullptr;  // the eager path names what is missing
      const std::string name = absolute_name(it->second);
      struct stat st;
      if (::stat(name.c_str(), &st) != 0) fail("{}: cannot stat: {}", name, std::strerror(errno));
      const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
      const std::optional<source::Fingerprint> built = store.fingerprint(name);
      if (!built)
        fail(
            "{}: the index {} has no entry for it; rebuild it with `ckptfs index build SRC "
            "--output {}`",
            name, args.shipped_index, args.shipped_index);
      if (built->size != static_cast<uint64_t>(st.st_size) || built->mtime_ns != mtime)
        fail(
            "{}: the index {} was built when it had {} bytes and mtime {} ns; it has {} and {} "
            "now; rebuild it with `ckptfs index build SRC --output {}`",
            name, args.shipped_index, built->size, built->mtime_ns, st.st_size, mtime,
            args.shipped_index);
    }
  }
  auto planning_ptr = dirs.planning;
  const std::map<int64_t, std::filesystem::path> chosen = dirs.choice.files;
  const bool mixed = dirs.choice.mixed_allowed;
  auto lazy = std::make_shared<fs::LazyRanks>(
      std::move(files), [planning_ptr, chosen, mixed](int64_t rank) {
        plan::Plan plan = planning_ptr->plan_ranks(chosen, mixed, {rank});
        for (const std::string& line : plan.warnings) spdlog::warn("rank {}: {}", rank, line);
        return plan;
      });
  spdlog::info("--index {}: {} ranks listed from its summaries, each planned on first open",
               args.shipped_index, shown.size());
  return std::make_unique<fs::Tree>(std::move(lazy));
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

size_t summarize_targets(const ViewArgs& args, index::Store& store,
                         const std::function<void(size_t, size_t)>& progress) {
  util::require_directory(args.src_dir, "source directory");
  const Detected detected = detect(args.src_dir, args.step);
  if (!is_rank_dirs(*detected.family))
    fail("{}: target summaries are for directories of rank_<N>/ checkpoints only", args.src_dir);
  if (args.by_stage) fail("index build: --by-stage views are planned at mount; omit it");
  ViewNotes notes;
  // The strategies' bytes before they are parsed, compared with them after: their compact copies
  // are stored under the digest of the bytes that were parsed.
  const StrategyDigests before{strategy_digest(args.src_strategy),
                               strategy_digest(args.dst_strategy)};
  const RankDirs dirs = prepare_rank_dirs(*detected.family, args, notes);
  Planning& planning = *dirs.planning;
  planning.store = &store;
  const int64_t count = plan::target_count(planning.dst.get());
  std::vector<index::TargetSummary> summaries(static_cast<size_t>(count));
  std::atomic<int64_t> next{0};
  std::atomic<size_t> done{0};
  std::exception_ptr error;
  std::mutex mu;
  const auto worker = [&] {
    Planning::Memos memos;
    for (int64_t t; (t = next.fetch_add(1)) < count;) {
      try {
        const plan::Plan plan =
            planning.plan_ranks(dirs.choice.files, dirs.choice.mixed_allowed, {t}, false, &memos);
        summaries[static_cast<size_t>(t)] = summarize(plan, t);
        if (progress) progress(done.fetch_add(1) + 1, static_cast<size_t>(count));
      } catch (...) {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
        next = count;
      }
    }
  };
  {
    std::vector<std::jthread> helpers;
    for (unsigned i = 1; i < std::clamp(std::thread::hardware_concurrency(), 1u, 2u); ++i)
      helpers.emplace_back(worker);
    worker();
  }
  if (error) std::rethrow_exception(error);
  // With each strategy's compact copy, under the digest of its files, so that a mount neither
  // parses them nor plans until a rank is opened.
  const StrategyDigests digests = strategy_digests(dirs, args);
  if (digests.src != before.src || digests.dst != before.dst)
    fail("index build: a strategy file changed while the index was built; build it again");
  std::vector<std::pair<std::string, std::string>> extra;
  if (planning.src)
    extra.emplace_back(compact_key("src", digests.src), stored_compact(*planning.src));
  if (planning.dst)
    extra.emplace_back(compact_key("dst", digests.dst), stored_compact(*planning.dst));
  store.put_targets(view_key(dirs, args, digests) + fmt::format("targets: {}\n", count),
                    absolute_files_text(dirs.choice), summaries, extra);
  return summaries.size();
}

std::unique_ptr<fs::Tree> build_tree(const ViewArgs& args, ViewNotes& notes, bool steps) {
  util::require_directory(args.src_dir, "source directory");
  // A source that runs out of memory while scanned is named by the scan; past that, the view.
  std::unique_ptr<fs::Tree> tree =
      naming_out_of_memory(args.src_dir, "planning the view of its files",
                           [&] { return build_step_tree(args, notes, steps); });
  notes.plan_warnings = tree->plan().warnings;
  notes.quiet = args.quiet;
  return tree;
}

}  // namespace ckptfs::view
