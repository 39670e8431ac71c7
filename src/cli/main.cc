// ckptfs: lazily resharded MindSpore checkpoints. Subcommands live in cmd_*.cc.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <string>

#include "ckptfs/error.h"
#include "commands.h"

namespace {

// A mount keeps a descriptor per source file open; 1,100 source ranks do not fit the usual
// soft limit of 1024, while the hard limit is usually far higher and ours to take.
void raise_open_file_limit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  raise_open_file_limit();
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
  ckptfs::cli::add_materialize_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ckptfs::Error& e) {
    std::fprintf(stderr, "ckptfs: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "ckptfs: out of memory (the input needs more than this process may allocate; "
                 "see ulimit -v)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckptfs: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
