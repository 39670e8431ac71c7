// ckptfs mount / umount: source scan -> index -> strategies -> plan -> FUSE.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/fs/mount.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/index/store.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/source/discover.h"
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
  bool foreground = false;
  std::vector<std::string> options;
};

// The -o words go to fs::mount as they are: it takes out its own (cache, noreadahead, ...) and
// hands the rest to libfuse.
fs::MountOptions mount_options(const MountArgs& args) {
  fs::MountOptions out;
  out.foreground = args.foreground;
  out.log_file = args.log_file;
  out.fuse_options = args.options;
  return out;
}

plan::Plan build_plan(const MountArgs& args) {
  const std::filesystem::path src_dir(args.src_dir);
  source::Discovery found = source::discover(src_dir);
  for (const std::string& warning : found.warnings) spdlog::warn("{}", warning);
  if (found.files.empty())
    fail("{}: no source checkpoints (expected rank_<N>/ directories holding *.ckpt files)",
         args.src_dir);

  std::optional<strategy::Strategy> src, dst;
  if (!args.src_strategy.empty()) src = strategy::read_strategy(args.src_strategy);
  if (!args.dst_strategy.empty()) dst = strategy::read_strategy(args.dst_strategy);

  std::vector<std::filesystem::path> paths;
  std::vector<int64_t> ranks;
  for (const auto& [rank, path] : found.files) {
    // Without a source strategy the source is one full checkpoint: rank_0 alone.
    if (!src && rank != 0) continue;
    ranks.push_back(rank);
    paths.push_back(path);
  }
  if (paths.empty()) fail("{}: no rank_0 checkpoint, needed without --src-strategy", args.src_dir);

  std::vector<index::IndexedSource> indexed;
  {
    // The LMDB environment is closed before the daemon forks.
    index::Store store(args.index_dir.empty() ? index::default_dir()
                                              : std::filesystem::path(args.index_dir));
    indexed = index::index_sources(store, paths);
  }
  std::map<int64_t, index::IndexedSource> sources;
  for (size_t i = 0; i < indexed.size(); ++i) sources.emplace(ranks[i], std::move(indexed[i]));
  return plan::make_plan(std::move(sources), src ? &*src : nullptr, dst ? &*dst : nullptr);
}

void run_mount(const MountArgs& args) {
  std::error_code ec;
  if (!std::filesystem::is_directory(args.mountpoint, ec))
    fail("mountpoint {} is not a directory", args.mountpoint);
  auto tree = std::make_unique<fs::Tree>(build_plan(args));
  const int rc = fs::mount(args.mountpoint, *tree, mount_options(args));
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
      "Mount SRC_DIR's checkpoints at MOUNTPOINT as rank_N/checkpoint_N.ckpt files resharded "
      "from the source strategy to the destination strategy, synthesized on read");
  mount->add_option("SRC_DIR", args->src_dir, "Directory holding rank_<N>/*.ckpt")
      ->required()
      ->check(CLI::ExistingDirectory);
  mount->add_option("MOUNTPOINT", args->mountpoint, "Empty directory to mount on")->required();
  mount->add_option("--src-strategy", args->src_strategy,
                    "Strategy the sources were saved with: protobuf file, .json file, or a "
                    "directory of per-stage files (omit: rank_0 holds one full checkpoint)");
  mount->add_option("--dst-strategy", args->dst_strategy,
                    "Strategy to present (omit: one merged checkpoint, rank_0)");
  mount->add_flag("-f,--foreground", args->foreground, "Stay in the foreground until unmounted");
  mount
      ->add_option("-o", args->options,
                   "Mount options, comma-separated: cache (page-cache mode for mmap users; "
                   "default is direct I/O), noreadahead (no read-ahead thread for sequential "
                   "readers), splice (splice long runs while several files are read; needs "
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
