// ckptfs index list|prune|clear|build: look after the persistent index of source scans.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/index/store.h"
#include "ckptfs/source/discover.h"
#include "ckptfs/source/step_choice.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/view/families.h"
#include "ckptfs/view/progress.h"
#include "commands.h"
#include "s3_source.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

namespace stdfs = std::filesystem;

struct IndexOptions {
  std::string index_dir;  // empty: index::default_dir()
  std::string src_dir;
  std::string output;    // index build --output: a shipped index
  bool quiet = false;    // index build: no progress lines
  bool drop_s3 = false;  // index prune --drop-s3: also the entries of s3:// sources
  // index build --output with strategies: the view whose target summaries are stored too.
  ViewArgs view;
};

stdfs::path index_dir(const IndexOptions& options) {
  return options.index_dir.empty() ? index::default_dir() : stdfs::path(options.index_dir);
}

void add_index_dir_option(CLI::App* command, IndexOptions& options) {
  command->add_option("--index-dir", options.index_dir,
                      "Index directory (default $XDG_CACHE_HOME/ckptfs/index or "
                      "~/.cache/ckptfs/index)");
}

// "ok", "stale" (gone or changed) or "?" (cannot be checked).
std::string_view state_word(const index::Freshness& f) {
  if (f.state == index::Freshness::kCurrent) return "ok";
  return f.state == index::Freshness::kUnknown ? "?" : "stale";
}

void list(const IndexOptions& options) {
  // Listing creates nothing: no index there (or a directory that cannot be read) lists empty.
  // A path of the wrong kind is refused, naming it, as every command does.
  const stdfs::path dir = index_dir(options);
  bool missing = !util::directory_if_present(dir, "index directory");
  if (!missing)
    if (auto kind = util::wrong_kind(dir / "data.mdb", S_IFREG, &missing))
      util::refuse_kind(dir / "data.mdb", "index file", *kind, S_IFREG);
  if (missing) {
    fmt::print("0 files in {}\n", dir.string());
    return;
  }
  const index::Store store(dir);
  std::vector<std::string> unreadable;
  const std::vector<index::Entry> entries = store.entries(&unreadable);
  if (!entries.empty())
    fmt::print("{:>10} {:>16}  {:<5}  {}\n", "PARAMS", "BYTES", "STATE", "PATH");
  size_t stale = 0;
  for (const index::Entry& entry : entries) {
    const index::Freshness f = index::freshness(entry);
    if (f.state == index::Freshness::kGone || f.state == index::Freshness::kChanged) ++stale;
    fmt::print("{:>10} {:>16}  {:<5}  {}{}\n", entry.params, entry.fingerprint.size, state_word(f),
               entry.path, f.why.empty() ? "" : " (" + f.why + ")");
  }
  fmt::print("{} files in {}", entries.size(), store.dir().string());
  if (stale + unreadable.size() > 0)
    fmt::print("; {} stale{}: `ckptfs index prune{}` drops them", stale,
               unreadable.empty()
                   ? ""
                   : fmt::format(", {} written by another ckptfs version", unreadable.size()),
               options.index_dir.empty() ? "" : " --index-dir " + options.index_dir);
  fmt::print("\n");
}

// Drops the entries no file has any more (gone, or changed so that it is scanned again anyway)
// and those of other index versions; entries whose file cannot be checked are kept. Those of S3
// objects cannot be checked without asking the store: kept (a changed object has another ETag,
// so its old entry is only dead weight), or all dropped with --drop-s3.
void prune(const IndexOptions& options) {
  index::Store store(index_dir(options));
  std::vector<std::string> doomed;
  const std::vector<index::Entry> entries = store.entries(&doomed);
  const size_t foreign = doomed.size();
  size_t gone = 0, changed = 0, s3_kept = 0, s3_dropped = 0;
  for (const index::Entry& entry : entries) {
    const index::Freshness f = index::freshness(entry);
    if (f.state == index::Freshness::kCurrent) continue;
    if (f.why == index::kNotChecked) {
      if (!options.drop_s3) {
        ++s3_kept;
        continue;
      }
      ++s3_dropped;
      doomed.push_back(entry.fingerprint.key());
      continue;
    }
    if (f.state == index::Freshness::kUnknown) {
      spdlog::warn("{}: kept, {}", entry.path, f.why);
      continue;
    }
    (f.state == index::Freshness::kGone ? gone : changed) += 1;
    fmt::print("removed {}: {}\n", entry.path, f.why);
    doomed.push_back(entry.fingerprint.key());
  }
  const size_t removed = store.remove(doomed);
  fmt::print(
      "removed {} entries from {} ({} file missing, {} changed, {} of another version{}); {} "
      "kept{}\n",
      removed, store.dir().string(), gone, changed, foreign,
      s3_dropped ? fmt::format(", {} of an S3 object (--drop-s3)", s3_dropped) : "",
      entries.size() + foreign - removed,
      s3_kept ? fmt::format(" ({} of an S3 object, not checked: --drop-s3 drops them)", s3_kept)
              : "");
}

