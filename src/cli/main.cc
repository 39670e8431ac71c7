// ckptfs: lazily resharded MindSpore checkpoints. Subcommands live in cmd_*.cc.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "ckptfs/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  // Logs go to stderr so they never mix with a command's output.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("ckptfs"));
  spdlog::set_pattern("ckptfs: %l: %v");
  CLI::App app{"ckptfs: MindSpore checkpoints resharded on read, through a FUSE mount"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });

  // Subcommands register here, one line each.
  ckptfs::cli::add_inspect_command(app);
  ckptfs::cli::add_index_command(app);
  ckptfs::cli::add_strategy_command(app);
  ckptfs::cli::add_ranks_command(app);
  ckptfs::cli::add_mount_commands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ckptfs::Error& e) {
    std::fprintf(stderr, "ckptfs: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckptfs: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
