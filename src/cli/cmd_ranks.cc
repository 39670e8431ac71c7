// `ckptfs ranks TARGET_RANK [--src-strategy P] [--dst-strategy P] [--minimal] [--src SRC_DIR]`:
// the source ranks whose checkpoint files a target rank needs, as rank_list_for_transform lists
// them. It refuses what `mount --ranks TARGET_RANK` would refuse, through the same code: the
// target rank check always, and with --src the whole view of that rank (rank directories,
// strategy coverage, every parameter the target needs).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/plan/planner.h"
#include "ckptfs/strategy/rank_list.h"
#include "ckptfs/strategy/strategy.h"
#include "ckptfs/util/printable.h"
#include "commands.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

struct RanksOptions {
  std::string target_rank;
  std::string src_strategy;
  std::string dst_strategy;
  bool minimal = false;
  std::string src_dir;  // --src: check the view as mount would
  std::string step = "latest";
  std::string index_dir;
};

// Decimal digits only, within 64 bits: CLI11's number check took -1 against a range ending in a
// 309-digit float, turned a rank past 64 bits into 2^63-1 without a word, and read "0x10" as 16.
int64_t parse_target_rank(const std::string& text) {
  int64_t rank = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || rank < 0)
    fail("TARGET_RANK {}: not a rank; give a whole number from 0 (decimal digits, within 64 bits)",
         printable(text));
  return rank;
}

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
  command->add_option("TARGET_RANK", options->target_rank, "Global rank of the target")->required();
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
    const int64_t target_rank = parse_target_rank(options->target_rank);
    const std::optional<strategy::Strategy> src = read_optional(options->src_strategy);
    const std::optional<strategy::Strategy> dst = read_optional(options->dst_strategy);
    plan::check_target_ranks({target_rank}, dst ? &*dst : nullptr);
    if (!options->src_dir.empty()) {
      ViewArgs view;
      view.src_dir = options->src_dir;
      view.src_strategy = options->src_strategy;
      view.dst_strategy = options->dst_strategy;
      view.step = options->step;
      view.index_dir = options->index_dir;
      view.ranks = std::to_string(target_rank);
      view.quiet = true;
      ViewNotes notes;
      build_tree(view, notes, /*steps=*/false);
    }
    const std::vector<int64_t> ranks = strategy::rank_list_for_transform(
        src ? &*src : nullptr, dst ? &*dst : nullptr, target_rank, options->minimal);
    fmt::print("{}\n", fmt::join(ranks, " "));
  });
}

}  // namespace ckptfs::cli