void clear(const IndexOptions& options) {
  const stdfs::path dir = index_dir(options);
  std::optional<index::Store> store;
  try {
    store.emplace(dir);
  } catch (const Error& e) {
    // Too damaged to open: the files go, which is all a clear has to achieve.
    if (!index::remove_environment(dir)) throw;
    fmt::print("removed the damaged index in {} ({})\n", dir.string(), e.what());
    return;
  }
  const size_t removed = store->clear();
  fmt::print("removed {} entries from {}\n", removed, store->dir().string());
}

// The files a mount with the default --step would serve: those its family names (every part of
// a unified_safetensors directory), else each rank's chosen checkpoint.
std::vector<stdfs::path> files_to_index(const IndexOptions& options,
                                        const view::Detected& detected) {
  if (detected.family->index_files) return detected.family->index_files(detected.found);
  const source::Listing listing = source::list_sources(options.src_dir);
  const source::Choice choice = source::choose(
      listing, source::StepRequest::parse(options.view.step, options.view.allow_mixed_steps));
  if (const std::string ignored = source::ignored_summary(listing); !ignored.empty())
    spdlog::warn("{}", ignored);
  spdlog::info("{}: {}", listing.root.string(), choice.summary);
  std::vector<stdfs::path> paths;
  paths.reserve(choice.files.size());
  for (const auto& [rank, path] : choice.files) paths.push_back(path);
  return paths;
}

bool summaries_wanted(const IndexOptions& options) {
  return !options.view.src_strategy.empty() || !options.view.dst_strategy.empty();
}

void build(IndexOptions& options) {
  options.view.src_dir = options.src_dir;
  if (summaries_wanted(options) && options.output.empty())
    fail(
        "index build: --src-strategy and --dst-strategy store target summaries, which only a "
        "shipped index (--output DIR) holds");
  util::require_directory(options.src_dir, "source directory");
  // Which family the directory is says which files are scanned, and with which readers.
  const view::Detected detected = view::detect(options.src_dir, options.view.step);
  const std::vector<stdfs::path> paths = files_to_index(options, detected);
  const stdfs::path dir = options.output.empty() ? index_dir(options) : stdfs::path(options.output);

  const auto start = std::chrono::steady_clock::now();
  // A shipped index is the output: one that cannot be written fails the build. The cache only
  // saves the next mount a scan: the build warns and still scans (and so checks) every file.
  std::optional<index::Store> store;
  try {
    store.emplace(dir);
  } catch (const Error& e) {
    if (!options.output.empty()) throw;
    spdlog::warn("{}; scanning without recording the scans", e.what());
  }
  Progress progress("index build", "files", Progress::mode_for(options.quiet));
  progress.also_count("tensors");
  progress.only_if_slow();
  progress.start_items(paths.size());
  const index::BuildResult built = index::build_index(
      store ? &*store : nullptr, paths,
      [&progress](const scan::FileScan& scan) {
        progress.add_also(scan.params.size());
        progress.item_done();
      },
      detected.family->readers(), summaries_wanted(options));
  progress.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t params = built.params;
  // -q: nothing but warnings and errors, as for every command.
  if (!options.quiet)
    fmt::print(
        "{} files, {} parameters: {} from the index, {} scanned; index in {}; {:.2f} s, {:.0f} "
        "source tensors/s\n",
        built.files, params, built.from_index, built.files - built.from_index, dir.string(),
        seconds, seconds > 0 ? static_cast<double>(params) / seconds : 0.0);
  if (built.unrecorded > 0 && !options.output.empty())
    fail(
        "{}: {} of {} files could not be recorded (see the warning above); a shipped index must "
        "hold every source",
        dir.string(), built.unrecorded, built.files);
  if (!summaries_wanted(options)) return;
  const auto planned = std::chrono::steady_clock::now();
  Progress ranks_progress("index build", "target ranks", Progress::mode_for(options.quiet));
  ranks_progress.only_if_slow();
  std::once_flag started;
  const size_t ranks = summarize_targets(options.view, *store, [&](size_t /*done*/, size_t total) {
    std::call_once(started, [&] { ranks_progress.start_items(total); });
    ranks_progress.item_done();
  });
  ranks_progress.finish();
  // The scans' pages went to the disk while the summaries were planned (build_index's
  // sync_later); the summaries' own commit synced as usual.
  try {
    store->wait_synced();
  } catch (const Error& e) {
    spdlog::warn("{}; the new scans may not be recorded", e.what());
    fail(
        "{}: {} of {} files could not be recorded (see the warning above); a shipped index must "
        "hold every source",
        dir.string(), built.files - built.from_index, built.files);
  }
  const auto end = std::chrono::steady_clock::now();
  if (!options.quiet)
    fmt::print(
        "{} target ranks summarized (sizes for listing, sources for checking) in {:.2f} s; {:.2f} "
        "s in all, {:.0f} source tensors/s\n",
        ranks, std::chrono::duration<double>(end - planned).count(),
        std::chrono::duration<double>(end - start).count(),
        static_cast<double>(params) / std::chrono::duration<double>(end - start).count());
}

}  // namespace

