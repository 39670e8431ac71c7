// `ckptfs materialize SRC_DIR OUT [view options] [--ranks LIST] [-j N] [--quiet]`: the view a
// mount would show, written as real files (what transform_checkpoints writes), without FUSE.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/fs/materialize.h"
#include "ckptfs/fs/tree.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/rank_set.h"
#include "ckptfs/view/progress.h"
#include "commands.h"
#include "view.h"

namespace ckptfs::cli {

namespace {

struct MaterializeArgs {
  ViewArgs view;
  std::string out;
  unsigned jobs = 0;
};

// The real path of `path`, resolving what exists of it (OUT need not exist yet).
std::filesystem::path real_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path out =
      std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  return ec ? std::filesystem::absolute(path).lexically_normal() : out;
}

// OUT in the source tree would put rank_N/ files among the sources (which then no longer mount:
// a rank directory holding two checkpoints of one step, or both formats). Compared by real path,
// so a symlink or ".." does not hide it; refused before anything is read or written.
void check_out_outside_source(const MaterializeArgs& args) {
  const std::filesystem::path src = real_path(args.view.src_dir);
  const std::filesystem::path out = real_path(args.out);
  const auto [src_end, out_at] = std::mismatch(src.begin(), src.end(), out.begin(), out.end());
  if (src_end == src.end())
    fail("materialize: OUT {} is inside the source directory {}; write the view elsewhere",
         args.out, src.string());
}

void run(const MaterializeArgs& args) {
  check_out_outside_source(args);
  fs::MaterializeOptions options;
  // The view plans only these ranks (ViewArgs::ranks); the writer writes them.
  if (!args.view.ranks.empty()) options.ranks = util::parse_rank_set(args.view.ranks);
  options.jobs = args.jobs != 0 ? args.jobs : std::max(1u, std::thread::hardware_concurrency());
  util::directory_if_present(args.out, "output directory");  // before the work of planning
  ViewNotes notes;
  const std::unique_ptr<fs::Tree> tree_ptr = build_tree(args.view, notes, /*steps=*/false);
  const fs::Tree& tree = *tree_ptr;
  Progress progress("materialize", "files", Progress::mode_for(args.view.quiet),
                    std::chrono::seconds(2));
  options.on_start = [&](uint64_t bytes, size_t files) {
    notes.say();  // only once sure to write: a refusal stays one line
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
  CLI::App* command = add_view_command(
      app, "materialize",
      "Write the view `mount` would show as real files OUT/rank_N/checkpoint_N.ckpt, without "
      "mounting; a rerun keeps the files already complete. Without --view, only the sources' "
      "format is written (.ckpt from .ckpt sources, .safetensors from .safetensors or hfai "
      "ones), so that OUT is itself a source",
      args->view);
  command
      ->add_option("OUT", args->out,
                   "Directory to write rank_N/checkpoint_N.ckpt into (not inside SRC_DIR)")
      ->required();
  command
      ->add_option("-j,--jobs", args->jobs,
                   "Worker threads (default: one per CPU); memory is 4 MiB per worker")
      ->check(CLI::Range(1, 256));
  command->callback([args, command] {
    // Both formats in a rank directory make OUT no source: one unless asked for both.
    args->view.source_format = command->get_option("--view")->count() == 0;
    run(*args);
  });
}

}  // namespace ckptfs::cli
