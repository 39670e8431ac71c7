// `ckptfs materialize SRC_DIR OUT [view options] [--ranks LIST] [-j N] [--quiet]`: the view a
// mount would show, written as real files (what transform_checkpoints writes), without FUSE.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/fs/materialize.h"
#include "ckptfs/fs/tree.h"
#include "commands.h"
#include "progress.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

struct MaterializeArgs {
  ViewArgs view;
  std::string out;
  std::string ranks;
  unsigned jobs = 0;
  bool quiet = false;
};

int64_t parse_rank(std::string_view text, std::string_view list) {
  int64_t n = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 0)
    fail("--ranks {}: \"{}\" is not a rank; give ranks and ranges such as 0,2,4-7", list, text);
  return n;
}

// "0,2,4-7" -> 0 2 4 5 6 7.
std::vector<int64_t> parse_ranks(std::string_view list) {
  std::vector<int64_t> out;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t end = list.find(',', begin);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view item = list.substr(begin, end - begin);
    if (const size_t dash = item.find('-'); dash != std::string_view::npos) {
      const int64_t lo = parse_rank(item.substr(0, dash), list);
      const int64_t hi = parse_rank(item.substr(dash + 1), list);
      if (hi < lo) fail("--ranks {}: the range {} runs backwards", list, item);
      for (int64_t r = lo; r <= hi; ++r) out.push_back(r);
    } else {
      out.push_back(parse_rank(item, list));
    }
    begin = end + 1;
  }
  return out;
}

void run(const MaterializeArgs& args) {
  fs::MaterializeOptions options;
  if (!args.ranks.empty()) options.ranks = parse_ranks(args.ranks);
  options.jobs = args.jobs != 0 ? args.jobs : std::max(1u, std::thread::hardware_concurrency());
  ViewNotes notes;
  const std::unique_ptr<fs::Tree> tree_ptr = build_tree(args.view, notes, /*steps=*/false);
  const fs::Tree& tree = *tree_ptr;
  Progress progress("materialize", "files", Progress::mode_for(args.quiet),
                    std::chrono::seconds(2));
  options.on_start = [&](uint64_t bytes, size_t files) {
    if (!args.quiet) notes.say();  // only once sure to write: a refusal stays one line
    progress.start(bytes, files);
  };
  options.on_bytes = [&](uint64_t bytes) { progress.advance(bytes); };
  options.on_file = [&] { progress.item_done(); };
  const fs::MaterializeResult result = fs::materialize(tree, args.out, options);
  progress.finish(fmt::format("{} complete files kept ({})", result.skipped,
                              human_bytes(static_cast<double>(result.bytes_skipped))));
}

}  // namespace

void add_materialize_command(CLI::App& app) {
  auto args = std::make_shared<MaterializeArgs>();
  CLI::App* command = app.add_subcommand(
      "materialize",
      "Write the view `mount` would show as real files OUT/rank_N/checkpoint_N.ckpt, without "
      "mounting; a rerun keeps the files already complete");
  add_view_options(command, args->view);
  command->add_option("OUT", args->out, "Directory to write rank_N/checkpoint_N.ckpt into")
      ->required();
  command->add_option("--ranks", args->ranks, "Target ranks to write, e.g. 0,2,4-7 (default: all)");
  command
      ->add_option("-j,--jobs", args->jobs,
                   "Worker threads (default: one per CPU); memory is 4 MiB per worker")
      ->check(CLI::Range(1, 256));
  command->add_flag("-q,--quiet", args->quiet, "No progress lines");
  command->callback([args] { run(*args); });
}

}  // namespace ckptfs::cli
