// ckptfs: lazily resharded MindSpore checkpoints. Subcommands live in cmd_*.cc.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "commands.h"
#include "mount_helper.h"

#ifdef CKPTFS_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#ifndef CKPTFS_VERSION
#define CKPTFS_VERSION "unknown"
#endif

namespace {

// The allocator is named too: it changes what memory and speed figures to expect.
std::string version_text() {
#ifdef CKPTFS_JEMALLOC
  const char* version = "?";
  size_t size = sizeof(version);
  mallctl("version", &version, &size, nullptr, 0);
  const std::string_view release(version);  // "5.3.0-0-g<commit>"
  return fmt::format("ckptfs {} (jemalloc {})", CKPTFS_VERSION,
                     release.substr(0, release.find('-')));
#else
  return "ckptfs " CKPTFS_VERSION " (C library allocator)";
#endif
}

// A mount keeps a descriptor per source file open; 1,100 source ranks do not fit the usual
// soft limit of 1024, while the hard limit is usually far higher and ours to take.
void raise_open_file_limit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// --log-level is global, but is accepted anywhere on the line (before "--"): it is taken out
// here, so that each subcommand need not know it.
std::string take_log_level(std::vector<std::string>& args) {
  std::string level = "warn";
  for (size_t i = 1; i < args.size();) {
    if (args[i] == "--") break;
    if (args[i] == "--log-level" && i + 1 < args.size()) {
      level = args[i + 1];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                 args.begin() + static_cast<std::ptrdiff_t>(i + 2));
    } else if (args[i].starts_with("--log-level=")) {
      level = args[i].substr(12);
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return level;
}

// -q/--quiet belongs to the subcommands, but a user may put it first, as many tools take it
// ("ckptfs -q mount ..."): moved to just after the subcommand's name (after both words of
// "index build").
void move_leading_quiet(std::vector<std::string>& args) {
  size_t command = 1;
  while (command < args.size() && args[command].starts_with("-") && args[command] != "--")
    ++command;
  if (command >= args.size() || args[command] == "--") return;
  std::vector<std::string> quiet;
  for (size_t i = command; i-- > 1;)
    if (args[i] == "-q" || args[i] == "--quiet") {
      quiet.push_back(args[i]);
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
      --command;
    }
  if (quiet.empty()) return;
  size_t at = command + 1;
  if (args[command] == "index" && at < args.size() && !args[at].starts_with("-")) ++at;
  args.insert(args.begin() + static_cast<std::ptrdiff_t>(at), quiet.begin(), quiet.end());
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// For an argument CLI11 did not expect: the nearest option or subcommand name of the command
// being parsed, as "; did you mean --x?", or "" if nothing is close.
std::string nearest(const CLI::App& app, std::string_view word) {
  const CLI::App* command = &app;
  while (!command->get_subcommands().empty()) command = command->get_subcommands().front();
  std::vector<std::string> names;
  for (const CLI::App* c = command; c != nullptr; c = c->get_parent())
    for (const CLI::Option* option : c->get_options()) {
      for (const std::string& n : option->get_lnames()) names.push_back("--" + n);
      for (const std::string& n : option->get_snames()) names.push_back("-" + n);
    }
  names.push_back("--log-level");
  if (!word.starts_with("-"))
    for (const CLI::App* sub : command->get_subcommands({})) names.push_back(sub->get_name());
  std::string best;
  size_t best_distance = word.size() / 3 + 2;  // closer than this or no suggestion
  const std::string_view bare = word.substr(0, word.find('='));
  for (const std::string& name : names) {
    const size_t d = edit_distance(bare, name);
    // The word itself is no suggestion: a valid option in the wrong place.
    if (d == 0) continue;
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  }
  return best.empty() ? std::string() : "; did you mean " + best + "?";
}

// CLI11's "The following argument(s) (was|were) not expected: a b" as one line per argument,
// each with the nearest valid name. An unknown option comes first and takes the word after it on
// the command line as its value: "--dst-stratgy PATH" is one mistake (the option's name), not
// also a stray PATH.
int report_unexpected(const CLI::App& app, const CLI::ParseError& e,
                      const std::vector<std::string>& args) {
  std::string message = e.what();
  const size_t colon = message.find(": ");
  const std::string text = colon == std::string::npos ? message : message.substr(colon + 2);
  std::vector<std::string> words;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find(' ', begin);
    if (end == std::string::npos) end = text.size();
    if (end > begin) words.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  std::vector<std::string> options, others;
  for (const std::string& word : words)
    (word.starts_with("-") && word.size() > 1 ? options : others).push_back(word);
  for (const std::string& option : options) {
    if (option.find('=') != std::string::npos) continue;
    const auto at = std::find(args.begin(), args.end(), option);
    if (at == args.end() || at + 1 == args.end()) continue;
    const auto value = std::find(others.begin(), others.end(), *(at + 1));
    if (value != others.end()) others.erase(value);
  }
  for (const std::string& option : options) {
    const std::string name = option.substr(0, option.find('='));
    std::fprintf(stderr, "ckptfs: unknown option %s%s (see --help)\n", name.c_str(),
                 nearest(app, name).c_str());
  }
  for (const std::string& word : others)
    std::fprintf(stderr, "ckptfs: unexpected argument %s%s (see --help)\n", word.c_str(),
                 nearest(app, word).c_str());
  return e.get_exit_code();
}

// "A subcommand is required" after a misspelt one: CLI11 took the word for an extra
// argument. Names the word and the nearest subcommand.
int report_missing_subcommand(const CLI::App& app, const CLI::ParseError& e,
                              const std::vector<std::string>& args) {
  const CLI::App* command = &app;
  while (!command->get_subcommands().empty()) command = command->get_subcommands().front();
  std::string word;
  if (command == &app) {
    for (size_t i = 1; i < args.size() && word.empty(); ++i)
      if (!args[i].starts_with("-")) word = args[i];
  } else {
    for (size_t i = 1; i + 1 < args.size() && word.empty(); ++i)
      if (args[i] == command->get_name()) word = args[i + 1];
  }
  if (word.empty() || word.starts_with("-")) return app.exit(e);
  std::fprintf(stderr, "ckptfs: unknown subcommand %s%s (see --help)\n", word.c_str(),
               nearest(app, word).c_str());
  return e.get_exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  raise_open_file_limit();
  // A file past `ulimit -f` (the S3 spool's) is then an EFBIG error with a message, not the end
  // of the process.
  std::signal(SIGXFSZ, SIG_IGN);
  // Logs go to stderr so they never mix with a command's output.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("ckptfs"));
  spdlog::set_pattern("ckptfs: %l: %v");
  std::vector<std::string> args(argv, argv + argc);
  try {
    if (argc > 0 && ckptfs::cli::is_mount_helper(argv[0])) {
      bool fake = false;
      args = ckptfs::cli::mount_helper_args(args, fake);
      if (fake) return 0;
    }
  } catch (const ckptfs::Error& e) {
    std::fprintf(stderr, "ckptfs: %s\n", e.what());
    return 1;
  }
  const std::string log_level = take_log_level(args);
  move_leading_quiet(args);
  const spdlog::level::level_enum level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    std::fprintf(stderr,
                 "ckptfs: --log-level %s: expected trace, debug, info, warn, error or off\n",
                 log_level.c_str());
    return 1;
  }
  spdlog::set_level(level);

  CLI::App app{"ckptfs: MindSpore checkpoints resharded on read, through a FUSE mount", "ckptfs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text());
  std::string unused_level = log_level;  // parsed above; listed here for --help
  app.add_option("--log-level", unused_level,
                 "trace, debug, info, warn, error or off (also accepted after the subcommand)")
      ->capture_default_str();

  // Subcommands register here, one line each.
  ckptfs::cli::add_inspect_command(app);
  ckptfs::cli::add_index_command(app);
  ckptfs::cli::add_strategy_command(app);
  ckptfs::cli::add_ranks_command(app);
  ckptfs::cli::add_mount_commands(app);
  ckptfs::cli::add_materialize_command(app);
  ckptfs::cli::add_verify_command(app);
  ckptfs::cli::add_plan_command(app);

  std::vector<const char*> cargs;
  for (const std::string& a : args) cargs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(cargs.size()), cargs.data());
  } catch (const CLI::ExtrasError& e) {
    return report_unexpected(app, e, args);
  } catch (const CLI::RequiredError& e) {
    if (std::string_view(e.what()).find("subcommand") == std::string_view::npos) return app.exit(e);
    return report_missing_subcommand(app, e, args);
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
