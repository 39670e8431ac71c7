// Helpers shared by the unit tests of every module: a temporary directory, whole-file writes and
// reads, running code as an unprivileged user, running a shell command, and hand-built bytes.
// Header-only; include as "support/test_support.h".
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace ckptfs::testsupport {

// A fresh directory under the system temp directory (TMPDIR, else /tmp), named
// `<prefix>-XXXXXX`, removed with all it holds when the object goes.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "ckptfs-test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    // A test may have taken permissions away from the top directory.
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes `bytes` to `path` (creating its parent directories), replacing what was there.
inline std::filesystem::path write_file(const std::filesystem::path& path, std::string_view bytes) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// All of `path`, or "" if it cannot be opened.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Sets both atime and mtime of `path`.
inline void set_mtime(const std::filesystem::path& path, time_t sec, long nsec) {
  const struct timespec times[2] = {{sec, nsec}, {sec, nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

// Runs `body` in a child process that has dropped root to nobody (root reads and writes
// anywhere, so permission failures need another user) and returns what body returned, or
// "exception: <what>" if it threw. Returns nullopt if root cannot be dropped. Without root,
// body simply runs here.
inline std::optional<std::string> unprivileged(const std::function<std::string()>& body) {
  if (::geteuid() != 0) return body();
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(77);
    std::string out;
    try {
      out = body();
    } catch (const std::exception& e) {
      out = std::string("exception: ") + e.what();
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return out;
}

struct CommandResult {
  int status = -1;  // the exit status, or -1 if the command did not exit normally
  std::string out;  // its stdout
};

// Runs `command` through the shell and collects its stdout.
inline CommandResult run_command(const std::string& command) {
  CommandResult run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return run;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) run.out.append(buf, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// Runs the fixture generator's built-in case `name` into `dir` (CKPTFS_PYTHON, CKPTFS_SOURCE_DIR
// come from the test binary's definitions) and returns its case.json's "fixture" part.
inline nlohmann::json make_fixture(const std::string& name, const std::filesystem::path& dir) {
  const std::string cmd = std::string(CKPTFS_PYTHON) + " " + CKPTFS_SOURCE_DIR +
                          "/scripts/ckpt_fixture.py make --builtin " + name + " " + dir.string() +
                          " >/dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("generator failed: " + cmd);
  return nlohmann::json::parse(read_file(dir / "case.json")).at("fixture");
}

// Bytes written out by value: bytes({0x0A, 'w', ...}).
inline std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

// A minimal protobuf writer, independent of the code under test.
inline std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
// A length-delimited field (wire type 2).
inline std::string len_field(int field, std::string_view payload) {
  return varint(static_cast<uint64_t>(field) << 3 | 2) + varint(payload.size()) +
         std::string(payload);
}
// A varint field (wire type 0).
inline std::string varint_field(int field, uint64_t v) {
  return varint(static_cast<uint64_t>(field) << 3) + varint(v);
}

}  // namespace ckptfs::testsupport
