// What every fuzz target needs to hand its input to a reader that takes a file: a scratch file
// per process on tmpfs, rewritten for each input. A reader's ckptfs::Error is the expected
// answer to bad input; anything else (a crash, a sanitizer report, another exception, a hang,
// memory past -rss_limit_mb) is a finding.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::fuzz {

// An in-memory file holding exactly the input; fd() reads it from offset 0.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(::memfd_create("ckptfs-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// The folder of this process's named scratch files; removed at exit. A fuzzer that stops on a
// finding exits without running atexit handlers: the folders of processes that are gone are
// removed when the next one starts.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    constexpr std::string_view kPrefix = "ckptfs-fuzz-";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with(kPrefix)) continue;
      const long pid = std::strtol(name.c_str() + kPrefix.size(), nullptr, 10);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
        std::filesystem::remove_all(entry.path(), ec);
    }
    auto d = std::filesystem::path(base) / (std::string(kPrefix) + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// A named file holding exactly the input, for readers that pick their format by the name.
inline std::filesystem::path write_named(const std::string& name, const uint8_t* data,
                                         size_t size) {
  const std::filesystem::path path = scratch_dir() / name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

// The test command's self-test (scripts/test-selftest.sh) sets CKPTFS_INJECT_FAILURE=1 to prove
// that a finding fails the fuzz stage: the target that calls this crashes on its first input.
inline void crash_if_injected() {
  static const bool injected = [] {
    const char* value = std::getenv("CKPTFS_INJECT_FAILURE");
    return value != nullptr && std::string_view(value) == "1";
  }();
  if (injected) __builtin_trap();
}

// The input as text, split at each '\n' (an input without one is one line).
inline std::vector<std::string_view> lines_of(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> out;
  size_t begin = 0;
  while (true) {
    const size_t nl = text.find('\n', begin);
    out.push_back(text.substr(begin, nl == std::string_view::npos ? nl : nl - begin));
    if (nl == std::string_view::npos) return out;
    begin = nl + 1;
  }
}

}  // namespace ckptfs::fuzz
