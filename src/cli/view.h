// The options that choose a view, as every command working on one (mount, materialize, verify,
// index build, ranks --src) takes them; the view itself is assembled by the view module.
#pragma once

#include <string>

#include "ckptfs/view/progress.h"
#include "ckptfs/view/view.h"

namespace CLI {
class App;
}

namespace ckptfs::cli {

using view::build_tree;
using view::human_bytes;
using view::Progress;
using view::summarize_targets;
using view::ViewArgs;
using view::ViewNotes;

// Adds the subcommand `name` of a command that works on a view (mount, materialize, verify) with
// the SRC_DIR positional (first, so the caller's positionals follow it), --src-strategy,
// --dst-strategy, --step, --allow-mixed-steps, --view, --prefix, --by-stage, --ranks,
// --shard-size, --rename, --index,
// --index-dir and -q/--quiet, filled into `args`.
CLI::App* add_view_command(CLI::App& app, std::string name, std::string description,
                           ViewArgs& args);

}  // namespace ckptfs::cli
