// Each subcommand registers itself on the CLI11 app; callbacks throw ckptfs::Error, which main
// prints as one line on stderr with a non-zero exit.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace ckptfs::cli {

void add_inspect_command(CLI::App& app);
void add_strategy_command(CLI::App& app);
void add_ranks_command(CLI::App& app);
void add_mount_commands(CLI::App& app);  // mount, umount
void add_index_command(CLI::App& app);
void add_materialize_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_plan_command(CLI::App& app);

}  // namespace ckptfs::cli

namespace ckptfs::fs {
class Tree;
}

namespace ckptfs::cli {

// For the mount's summary: what reading all of an eagerly planned tree costs ("the N files needs
// ...; fetched in blocks of 4 KiB: ..."), when a source is on a remote filesystem; else "".
std::string plan_cost_line(const fs::Tree& tree);

}  // namespace ckptfs::cli
