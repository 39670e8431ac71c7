// Rank directories: listed, their strategies parsed once, indexed and planned (rank_dirs.h).

#include "rank_dirs.h"

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

namespace ckptfs::view::detail {

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

}  // namespace

std::mutex& shipped_mutex() {
  static std::mutex mu;
  return mu;
}

std::vector<index::IndexedSource> index_files(const std::optional<std::filesystem::path>& dir,
                                              const std::string& shipped,
                                              const std::vector<std::filesystem::path>& paths,
                                              bool quiet, scan::Readers readers,
                                              source::OpenFiles* opens, bool defer,
                                              bool defer_shipped) {
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
    return index::index_sources_shipped(index::Store::open_shipped(shipped), paths, on_file, true,
                                        opens, defer_shipped);
  }
  std::unique_ptr<index::Store> store = open_index(dir);
  return index::index_sources(store.get(), paths, on_file, readers, opens, defer);
}

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

RankDirs prepare_rank_dirs(const family::Family& fam, const ViewArgs& args, ViewNotes& notes,
                           const source::Choice* pinned, bool parse) {
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

}  // namespace ckptfs::view::detail
