// Opening a path a user or a source tree names (checkpoints, strategies, indexes, outputs, log
// files): only the kind of file the command expects, and never blocking on the way. A FIFO would
// block open(2) or read(2) forever, a character device such as /dev/zero reads without end, a
// symlink loop fails with a cryptic errno: each is refused with one line naming the path and
// what it is. Stateless; safe from any thread.
//
// The kind is checked with stat(2) before opening, so that a device is never even opened (some
// act on open), and again with fstat(2) on the descriptor, opened O_NONBLOCK, so that a path
// swapped in between cannot block or stream either.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "ckptfs/error.h"
#include "ckptfs/util/eintr.h"
#include "ckptfs/util/fd.h"

namespace ckptfs::util {

// "a FIFO (named pipe)", "a character device", ... for a mode that stat(2) gave.
inline std::string kind_of_mode(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "of an unknown file type";
}

// What `path` is, symlinks followed, when that is not `want` (S_IFREG or S_IFDIR): "a FIFO (named
// pipe)", "a symlink to /dev/zero, a character device", "a symlink loop", "a dangling symlink to
// x". nullopt when it is of that kind, or when it does not exist (`missing` then says so).
inline std::optional<std::string> wrong_kind(const std::filesystem::path& path, mode_t want,
                                             bool* missing = nullptr) {
  if (missing) *missing = false;
  struct stat link_st, st;
  const bool is_link = ::lstat(path.c_str(), &link_st) == 0 && S_ISLNK(link_st.st_mode);
  std::error_code ec;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ELOOP) return std::string("a symlink loop (too many levels of symbolic links)");
    if (err == ENOENT && is_link)
      return "a dangling symlink to " + std::filesystem::read_symlink(path, ec).string();
    if (err == ENOENT && missing) *missing = true;
    return std::nullopt;  // the caller's open or listing reports the errno
  }
  if ((st.st_mode & S_IFMT) == want) return std::nullopt;
  const std::string kind = kind_of_mode(st.st_mode);
  if (!is_link) return kind;
  const std::filesystem::path target = std::filesystem::canonical(path, ec);
  return "a symlink to " + (ec ? std::string("something") : target.string()) + ", " + kind;
}

// The refusal of a path of the wrong kind: "PATH: the WHAT is a FIFO (named pipe), not a regular
// file". `what` names the role ("checkpoint file", "strategy file", "log file").
[[noreturn]] inline void refuse_kind(const std::filesystem::path& path, std::string_view what,
                                     const std::string& kind, mode_t want) {
  fail("{}: the {} is {}, not {}", path.string(), what, kind,
       want == S_IFDIR ? "a directory" : "a regular file");
}

// Throws Error unless `path` exists and is a directory (symlinks followed).
inline void require_directory(const std::filesystem::path& path, std::string_view what) {
  if (auto kind = wrong_kind(path, S_IFDIR)) refuse_kind(path, what, *kind, S_IFDIR);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    fail("{}: cannot open the {}: {}", path.string(), what, errno_text(errno));
}

// Throws Error if `path` exists (symlinks followed) and is not a directory; false if it does not
// exist, true otherwise (a directory, or one stat cannot see, whose use then reports the errno).
inline bool directory_if_present(const std::filesystem::path& path, std::string_view what) {
  bool missing = false;
  if (auto kind = wrong_kind(path, S_IFDIR, &missing)) refuse_kind(path, what, *kind, S_IFDIR);
  return !missing;
}

namespace detail {

// After open with O_NONBLOCK: refuses what fstat says is not a regular file, then clears
// O_NONBLOCK (reads of a regular file never block, but a FUSE or network filesystem may see it).
inline UniqueFd checked_regular(UniqueFd fd, const std::filesystem::path& path,
                                std::string_view what) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    fail("{}: cannot stat the {}: {}", path.string(), what, errno_text(errno));
  if (!S_ISREG(st.st_mode)) refuse_kind(path, what, kind_of_mode(st.st_mode), S_IFREG);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace detail

// Opens a regular file read-only (O_CLOEXEC), symlinks followed. Throws Error naming the path
// and what it is instead (a FIFO, a device, a directory, a symlink loop), or the errno.
inline UniqueFd open_regular(const std::filesystem::path& path, std::string_view what) {
  if (auto kind = wrong_kind(path, S_IFREG)) refuse_kind(path, what, *kind, S_IFREG);
  UniqueFd fd(retry_eintr(
      [&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY); }));
  if (!fd) fail("{}: cannot open the {}: {}", path.string(), what, errno_text(errno));
  return detail::checked_regular(std::move(fd), path, what);
}

// Opens a regular file for appending, creating it (`mode`) if absent. Same refusals as
// open_regular.
inline UniqueFd open_regular_append(const std::filesystem::path& path, std::string_view what,
                                    mode_t mode) {
  if (auto kind = wrong_kind(path, S_IFREG)) refuse_kind(path, what, *kind, S_IFREG);
  UniqueFd fd(retry_eintr([&] {
    return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY,
                  mode);
  }));
  if (!fd) fail("{}: cannot open the {}: {}", path.string(), what, errno_text(errno));
  return detail::checked_regular(std::move(fd), path, what);
}

// The whole of a regular file (open_regular's refusals). A regular file ends, so this is
// bounded by its size.
inline std::string read_regular(const std::filesystem::path& path, std::string_view what) {
  const UniqueFd fd = open_regular(path, what);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = retry_eintr([&] { return ::read(fd.get(), buf, sizeof buf); });
    if (n < 0) fail("{}: cannot read the {}: {}", path.string(), what, errno_text(errno));
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace ckptfs::util