void add_index_command(CLI::App& app) {
  auto options = std::make_shared<IndexOptions>();
  CLI::App* command = app.add_subcommand("index", "Manage the index of scanned source checkpoints");
  command->require_subcommand(1);

  CLI::App* list_command = command->add_subcommand("list",
                                                   "List the indexed source files; STATE marks "
                                                   "the stale ones (file missing, size or mtime "
                                                   "changed)");
  add_index_dir_option(list_command, *options);
  list_command->callback([options] { list(*options); });

  CLI::App* prune_command = command->add_subcommand(
      "prune",
      "Remove the entries whose file is gone or has changed since it was scanned (each named "
      "with the reason), and those written by another ckptfs version");
  add_index_dir_option(prune_command, *options);
  prune_command->add_flag("--drop-s3", options->drop_s3,
                          "Also remove the entries of s3:// sources (kept otherwise: prune cannot "
                          "check an object without asking the store)");
  prune_command->callback([options] { prune(*options); });

  CLI::App* clear_command = command->add_subcommand("clear", "Remove every entry of the index");
  add_index_dir_option(clear_command, *options);
  clear_command->callback([options] { clear(*options); });

  CLI::App* build_command = command->add_subcommand(
      "build", "Scan the checkpoints of SRC_DIR/rank_*/ that the index does not hold yet");
  build_command->add_option("SRC_DIR", options->src_dir, "Source checkpoint directory")->required();
  add_s3_source(build_command, options->src_dir);
  add_index_dir_option(build_command, *options);
  build_command
      ->add_option("--output", options->output,
                   "Write a shipped index here: copy it next to the checkpoint on shared storage "
                   "and mount every node with --index DIR")
      ->excludes(build_command->get_option("--index-dir"));
  build_command->add_flag("-q,--quiet", options->quiet,
                          "No progress lines (shown on stderr if the build takes more than a "
                          "second) and no summary: only warnings and errors");
  build_command->add_option(
      "--src-strategy", options->view.src_strategy,
      "With --output: also plan every target rank of this view and store what listing it needs "
      "(exact sizes, mtimes, sources read), so that a mount with --index lists its ranks at once "
      "and plans each on first open; the strategy the sources were saved with");
  build_command->add_option("--dst-strategy", options->view.dst_strategy,
                            "With --output: the strategy the mounts present");
  build_command
      ->add_option("--view", options->view.views,
                   "With --output and a strategy: the files the mounts show (default "
                   "ckpt,safetensors); a mount with other views plans at mount")
      ->delimiter(',');
  build_command->add_option("--prefix", options->view.prefix,
                            "With --output and a strategy: the file name prefix the mounts use");
  build_command
      ->add_option("--step", options->view.step,
                   "Which checkpoint of each rank to index, as mount's --step (default latest)")
      ->capture_default_str();
  build_command->add_flag(
      "--allow-mixed-steps", options->view.allow_mixed_steps,
      "With --step FILE-GLOB: index the named files even if their steps differ");
  build_command->callback([options] { build(*options); });
}

}  // namespace ckptfs::cli
