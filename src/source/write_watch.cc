#include "ckptfs/source/write_watch.h"

#include <spdlog/spdlog.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "ckptfs/util/fd.h"

namespace ckptfs::source {

namespace {

struct Watched {
  int handles = 0;
  uint64_t writes = 0;  // IN_MODIFY events seen (a lost queue counts as one for every inode)
  bool lost = false;    // the kernel dropped the watch: nothing more would be reported
};

// The process's inotify instance and what its events said. Never destroyed: handles may be
// released by static destructors after this would have been.
struct State {
  std::mutex mu;
  bool tried = false;
  bool said_limit = false;  // the watch limit was reported
  UniqueFd fd;
  std::unordered_map<int, Watched> watched;  // by watch descriptor

  // Takes every queued event into `watched`. Called with `mu` held, before any answer, so an
  // event the kernel queued before the question is always counted.
  void drain() {
    alignas(inotify_event) char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // EAGAIN: the queue is empty
      for (ssize_t at = 0; at < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + at);
        at += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if (ev->mask & IN_Q_OVERFLOW) {
          for (auto& [wd, w] : watched) ++w.writes;
          continue;
        }
        auto it = watched.find(ev->wd);
        if (it == watched.end()) continue;  // a watch already removed
        if (ev->mask & IN_MODIFY) ++it->second.writes;
        if (ev->mask & IN_IGNORED) it->second.lost = true;
      }
    }
  }
};

State& state() {
  static State* s = new State;
  return *s;
}

}  // namespace

WriteWatch WriteWatch::of(int fd) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.tried) {
    s.tried = true;
    s.fd = UniqueFd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    // Debug only: commands other than mount never need it, and a refusal is one line.
    if (!s.fd)
      spdlog::debug("no inotify ({}): a source deleted while in use is no longer served",
                    std::strerror(errno));
  }
  WriteWatch w;
  if (!s.fd) return w;
  // The magic link names the open file itself, whatever became of its path.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int wd = ::inotify_add_watch(s.fd.get(), self.c_str(), IN_MODIFY);
  if (wd < 0) {
    // The watch limit is a machine setting the operator can raise: said once, not per file.
    if (errno == ENOSPC && !s.said_limit) {
      s.said_limit = true;
      spdlog::warn(
          "the inotify watch limit is reached (fs.inotify.max_user_watches): a source deleted "
          "while in use is no longer served (EIO); raise the limit to keep serving such files");
    } else {
      spdlog::debug("{}: no inotify watch ({}): if deleted while in use, it is no longer served",
                    self, std::strerror(errno));
    }
    return w;
  }
  s.drain();
  Watched& entry = s.watched[wd];
  ++entry.handles;
  w.wd_ = wd;
  w.writes_at_start_ = entry.writes;
  return w;
}

bool WriteWatch::written() const {
  if (wd_ < 0) return true;
  State& s = state();
  std::lock_guard lock(s.mu);
  s.drain();
  const auto it = s.watched.find(wd_);
  return it == s.watched.end() || it->second.lost || it->second.writes != writes_at_start_;
}

WriteWatch::WriteWatch(WriteWatch&& other) noexcept
    : wd_(std::exchange(other.wd_, -1)), writes_at_start_(other.writes_at_start_) {}

WriteWatch& WriteWatch::operator=(WriteWatch&& other) noexcept {
  if (this != &other) {
    release();
    wd_ = std::exchange(other.wd_, -1);
    writes_at_start_ = other.writes_at_start_;
  }
  return *this;
}

WriteWatch::~WriteWatch() { release(); }

void WriteWatch::release() {
  if (wd_ < 0) return;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.watched.find(std::exchange(wd_, -1));
  if (it == s.watched.end() || --it->second.handles > 0) return;
  if (!it->second.lost) ::inotify_rm_watch(s.fd.get(), it->first);
  s.watched.erase(it);
}

}  // namespace ckptfs::source
