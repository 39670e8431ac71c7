// `ckptfs ranks TARGET_RANK [--src-strategy P] [--dst-strategy P] [--minimal] [--src SRC_DIR]`:
// the source ranks whose checkpoint files a target rank needs, as rank_list_for_transform lists
// them. It refuses what `mount --ranks TARGET_RANK` would refuse, through the same code: the
// target rank check always, and with --src the whole view of that rank (rank directories,
// strategy coverage, every parameter the target needs).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/plan/planner.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/strategy/strategy.h"
#include "commands.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

struct RanksOptions {
  int64_t target_rank = 0;
  std::string src_strategy;
  std::string dst_strategy;
  bool minimal = false;
  std::string src_dir;  // --src: check the view as mount would
  std::string step = "latest";
  std::string index_dir;
};

std::optional<strategy::Strategy> read_optional(const std::string& path) {
  if (path.empty()) return std::nullopt;
  return strategy::read_strategy(path);
}

}  // namespace

void add_ranks_command(CLI::App& app) {
  auto options = std::make_shared<RanksOptions>();
  CLI::App* command =
      app.add_subcommand("ranks",
                         "Print the source ranks a target rank needs, descending, like MindSpore's "
                         "rank_list_for_transform");
  command->add_option("TARGET_RANK", options->target_rank, "Global rank of the target")
      ->required()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--src-strategy", options->src_strategy,
                      "Source strategy file or directory (omitted: one unsharded checkpoint)");
  command->add_option("--dst-strategy", options->dst_strategy,
                      "Destination strategy file or directory (omitted: unsharded)");
  command->add_flag("--minimal", options->minimal,
                    "Only the ranks whose data is read (MindSpore's replicas of the blocks that "
                    "overlap the target); passthrough parameters' source not included");
  command->add_option("--src", options->src_dir,
                      "Also check the checkpoint directory as `mount --ranks TARGET_RANK` would "
                      "(rank directories against the source strategy, parameters the target needs) "
                      "and refuse what it refuses");
  command->add_option("--step", options->step, "With --src: which checkpoint of each rank")
      ->capture_default_str();
  command->add_option("--index-dir", options->index_dir, "With --src: where the index lives");
  command->callback([options] {
    const std::optional<strategy::Strategy> src = read_optional(options->src_strategy);
    const std::optional<strategy::Strategy> dst = read_optional(options->dst_strategy);
    plan::check_target_ranks({options->target_rank}, dst ? &*dst : nullptr);
    if (!options->src_dir.empty()) {
      ViewArgs view;
      view.src_dir = options->src_dir;
      view.src_strategy = options->src_strategy;
      view.dst_strategy = options->dst_strategy;
      view.step = options->step;
      view.index_dir = options->index_dir;
      view.ranks = std::to_string(options->target_rank);
      view.quiet = true;
      ViewNotes notes;
      build_tree(view, notes, /*steps=*/false);
    }
    const std::vector<int64_t> ranks = strategy::rank_list_for_transform(
        src ? &*src : nullptr, dst ? &*dst : nullptr, options->target_rank, options->minimal);
    fmt::print("{}\n", fmt::join(ranks, " "));
  });
}

}  // namespace ckptfs::cli
